//! The daemon roles.
//! - `silt up` / `silt mount URI DIR`: a single node: worker + client + FUSE mount + control
//!   socket in one process (the embedded membership: this process is the only worker).
//! - `silt up` / `silt mount DIR` with `--etcd` or `--workers`: a cluster client: FUSE mount,
//!   a memory-only near cache, and page fetches routed to the owning workers.
//! - `silt worker`: a cluster worker: page store + RPC (TCP, and a Unix socket for clients on
//!   the same host) + registration in the membership; no mount.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use silt_cache::{PageStore, PageStoreConfig};
use silt_client::{Client, ClientOptions, MountPoint, Namespace, WriteSetup};
use silt_cluster::rpc::{FixedStores, Service};
use silt_cluster::{
    auth::cluster_key, local_host_id, ClusterKey, EtcdMembership, Member, Membership, Replicas,
    ResidentTable, Router, RouterOptions, StaticMembership,
};
use silt_common::config::{parse_mount_table, Config, DiskTierSpec, MountSpec};
use silt_common::write::WriteRules;
use silt_common::{Error, ErrorKind};
use silt_fuse::{FuseOptions, FuseState};
use silt_ufs::S3Options;
use silt_worker::{Fetcher, Worker, WorkerOptions};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::control;

/// The metadata cache saved at a clean shutdown, read (and removed) at the next start.
const METADATA_SNAPSHOT: &str = "metadata-snapshot";
/// How often (at most) a running daemon saves its metadata cache, when it changed, for a
/// crash restart.
const METADATA_SNAPSHOT_EVERY: Duration = Duration::from_secs(5);

/// What the control server needs of the running daemon.
pub struct Daemon {
    /// `single node`, `cluster client` or `worker`.
    pub role: &'static str,
    pub client: Arc<Client>,
    pub fuse: Arc<FuseState>,
    pub config: Config,
    /// The cluster this process belongs to (reads, preloads and reports go through it).
    pub cluster: Option<Arc<Router>>,
    pub shutdown: Notify,
}

impl Daemon {
    /// The namespace served (a cluster client's comes from the cluster, not its flags).
    pub fn mounts(&self) -> Vec<MountSpec> {
        self.client
            .namespace()
            .mounts()
            .iter()
            .map(|m| MountSpec {
                path: m.path.clone(),
                uri: m.store.uri().to_string(),
            })
            .collect()
    }
}

/// The state file holding a worker's generated identity.
const WORKER_ID_FILE: &str = "worker-id";
/// A worker's Unix socket for clients on the same host.
const WORKER_SOCKET: &str = "worker.sock";

/// Holds the state dir's lock for the life of the process (released when the fd closes).
struct StateLock {
    _file: File,
}

