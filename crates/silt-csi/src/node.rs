//! The Node service: a staged volume is one client mount (`silt mount`, a process of its own
//! with its own state directory) on the staging path; publishing bind-mounts the volume's
//! directory from there into the pod's volume directory, so every pod of a volume on this node
//! shares one client and one cache.
//!
//! The mount process keeps its FUSE connection in a holder process (docs/SEMANTICS.md,
//! "Restarts"), so when it dies the staging mount and every bind mount of it stay: their
//! requests wait. The plugin watches each mount process (pidfd) and starts it again; the new
//! one takes the connection back from the holder and answers them. The plugin itself keeps
//! what it staged in `STATE_DIR/volumes/*/volume.json`, so a restarted plugin adopts the mount
//! processes that outlived it (they run in their own process group) and watches them again.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use silt_common::metrics;

use crate::grpc::{Code, Status};
use crate::mounts;
use crate::proto::{self, VolumeCapability};
use crate::volume::{self, MountSpec};

/// What the plugin keeps of a staged volume (in `volume.json`, owner-only: it holds the
/// secrets the mount process is started with).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Staged {
    pub volume_id: String,
    pub staging: PathBuf,
    pub spec: MountSpec,
    /// Published targets, and whether each is read-only.
    pub targets: BTreeMap<PathBuf, bool>,
    /// The mount process now serving (0: none yet).
    pub pid: i32,
}

/// How long a mount process may take to mount before staging fails.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an unstaged volume's mount process may take to commit and unmount.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// A mount process that dies sooner than this after its start is restarted after a growing
/// pause (a crash loop must not spin), up to `MAX_BACKOFF`.
const STABLE_AFTER: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

type Slot = Arc<tokio::sync::Mutex<Option<Staged>>>;

pub struct NodeService {
    pub node_id: String,
    state_dir: PathBuf,
    exe: PathBuf,
    config_file: Option<PathBuf>,
    /// One lock per volume id: calls on one volume run one at a time, other volumes' go on.
    slots: parking_lot::Mutex<HashMap<String, Slot>>,
}

