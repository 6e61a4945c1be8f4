//! Command-line parsing. Options of the daemon roles are generated from the one option
//! table in `silt_common::config`, so a flag, its environment variable and its config-file
//! key always share a name.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Arg, ArgAction, ArgMatches, Command};
use silt_common::config::{env_name, flag_name, Config, OPTIONS, SECRET_OPTIONS};
use silt_common::size::parse_size;

use crate::{control, csi, daemon, gateway, ring};

fn option_args() -> Vec<Arg> {
    OPTIONS
        .iter()
        .map(|o| {
            let mut a = Arg::new(o.name)
                .long(flag_name(o.name))
                .help(o.help)
                .value_name("VALUE")
                .env(env_name(o.name));
            if o.name == "mounts" {
                a = a
                    .alias("mount")
                    .action(ArgAction::Append)
                    .value_name("PATH=URI");
            }
            if SECRET_OPTIONS.contains(&o.name) {
                a = a.hide_env_values(true);
            }
            a
        })
        .collect()
}

fn config_arg() -> Arg {
    Arg::new("config")
        .long("config")
        .short('c')
        .value_name("FILE")
        .env("SILT_CONFIG")
        .help("Config file (TOML, keys as in docs/CONFIGURATION.md)")
}

/// `--takeover`: a planned upgrade of a running daemon (see docs/SEMANTICS.md, "Restarts").
fn takeover_arg() -> Arg {
    Arg::new("takeover")
        .long("takeover")
        .action(ArgAction::SetTrue)
        .help("Take the mount over from the silt running on this state dir: it commits open files and exits without unmounting; open files and readers carry on")
}

fn state_args() -> Vec<Arg> {
    vec![
        config_arg(),
        Arg::new("state_dir")
            .long("state-dir")
            .value_name("DIR")
            .env("SILT_STATE_DIR")
            .help("State directory of the running Silt to talk to"),
    ]
}