fn lock_state_dir(dir: &Path) -> Result<StateLock> {
    // Owner-only whatever the umask, and tightened if an older version left it wider.
    silt_common::private::create_dir(dir)
        .with_context(|| format!("creating state dir {}", dir.display()))?;
    let path = dir.join("lock");
    let mut file = silt_common::private::options()
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

/// Raises the soft limit on open files to the hard one: worker connections, passed
/// descriptors and open cache files all count, and the common default soft limit (1024) is
/// reached by a client talking to a few dozen workers.
fn raise_fd_limit() {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                warn!("could not raise the open-file limit");
            }
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    raise_fd_limit();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("silt-rt")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The membership named by the configuration: etcd, or the static worker list.
async fn membership(cfg: &Config) -> Result<Arc<dyn Membership>> {
    if !cfg.etcd.is_empty() {
        let m = EtcdMembership::connect(&cfg.etcd, &cfg.cluster_name, cfg.member_ttl).await?;
        return Ok(m);
    }
    let members = cfg
        .workers
        .iter()
        .map(|(id, addr)| Member::new(id, addr))
        .collect();
    Ok(Arc::new(StaticMembership::new(members)))
}

fn mount_table_text(mounts: &[MountSpec]) -> String {
    mounts
        .iter()
        .map(|m| format!("{}={}", m.path, m.uri))
        .collect::<Vec<_>>()
        .join(",")
}

/// The cluster's mount table: the one stored in the membership, published from this
/// process's `mounts` if none is stored yet. A process given other mounts than the stored
/// table is refused, so every process serves one namespace.
async fn cluster_mounts(cfg: &Config, m: &dyn Membership) -> Result<Vec<MountSpec>> {
    let stored = if cfg.mounts.is_empty() {
        m.mounts().await?.ok_or_else(|| {
            Error::invalid(format!(
                "{} holds no mount table yet: give the first process --mount PATH=URI",
                m.describe()
            ))
        })?
    } else {
        m.publish_mounts(&mount_table_text(&cfg.mounts)).await?
    };
    let table = parse_mount_table(&stored).context("the cluster's stored mount table")?;
    if !cfg.mounts.is_empty() && !same_mounts(&cfg.mounts, &table) {
        return Err(Error::invalid(format!(
            "this process was given mounts {:?} but the cluster's mount table ({}) is {stored:?}; drop --mount to use the cluster's",
            mount_table_text(&cfg.mounts),
            m.describe()
        ))
        .into());
    }
    Ok(table)
}

/// Whether two mount tables hold the same mounts, in any order.
fn same_mounts(a: &[MountSpec], b: &[MountSpec]) -> bool {
    let sorted = |t: &[MountSpec]| {
        let mut t = t.to_vec();
        t.sort_by(|x, y| (&x.path, &x.uri).cmp(&(&y.path, &y.uri)));
        t
    };
    sorted(a) == sorted(b)
}

async fn open_namespace(cfg: &Config, mounts: &[MountSpec]) -> Result<Namespace> {
    let s3 = S3Options::from_config(cfg);
    let mut points = Vec::new();
    for m in mounts {
        let store = silt_ufs::open_store(&m.uri, &s3)
            .await
            .with_context(|| format!("mount {} -> {}", m.path, m.uri))?;
        points.push(MountPoint {
            path: m.path.clone(),
            store,
        });
    }
    Ok(Namespace::new(points)?)
}

fn router_options(cfg: &Config, key: ClusterKey) -> RouterOptions {
    RouterOptions {
        key,
        timeout: cfg.worker_timeout,
        retry_after: cfg.worker_retry_after,
        group_size: cfg.placement_group,
        candidates: cfg.failover_candidates,
        host_id: local_host_id(),
        unix_socket: cfg.cluster_unix_socket,
    }
}

/// The page store of the configuration; `disk: false` keeps it in memory (a cluster client's
/// near cache: the workers' disk tiers hold the data).
fn page_store(cfg: &Config, disk: bool) -> Result<Arc<PageStore>> {
    let mut pc = PageStoreConfig::from_config(cfg)?;
    if !disk {
        pc.disk_tiers.clear();
    }
    Ok(Arc::new(PageStore::open(pc)?))
}

/// Where written data goes: memory first (`write_memory`), spilling into a `spill`
/// directory of each disk tier within its quota (a cluster client, whose near cache has no
/// disk tiers, spills into STATE_DIR/spill); `back` writes are logged in STATE_DIR/wal.
fn write_setup(cfg: &Config) -> Result<WriteSetup> {
    let mut spill = WriteSetup::tier_spill_dirs(cfg)?;
    if spill.is_empty() || cfg.is_cluster() {
        spill = vec![DiskTierSpec {
            dir: cfg.state_dir.join("spill"),
            quota: u64::MAX / 2,
        }];
    }
    Ok(WriteSetup::from_config(
        cfg,
        spill,
        cfg.state_dir.join("wal"),
    )?)
}

/// `silt up` / `silt mount`: a single node, or a cluster client when the configuration names
/// a cluster.
pub fn run(cfg: Config, takeover: bool) -> Result<ExitCode> {
    init_logging(&cfg.log);
    let rt = runtime()?;

    // A live holder keeps this state dir's mount: take it over (from a dead daemon, or with
    // --takeover from a running one) instead of mounting.
    let holder = silt_fuse::takeover::holder_alive(&cfg.state_dir);
    if takeover {
        if !holder {
            return Err(Error::invalid(format!(
                "--takeover: no mount to take over (no FUSE holder in {}); start without --takeover",
                cfg.state_dir.display()
            ))
            .into());
        }
        stop_for_takeover(&cfg.state_dir)?;
    } else if !holder {
        // Check what can be checked before touching anything.
        silt_fuse::check_mountpoint(&cfg.mountpoint)?;
    }
    let _lock = lock_state_dir(&cfg.state_dir).map_err(|e| {
        if holder {
            e.context("the mount is served by a running silt; `silt up --takeover` replaces it")
        } else {
            e
        }
    })?;
    let held = if holder {
        silt_fuse::takeover::take_from_holder(&cfg.state_dir, &cfg.mountpoint)?
    } else {
        None
    };

    let (ns, pages, fetcher, cluster, role) = if cfg.is_cluster() {
        // A cluster client proves membership with the cluster's secret: it must be given one.
        let key =
            cluster_key(&cfg.cluster_secret, &cfg.state_dir, false)?.with_tls(cfg.cluster_tls);
        let m = rt.block_on(membership(&cfg))?;
        let mounts = rt.block_on(cluster_mounts(&cfg, m.as_ref()))?;
        let ns = rt.block_on(open_namespace(&cfg, &mounts))?;
        let router = Arc::new(Router::new(m, router_options(&cfg, key)));
        // The near cache is memory only: the workers' disk tiers hold the data.
        let fetcher: Arc<dyn Fetcher> = router.clone();
        (
            ns,
            page_store(&cfg, false)?,
            fetcher,
            Some(router),
            "cluster client",
        )
    } else {
        // A single node serves no worker port; it generates a secret into its state dir at its
        // first start, so the state dir is ready to join a cluster later (docs/SECURITY.md).
        // It uses no key itself, so a bad one is worth a warning, not a refusal to start.
        if let Err(e) = cluster_key(&cfg.cluster_secret, &cfg.state_dir, true) {
            warn!(error = %e, "no usable cluster secret (needed only to join a cluster)");
        }
        let ns = rt.block_on(open_namespace(&cfg, &cfg.mounts))?;
        let fetcher: Arc<dyn Fetcher> = Arc::new(silt_worker::StoreFetcher);
        (ns, page_store(&cfg, true)?, fetcher, None, "single node")
    };
    let worker = Arc::new(Worker::with_fetcher(
        pages,
        &WorkerOptions::from_config(&cfg),
        rt.handle().clone(),
        fetcher,
    ));
    let mut client = Client::new(
        ns,
        worker,
        ClientOptions::from_config(&cfg),
        rt.handle().clone(),
    );
    if let Some(router) = &cluster {
        // Files whole on a same-host worker open in passthrough from that worker's cache.
        client = client.with_backing_source(router.clone());
    }
    if WriteRules::new(cfg.write_type, cfg.write_rules.clone()).any_writable() {
        client = client.with_write_setup(write_setup(&cfg)?)?;
        match &cluster {
            // Cache-only files are kept by workers, not by this process.
            Some(router) if cfg.cache_only_replicas > 0 => {
                client = client.with_resident_remote(Arc::new(Replicas::new(
                    router.clone(),
                    cfg.cache_only_replicas,
                )));
            }
            None if cfg.cache_only_replicas > 0 => {
                warn!("cache_only_replicas applies to cluster clients; a single node keeps cache-only files itself")
            }
            _ => {}
        }
    }
    let client = Arc::new(client);
    if client.write_rules().any_writable() {
        // Uploads of `back` files (those recovered from the log included) and the TTL sweep.
        rt.spawn(client.clone().run_background());
    }

    // Listings and stats still fresh from before a clean restart (see silt_client::snapshot).
    let snapshot = cfg.state_dir.join(METADATA_SNAPSHOT);
    match client.restore_metadata(&snapshot) {
        Ok(0) => {}
        Ok(n) => info!(
            records = n,
            "metadata cache restored from the last snapshot"
        ),
        Err(e) => {
            warn!(error = %e, "metadata snapshot ignored; starting with an empty metadata cache")
        }
    }

    // Saved as it changes too, so a crash restart is as warm as a clean one (see the
    // snapshot's rules on what a periodic save may restore). The first save is at once: what
    // was just restored (restoring removed the file) stays saved if this run crashes early.
    {
        // Weak: the client (and its page store, whose drop marks a clean shutdown) must not be
        // kept alive by this thread.
        let (client, snapshot) = (Arc::downgrade(&client), snapshot.clone());
        std::thread::Builder::new()
            .name("silt-snapshot".into())
            .spawn(move || {
                let mut since = 0;
                loop {
                    let started = std::time::Instant::now();
                    let Some(client) = client.upgrade() else {
                        return;
                    };
                    if let Err(e) = client.save_metadata_if_changed(&snapshot, &mut since) {
                        warn!(error = %e, "periodic metadata snapshot failed");
                    }
                    drop(client);
                    // A large cache takes a while to save: keep saves under ~2 % of a core.
                    std::thread::sleep(METADATA_SNAPSHOT_EVERY.max(started.elapsed() * 50));
                }
            })
            .context("starting the metadata snapshot thread")?;
    }

    let fuse_state = Arc::new(FuseState::default());
    let daemon = Arc::new(Daemon {
        role,
        client: client.clone(),
        fuse: fuse_state.clone(),
        config: cfg.clone(),
        cluster,
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
        silt_fuse::MountSetup {
            state_dir: cfg.state_dir.clone(),
            holder_exe: std::env::current_exe().ok(),
            held,
        },
    )?;
    rt.spawn(control::serve(listener, daemon.clone()));
    eprintln!(
        "silt: serving {} at {} (state {}, control {}){}",
        mount_table_text(&daemon.mounts()),
        cfg.mountpoint.display(),
        cfg.state_dir.display(),
        socket.display(),
        if mounted.took_over {
            "; took over the running mount"
        } else {
            ""
        }
    );

    let why = rt.block_on(wait_for_stop(&daemon, || mounted.is_finished()))?;
    if why == HANDING_OVER {
        eprintln!(
            "silt: {why}: leaving the mount at {} to the new daemon",
            cfg.mountpoint.display()
        );
        let result = mounted.hand_over();
        if let Err(e) = daemon.client.save_metadata(&snapshot) {
            warn!(error = %e, "could not save the metadata cache; the next start begins empty");
        }
        rt.shutdown_timeout(Duration::from_secs(2));
        result?;
        return Ok(ExitCode::SUCCESS);
    }
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

/// What `wait_for_stop` answers for SIGUSR2: a new daemon takes the mount over.
const HANDING_OVER: &str = "handing over";

/// `--takeover`: asks the daemon holding the state dir (if one runs) to hand the mount over
/// (SIGUSR2: it commits open files and exits without unmounting) and waits until it is gone.
fn stop_for_takeover(dir: &Path) -> Result<()> {
    let path = dir.join("lock");
    let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) else {
        return Ok(());
    };
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        // Nobody holds it: the daemon is dead already; the holder alone keeps the mount.
        return Ok(());
    }
    drop(file);
    let pid: i32 = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|p| *p > 1)
        .ok_or_else(|| Error::invalid(format!("{}: no daemon pid in it", path.display())))?;
    info!(pid, "asking the running daemon to hand the mount over");
    // SAFETY: plain kill(2).
    if unsafe { libc::kill(pid, libc::SIGUSR2) } != 0 {
        return Err(Error::from(std::io::Error::last_os_error())
            .context(format!("signalling the running daemon (pid {pid})"))
            .into());
    }
    if !silt_fuse::takeover::wait_for_exit(pid, TAKEOVER_WAIT)? {
        return Err(Error::new(
            ErrorKind::Timeout,
            format!(
                "the running daemon (pid {pid}) did not exit within {}s of the handover request",
                TAKEOVER_WAIT.as_secs()
            ),
        )
        .into());
    }
    Ok(())
}

