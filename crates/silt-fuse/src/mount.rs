//! Mounting: the kernel mount (or the one taken from its holder), the inode log a takeover
//! reads, the session threads and the invalidation thread.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use fuser::{Config as FuseConfig, INodeNo, SessionACL};
use silt_client::fs::inodes::Inodes;
use silt_client::fs::FileSystem;
use silt_client::{Change, Client};
use silt_common::sys::{is_silt_mount_of, unescape_mountinfo};
use silt_common::{Error, ErrorKind, Result};

use crate::inval::{invalidate_kernel, Inval, InvalQueue};
use crate::{takeover, FuseOptions, FuseState, Kernel, SiltFs};

/// Checks that `mountpoint` exists, is a directory and is not already a mount point.
pub fn check_mountpoint(mountpoint: &Path) -> Result<()> {
    // The kernel may answer a stat of a dead mount's root from its attribute cache; statfs
    // always asks the connection, so it tells a dead one (ENOTCONN) from a live one.
    if statfs_errno(mountpoint) == Some(libc::ENOTCONN) {
        remove_dead_silt_mount(mountpoint);
    }
    let meta = match std::fs::metadata(mountpoint) {
        Err(e)
            if e.raw_os_error() == Some(libc::ENOTCONN) && remove_dead_silt_mount(mountpoint) =>
        {
            std::fs::metadata(mountpoint)
        }
        other => other,
    }
    .map_err(|e| Error::from(e).context(format!("mountpoint {}", mountpoint.display())))?;
    if !meta.is_dir() {
        return Err(Error::new(
            ErrorKind::NotADirectory,
            format!("mountpoint {} is not a directory", mountpoint.display()),
        ));
    }
    let canon = std::fs::canonicalize(mountpoint)?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        // Field 5 is the mount point, with spaces etc. octal-escaped.
        if let Some(mp) = line.split(' ').nth(4) {
            if unescape_mountinfo(mp) == canon.to_string_lossy() {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!("mountpoint {} is busy: something is already mounted there (unmount it first)", mountpoint.display()),
                ));
            }
        }
    }
    Ok(())
}

/// The kernel starts a FUSE mount with 128 KiB of read-ahead, which caps read requests at
/// 128 KiB; raising the mount's bdi read-ahead lets sequential reads arrive as `max_read`-sized
/// requests (8× fewer round trips through the daemon). Best effort: needs root and sysfs.
fn raise_read_ahead(mountpoint: &Path, bytes: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, format!("{}", bytes / 1024)) {
        tracing::info!(path, error = %e, "could not raise FUSE read-ahead; reads stay at 128 KiB");
    }
}

/// The errno of statfs(2) on `path`, `None` if it succeeds.
fn statfs_errno(path: &Path) -> Option<i32> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a valid C string and a zeroed out-struct.
    let rc = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st)
    };
    (rc != 0).then(|| {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    })
}

/// A silt mount whose process died answers ENOTCONN; nothing can use it, so a new silt may
/// detach it. Only silt's own mounts are touched. Returns whether one was removed.
fn remove_dead_silt_mount(mountpoint: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let target = mountpoint.to_string_lossy();
    if !mounts.lines().any(|l| is_silt_mount_of(l, &target)) {
        return false;
    }
    let Ok(c) = std::ffi::CString::new(target.as_bytes()) else {
        return false;
    };
    // SAFETY: a valid C string; MNT_DETACH only detaches the dead mount.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 {
        tracing::warn!(mountpoint = %target, "removed the dead mount of an earlier silt process");
    }
    rc == 0
}

/// How a mount starts and where it keeps what a takeover needs.
pub struct MountSetup {
    /// The state dir: the holder's socket, the INIT request and the inode log live there.
    pub state_dir: std::path::PathBuf,
    /// The silt executable, run as `silt fuse-holder` to keep the connection alive; `None`
    /// mounts without a holder (the mount dies with this process).
    pub holder_exe: Option<std::path::PathBuf>,
    /// The device taken from a live holder (`takeover::take_from_holder`): serve that mount
    /// instead of mounting anew.
    pub held: Option<takeover::Held>,
}