fn command() -> Command {
    let path_arg = || {
        Arg::new("path")
            .required(true)
            .value_name("PATH")
            .help("Namespace path, e.g. /data/x")
    };
    Command::new("silt")
        .about("Silt: a distributed cache for object stores and remote file systems")
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(
            Command::new("up")
                .about("Run a worker and a FUSE mount on this machine (state in --state-dir)")
                .arg(config_arg())
                .arg(takeover_arg())
                .arg(
                    Arg::new("gateway")
                        .long("gateway")
                        .value_name("ADDR")
                        .env("SILT_GATEWAY")
                        .help("Also serve the namespace over the S3 API at ADDR (host:port; see docs/gateway.md)"),
                )
                .args(gateway::gateway_args("gateway-"))
                .args(option_args()),
        )
        .subcommand(
            Command::new("gateway")
                .about("Serve the namespace over the S3 API: attached to the silt up of --state-dir, a cluster client with --etcd/--workers, or its own single node over --mount")
                .arg(
                    Arg::new("listen")
                        .long("listen")
                        .value_name("ADDR")
                        .required(true)
                        .help("Address to serve S3 on (host:port; port 0 picks a free one)"),
                )
                .args(gateway::gateway_args(""))
                .arg(config_arg())
                .args(
                    // `listen` is the gateway's own here (a gateway serves no worker port).
                    option_args()
                        .into_iter()
                        .filter(|a| a.get_id() != "mountpoint" && a.get_id() != "listen"),
                ),
        )
        .subcommand(
            Command::new("worker")
                .about("Run a cluster worker: cache + RPC, registered in --etcd or listed in --workers (no mount)")
                .arg(config_arg())
                .args(
                    option_args()
                        .into_iter()
                        .filter(|a| a.get_id() != "mountpoint"),
                ),
        )
        .subcommand(
            Command::new("mount")
                .about("Mount one under-store at MOUNTPOINT (single process), or with --etcd/--workers and no URI the cluster's namespace (client only)")
                .arg(
                    Arg::new("uri")
                        .value_name("URI")
                        .help("file:///dir or s3://bucket/prefix"),
                )
                .arg(Arg::new("target").value_name("MOUNTPOINT"))
                .arg(config_arg())
                .arg(takeover_arg())
                .args(
                    option_args()
                        .into_iter()
                        .filter(|a| a.get_id() != "mountpoint"),
                ),
        )
        .subcommand(
            Command::new("fs")
                .about("Namespace operations against a running Silt")
                .subcommand_required(true)
                .subcommand(
                    Command::new("ls")
                        .about("List a directory")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("stat")
                        .about("Show one entry")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("cat")
                        .about("Write a file's bytes to stdout")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("sync")
                        .about("Revalidate PATH against the under-store now and report what changed")
                        .arg(path_arg())
                        .arg(
                            Arg::new("recursive")
                                .long("recursive")
                                .short('r')
                                .action(ArgAction::SetTrue)
                                .help("The whole tree below PATH (one recursive listing)"),
                        )
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("pin")
                        .about("Keep the files at or below PATH cached: load them, and never evict them (refused if they would not fit the disk tiers)")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("unpin")
                        .about("Let the files at or below PATH be evicted again")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("free")
                        .about("Drop the cached pages (and pins) of the files at or below PATH now; metadata stays")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("invalidate")
                        .about("Drop cached metadata and data of PATH and everything below it")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("persist")
                        .about("Upload the `back` files at or below PATH now and wait; exit 1 if one fails")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("state")
                        .about("Show where the `back` files at or below PATH stand: pending, uploading, persisted, failed (with the reason)")
                        .arg(path_arg())
                        .args(state_args()),
                )
                .subcommand(
                    Command::new("sync-policy")
                        .about("Show the sync policy of PATH, or set it for PATH and below (never, always, interval=D) until the daemon stops")
                        .arg(path_arg())
                        .arg(Arg::new("policy").value_name("POLICY"))
                        .args(state_args()),
                ),
        )
        .subcommand(
            Command::new("load")
                .about("Preload paths into the cache, with progress (throughput, ETA); a rerun skips what is cached, so an interrupted load resumes")
                .arg(path_arg().required(false).required_unless_present("from_file"))
                .arg(
                    Arg::new("from_file")
                        .long("from-file")
                        .value_name("FILE")
                        .help("Also load every path listed in FILE, one per line (blank lines and lines starting with # are skipped)"),
                )
                .arg(
                    Arg::new("concurrency")
                        .long("concurrency")
                        .value_name("N")
                        .value_parser(clap::value_parser!(u32).range(1..=1024))
                        .help("Fetches in flight at once (default: fetch_concurrency of the running Silt)"),
                )
                .args(state_args()),
        )
        .subcommand(
            Command::new("report")
                .about("Capacity per tier, pages, hit ratio, bytes by source, passthrough use")
                .arg(
                    Arg::new("json")
                        .long("json")
                        .action(ArgAction::SetTrue)
                        .help("Print JSON"),
                )
                .args(state_args()),
        )
        .subcommand(
            Command::new("memory")
                .about("Show memory of the read cache and of written data; --write/--cache lower (or raise) their ceilings at run time")
                .arg(
                    Arg::new("write")
                        .long("write")
                        .value_name("SIZE")
                        .help("New ceiling of write memory (data beyond it spills to disk)"),
                )
                .arg(
                    Arg::new("cache")
                        .long("cache")
                        .value_name("SIZE")
                        .help("New quota of the read cache's memory tier (evicts down to it)"),
                )
                .args(state_args()),
        )
        .subcommand(
            Command::new("down")
                .about("Unmount and stop a running Silt")
                .args(state_args()),
        )
        .subcommand(
            Command::new("csi")
                .about("Serve the CSI plugin (Node and Controller) on a Unix socket: each staged volume is a client mount of its own, bind-mounted into pods (docs/csi.md)")
                .args(csi::args())
                .arg(config_arg())
                .args(
                    option_args()
                        .into_iter()
                        .filter(|a| a.get_id() != "mountpoint"),
                ),
        )
        .subcommand(ring::command())
        .subcommand(
            // Keeps a mount's FUSE connection alive across its daemon (spawned by the daemon).
            Command::new("fuse-holder")
                .hide(true)
                .arg(Arg::new("state_dir").long("state-dir").required(true))
                .arg(Arg::new("mountpoint").long("mountpoint").required(true)),
        )
}

/// Builds the configuration: defaults < config file < environment < flags.
fn build_config(m: &ArgMatches, extra_mount: Option<(&str, &Path)>) -> Result<Config> {
    let mut cfg = Config::default();
    if let Some(file) = m.get_one::<String>("config") {
        cfg.apply_file(Path::new(file))?;
    }
    // Flags and environment variables arrive through clap; apply env first, flags last.
    for pass in [
        clap::parser::ValueSource::EnvVariable,
        clap::parser::ValueSource::CommandLine,
    ] {
        for o in OPTIONS {
            let Ok(Some(values)) = m.try_get_raw(o.name) else {
                continue;
            };
            if m.value_source(o.name) != Some(pass) {
                continue;
            }
            let joined: Vec<String> = values.map(|v| v.to_string_lossy().into_owned()).collect();
            let what = if pass == clap::parser::ValueSource::CommandLine {
                format!("--{}", flag_name(o.name))
            } else {
                env_name(o.name)
            };
            if pass == clap::parser::ValueSource::CommandLine && SECRET_OPTIONS.contains(&o.name) {
                // Logging starts later, with the configured filter: say it on stderr now.
                eprintln!(
                    "silt: warning: {what} is visible to every user of this machine (ps, /proc/PID/cmdline); pass it with {} or --{}-file instead",
                    env_name(o.name),
                    flag_name(o.name)
                );
            }
            cfg.set(o.name, &joined.join(","))
                .with_context(|| what.clone())?;
        }
    }
    if let Some((uri, target)) = extra_mount {
        cfg.set("mounts", &format!("/={uri}")).context("URI")?;
        cfg.mountpoint = target.to_path_buf();
    }
    cfg.validate()?;
    for w in cfg.load_secret_files()? {
        eprintln!("silt: warning: {w}");
    }
    Ok(cfg)
}

