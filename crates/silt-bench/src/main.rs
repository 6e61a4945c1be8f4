//! `silt-bench`: the benchmark environment's command line (see the library docs).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{value_parser, Arg, ArgMatches, Command};
use silt_bench::proxy::{self, Shaping};
use silt_bench::{env, Env, Profile, UpOptions};

fn cli() -> Command {
    let id = Arg::new("id")
        .long("id")
        .value_parser(value_parser!(u8))
        .default_value("0")
        .help("Instance id (0-255): namespace silt-bench-<id>, addresses 198.18.<id>.0/30");
    Command::new("silt-bench")
        .about("Benchmark environment: a shaped S3 server in its own network namespace")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(
            Command::new("env")
                .about("Manage benchmark environments")
                .subcommand_required(true)
                .arg_required_else_help(true)
                .subcommand(
                    Command::new("up")
                        .about("Create (or re-create) an environment and leave it running")
                        .arg(id.clone())
                        .arg(
                            Arg::new("profile")
                                .long("profile")
                                .value_parser(["fast", "remote"])
                                .default_value("remote")
                                .help("Base profile: fast (no shaping) or remote (10ms, 50MB/s per connection, 250MB/s in all)"),
                        )
                        .arg(Arg::new("rtt").long("rtt").help("Round-trip time added, e.g. 10ms (0: none)"))
                        .arg(
                            Arg::new("per-conn-rate")
                                .long("per-conn-rate")
                                .help("Rate of each connection and direction, e.g. 50MB, 400Mbit (none: unlimited)"),
                        )
                        .arg(
                            Arg::new("aggregate-rate")
                                .long("aggregate-rate")
                                .help("Rate of all traffic per direction, e.g. 250MB (none: unlimited)"),
                        )
                        .arg(
                            Arg::new("data")
                                .long("data")
                                .value_parser(value_parser!(PathBuf))
                                .help("Directory served (top-level directories are buckets); default: a fresh one in the run dir, removed by `down`"),
                        ),
                )
                .subcommand(Command::new("down").about("Remove an environment").arg(id))
                .subcommand(Command::new("status").about("List environments")),
        )
        .subcommand(
            Command::new("proxy")
                .hide(true)
                .about("The shaping proxy (started inside the namespace by `env up`)")
                .arg(Arg::new("listen").long("listen").required(true).value_parser(value_parser!(SocketAddr)))
                .arg(Arg::new("upstream").long("upstream").required(true).value_parser(value_parser!(SocketAddr)))
                .arg(Arg::new("delay-us").long("delay-us").value_parser(value_parser!(u64)).default_value("0"))
                .arg(Arg::new("rate").long("rate").value_parser(value_parser!(u64)).default_value("0")),
        )
}

fn main() -> ExitCode {
    match run(cli().get_matches()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("silt-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(m: ArgMatches) -> Result<()> {
    match m.subcommand() {
        Some(("env", m)) => match m.subcommand() {
            Some(("up", m)) => env_up(m),
            Some(("down", m)) => {
                let id = id_arg(m)?;
                Env::down(id)?;
                println!("environment {id} removed");
                Ok(())
            }
            Some(("status", _)) => {
                let lines = env::status();
                if lines.is_empty() {
                    println!("no environments");
                }
                for l in lines {
                    println!("{l}");
                }
                Ok(())
            }
            _ => anyhow::bail!("unknown env command"),
        },
        Some(("proxy", m)) => run_proxy(m),
        _ => anyhow::bail!("unknown command"),
    }
}

fn id_arg(m: &ArgMatches) -> Result<u8> {
    m.get_one::<u8>("id").copied().context("--id is required")
}

fn env_up(m: &ArgMatches) -> Result<()> {
    let id = id_arg(m)?;
    let base = m
        .get_one::<String>("profile")
        .map(String::as_str)
        .unwrap_or("remote");
    let s = |k: &str| m.get_one::<String>(k).map(String::as_str);
    let profile =
        Profile::named(base)?.with_knobs(s("rtt"), s("per-conn-rate"), s("aggregate-rate"))?;
    let mut opts = UpOptions::new(id, profile);
    opts.data_dir = m.get_one::<PathBuf>("data").cloned();
    let env = Env::up_with(opts)?;
    println!("id={}", env.id());
    println!("endpoint={}", env.endpoint());
    println!("access_key={}", env.access_key());
    println!("secret_key={}", env.secret_key());
    println!("data_dir={}", env.data_dir().display());
    println!("netns={}", env.netns());
    println!("profile={}", env.profile());
    env.detach();
    Ok(())
}

fn run_proxy(m: &ArgMatches) -> Result<()> {
    let listen = *m.get_one::<SocketAddr>("listen").context("--listen")?;
    let upstream = *m.get_one::<SocketAddr>("upstream").context("--upstream")?;
    let delay = m.get_one::<u64>("delay-us").copied().unwrap_or(0);
    let rate = m.get_one::<u64>("rate").copied().filter(|r| *r > 0);
    let shaping = Shaping {
        one_way_delay: Duration::from_micros(delay),
        rate,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        proxy::serve(listener, upstream, shaping).await;
        Ok(())
    })
}