/// A live mount. Dropping it leaves the kernel mount to its holder (see `unmount`).
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    mountpoint: std::path::PathBuf,
    state_dir: std::path::PathBuf,
    core: Arc<FileSystem>,
    /// Whether this daemon took over a mount an earlier one had served.
    pub took_over: bool,
}

impl Mounted {
    /// Unmounts, lets the holder go and waits for the session threads. If files are still
    /// open (EBUSY), the mount is detached lazily instead: it disappears from the namespace
    /// now, and the open files fail once this process exits.
    pub fn unmount(mut self) -> Result<()> {
        let Some(s) = self.session.take() else {
            return Ok(());
        };
        let c = takeover_cstr(&self.mountpoint)?;
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            takeover::release_holder(&self.state_dir);
            return s.join().map_err(|e| Error::from(e).context("FUSE session"));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            // Not a mount point any more: someone unmounted it first (`fusermount3 -u`), which
            // is what stopping wanted; the session ends with the connection.
            tracing::info!(mountpoint = %self.mountpoint.display(), "already unmounted");
            takeover::release_holder(&self.state_dir);
            return Ok(());
        }
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(Error::from(e).context("unmount"));
        }
        tracing::warn!(mountpoint = %self.mountpoint.display(), "files still open: detaching the mount lazily");
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(Error::from(std::io::Error::last_os_error()).context("lazy unmount"));
        }
        // The holder's descriptor would keep the detached mount's open files waiting for a
        // daemon that never comes.
        takeover::release_holder(&self.state_dir);
        Ok(())
    }

    /// A planned handover: commits every file open for writing and leaves the mount to the
    /// holder, for the daemon taking it over (the kernel keeps the handles; writes through
    /// them after this answer EIO).
    pub fn hand_over(mut self) -> Result<()> {
        let committed = self.core.commit_all();
        // Not joined: the threads end with the process; the holder keeps the connection.
        self.session.take();
        committed
    }

    /// Blocks until the file system is unmounted from outside (e.g. `fusermount3 -u`).
    pub fn join(mut self) -> Result<()> {
        if let Some(s) = self.session.take() {
            s.join()
                .map_err(|e| Error::from(e).context("FUSE session"))?;
        }
        Ok(())
    }

    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }
}

fn takeover_cstr(p: &Path) -> Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::invalid("mountpoint contains a NUL byte"))
}

/// The inode log in the state dir (see `inodes`).
const INODE_LOG: &str = "fuse-inodes";