impl NodeService {
    pub fn new(
        node_id: String,
        state_dir: PathBuf,
        exe: PathBuf,
        config_file: Option<PathBuf>,
    ) -> Self {
        NodeService {
            node_id,
            state_dir,
            exe,
            config_file,
            slots: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, volume_id: &str) -> Slot {
        self.slots
            .lock()
            .entry(volume_id.to_string())
            .or_default()
            .clone()
    }

    /// The directory of a volume's records, mount state and log.
    fn volume_dir(&self, volume_id: &str) -> PathBuf {
        let h = xxhash_rust::xxh3::xxh3_128(volume_id.as_bytes());
        self.state_dir.join("volumes").join(format!("{h:032x}"))
    }

    /// Adopts what an earlier run of the plugin staged: watches the mount processes that
    /// still run, restarts those that do not.
    pub fn adopt(self: &Arc<Self>) {
        let Ok(dirs) = std::fs::read_dir(self.state_dir.join("volumes")) else {
            return;
        };
        for dir in dirs.flatten() {
            let file = dir.path().join(RECORD);
            let Ok(text) = std::fs::read(&file) else {
                continue;
            };
            let staged: Staged = match serde_json::from_slice(&text) {
                Ok(s) => s,
                Err(e) => {
                    warn!(file = %file.display(), error = %e, "unreadable volume record; leaving it alone");
                    continue;
                }
            };
            if self.volume_dir(&staged.volume_id) != dir.path() {
                warn!(file = %file.display(), "volume record in another volume's directory; leaving it alone");
                continue;
            }
            info!(volume = %staged.volume_id, staging = %staged.staging.display(), pid = staged.pid, "adopting a staged volume");
            let pid = staged.pid;
            let slot = self.slot(&staged.volume_id);
            let id = staged.volume_id.clone();
            let published = staged.targets.len() as i64;
            match slot.try_lock() {
                Ok(mut g) => *g = Some(staged),
                Err(_) => continue,
            }
            metrics::CSI_STAGED.inc();
            metrics::CSI_PUBLISHED.add(published);
            let pidfd = (pid > 0 && self.is_mount_process(pid, &id))
                .then(|| silt_common::sys::open_pidfd(pid).ok())
                .flatten();
            let me = self.clone();
            tokio::spawn(async move { me.watch(id, pid, pidfd).await });
        }
    }

    /// Whether `pid` is the mount process of `volume_id` (and not a reused number).
    fn is_mount_process(&self, pid: i32, volume_id: &str) -> bool {
        let dir = self.volume_dir(volume_id).join(MOUNT_STATE);
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                c.split(|b| *b == 0)
                    .any(|arg| arg == dir.as_os_str().as_encoded_bytes())
            })
            .unwrap_or(false)
    }

    fn persist(&self, staged: &Staged) -> Result<(), Status> {
        let dir = self.volume_dir(&staged.volume_id);
        let text = serde_json::to_vec_pretty(staged)
            .map_err(|e| Status::internal(format!("encoding the volume record: {e}")))?;
        let (tmp, file) = (dir.join("volume.json.tmp"), dir.join(RECORD));
        silt_common::private::write(&tmp, &text)
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(|e| Status::internal(format!("writing {}: {e}", file.display())))
    }

    /// Starts the mount process of `staged` (its output appended to the volume's log).
    fn spawn_mount(&self, staged: &Staged) -> io::Result<(i32, OwnedFd)> {
        use std::os::unix::process::CommandExt;
        let dir = self.volume_dir(&staged.volume_id);
        silt_common::private::create_dir(&dir)?;
        let log = silt_common::private::options()
            .append(true)
            .create(true)
            .open(dir.join(LOG))?;
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("mount");
        if let Some(uri) = &staged.spec.uri {
            cmd.arg(uri);
        }
        cmd.arg(&staged.staging)
            .arg("--state-dir")
            .arg(dir.join(MOUNT_STATE));
        if let Some(c) = &self.config_file {
            cmd.arg("--config").arg(c);
        }
        cmd.env_remove("SILT_STATE_DIR")
            // The plugin's own endpoints are not the mounts': a volume may turn them on.
            .env("SILT_METRICS_LISTEN", "off")
            .env("SILT_WEB_LISTEN", "off")
            .envs(&staged.spec.env)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: signals meant for the plugin (a terminal's ^C, a
            // supervisor's stop of the plugin's group) do not reach the mounts.
            .process_group(0);
        let child = cmd.spawn()?;
        let pid = child.id() as i32;
        // Not waited for here: the watcher reaps it (pidfd, then waitpid).
        drop(child);
        let fd = silt_common::sys::open_pidfd(pid)?;
        Ok((pid, fd))
    }

    /// Waits for the mount process to mount the staging path; kills it on failure.
    async fn wait_mounted(&self, staged: &Staged, pid: i32, pidfd: &OwnedFd) -> Result<(), Status> {
        let started = Instant::now();
        loop {
            if mounts::is_silt_mount(&staged.staging) {
                return Ok(());
            }
            if exited(pidfd) {
                reap(pid);
                return Err(Status::internal(format!(
                    "the mount process of volume {} exited before mounting: {}",
                    staged.volume_id,
                    self.log_tail(&staged.volume_id)
                )));
            }
            if started.elapsed() > MOUNT_TIMEOUT {
                kill(pid, libc::SIGKILL);
                let _ = wait_exit(
                    pidfd
                        .try_clone()
                        .map_err(|e| Status::internal(e.to_string()))?,
                )
                .await;
                reap(pid);
                return Err(Status::new(
                    Code::Unavailable,
                    format!(
                        "the mount process of volume {} did not mount within {} s: {}",
                        staged.volume_id,
                        MOUNT_TIMEOUT.as_secs(),
                        self.log_tail(&staged.volume_id)
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// After a restart whose holder was gone: the dead mount stays listed on the staging
    /// path (answering `ENOTCONN`) until the new process detaches it and mounts, so wait for
    /// the staging path to answer, not merely to be listed.
    async fn wait_answering(
        &self,
        staged: &Staged,
        pid: i32,
        pidfd: &OwnedFd,
    ) -> Result<(), Status> {
        let started = Instant::now();
        loop {
            self.wait_mounted(staged, pid, pidfd).await?;
            let staging = staged.staging.clone();
            if tokio::task::spawn_blocking(move || mounts::answers(&staging))
                .await
                .unwrap_or(false)
            {
                return Ok(());
            }
            if started.elapsed() > MOUNT_TIMEOUT {
                return Err(Status::new(
                    Code::Unavailable,
                    format!(
                        "the staging path of volume {} does not answer",
                        staged.volume_id
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The last lines of a volume's mount log, for an error message.
    fn log_tail(&self, volume_id: &str) -> String {
        let text =
            std::fs::read_to_string(self.volume_dir(volume_id).join(LOG)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        if tail.is_empty() {
            "(it logged nothing)".into()
        } else {
            tail
        }
    }

    /// Watches a volume's mount process and starts it again whenever it dies while the
    /// volume is staged. `pidfd` `None`: not running now (start it at once).
    async fn watch(self: Arc<Self>, volume_id: String, mut pid: i32, mut pidfd: Option<OwnedFd>) {
        let slot = self.slot(&volume_id);
        let mut backoff = Duration::from_millis(200);
        loop {
            let since = Instant::now();
            if let Some(fd) = pidfd.take() {
                if let Err(e) = wait_exit(fd).await {
                    warn!(volume = %volume_id, error = %e, "cannot watch the mount process; it will not be restarted");
                    return;
                }
                reap(pid);
            }
            {
                let guard = slot.lock().await;
                match &*guard {
                    Some(s) if s.pid == pid => {}
                    // Unstaged, or restarted by someone else meanwhile.
                    _ => return,
                }
            }
            if since.elapsed() > STABLE_AFTER {
                backoff = Duration::from_millis(200);
            }
            warn!(volume = %volume_id, pid, pause = ?backoff, "the volume's mount process is gone; starting it again onto the kept mount");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            let mut guard = slot.lock().await;
            let Some(staged) = guard.as_mut() else {
                return;
            };
            if staged.pid != pid {
                return;
            }
            let holder_was_alive =
                silt_common::sys::holder_alive(&self.volume_dir(&volume_id).join(MOUNT_STATE));
            match self.spawn_mount(staged) {
                Ok((p, fd)) => {
                    metrics::CSI_MOUNT_RESTARTS.inc();
                    staged.pid = p;
                    pid = p;
                    if let Err(e) = self.persist(staged) {
                        warn!(volume = %volume_id, error = %e, "could not save the volume record");
                    }
                    // The FUSE connection died with its holder: the new process mounts anew,
                    // and the pods' bind mounts of the dead one must follow. A holder killed
                    // with it may still accept a connection while it dies (so it seemed
                    // alive), and the new process then finds it gone and mounts anew too:
                    // then the pods' mounts that no longer answer are bound again.
                    let s = staged.clone();
                    match self.wait_answering(&s, p, &fd).await {
                        Ok(()) => rebind(&s, !holder_was_alive),
                        Err(e) => {
                            warn!(volume = %volume_id, error = %e.message, "restarting the mount failed");
                        }
                    }
                    pidfd = Some(fd);
                }
                Err(e) => {
                    warn!(volume = %volume_id, error = %e, "could not start the mount process; trying again");
                    pidfd = None;
                }
            }
        }
    }

    pub async fn stage(self: &Arc<Self>, req: proto::NodeStageVolumeRequest) -> Result<(), Status> {
        require(&req.volume_id, "volume_id")?;
        require_path(&req.staging_target_path, "staging_target_path")?;
        check_capability(req.volume_capability.as_ref())?;
        let spec = volume::mount_spec(&req.volume_context, &req.secrets)?;
        let staging = PathBuf::from(&req.staging_target_path);
        let slot = self.slot(&req.volume_id);
        let mut guard = slot.lock().await;
        if let Some(s) = &*guard {
            if s.staging == staging && s.spec == spec {
                return Ok(());
            }
            return Err(Status::new(
                Code::AlreadyExists,
                format!(
                    "volume {} is staged at {} with other attributes; unstage it first",
                    req.volume_id,
                    s.staging.display()
                ),
            ));
        }
        std::fs::create_dir_all(&staging)
            .map_err(|e| Status::internal(format!("creating {}: {e}", staging.display())))?;
        if mounts::mounts_on(&staging) > 0 {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!("something else is mounted on {}", staging.display()),
            ));
        }
        let mut staged = Staged {
            volume_id: req.volume_id.clone(),
            staging,
            spec,
            targets: BTreeMap::new(),
            pid: 0,
        };
        let (pid, pidfd) = self
            .spawn_mount(&staged)
            .map_err(|e| Status::internal(format!("starting the mount process: {e}")))?;
        staged.pid = pid;
        if let Err(e) = self.wait_mounted(&staged, pid, &pidfd).await {
            // Whatever it left (a holder, a half-made state dir) goes; the error says why.
            self.stop(&staged).await;
            return Err(e);
        }
        // The volume's directory in the mounted namespace (a created volume's is made by
        // CreateVolume; a static one may name a directory to be).
        let source = staged.source();
        if let Err(e) = tokio::task::spawn_blocking({
            let source = source.clone();
            move || std::fs::create_dir_all(source)
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
        {
            let msg = format!("creating the volume's directory {}: {e}", source.display());
            self.stop(&staged).await;
            return Err(Status::internal(msg));
        }
        if let Err(e) = self.persist(&staged) {
            self.stop(&staged).await;
            return Err(e);
        }
        info!(volume = %staged.volume_id, staging = %staged.staging.display(), pid, "volume staged");
        *guard = Some(staged);
        metrics::CSI_STAGED.inc();
        drop(guard);
        let me = self.clone();
        let id = req.volume_id.clone();
        tokio::spawn(async move { me.watch(id, pid, Some(pidfd)).await });
        Ok(())
    }

    /// Stops a volume's mount process (it commits open files and unmounts), then makes sure
    /// nothing is left mounted on the staging path and removes the volume's state.
    async fn stop(&self, staged: &Staged) {
        let dir = self.volume_dir(&staged.volume_id);
        let pid = staged.pid;
        if pid > 0 && self.is_mount_process(pid, &staged.volume_id) {
            kill(pid, libc::SIGTERM);
            let gone = tokio::task::spawn_blocking(move || {
                silt_common::sys::wait_for_exit(pid, STOP_TIMEOUT).unwrap_or(false)
            })
            .await
            .unwrap_or(false);
            if !gone {
                warn!(volume = %staged.volume_id, pid, "the mount process did not stop in time; killing it");
                kill(pid, libc::SIGKILL);
            }
            reap(pid);
        }
        if let Err(e) = mounts::unmount(&staged.staging) {
            warn!(staging = %staged.staging.display(), error = %e, "could not unmount the staging path");
        }
        silt_common::sys::release_holder(&dir.join(MOUNT_STATE));
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != io::ErrorKind::NotFound {
                warn!(dir = %dir.display(), error = %e, "could not remove the volume's state");
            }
        }
    }

    pub async fn unstage(&self, req: proto::NodeUnstageVolumeRequest) -> Result<(), Status> {
        require(&req.volume_id, "volume_id")?;
        require_path(&req.staging_target_path, "staging_target_path")?;
        let slot = self.slot(&req.volume_id);
        let mut guard = slot.lock().await;
        let Some(staged) = guard.clone() else {
            // Not staged (or unstaged before): nothing to do.
            return Ok(());
        };
        if staged.staging != Path::new(&req.staging_target_path) {
            return Ok(());
        }
        if let Some(t) = staged.targets.keys().next() {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!(
                    "volume {} is still published at {}",
                    req.volume_id,
                    t.display()
                ),
            ));
        }
        // The watcher sees the slot empty and does not restart the process.
        *guard = None;
        metrics::CSI_STAGED.dec();
        self.stop(&staged).await;
        info!(volume = %req.volume_id, "volume unstaged");
        Ok(())
    }

    pub async fn publish(&self, req: proto::NodePublishVolumeRequest) -> Result<(), Status> {
        require(&req.volume_id, "volume_id")?;
        require_path(&req.target_path, "target_path")?;
        let cap = check_capability(req.volume_capability.as_ref())?;
        let read_only = req.readonly || volume::reads_only(cap);
        let target = PathBuf::from(&req.target_path);
        let slot = self.slot(&req.volume_id);
        let mut guard = slot.lock().await;
        let Some(staged) = guard.as_mut() else {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!("volume {} is not staged on this node", req.volume_id),
            ));
        };
        if !req.staging_target_path.is_empty()
            && staged.staging != Path::new(&req.staging_target_path)
        {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!(
                    "volume {} is staged at {}, not {}",
                    req.volume_id,
                    staged.staging.display(),
                    req.staging_target_path
                ),
            ));
        }
        if let Some(&ro) = staged.targets.get(&target) {
            if ro == read_only && mounts::mounts_on(&target) > 0 {
                return Ok(());
            }
            if ro != read_only {
                return Err(Status::new(
                    Code::AlreadyExists,
                    format!(
                        "volume {} is published at {} {}",
                        req.volume_id,
                        target.display(),
                        if ro { "read-only" } else { "read-write" }
                    ),
                ));
            }
        } else if mounts::mounts_on(&target) > 0 {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!("something else is mounted on {}", target.display()),
            ));
        }
        // The source is looked up through the FUSE mount, which waits while its process
        // restarts: off the async threads.
        let (source, t) = (staged.source(), target.clone());
        tokio::task::spawn_blocking(move || -> Result<(), Status> {
            std::fs::create_dir_all(&t)
                .map_err(|e| Status::internal(format!("creating {}: {e}", t.display())))?;
            mounts::bind(&source, &t, read_only).map_err(|e| {
                Status::internal(format!(
                    "bind-mounting {} on {}: {e}",
                    source.display(),
                    t.display()
                ))
            })
        })
        .await
        .unwrap_or_else(|e| Err(Status::internal(e.to_string())))?;
        staged.targets.insert(target.clone(), read_only);
        metrics::CSI_PUBLISHED.inc();
        self.persist(staged)?;
        info!(volume = %req.volume_id, target = %target.display(), read_only, "volume published");
        Ok(())
    }

    pub async fn unpublish(&self, req: proto::NodeUnpublishVolumeRequest) -> Result<(), Status> {
        require(&req.volume_id, "volume_id")?;
        require_path(&req.target_path, "target_path")?;
        let target = PathBuf::from(&req.target_path);
        let slot = self.slot(&req.volume_id);
        let mut guard = slot.lock().await;
        let ours = guard
            .as_ref()
            .is_some_and(|s| s.targets.contains_key(&target));
        // Only what this plugin mounted there is unmounted; an unknown target is done.
        if ours {
            let t = target.clone();
            tokio::task::spawn_blocking(move || mounts::unmount(&t))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
                .map_err(|e| Status::internal(format!("unmounting {}: {e}", target.display())))?;
        }
        if mounts::mounts_on(&target) == 0 {
            match std::fs::remove_dir(&target) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Status::internal(format!(
                        "removing {}: {e}",
                        target.display()
                    )))
                }
            }
        }
        if let Some(s) = guard.as_mut() {
            if s.targets.remove(&target).is_some() {
                metrics::CSI_PUBLISHED.dec();
                self.persist(s)?;
                info!(volume = %req.volume_id, target = %target.display(), "volume unpublished");
            }
        }
        Ok(())
    }

    pub async fn stats(
        &self,
        req: proto::NodeGetVolumeStatsRequest,
    ) -> Result<proto::NodeGetVolumeStatsResponse, Status> {
        require(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        let path = PathBuf::from(&req.volume_path);
        let known = {
            let slot = self.slot(&req.volume_id);
            let guard = slot.lock().await;
            match &*guard {
                None => {
                    return Err(Status::not_found(format!(
                        "volume {} is not staged on this node",
                        req.volume_id
                    )))
                }
                Some(s) => s.staging == path || s.targets.contains_key(&path),
            }
        };
        if !known {
            return Err(Status::not_found(format!(
                "volume {} is not published at {}",
                req.volume_id, req.volume_path
            )));
        }
        let (bytes, inodes) = tokio::task::spawn_blocking(move || mounts::usage(&path))
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))
            .map_err(|e| Status::internal(format!("statfs of {}: {e}", req.volume_path)))?;
        let usage = |v: [u64; 3], unit| proto::VolumeUsage {
            total: v[0] as i64,
            available: v[1] as i64,
            used: v[2] as i64,
            unit,
        };
        Ok(proto::NodeGetVolumeStatsResponse {
            usage: vec![usage(bytes, 1), usage(inodes, 2)],
        })
    }
}