/// The state dir for client commands: flag/env, else the config file's, else the default.
fn state_dir(m: &ArgMatches) -> Result<PathBuf> {
    if let Some(d) = m.get_one::<String>("state_dir") {
        return Ok(PathBuf::from(d));
    }
    let mut cfg = Config::default();
    if let Some(file) = m.get_one::<String>("config") {
        cfg.apply_file(Path::new(file))?;
    }
    Ok(cfg.state_dir)
}

pub fn run() -> Result<ExitCode> {
    let matches = command().get_matches();
    match matches.subcommand() {
        Some(("up", m)) => {
            let gw = match m.get_one::<String>("gateway") {
                Some(addr) => Some((addr.clone(), gateway::settings(m, "gateway-")?)),
                None => None,
            };
            daemon::run(
                daemon::logged(build_config(m, None)?, "up"),
                m.get_flag("takeover"),
                gw,
                true,
            )
        }
        Some(("gateway", m)) => gateway::run(daemon::logged(build_config(m, None)?, "gateway"), m),
        Some(("worker", m)) => daemon::run_worker(daemon::logged(build_config(m, None)?, "worker")),
        Some(("mount", m)) => {
            let first = m.get_one::<String>("uri").cloned();
            let second = m.get_one::<String>("target").cloned();
            let mount_flags =
                m.value_source("mounts") == Some(clap::parser::ValueSource::CommandLine);
            match (first, second) {
                (Some(_), Some(_)) if mount_flags => {
                    bail!("silt mount takes URI MOUNTPOINT, or MOUNTPOINT with --mount PATH=URI and --etcd or --workers, not both")
                }
                (Some(uri), Some(target)) => daemon::run(
                    daemon::logged(build_config(m, Some((&uri, Path::new(&target))))?, "mount"),
                    m.get_flag("takeover"),
                    None,
                    false,
                ),
                // One argument: the mountpoint of a cluster client (namespace from the cluster).
                (Some(target), None) => {
                    let mut cfg = build_config(m, None)?;
                    if !cfg.is_cluster() {
                        bail!("silt mount needs URI MOUNTPOINT, or MOUNTPOINT with --etcd or --workers");
                    }
                    cfg.mountpoint = PathBuf::from(target);
                    daemon::run(
                        daemon::logged(cfg, "mount"),
                        m.get_flag("takeover"),
                        None,
                        false,
                    )
                }
                _ => {
                    bail!("silt mount needs URI MOUNTPOINT, or MOUNTPOINT with --etcd or --workers")
                }
            }
        }
        Some(("fs", sub)) => {
            let (op, m) = sub.subcommand().context("missing fs subcommand")?;
            let path = m.get_one::<String>("path").cloned().unwrap_or_default();
            let dir = state_dir(m)?;
            match op {
                "sync" => control::sync(&dir, &path, m.get_flag("recursive")),
                "invalidate" => control::invalidate(&dir, &path),
                "persist" => control::persist(&dir, &path),
                "state" => control::persist_state(&dir, &path),
                "sync-policy" => control::sync_policy(
                    &dir,
                    &path,
                    m.get_one::<String>("policy").map(String::as_str),
                ),
                _ => control::fs_command(&dir, op, &path),
            }
        }
        Some(("load", m)) => {
            let mut paths: Vec<String> = m.get_one::<String>("path").cloned().into_iter().collect();
            if let Some(f) = m.get_one::<String>("from_file") {
                let text = std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?;
                paths.extend(
                    text.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty() && !l.starts_with('#'))
                        .map(str::to_string),
                );
                if paths.is_empty() {
                    bail!("{f} lists no path to load");
                }
            }
            let concurrency = m.get_one::<u32>("concurrency").map(|&n| n as usize);
            control::load(&state_dir(m)?, &paths, concurrency)
        }
        Some(("report", m)) => control::report(&state_dir(m)?, m.get_flag("json")),
        Some(("memory", m)) => {
            let size = |k: &str| -> Result<Option<u64>> {
                m.get_one::<String>(k)
                    .map(|v| parse_size(v).with_context(|| format!("--{k}")))
                    .transpose()
            };
            control::memory(&state_dir(m)?, size("write")?, size("cache")?)
        }
        Some(("down", m)) => control::down(&state_dir(m)?),
        Some(("ring", m)) => ring::run(m),
        Some(("csi", m)) => csi::run(daemon::logged(build_config(m, None)?, "csi"), m),
        Some(("fuse-holder", m)) => {
            let arg = |k: &str| PathBuf::from(m.get_one::<String>(k).cloned().unwrap_or_default());
            silt_fuse::takeover::run_holder(&arg("state_dir"), &arg("mountpoint"))?;
            Ok(ExitCode::SUCCESS)
        }
        _ => bail!("unknown command"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_well_formed() {
        super::command().debug_assert();
    }
}