/// Mounts the namespace at `mountpoint` (or serves the mount taken from its holder),
/// serving requests on background threads.
pub fn mount(
    client: Arc<Client>,
    mountpoint: &Path,
    opts: FuseOptions,
    state: Arc<FuseState>,
    setup: MountSetup,
) -> Result<Mounted> {
    let dir = setup.state_dir.clone();
    let read_only = !client.write_rules().any_writable();
    let (dev, init, generation, fresh) = match setup.held {
        Some(h) => {
            let init = takeover::load_init(&dir)?;
            (h.dev, init, h.generation, false)
        }
        None => {
            check_mountpoint(mountpoint)?;
            let dev = takeover::mount_device(mountpoint, read_only, opts.allow_other)?;
            let init = takeover::read_init(dev.as_fd()).inspect_err(|_| {
                takeover::detach(mountpoint);
            })?;
            (dev, init, 0, true)
        }
    };
    let log_path = dir.join(INODE_LOG);
    let table = if fresh {
        Inodes::new().with_log(&log_path)
    } else {
        Inodes::replay(&log_path)
    };
    let table = table.unwrap_or_else(|e| {
        tracing::warn!(
            "inode log {}: {e}; a later takeover will not know this mount's inodes",
            log_path.display()
        );
        Inodes::new()
    });
    let mut cfg = FuseConfig::default();
    if opts.allow_other {
        cfg.acl = SessionACL::All;
    }
    cfg.n_threads = Some(opts.threads.max(1));
    // One open file description for every thread, shared with the holder: requests a dead
    // daemon had read stay on the connection for `takeover::resend` (a cloned device's
    // requests are aborted when its process dies).
    cfg.clone_fd = false;
    let read_ahead = opts.max_read;
    let (changes_tx, changes_rx) = std::sync::mpsc::channel::<Inval>();
    let queue = Arc::new(InvalQueue::new(changes_tx));
    if state.invalidations.set(queue.clone()).is_err() {
        return Err(Error::invalid("this FUSE state is already mounted"));
    }
    let q = queue.clone();
    client.subscribe(Arc::new(move |c: &[Change]| q.push(c.to_vec())));
    let state_for_link = state.clone();
    let device = dev
        .try_clone()
        .inspect_err(|e| {
            tracing::warn!(
                "duplicating the FUSE device: {e}; passthrough files open across a takeover of this mount will fail to open again"
            )
        })
        .ok();
    let kernel = Arc::new(Kernel {
        state: state.clone(),
        passthrough: opts.passthrough,
        dev: device,
    });
    let core =
        Arc::new(FileSystem::new(client.clone(), opts.core(), kernel).restarted(table, generation));
    let inodes = core.inodes().clone();
    let fs = SiltFs::new(core.clone(), opts, state);
    let (session, reply) = match takeover::start_session(fs, dev.as_fd(), &init, cfg) {
        Ok(v) => v,
        Err(e) => {
            if fresh {
                takeover::detach(mountpoint);
            }
            return Err(e.context(format!("mounting FUSE at {}", mountpoint.display())));
        }
    };
    if fresh {
        // The kernel negotiated once, with the first daemon; a takeover drops its reply.
        takeover::write_device(dev.as_fd(), &reply).inspect_err(|_| {
            takeover::detach(mountpoint);
        })?;
        let held = takeover::save_init(&dir, &init).and_then(|()| match &setup.holder_exe {
            Some(exe) => takeover::spawn_holder(exe, &dir, mountpoint, dev.as_fd()),
            None => Ok(()),
        });
        if let Err(e) = held {
            tracing::warn!("no FUSE holder: {e}; the mount ends with this process");
        }
    }
    let notifier = session.notifier();
    let _ = state_for_link.notifier.set(session.notifier());
    let session = session
        .spawn()
        .map_err(|e| Error::from(e).context(format!("serving FUSE at {}", mountpoint.display())))?;
    if !fresh {
        // Requests the dead daemon had read but not answered come again (Linux >= 6.9).
        match takeover::resend(dev.as_fd()) {
            Ok(()) => tracing::info!(generation, "took over the mount; unanswered requests resent"),
            Err(e) => tracing::warn!(
                "took over the mount, but the kernel cannot resend the requests the old daemon had read ({e}; needs Linux >= 6.9): those fail or hang"
            ),
        }
    }
    drop(dev);
    // Invalidations go to the kernel from their own thread: a FUSE request handler that
    // learned of a change must not wait on the kernel locks its own request holds.
    std::thread::Builder::new()
        .name("silt-fuse-inval".into())
        .spawn(move || {
            while let Ok(work) = changes_rx.recv() {
                match work {
                    Inval::Changes(changes) => {
                        invalidate_kernel(&notifier, &inodes, &changes);
                        queue.mark_told();
                    }
                    Inval::Reread(dir) => {
                        let ino = inodes.lock().ino(&dir);
                        if let Some(ino) = ino {
                            let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
                        }
                    }
                }
            }
        })
        .map_err(|e| Error::from(e).context("starting the FUSE invalidation thread"))?;
    raise_read_ahead(mountpoint, read_ahead);
    Ok(Mounted {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        state_dir: dir,
        core,
        took_over: !fresh,
    })
}