impl Staged {
    /// The directory a publish binds: the volume's path inside the staged mount.
    pub fn source(&self) -> PathBuf {
        self.staging.join(self.spec.path.trim_start_matches('/'))
    }
}

/// After a mount was made anew (its holder died too): the targets still hold the dead
/// connection's bind mounts, which answer `ENOTCONN`; binds them again from the new mount,
/// every one (`all`) or those that no longer answer.
fn rebind(staged: &Staged, all: bool) {
    for (target, &ro) in &staged.targets {
        if !all && mounts::answers(target) {
            continue;
        }
        let _ = mounts::unmount(target);
        match mounts::bind(&staged.source(), target, ro) {
            Ok(()) => info!(target = %target.display(), "bound again to the new mount"),
            Err(e) => warn!(target = %target.display(), error = %e, "could not bind the new mount"),
        }
    }
}

/// The volume record's file name and the mount process's state dir and log, in a volume's
/// directory.
const RECORD: &str = "volume.json";
const MOUNT_STATE: &str = "silt";
const LOG: &str = "mount.log";

fn require(value: &str, what: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid(format!("{what} is required")));
    }
    Ok(())
}

/// A path the plugin mounts on: given, and absolute.
fn require_path(value: &str, what: &str) -> Result<(), Status> {
    require(value, what)?;
    if !value.starts_with('/') {
        return Err(Status::invalid(format!(
            "{what} {value:?} is not an absolute path"
        )));
    }
    Ok(())
}

/// A mount (file system) capability is required; a block one is refused.
fn check_capability(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability, Status> {
    let cap = cap.ok_or_else(|| Status::invalid("volume_capability is required"))?;
    volume::check_capability(cap)?;
    Ok(cap)
}

/// Whether the process behind `pidfd` has exited (a pidfd polls readable then).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one valid fd without waiting.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

async fn wait_exit(pidfd: OwnedFd) -> io::Result<()> {
    // SAFETY: the AsyncFd owns the pidfd, so the fd stays open as long as it is registered.
    let fd = unsafe { AsyncFd::register(pidfd) }.map_err(|e| io::Error::other(e.to_string()))?;
    let _ = fd.readable().await?;
    Ok(())
}

/// Collects an exited child's status (nothing for a process the plugin did not start).
fn reap(pid: i32) {
    // SAFETY: waitpid on one pid, without blocking.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
    }
}

fn kill(pid: i32, signal: i32) {
    // SAFETY: plain kill(2).
    unsafe {
        libc::kill(pid, signal);
    }
}