/// How long `--takeover` waits for the old daemon (it commits open files first).
const TAKEOVER_WAIT: Duration = Duration::from_secs(120);

/// Waits for a signal, `silt down`, or `gone()` (polled: the mount went away from outside).
async fn wait_for_stop(daemon: &Daemon, gone: impl Fn() -> bool) -> std::io::Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok("interrupted"),
            _ = term.recv() => return Ok("terminated"),
            _ = usr2.recv() => return Ok(HANDING_OVER),
            _ = daemon.shutdown.notified() => return Ok("asked to stop"),
            _ = poll.tick() => {
                // Unmounted from outside (fusermount3 -u): nothing left to serve.
                if gone() {
                    return Ok("unmounted");
                }
            }
        }
    }
}

/// This worker's stable identity: `worker_id`, else the one generated at its first start.
fn worker_id(cfg: &Config) -> Result<String> {
    if !cfg.worker_id.is_empty() {
        return Ok(cfg.worker_id.clone());
    }
    let path = cfg.state_dir.join(WORKER_ID_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim().to_string();
        silt_common::config::check_worker_id(&id).with_context(|| {
            format!(
                "{} is damaged; delete it or pass --worker-id",
                path.display()
            )
        })?;
        return Ok(id);
    }
    let id = format!("w-{:016x}", rand::random::<u64>());
    let tmp = path.with_extension("tmp");
    silt_common::private::write(&tmp, &id)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .with_context(|| format!("saving the worker id in {}", path.display()))?;
    Ok(id)
}

