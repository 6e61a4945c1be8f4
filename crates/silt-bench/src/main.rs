//! `silt-bench`: the benchmark environment's command line (see the library docs), and the
//! shuffle benchmark B5 (`silt-bench shuffle`, see `shuffle.rs`).

mod meta;
mod shuffle;

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
        .subcommand(shuffle_cli())
        .subcommand(meta_cli())
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
        Some(("shuffle", m)) => run_shuffle(m),
        Some(("meta", m)) => run_meta(m),
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

fn shuffle_cli() -> Command {
    let size = |name: &'static str, default: &'static str, help: &'static str| {
        Arg::new(name).long(name).default_value(default).help(help)
    };
    let count = |name: &'static str, default: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .value_parser(value_parser!(usize))
            .default_value(default)
            .help(help)
    };
    Command::new("shuffle")
        .about("Benchmark B5: the shuffle on a directory or through the client library; through, back and direct uploads")
        .long_about(
            "Benchmark B5. Prints one JSON object.\n\
             dir: WRITERS threads each write PARTITIONS files of PART_SIZE under --dir, then READERS threads read partition columns and check every byte (a tmpfs, or Silt's mount).\n\
             client --write-type cache-only: the same shuffle in-process through silt_client (set up as `silt up` sets up its client) over --store mounted at /data.\n\
             client --write-type through|back: FILES files of FILE_SIZE written through silt_client to --store, CONCURRENCY at a time (back: acknowledged, then persisted).\n\
             direct: the same files uploaded with the store's write_from (multipart), the baseline of through and back.\n\
             The store's endpoint and keys come from SILT_S3_* / AWS_*.",
        )
        .arg(
            Arg::new("mode")
                .long("mode")
                .required(true)
                .value_parser(["dir", "tmpfs-dir", "client", "direct"])
                .help("dir (alias tmpfs-dir), client or direct"),
        )
        .arg(
            Arg::new("write-type")
                .long("write-type")
                .default_value("cache-only")
                .value_parser(["cache-only", "through", "back"])
                .help("client mode: cache-only runs the shuffle; through and back time uploads"),
        )
        .arg(Arg::new("dir").long("dir").value_parser(value_parser!(PathBuf)).help("dir mode: where the shuffle writes"))
        .arg(Arg::new("store").long("store").help("client and direct modes: the store, e.g. s3://bench/b5"))
        .arg(
            Arg::new("state-dir")
                .long("state-dir")
                .value_parser(value_parser!(PathBuf))
                .help("client mode: state directory (disk tier STATE/cache, its spill directory, the write-ahead log)"),
        )
        .arg(Arg::new("prefix").long("prefix").default_value("b5").help("client and direct modes: directory in the store written"))
        .arg(count("writers", "32", "Shuffle writers"))
        .arg(count("partitions", "64", "Partitions per writer"))
        .arg(size("part-size", "1MiB", "Bytes per partition file"))
        .arg(count("readers", "32", "Shuffle readers"))
        .arg(size("io-chunk", "1MiB", "client mode: bytes per write_at and per read call"))
        .arg(size("write-memory", "1GiB", "client mode: write_memory, the ceiling of memory holding written data"))
        .arg(size("memory-capacity", "256MiB", "client mode: memory tier (read cache)"))
        .arg(size("disk-quota", "40GiB", "client mode: quota of the disk tier (and so of spilled data)"))
        .arg(count("files", "16", "through, back and direct: files uploaded"))
        .arg(size("file-size", "64MiB", "through, back and direct: bytes per file"))
        .arg(count("concurrency", "8", "through, back and direct: files in flight (Silt uploads back files 8 at a time)"))
        .arg(
            Arg::new("seed")
                .long("seed")
                .value_parser(value_parser!(u64))
                .default_value("7")
                .help("Seed of the data"),
        )
}

fn meta_cli() -> Command {
    let number = |name: &'static str, default: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .value_parser(value_parser!(u64))
            .default_value(default)
            .help(help)
    };
    Command::new("meta")
        .about("Benchmark B7: a client's metadata at scale, walking a synthetic store in process (prints one JSON object)")
        .arg(number("dirs", "1000", "Directories of the synthetic namespace"))
        .arg(number("files-per-dir", "1000", "Files in each directory"))
        .arg(number("seed", "7", "Seed of names' sizes, times and ETags"))
        .arg(number("samples", "100000", "Files stat'ed again after the walk (latency figures)"))
        .arg(
            Arg::new("state-dir")
                .long("state-dir")
                .required(true)
                .value_parser(value_parser!(PathBuf))
                .help("The client's state directory"),
        )
}

