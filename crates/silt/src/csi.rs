//! `silt csi`: the CSI plugin's process (crates/silt-csi does the work).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Arg, ArgMatches};
use silt_common::config::Config;
use silt_common::metrics;

pub fn args() -> Vec<Arg> {
    vec![
        Arg::new("endpoint")
            .long("endpoint")
            .value_name("unix:///PATH")
            .env("CSI_ENDPOINT")
            .default_value("unix:///csi/csi.sock")
            .help("The Unix socket to serve CSI on"),
        Arg::new("node_id")
            .long("node-id")
            .value_name("ID")
            .env("NODE_NAME")
            .help("This node's id (default: the host name)"),
        Arg::new("driver_name")
            .long("driver-name")
            .value_name("NAME")
            .env("SILT_CSI_DRIVER_NAME")
            .default_value(silt_csi::DEFAULT_DRIVER_NAME)
            .help("The driver's name, as the CSIDriver object and StorageClasses spell it"),
    ]
}

pub fn run(cfg: Config, m: &ArgMatches) -> Result<ExitCode> {
    let endpoint = m
        .get_one::<String>("endpoint")
        .context("--endpoint is required")?;
    let socket = silt_csi::socket_path(endpoint).map_err(anyhow::Error::msg)?;
    let node_id = match m.get_one::<String>("node_id") {
        Some(id) if !id.is_empty() => id.clone(),
        _ => host_name().context("no --node-id and no host name")?,
    };
    let settings = silt_csi::Settings {
        socket: socket.clone(),
        driver_name: m
            .get_one::<String>("driver_name")
            .cloned()
            .unwrap_or_else(|| silt_csi::DEFAULT_DRIVER_NAME.into()),
        node_id,
        config_file: m.get_one::<String>("config").map(PathBuf::from),
        exe: std::env::current_exe().context("finding the silt executable")?,
        cfg,
    };
    if settings.cfg.web_listen.resolve(false, "").is_some() {
        anyhow::bail!(
            "silt csi serves no web page (it has no namespace): drop --web-listen; a volume's mount serves one with the web_listen volume attribute"
        );
    }
    let rt = crate::daemon::runtime()?;
    let gauges = vec![
        (&metrics::CSI_VOLUMES_STAGED, &metrics::CSI_STAGED),
        (&metrics::CSI_VOLUMES_PUBLISHED, &metrics::CSI_PUBLISHED),
    ];
    let ops = std::sync::Arc::new(silt_ops::Ops::process("csi", gauges));
    for line in silt_ops::start(&settings.cfg, false, ops, &rt)?.announce() {
        eprintln!("{line}");
    }
    // Made and dropped here, outside the runtime: the plugin owns the controller's runtime,
    // which may not be dropped from async code.
    let plugin = silt_csi::Plugin::new(&settings)
        .with_context(|| format!("state dir {}", settings.cfg.state_dir.display()))?;
    let why = rt.block_on(async {
        let serving = silt_csi::serve(plugin.clone(), &socket);
        eprintln!(
            "silt: CSI plugin {} serving on {} (node {}; state in {})",
            settings.driver_name,
            socket.display(),
            settings.node_id,
            settings.cfg.state_dir.display()
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = serving => r.with_context(|| format!("serving on {}", socket.display())).map(|()| "stopped"),
            _ = tokio::signal::ctrl_c() => Ok("interrupted"),
            _ = term.recv() => Ok("terminated"),
        }
    })?;
    // The volumes' mount processes stay: pods keep their mounts while the plugin is away,
    // and the next plugin adopts them.
    eprintln!("silt: CSI plugin {why}; the volumes' mounts keep running");
    let _ = std::fs::remove_file(&socket);
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    drop(plugin);
    Ok(ExitCode::SUCCESS)
}

fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}