/// `silt worker`: page store + RPC + membership registration.
pub fn run_worker(cfg: Config) -> Result<ExitCode> {
    init_logging(&cfg.log);
    if !cfg.is_cluster() {
        return Err(Error::invalid(
            "a worker needs a cluster: give --etcd http://HOST:2379 or --workers ID=HOST:PORT,...",
        )
        .into());
    }
    let rt = runtime()?;
    let _lock = lock_state_dir(&cfg.state_dir)?;
    // Refusing to serve unauthenticated: a worker without the cluster's secret does not start.
    let key = cluster_key(&cfg.cluster_secret, &cfg.state_dir, false)?.with_tls(cfg.cluster_tls);
    let id = worker_id(&cfg)?;
    // In a static cluster the list says where this worker is reached.
    let listed = cfg
        .workers
        .iter()
        .find(|(w, _)| *w == id)
        .map(|(_, a)| a.clone());
    if !cfg.workers.is_empty() && listed.is_none() {
        return Err(Error::invalid(format!(
            "this worker's id {id:?} is not in --workers; give --worker-id with one of the listed ids"
        ))
        .into());
    }
    let tcp = rt
        .block_on(tokio::net::TcpListener::bind(&cfg.listen))
        .with_context(|| format!("listening on {}", cfg.listen))?;
    // The listed address, else the advertised one; fails now, before joining anything, when
    // neither says where others reach this worker.
    let addr = match listed {
        Some(a) => a,
        None => cfg.advertised_addr(tcp.local_addr()?)?,
    };
    let m = rt.block_on(membership(&cfg))?;
    let mounts = rt.block_on(cluster_mounts(&cfg, m.as_ref()))?;
    let ns = rt.block_on(open_namespace(&cfg, &mounts))?;
    let stores = FixedStores(ns.mounts().iter().map(|p| p.store.clone()).collect());
    let pages = page_store(&cfg, true)?;
    let capacity: u64 = pages.stats().tiers.iter().map(|t| t.capacity).sum();
    let worker = Arc::new(Worker::new(
        pages,
        &WorkerOptions::from_config(&cfg),
        rt.handle().clone(),
    ));

    let uds_path = cfg.state_dir.join(WORKER_SOCKET);
    let _ = std::fs::remove_file(&uds_path);
    let uds = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&uds_path)
            .with_context(|| format!("binding {}", uds_path.display()))?
    };
    // Same-host clients run as this user (or root): the socket lends cache files.
    silt_common::private::restrict(&uds_path)
        .with_context(|| format!("restricting {}", uds_path.display()))?;
    let me = Member {
        id: id.clone(),
        addr: addr.clone(),
        host: local_host_id(),
        uds: Some(uds_path.display().to_string()),
        capacity,
    };
    // Cache-only files clients replicate here: memory first, spilling like written data.
    let resident = Arc::new(ResidentTable::new(write_setup(&cfg)?.arena));
    rt.spawn(resident.clone().sweep_forever(Duration::from_secs(30)));
    let svc = Arc::new(
        Service::new(
            worker.clone(),
            Arc::new(stores),
            serde_json::json!({"id": id, "addr": addr}),
            key.clone(),
        )
        .with_resident(resident),
    );
    rt.spawn(silt_cluster::rpc::serve_tcp(tcp, svc.clone()));
    rt.spawn(silt_cluster::rpc::serve_unix(uds, svc));
    let registration = rt.block_on(m.register(me))?;

    let router = Arc::new(Router::new(m.clone(), router_options(&cfg, key)));
    let client = Arc::new(Client::new(
        ns,
        worker,
        ClientOptions::from_config(&cfg),
        rt.handle().clone(),
    ));
    let daemon = Arc::new(Daemon {
        role: "worker",
        client,
        fuse: Arc::new(FuseState::default()),
        config: cfg.clone(),
        cluster: Some(router),
        shutdown: Notify::new(),
    });
    let socket = control::socket_path(&cfg.state_dir);
    let listener = rt.block_on(control::bind(&socket))?;
    rt.spawn(control::serve(listener, daemon.clone()));
    eprintln!(
        "silt: serving as worker {id}: {} at {addr} ({}), state {}",
        mount_table_text(&daemon.mounts()),
        m.describe(),
        cfg.state_dir.display()
    );
    let why = rt.block_on(wait_for_stop(&daemon, || false))?;
    eprintln!("silt: worker {id}: {why}; leaving the cluster");
    // Leave at once (revokes the etcd lease) so clients stop routing here.
    rt.block_on(registration.leave());
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&uds_path);
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(ExitCode::SUCCESS)
}
