//! The daemon roles.
//! - `silt up` / `silt mount URI DIR`: a single node: worker + client + FUSE mount + control
//!   socket in one process (the embedded membership: this process is the only worker).
//! - `silt up` / `silt mount DIR` with `--etcd` or `--workers`: a cluster client: FUSE mount,
//!   a memory-only near cache, and page fetches routed to the owning workers.
//! - `silt worker`: a cluster worker: page store + RPC (TCP, and a Unix socket for clients on
//!   the same host) + registration in the membership; no mount.

use std::fs::OpenOptions;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use silt_client::{Client, ClientOptions};
use silt_cluster::rpc::{FixedStores, Service};
use silt_cluster::{auth::cluster_key, local_host_id, Member, ResidentTable, Router};
use silt_common::config::{Config, MountSpec};
use silt_common::{Error, ErrorKind};
use silt_fuse::{FuseOptions, FuseState};
use silt_node::local::{lock_state_dir, LocalService};
use silt_node::{
    cluster_mounts, membership, mount_table_text, open_namespace, page_store, router_options,
    write_setup, Node, Role, METADATA_SNAPSHOT,
};
use silt_reader::{PageReader, PageReaderOptions};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::control;

/// What the control server needs of the running daemon.
pub struct Daemon {
    /// `single node`, `cluster client` or `worker` (the report's role).
    pub role: &'static str,
    /// How its client reaches its cache (a worker's is its own: `Role::Single`).
    pub node_role: Role,
    pub client: Arc<Client>,
    pub fuse: Arc<FuseState>,
    pub config: Config,
    /// The cluster this process belongs to (reads, preloads and reports go through it).
    pub cluster: Option<Arc<Router>>,
    pub shutdown: Notify,
    /// Loads run through the control socket, for the web page.
    pub loads: Arc<silt_ops::Loads>,
    /// What serves this node to same-host clients, if it does (taken out at the stop).
    pub local: std::sync::Mutex<Option<LocalService>>,
}

