//! `silt gateway` and `silt up --gateway`: the S3 gateway's options and wiring. The gateway
//! itself is the `silt-gateway` crate.

use std::path::{Path, PathBuf};
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

/// The gateway's options: who may use it (`--keys`, the key in the environment,
/// `--anonymous`), its domain, TLS. `prefix` is "" for `silt gateway` and "gateway-" for
/// `silt up`.
pub fn gateway_args(prefix: &str) -> Vec<Arg> {
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
        Arg::new(id("domain"))
            .long(format!("{prefix}domain"))
            .value_name("DOMAIN")
            .help("Also accept virtual-host-style requests: BUCKET.DOMAIN names a bucket (DNS for *.DOMAIN is yours to set up)"),
        Arg::new(id("tls_cert"))
            .long(format!("{prefix}tls-cert"))
            .value_name("FILE")
            .requires(id("tls_key"))
            .help("Serve HTTPS with this PEM certificate chain (with --tls-key)"),
        Arg::new(id("tls_key"))
            .long(format!("{prefix}tls-key"))
            .value_name("FILE")
            .requires(id("tls_cert"))
            .help("The PEM private key of --tls-cert (mode 600)"),
    ]
}

/// How a gateway is set up, beside its listen address and its client.
pub struct Settings {
    pub keys: Keys,
    pub domain: Option<String>,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// The gateway's settings from its options; refuses a gateway nobody could use.
pub fn settings(m: &ArgMatches, prefix: &str) -> Result<Settings> {
    let id = |s: &str| format!("{}{s}", prefix.replace('-', "_"));
    let tls = match (
        m.get_one::<String>(&id("tls_cert")),
        m.get_one::<String>(&id("tls_key")),
    ) {
        (Some(c), Some(k)) => Some(silt_gateway::tls::acceptor(Path::new(c), Path::new(k))?),
        _ => None,
    };
    Ok(Settings {
        keys: keys(m, prefix)?,
        domain: m.get_one::<String>(&id("domain")).cloned(),
        tls,
    })
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

/// Starts a gateway over `client` on `rt`, serving until the runtime stops; multipart parts
/// wait in `uploads_dir`. Binds before it returns, so a
/// bad address fails the start. Returns the address and its scheme.
pub fn start(
    client: Arc<Client>,
    settings: Settings,
    listen: &str,
    uploads_dir: PathBuf,
    rt: &tokio::runtime::Runtime,
) -> Result<String> {
    let n = settings.keys.len();
    let anonymous = settings.keys.anonymous;
    let listener = rt.block_on(silt_gateway::bind(listen))?;
    let addr = listener.local_addr().context("gateway address")?;
    let gw = Gateway::new(client, settings.keys, uploads_dir).with_domain(settings.domain);
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    rt.spawn(silt_gateway::serve(
        listener,
        gw.into_service(),
        settings.tls,
        std::future::pending(),
    ));
    info!(%addr, keys = n, anonymous, scheme, "S3 gateway listening");
    Ok(format!("{scheme}://{addr}"))
}

/// `silt gateway`: a gateway with a client of its own (attached to the `silt up` of its state
/// dir, a cluster client, or a single node over the mounts given).
pub fn run(cfg: Config, m: &ArgMatches) -> Result<ExitCode> {
    let settings = settings(m, "")?;
    let listen = m
        .get_one::<String>("listen")
        .context("--listen ADDR is required")?
        .clone();
    let rt = crate::daemon::runtime()?;
    let connected = silt_gateway::connect::connect(&cfg, &rt)?;
    let client = connected.node().client.clone();
    let url = start(
        client.clone(),
        settings,
        &listen,
        connected.uploads_dir(),
        &rt,
    )?;
    let ops = silt_ops::Ops::new(connected.node().clone(), "gateway");
    for line in silt_ops::start(&cfg, false, Arc::new(ops), &rt)?.announce() {
        eprintln!("{line}");
    }
    eprintln!(
        "silt: serving S3 gateway at {url} ({} of {}; buckets: the top-level directories of {})",
        connected.role(),
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