fn run_meta(m: &ArgMatches) -> Result<()> {
    let n = |k: &str| m.get_one::<u64>(k).copied().unwrap_or_default();
    let spec = meta::MetaSpec {
        dirs: n("dirs"),
        files_per_dir: n("files-per-dir"),
        seed: n("seed"),
        samples: n("samples") as usize,
        state_dir: m
            .get_one::<PathBuf>("state-dir")
            .cloned()
            .context("--state-dir is required")?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let out = rt.block_on(meta::run(&spec))?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

fn run_shuffle(m: &ArgMatches) -> Result<()> {
    let size = |k: &str| -> Result<u64> {
        let v = m
            .get_one::<String>(k)
            .map(String::as_str)
            .unwrap_or_default();
        silt_common::size::parse_size(v).with_context(|| format!("--{k} {v}"))
    };
    let count = |k: &str| m.get_one::<usize>(k).copied().unwrap_or_default();
    let seed = m.get_one::<u64>("seed").copied().unwrap_or(7);
    let mode = m
        .get_one::<String>("mode")
        .map(String::as_str)
        .unwrap_or_default();
    let write_type = shuffle::parse_write_type(
        m.get_one::<String>("write-type")
            .map(String::as_str)
            .unwrap_or("cache-only"),
    )?;
    let shape = shuffle::Shape {
        writers: count("writers"),
        partitions: count("partitions"),
        part_size: size("part-size")? as usize,
        readers: count("readers"),
        io_chunk: size("io-chunk")? as usize,
    };
    let uploads = shuffle::Uploads {
        files: count("files"),
        file_size: size("file-size")? as usize,
        concurrency: count("concurrency"),
        io_chunk: size("io-chunk")? as usize,
    };
    let prefix = m.get_one::<String>("prefix").cloned().unwrap_or_default();
    let json = if mode == "dir" || mode == "tmpfs-dir" {
        let dir = m
            .get_one::<PathBuf>("dir")
            .context("--mode dir needs --dir")?;
        serde_json::to_string(&shuffle::shuffle_dir(dir, &shape, seed)?)?
    } else {
        let store_uri = m
            .get_one::<String>("store")
            .context("--mode client and direct need --store")?;
        // The daemon's runtime size (crates/silt/src/daemon.rs).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .context("starting the runtime")?;
        rt.block_on(async {
            if mode == "direct" {
                let mut cfg = silt_common::config::Config::default();
                cfg.apply_env()?;
                let store =
                    silt_ufs::open_store(store_uri, &silt_ufs::S3Options::from_config(&cfg))
                        .await
                        .with_context(|| format!("opening {store_uri}"))?;
                return Ok(serde_json::to_string(
                    &shuffle::upload_direct(&store, &prefix, &uploads, seed).await?,
                )?);
            }
            let spec = shuffle::ClientSpec {
                store: store_uri.clone(),
                state_dir: m
                    .get_one::<PathBuf>("state-dir")
                    .cloned()
                    .context("--mode client needs --state-dir")?,
                write_type,
                write_memory: size("write-memory")?,
                memory_capacity: size("memory-capacity")?,
                disk_quota: size("disk-quota")?,
            };
            let client = shuffle::build_client(&spec).await?;
            anyhow::Ok(if write_type == silt_common::write::WriteType::CacheOnly {
                serde_json::to_string(
                    &shuffle::shuffle_client(client, &prefix, &shape, seed).await?,
                )?
            } else {
                let store = {
                    let cfg = spec.config()?;
                    silt_ufs::open_store(store_uri, &silt_ufs::S3Options::from_config(&cfg)).await?
                };
                serde_json::to_string(
                    &shuffle::upload_client(client, &store, &prefix, write_type, &uploads, seed)
                        .await?,
                )?
            })
        })?
    };
    println!("{json}");
    Ok(())
}