impl Daemon {
    /// Stops serving same-host clients: the socket and `attach.json` go, so no process
    /// attaches to a node on its way out.
    pub fn stop_serving_local(&self) {
        drop(self.local.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    /// Tells clients attaching from now on of changed sync rules (`attach.json`).
    pub fn sync_rules_changed(&self) {
        if let Some(local) = &*self.local.lock().unwrap_or_else(|e| e.into_inner()) {
            if let Err(e) = local.rules_changed(&self.client) {
                warn!(error = %e, "attached clients not told of the changed sync rules");
            }
        }
    }

    /// The namespace served (a cluster client's comes from the cluster, not its flags).
    pub fn mounts(&self) -> Vec<MountSpec> {
        silt_node::client_mounts(&self.client)
    }

    /// The client and its cluster as a `Node` (for the calls shared with the Python SDK).
    pub fn node(&self) -> Node {
        Node {
            client: self.client.clone(),
            cluster: self.cluster.clone(),
            role: self.node_role,
        }
    }
}

/// The state file holding a worker's generated identity.
const WORKER_ID_FILE: &str = "worker-id";
/// A worker's Unix socket for clients on the same host.
const WORKER_SOCKET: &str = "worker.sock";

/// Starts logging for a daemon role (`up`, `mount`, `worker`, `gateway`) and hands the
/// configuration on.
pub(crate) fn logged(cfg: Config, role: &'static str) -> Config {
    silt_node::init_logging(&cfg, role, "RUST_LOG", "info");
    cfg
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

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    raise_fd_limit();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("silt-rt")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The membership named by the configuration: etcd, or the static worker list.
/// `silt up` / `silt mount`: a single node, or a cluster client when the configuration names
/// a cluster.
/// `gateway`: also serve the namespace over S3 at this address with these keys.
/// `ops_default`: whether `metrics_listen`/`web_listen = auto` serve (`silt up`) or not
/// (`silt mount`).
pub fn run(
    cfg: Config,
    takeover: bool,
    gateway: Option<(String, crate::gateway::Settings)>,
    ops_default: bool,
) -> Result<ExitCode> {
    let rt = runtime()?;
    let fuse = cfg.mounts_fuse();
    if takeover && !fuse {
        return Err(Error::invalid(
            "--takeover: mountpoint is `none` (no FUSE mount to take over); start without --takeover",
        )
        .into());
    }

    // A live holder keeps this state dir's mount: take it over (from a dead daemon, or with
    // --takeover from a running one) instead of mounting.
    let holder = fuse && silt_fuse::takeover::holder_alive(&cfg.state_dir);
    if takeover {
        if !holder {
            return Err(Error::invalid(format!(
                "--takeover: no mount to take over (no FUSE holder in {}); start without --takeover",
                cfg.state_dir.display()
            ))
            .into());
        }
        stop_for_takeover(&cfg.state_dir)?;
    } else if fuse && !holder {
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

    // The client (single node or cluster client), its metadata kept across restarts.
    let node = Node::build(&cfg, &rt)?;
    node.keep_metadata(&cfg.state_dir)?;
    node.keep_sweeping_ttl()?;
    let snapshot = cfg.state_dir.join(METADATA_SNAPSHOT);
    let Node {
        client,
        cluster,
        role,
    } = node;
    let fuse_state = Arc::new(FuseState::default());
    // Same-host processes (Python clients, their DataLoader workers, pods given the state
    // directory) attach to this node instead of opening a cache and the stores themselves
    // (silt_node::local). A change one of them reports is answered once the kernel was told,
    // so the mount shows it when the call returns. A single node proves its state
    // directory's secret (or the one it was given); a cluster client the state directory's
    // own, never the cluster's: whoever may attach must not become a member of the cluster.
    let settled: silt_node::local::Settled = {
        let fuse = fuse_state.clone();
        Arc::new(move || fuse.wait_for_invalidations())
    };
    let local_secret = match cluster {
        Some(_) => Default::default(),
        None => cfg.cluster_secret.clone(),
    };
    let local = cluster_key(&local_secret, &cfg.state_dir, true)
        .and_then(|key| {
            LocalService::start(&client, &cfg.state_dir, key, rt.handle(), Some(settled))
        })
        .map_err(|e| warn!(error = %e, "not serving this node to same-host clients"))
        .ok();

    let daemon = Arc::new(Daemon {
        role: role.describe(),
        node_role: role,
        client: client.clone(),
        fuse: fuse_state.clone(),
        config: cfg.clone(),
        cluster,
        shutdown: Notify::new(),
        loads: Arc::default(),
        local: std::sync::Mutex::new(local),
    });
    let socket = control::socket_path(&cfg.state_dir);
    let listener = rt.block_on(control::bind(&socket))?;
    // Bound before mounting: a bad address fails the start with nothing to undo.
    let mut ops =
        silt_ops::Ops::new(daemon.node(), role.describe()).with_loads(daemon.loads.clone());
    if fuse {
        ops = ops.with_mountpoint(cfg.mountpoint.clone());
    }
    let ops_addrs = silt_ops::start(&cfg, ops_default, Arc::new(ops), &rt)?;
    let gateway_addr = match gateway {
        Some((addr, settings)) => Some(crate::gateway::start(
            daemon.client.clone(),
            settings,
            &addr,
            cfg.state_dir.join(silt_gateway::connect::UPLOADS_DIR),
            &rt,
        )?),
        None => None,
    };

    let mounted = if !fuse {
        None
    } else {
        Some(silt_fuse::mount(
            client,
            &cfg.mountpoint,
            FuseOptions {
                attr_ttl: cfg.attr_ttl,
                entry_ttl: cfg.entry_ttl,
                threads: cfg.fuse_threads,
                max_read: cfg.fuse_max_read,
                cold_direct_io: cfg.fuse_cold_direct_io,
                open_fill_max: cfg.fuse_open_fill_max,
                source_passthrough: cfg.fuse_source_passthrough,
                xattrs: cfg.fuse_xattrs,
                passthrough: cfg.passthrough,
                allow_other: cfg.allow_other,
            },
            fuse_state,
            silt_fuse::MountSetup {
                state_dir: cfg.state_dir.clone(),
                holder_exe: std::env::current_exe().ok(),
                held,
            },
        )?)
    };
    rt.spawn(control::serve(listener, daemon.clone()));
    if let Some(addr) = gateway_addr {
        // Said before the "serving" line: whoever waits for that line finds this one too.
        eprintln!("silt: S3 gateway at {addr}");
    }
    for line in ops_addrs.announce() {
        eprintln!("{line}");
    }
    eprintln!(
        "silt: serving {} {} (state {}, control {}){}",
        mount_table_text(&daemon.mounts()),
        match &mounted {
            Some(_) => format!("at {}", cfg.mountpoint.display()),
            None => "with no mount, to same-host clients".to_string(),
        },
        cfg.state_dir.display(),
        socket.display(),
        if mounted.as_ref().is_some_and(|m| m.took_over) {
            "; took over the running mount"
        } else {
            ""
        }
    );

    let why = rt.block_on(wait_for_stop(&daemon, || {
        mounted.as_ref().is_some_and(|m| m.is_finished())
    }))?;
    // A handover leaves the mount (and the control socket's path) to the new daemon; any other
    // stop unmounts, if there is a mount. The metadata is kept unless an unmount failed.
    let handing_over = mounted.is_some() && why == HANDING_OVER;
    let result = match mounted {
        None => {
            eprintln!("silt: {why}; stopping");
            Ok(())
        }
        Some(m) if handing_over => {
            eprintln!(
                "silt: {why}: leaving the mount at {} to the new daemon",
                cfg.mountpoint.display()
            );
            m.hand_over()
        }
        Some(m) => {
            eprintln!("silt: {why}; unmounting {}", cfg.mountpoint.display());
            m.unmount()
        }
    };
    daemon.stop_serving_local();
    if !handing_over {
        let _ = std::fs::remove_file(&socket);
    }
    if handing_over || result.is_ok() {
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
    silt_node::set_log_worker_id(&id);
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
    let worker = Arc::new(PageReader::new(
        pages,
        &PageReaderOptions::from_config(&cfg),
        rt.handle().clone(),
    ));

    let uds_path = cfg.state_dir.join(WORKER_SOCKET);
    let _ = std::fs::remove_file(&uds_path);
    let uds = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&uds_path)
            .with_context(|| format!("binding {}", uds_path.display()))?
    };
    // Same-host clients run as this user (or root): the socket leases cache files.
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
            silt_cluster::rpc::answer::Identity::new(id.clone()).at(addr.clone()),
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
        node_role: Role::Single,
        client,
        fuse: Arc::new(FuseState::default()),
        config: cfg.clone(),
        cluster: Some(router),
        shutdown: Notify::new(),
        loads: Arc::default(),
        local: std::sync::Mutex::new(None),
    });
    let socket = control::socket_path(&cfg.state_dir);
    let listener = rt.block_on(control::bind(&socket))?;
    let ops = silt_ops::Ops::new(daemon.node(), "worker").with_loads(daemon.loads.clone());
    let ops_addrs = silt_ops::start(&cfg, true, Arc::new(ops), &rt)?;
    rt.spawn(control::serve(listener, daemon.clone()));
    for line in ops_addrs.announce() {
        eprintln!("{line}");
    }
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
