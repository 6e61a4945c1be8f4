//! `silt up` / `silt mount`: worker + client + FUSE mount + control socket in one process.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use silt_cache::{PageStore, PageStoreConfig};
use silt_client::{Client, ClientOptions, MountPoint, Namespace};
use silt_common::config::Config;
use silt_common::{Error, ErrorKind};
use silt_fuse::{FuseOptions, FuseState};
use silt_ufs::S3Options;
use silt_worker::{Worker, WorkerOptions};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::control;

/// The metadata cache saved at a clean shutdown, read (and removed) at the next start.
const METADATA_SNAPSHOT: &str = "metadata-snapshot";

/// What the control server needs of the running daemon.
pub struct Daemon {
    pub client: Arc<Client>,
    pub fuse: Arc<FuseState>,
    pub config: Config,
    pub shutdown: Notify,
}

/// Holds the state dir's lock for the life of the process (released when the fd closes).
struct StateLock {
    _file: File,
}

fn lock_state_dir(dir: &Path) -> Result<StateLock> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating state dir {}", dir.display()))?;
    let path = dir.join("lock");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on an fd we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(Error::new(
            ErrorKind::Busy,
            format!(
                "state dir {} is in use by another silt process (pid {}); stop it (`silt down`) or pass --state-dir",
                dir.display(),
                holder.trim()
            ),
        )
        .into());
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(StateLock { _file: file })
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn run(cfg: Config) -> Result<ExitCode> {
    init_logging(&cfg.log);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("silt-rt")
        .enable_all()
        .build()
        .context("starting the async runtime")?;

    // Check what can be checked before touching anything.
    silt_fuse::check_mountpoint(&cfg.mountpoint)?;
    let _lock = lock_state_dir(&cfg.state_dir)?;

    let s3 = S3Options::from_config(&cfg);
    let mut mounts = Vec::new();
    for m in &cfg.mounts {
        let store = rt
            .block_on(silt_ufs::open_store(&m.uri, &s3))
            .with_context(|| format!("mount {} -> {}", m.path, m.uri))?;
        mounts.push(MountPoint {
            path: m.path.clone(),
            store,
        });
    }
    let ns = Namespace::new(mounts)?;

    let pages = Arc::new(PageStore::open(PageStoreConfig {
        page_size: cfg.page_size,
        memory_capacity: cfg.memory_capacity,
        disk_tiers: cfg.disk_tiers()?,
        high_watermark: cfg.high_watermark,
        low_watermark: cfg.low_watermark,
        eviction_policy: cfg.eviction_policy.clone(),
    })?);
    let worker = Arc::new(Worker::new(
        pages,
        &WorkerOptions {
            fetch_concurrency: cfg.fetch_concurrency,
            buffer_memory: cfg.buffer_memory,
            request_size: cfg.request_size,
        },
        rt.handle().clone(),
    ));
    let client = Arc::new(Client::new(
        ns,
        worker,
        ClientOptions {
            metadata_ttl: cfg.metadata_ttl,
            lookup_lists_parent: cfg.lookup_lists_parent,
            prefetch_max: cfg.prefetch_max,
            fetch_concurrency: cfg.fetch_concurrency,
        },
        rt.handle().clone(),
    ));

    // Listings and stats still fresh from before a clean restart (see silt_client::snapshot).
    let snapshot = cfg.state_dir.join(METADATA_SNAPSHOT);
    match client.restore_metadata(&snapshot) {
        Ok(0) => {}
        Ok(n) => info!(
            records = n,
            "metadata cache restored from the last clean shutdown"
        ),
        Err(e) => {
            warn!(error = %e, "metadata snapshot ignored; starting with an empty metadata cache")
        }
    }

    let fuse_state = Arc::new(FuseState::default());
    let daemon = Arc::new(Daemon {
        client: client.clone(),
        fuse: fuse_state.clone(),
        config: cfg.clone(),
        shutdown: Notify::new(),
    });
    let socket = control::socket_path(&cfg.state_dir);
    let listener = rt.block_on(control::bind(&socket))?;

    let mounted = silt_fuse::mount(
        client,
        &cfg.mountpoint,
        FuseOptions {
            attr_ttl: cfg.attr_ttl,
            entry_ttl: cfg.entry_ttl,
            threads: cfg.fuse_threads,
            max_read: cfg.fuse_max_read,
            passthrough: cfg.passthrough,
            allow_other: cfg.allow_other,
        },
        fuse_state,
    )?;
    rt.spawn(control::serve(listener, daemon.clone()));
    let mounts: Vec<String> = cfg
        .mounts
        .iter()
        .map(|m| format!("{}={}", m.path, m.uri))
        .collect();
    eprintln!(
        "silt: serving {} at {} (state {}, control {})",
        mounts.join(", "),
        cfg.mountpoint.display(),
        cfg.state_dir.display(),
        socket.display()
    );

    let why = rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut poll = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok::<_, std::io::Error>("interrupted"),
                _ = term.recv() => return Ok("terminated"),
                _ = daemon.shutdown.notified() => return Ok("asked to stop"),
                _ = poll.tick() => {
                    // Unmounted from outside (fusermount3 -u): nothing left to serve.
                    if mounted.is_finished() {
                        return Ok("unmounted");
                    }
                }
            }
        }
    })?;
    eprintln!("silt: {why}; unmounting {}", cfg.mountpoint.display());
    let result = mounted.unmount();
    let _ = std::fs::remove_file(&socket);
    if result.is_ok() {
        if let Err(e) = daemon.client.save_metadata(&snapshot) {
            warn!(error = %e, "could not save the metadata cache; the next start begins empty");
        }
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    result?;
    Ok(ExitCode::SUCCESS)
}
