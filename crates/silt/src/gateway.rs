//! `silt gateway` and `silt up --gateway`: the S3 gateway's options and wiring. The gateway
//! itself is the `silt-gateway` crate.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Arg, ArgAction, ArgMatches};
use silt_client::Client;
use silt_common::config::Config;
use silt_gateway::{Gateway, Keys};
use tracing::info;

/// Environment variables of one access key (read-write, every bucket), beside `--keys`.
const ENV_ACCESS_KEY: &str = "SILT_GATEWAY_ACCESS_KEY";
const ENV_SECRET_KEY: &str = "SILT_GATEWAY_SECRET_KEY";

/// Who may use the gateway: `--keys`, the key in the environment, `--anonymous`.
/// `prefix` is "" for `silt gateway` and "gateway-" for `silt up`.
pub fn auth_args(prefix: &str) -> Vec<Arg> {
    let id = |s: &str| format!("{}{s}", prefix.replace('-', "_"));
    vec![
        Arg::new(id("keys"))
            .long(format!("{prefix}keys"))
            .value_name("FILE")
            .env("SILT_GATEWAY_KEYS")
            .help("S3 access keys, one a line: ACCESS_KEY SECRET [ro|rw] [BUCKET,...] (mode 600; see docs/gateway.md)"),
        Arg::new(id("anonymous"))
            .long(format!("{prefix}anonymous"))
            .action(ArgAction::SetTrue)
            .help("Serve unsigned requests too (read-only, every bucket)"),
    ]
}

/// The keys given to the gateway; refuses a gateway nobody could use.
pub fn keys(m: &ArgMatches, prefix: &str) -> Result<Keys> {
    let id = |s: &str| format!("{}{s}", prefix.replace('-', "_"));
    let mut keys = match m.get_one::<String>(&id("keys")) {
        Some(f) => Keys::from_file(Path::new(f))?,
        None => Keys::new(),
    };
    match (std::env::var(ENV_ACCESS_KEY), std::env::var(ENV_SECRET_KEY)) {
        (Ok(a), Ok(s)) if !a.is_empty() && !s.is_empty() => keys.insert(&a, &s, true, None),
        (Ok(_), Err(_)) | (Err(_), Ok(_)) => {
            bail!("{ENV_ACCESS_KEY} and {ENV_SECRET_KEY} go together: give both or neither")
        }
        _ => {}
    }
    keys.anonymous = m.get_flag(&id("anonymous"));
    if keys.is_empty() && !keys.anonymous {
        bail!(
            "the gateway has no access keys: give --{prefix}keys FILE or {ENV_ACCESS_KEY}/{ENV_SECRET_KEY}, or --{prefix}anonymous to serve unsigned requests"
        );
    }
    Ok(keys)
}

/// Starts a gateway over `client` on `rt`, serving until the runtime stops. Binds before it
/// returns, so a bad address fails the start.
pub fn start(
    client: Arc<Client>,
    keys: Keys,
    listen: &str,
    rt: &tokio::runtime::Runtime,
) -> Result<std::net::SocketAddr> {
    let n = keys.len();
    let anonymous = keys.anonymous;
    let listener = rt.block_on(silt_gateway::bind(listen))?;
    let addr = listener.local_addr().context("gateway address")?;
    let service = Gateway::new(client, keys).into_service();
    rt.spawn(silt_gateway::serve(
        listener,
        service,
        std::future::pending(),
    ));
    info!(%addr, keys = n, anonymous, "S3 gateway listening");
    Ok(addr)
}

/// `silt gateway`: a gateway with a client of its own (attached to the `silt up` of its state
/// dir, a cluster client, or a single node over the mounts given).
pub fn run(cfg: Config, m: &ArgMatches) -> Result<ExitCode> {
    crate::daemon::init_logging(&cfg.log);
    let keys = keys(m, "")?;
    let listen = m
        .get_one::<String>("listen")
        .context("--listen ADDR is required")?
        .clone();
    let rt = crate::daemon::runtime()?;
    let connected = silt_gateway::connect::connect(&cfg, &rt)?;
    let client = connected.node.client.clone();
    let addr = start(client.clone(), keys, &listen, &rt)?;
    eprintln!(
        "silt: serving S3 gateway at http://{addr} ({} client of {}; buckets: the top-level directories of {})",
        connected.mode,
        cfg.state_dir.display(),
        silt_node::mount_table_text(&silt_node::client_mounts(&client)),
    );
    let why = rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => Ok::<_, std::io::Error>("interrupted"),
            _ = term.recv() => Ok("terminated"),
        }
    })?;
    eprintln!("silt: gateway {why}; stopping");
    drop(connected);
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    Ok(ExitCode::SUCCESS)
}
