//! The FUSE adapter: a thin layer mapping kernel requests onto `silt-client`.
//!
//! The mount is read-write when the client's write rules make any path writable (else `ro`).
//! What it adds over the client:
//! - inode numbers (path ↔ ino, with the kernel's lookup counts),
//! - kernel caching: long entry/attr TTLs, `readdirplus` so a walk needs no per-file lookup,
//!   and `FOPEN_KEEP_CACHE` whenever the kernel's cached pages belong to the version being
//!   opened (a changed object is opened without it, which drops the stale page cache); with
//!   `fuse_cold_direct_io`, the first open of a version gets `FOPEN_DIRECT_IO` instead (a
//!   cold scan's bytes go to the reader without filling the mount's page cache),
//! - FUSE passthrough: when a file is wholly present in a local disk-tier file and the kernel
//!   supports passthrough (Linux ≥ 6.9), the open hands the kernel that file so reads bypass
//!   the daemon. Support is detected in `init`; without it every open falls back to the
//!   daemon's read path. Each open's mode is recorded for `silt report`,
//! - writes: every handle open for writing holds one of the client's `FileWriter`s, and all
//!   handles of a file share the client's write session of it (`silt_client::Session`: one
//!   buffer, live size, commit, unlink and rename rules — the adapter adds none of its own).
//!   `write` goes to it, `flush` (every `close(2)` by the opening process) and `fsync`
//!   commit, `release` closes (the last close commits), so `close` reports a failed upload.
//!   Lookups, `getattr` and listings answer from the client's live view (`stat_live`,
//!   `list_live`), and a reader of a file open for writing here reads the session's bytes.
//!   `unlink`, `mkdir`, `rmdir` and `rename` call the client and keep the inode table in
//!   step (a renamed path and everything below it keep their numbers).
//! - `setattr` of a size truncates (through the handle's session, or `Client::truncate_path`
//!   for `truncate(2)`); mode, owner and times go to `Client::set_attrs` (POSIX rules, kept
//!   by the store). Created files and directories get the caller's uid/gid and mode.
//!
//! Errors beside the client's: a name over 255 bytes is `ENAMETOOLONG`; `RENAME_EXCHANGE` is
//! `EINVAL`; `RENAME_NOREPLACE` onto an existing name is `EEXIST`.

mod inodes;
pub mod takeover;

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackingId, BsdFileFlags, Config as FuseConfig, Errno, FileAttr, FileHandle, FileType,
    FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, OpenAccMode, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL,
    TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use silt_client::{Change, ChangeKind, Client, Entry, FileWriter, OpenFile, OpenOptions};
use silt_common::config::PassthroughMode;
use silt_common::metrics::FuseOp;
use silt_common::sys::{is_silt_mount_of, unescape_mountinfo};
use silt_common::{metrics, Error, ErrorKind, ObjectId, Result};
use silt_ufs::{EntryKind, SpecialKind};

use inodes::{HandleMode, Inodes};

/// Mount options of the adapter (from `Config`).
#[derive(Debug, Clone)]
pub struct FuseOptions {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub threads: usize,
    pub max_read: u64,
    /// The first open of each version bypasses the kernel's page cache (`fuse_cold_direct_io`).
    pub cold_direct_io: bool,
    /// A read open of a file of at most this many bytes not yet whole on local disk fetches
    /// it whole first, then opens it in passthrough (`fuse_open_fill_max`; 0: never).
    pub open_fill_max: u64,
    /// A read open of a file not whole on local disk, from a store whose objects are files
    /// this host can open (`file://`), hands the kernel the store's own file and fills the
    /// cache behind the reader (`fuse_source_passthrough`).
    pub source_passthrough: bool,
    /// Answer getxattr and listxattr with the files' S3 headers (`fuse_xattrs`).
    pub xattrs: bool,
    pub passthrough: PassthroughMode,
    pub allow_other: bool,
}

/// How one open was served.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpenRecord {
    pub path: String,
    pub mode: &'static str,
    pub reason: &'static str,
}

/// What the adapter reports (shared with the control server).
#[derive(Default)]
pub struct FuseState {
    /// Whether the kernel offered passthrough in FUSE_INIT.
    pub kernel_passthrough: AtomicBool,
    /// Whether passthrough is in use (offered and not disabled).
    pub passthrough_enabled: AtomicBool,
    /// Whether first opens bypass the page cache (asked for, and the kernel lets such files
    /// be mapped shared: `FUSE_DIRECT_IO_ALLOW_MMAP`).
    pub cold_direct_io: AtomicBool,
    pub recent_opens: Mutex<VecDeque<OpenRecord>>,
    /// Kernel invalidations queued for the invalidation thread (set when mounted).
    invalidations: std::sync::OnceLock<Arc<InvalQueue>>,
    /// The kernel's notification channel (set when mounted), for the one invalidation a
    /// handler sends itself: attributes only, which takes no lock a request could hold.
    notifier: std::sync::OnceLock<fuser::Notifier>,
}

const RECENT_OPENS: usize = 32;

/// Work for the invalidation thread.
enum Inval {
    /// Changes Silt learned; counted, so callers can wait for them (`InvalQueue::wait`).
    Changes(Vec<Change>),
    /// A directory whose readdir cache must be dropped; not waited for.
    Reread(String),
}

/// Longest an open or a control command waits for queued kernel invalidations; past it the
/// reply goes out anyway (logged), so a stuck kernel never hangs the mount.
const INVAL_WAIT: Duration = Duration::from_secs(5);

/// Changes waiting to be told to the kernel, in order, with counts of batches queued and told,
/// so a caller can wait until everything learned before it has reached the kernel.
///
/// A batch is counted before it is sent. So when a caller reads `queued` after sending its own
/// batch, every batch ahead of its own in the (FIFO) channel is counted too, and `told` can
/// reach that count only once its own batch has been told.
struct InvalQueue {
    tx: std::sync::mpsc::Sender<Inval>,
    queued: AtomicU64,
    told: AtomicU64,
    lock: Mutex<()>,
    cond: parking_lot::Condvar,
}

impl InvalQueue {
    fn new(tx: std::sync::mpsc::Sender<Inval>) -> Self {
        InvalQueue {
            tx,
            queued: AtomicU64::new(0),
            told: AtomicU64::new(0),
            lock: Mutex::new(()),
            cond: parking_lot::Condvar::new(),
        }
    }

    fn push(&self, changes: Vec<Change>) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(Inval::Changes(changes)).is_err() {
            // Unmounted: nothing will tell it, nobody must wait for it.
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Has the kernel read directory `path` again, without anyone waiting for it (nothing
    /// Silt learned depends on it: see `forget`).
    fn push_reread(&self, path: String) {
        let _ = self.tx.send(Inval::Reread(path));
    }

    fn mark_told(&self) {
        self.told.fetch_add(1, Ordering::SeqCst);
        let _g = self.lock.lock();
        self.cond.notify_all();
    }

    /// Waits until every batch queued before this call has been told to the kernel. Without
    /// pending batches (nearly always, on every open) it takes no lock.
    fn wait(&self) {
        let target = self.queued.load(Ordering::SeqCst);
        if self.told.load(Ordering::SeqCst) >= target {
            return;
        }
        let deadline = std::time::Instant::now() + INVAL_WAIT;
        let mut g = self.lock.lock();
        while self.told.load(Ordering::SeqCst) < target {
            if self.cond.wait_until(&mut g, deadline).timed_out() {
                tracing::warn!("kernel cache invalidations are slow: replying without them");
                return;
            }
        }
    }
}

impl FuseState {
    /// Returns once every change Silt learned so far has been told to the kernel (so a
    /// `silt fs sync` that returns has cleared the kernel's caches too).
    pub fn wait_for_invalidations(&self) {
        if let Some(q) = self.invalidations.get() {
            q.wait();
        }
    }

    fn record(&self, path: &str, mode: &'static str, reason: &'static str) {
        let mut r = self.recent_opens.lock();
        if r.len() == RECENT_OPENS {
            r.pop_front();
        }
        r.push_back(OpenRecord {
            path: path.to_string(),
            mode,
            reason,
        });
    }
}

struct Handle {
    /// The version this handle reads (`None`: a file not in the store yet, see `live`);
    /// replaced when the file was rewritten through this client since (see `current_file`).
    file: Mutex<(Option<Arc<OpenFile>>, u64)>,
    /// The write session of the file when this handle opened it, or when the file was
    /// unlinked or renamed over while open for writing (`hand_session_to_readers`): read once
    /// the file has no name (its bytes outlive an unlink, as an open file does).
    live: Mutex<Option<Arc<silt_client::Session>>>,
    path: String,
    ino: u64,
    /// Keeps the object's disk pages from eviction while the kernel reads the backing file
    /// (a local pin, or a same-host worker's pin held over its socket).
    _pin: Option<Box<dyn Send + Sync>>,
    passthrough: bool,
}

/// A file open for writing (or reading and writing): the client's handle on the file's
/// write session.
struct WriteHandle {
    ino: u64,
    /// The process that opened the file (see `flush`), if known.
    opener: Option<u32>,
    writer: FileWriter,
}

/// The credentials of a request: its uid and gid, and the supplementary groups of its
/// process (from `/proc`; none if it is gone).
fn caller(req: &Request) -> silt_client::attrs::Caller {
    let groups = proc_status(req.pid(), "Groups:")
        .map(|g| {
            g.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    silt_client::attrs::Caller {
        uid: req.uid(),
        gid: req.gid(),
        groups,
    }
}

/// What a file or directory created by `req` gets: `mode` (the kernel applied the umask)
/// and the caller's owner and group where they differ from Silt's own (which a new local
/// file has already, and which an entry without stored owner reports).
fn new_attrs(req: &Request, mode: u32) -> silt_ufs::SetAttrs {
    let (uid, gid) = silt_client::attrs::default_owner();
    silt_ufs::SetAttrs {
        mode: Some(mode & 0o7777),
        uid: (req.uid() != uid).then_some(req.uid()),
        gid: (req.gid() != gid).then_some(req.gid()),
        ..Default::default()
    }
}

/// The process (thread group) of thread `pid`, from `/proc`; `None` if it cannot be read.
fn process_of(pid: u32) -> Option<u32> {
    proc_status(pid, "Tgid:").and_then(|v| v.trim().parse().ok())
}

/// The value of line `key` (e.g. `"Tgid:"`) of `/proc/PID/status`; `None` if it cannot be read.
fn proc_status(pid: u32, key: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::to_string)
}

/// How long an open the kernel would refuse next to a passthrough handle waits for that handle
/// to be released (see `open_cached_waiting`); past it, `EBUSY`.
const PASSTHROUGH_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Longest name of one path component.
const NAME_MAX: usize = 255;

/// A passthrough open: the backing, the guard keeping its bytes in place, where it came from.
type Passthrough = (u32, Box<dyn Send + Sync>, &'static str);

/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)` (include/uapi/linux/fuse.h).
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = 0x4004_E502;

/// Closes backing `id` on the connection of the device `dev`.
fn close_raw_backing(dev: &OwnedFd, id: u32) {
    // SAFETY: an ioctl on an open descriptor with a pointer to a live u32.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_BACKING_CLOSE, &id) };
    if rc != 0 {
        tracing::debug!(
            id,
            error = %std::io::Error::last_os_error(),
            "closing a passthrough backing"
        );
    }
}

/// One backing file registered with the kernel, shared by every passthrough handle of an inode.
/// Its kernel id lives in the inode log until the last handle is released, when it is
/// closed: never by a daemon's exit, so a daemon taking over the mount goes on with it.
struct Backing {
    /// What the inode log keeps of it (kernel id, object, whether a handle needs a pin of its
    /// own, whether it is the store's file).
    kernel: inodes::LoggedBacking,
    handles: usize,
}

/// Where a passthrough handle reading the store's own file got it (see `source_passthrough`).
const FROM_SOURCE: &str = "the store's own file (the cache filled behind)";

/// How each open inode is open, as the kernel's FUSE io modes require (Linux `iomode.c`): an
/// inode with a passthrough backing accepts only passthrough opens, and a passthrough open of
/// an inode with handles open through the page cache fails. Both answer the user's open()
/// with EIO, so the choice is made under one lock from this record.
#[derive(Default)]
struct IoModes {
    backings: HashMap<u64, Backing>,
    /// Handles open through the daemon (kernel page cache), per inode.
    cached: HashMap<u64, usize>,
}

/// Counts one more handle on the inode's backing and returns it, with where it came from, if
/// there is one for this version that the new handle may use: a lent copy, the store's own
/// file, or a local file this open has pinned.
/// `Err` when a backing exists that it may not use (another version, or a local file it could
/// not pin), so the open goes through the daemon.
fn share(
    io: &mut IoModes,
    ino: u64,
    object: ObjectId,
    pinned_locally: bool,
) -> std::result::Result<Option<(u32, &'static str)>, &'static str> {
    if io.cached.get(&ino).is_some_and(|n| *n > 0) {
        return Err("file open through the daemon by another handle");
    }
    let Some(b) = io.backings.get_mut(&ino) else {
        return Ok(None);
    };
    if b.kernel.object != object {
        // Another version is still open through passthrough; serve this one via the daemon.
        return Err("older version of the file still open");
    }
    if !(b.kernel.lent || pinned_locally) {
        return Err("not fully cached on local disk");
    }
    b.handles += 1;
    let origin = if b.kernel.source {
        FROM_SOURCE
    } else {
        "shared with an open handle"
    };
    Ok(Some((b.kernel.id, origin)))
}

/// One of `SiltFs::filling`'s slots, given back when dropped.
struct FillSlot<'a>(&'a AtomicUsize);

impl Drop for FillSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub struct SiltFs {
    client: Arc<Client>,
    opts: FuseOptions,
    state: Arc<FuseState>,
    inodes: Arc<Mutex<Inodes>>,
    handles: Mutex<HashMap<u64, Handle>>,
    /// Handles open for writing, by fh (numbered with the read handles).
    writers: Arc<Mutex<HashMap<u64, Arc<WriteHandle>>>>,
    io: Mutex<IoModes>,
    /// Signalled when an inode's last passthrough handle is released (a write open waits).
    io_released: parking_lot::Condvar,
    /// The version whose pages the kernel may hold in its page cache, per inode.
    kernel_cached: Mutex<HashMap<u64, ObjectId>>,
    next_fh: AtomicU64,
    /// Opens fetching their file whole right now (`open_fill_max`): at most half the FUSE
    /// threads, so the others stay free for everything else.
    filling: AtomicUsize,
    /// Versions the cache is being filled with behind a reader of the store's own file
    /// (`source_passthrough`), at most `threads` at once.
    filling_behind: Arc<BehindSlots>,
    /// The mount's FUSE device (a duplicate), to register passthrough backings whose kernel
    /// ids go into the inode log, and to close inherited ones.
    dev: Option<OwnedFd>,
    /// Handles an earlier daemon opened through the daemon and this one has not reopened
    /// (see `reopen_old_handle`): counted in `io.cached` from the start, since the kernel
    /// has their inodes open through its page cache. fh -> inode.
    inherited_daemon_handles: Mutex<HashMap<u64, u64>>,
    /// The first handle number of this daemon: smaller ones were handed to the kernel by a
    /// daemon before a takeover (see `reopen_old_handle`).
    fh_base: u64,
    started: SystemTime,
}

/// The versions being filled behind readers of the store's own file (`fill_behind`): each
/// version once at a time, at most a given number at once.
#[derive(Default)]
struct BehindSlots(Mutex<HashSet<ObjectId>>);

impl BehindSlots {
    /// A slot to fill `object`, held until dropped; `None` if it is being filled already or
    /// `max` (at least one) versions are.
    fn take(self: &Arc<Self>, object: ObjectId, max: usize) -> Option<BehindSlot> {
        let mut busy = self.0.lock();
        if busy.len() >= max.max(1) || !busy.insert(object) {
            return None;
        }
        Some(BehindSlot {
            slots: self.clone(),
            object,
        })
    }
}

/// A version's fill slot; dropping it (the fill ended, or its task was dropped) frees it.
struct BehindSlot {
    slots: Arc<BehindSlots>,
    object: ObjectId,
}

impl Drop for BehindSlot {
    fn drop(&mut self) {
        self.slots.0.lock().remove(&self.object);
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

impl SiltFs {
    pub fn new(client: Arc<Client>, opts: FuseOptions, state: Arc<FuseState>) -> Self {
        SiltFs {
            client,
            opts,
            state,
            inodes: Arc::new(Mutex::new(Inodes::new())),
            handles: Mutex::new(HashMap::new()),
            writers: Arc::new(Mutex::new(HashMap::new())),
            io: Mutex::new(IoModes::default()),
            io_released: parking_lot::Condvar::new(),
            kernel_cached: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            filling: AtomicUsize::new(0),
            filling_behind: Arc::new(BehindSlots::default()),
            dev: None,
            inherited_daemon_handles: Mutex::new(HashMap::new()),
            fh_base: 1,
            started: SystemTime::now(),
        }
    }

    /// This daemon took over a mount: the inode table from the log, handle numbers above
    /// every earlier daemon's (the takeover `generation` in the high bits).
    fn restarted(mut self, inodes: Inodes, generation: u64) -> Self {
        let inherited = inodes.passthrough_state();
        let daemon_handles = inodes.daemon_handles();
        self.inodes = Arc::new(Mutex::new(inodes));
        self.fh_base = (generation << 40).max(1);
        self.next_fh = AtomicU64::new(self.fh_base);
        for (ino, b, fhs) in inherited {
            self.adopt_backing(ino, b, &fhs);
        }
        {
            let mut io = self.io.lock();
            for &(_, ino) in &daemon_handles {
                *io.cached.entry(ino).or_insert(0) += 1;
            }
        }
        *self.inherited_daemon_handles.lock() = daemon_handles.into_iter().collect();
        self
    }

    /// The mount's FUSE device (see `dev`).
    fn with_device(mut self, dev: OwnedFd) -> Self {
        self.dev = Some(dev);
        self
    }

    /// Takes over a passthrough backing an earlier daemon left open on inode `ino`, with its
    /// handles `fhs`: the kernel goes on reading that file for them and refuses another
    /// backing for the inode, so later opens of the same version share it, the file's cache
    /// pages stay pinned while a handle lives (an evicted page is a hole, read as zeros), and
    /// the last release closes it. A backing no handle holds any more is closed now.
    fn adopt_backing(&self, ino: u64, b: inodes::LoggedBacking, fhs: &[u64]) {
        if fhs.is_empty() {
            if let Some(dev) = &self.dev {
                close_raw_backing(dev, b.id);
            }
            self.inodes.lock().backing(ino, None);
            return;
        }
        let path = self.inodes.lock().path(ino).unwrap_or_default();
        let mut handles = self.handles.lock();
        for &fh in fhs {
            let pin: Option<Box<dyn Send + Sync>> = (!b.lent)
                .then(|| Box::new(self.client.keep_cached(b.object)) as Box<dyn Send + Sync>);
            metrics::FUSE_HANDLES.inc();
            handles.insert(
                fh,
                Handle {
                    file: Mutex::new((None, 0)),
                    live: Mutex::new(None),
                    path: path.clone(),
                    ino,
                    _pin: pin,
                    passthrough: true,
                },
            );
        }
        self.io.lock().backings.insert(
            ino,
            Backing {
                kernel: b,
                handles: fhs.len(),
            },
        );
    }

    /// Registers `file` with the kernel as a passthrough backing; its kernel id.
    fn register_backing(&self, file: &std::fs::File) -> std::io::Result<u32> {
        let dev = self
            .dev
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the mount's FUSE device is not at hand"))?;
        BackingId::create_raw(dev, file)
    }

    /// Inserts `ino`'s backing `kernel` with its first handle (under `io`'s lock), logged
    /// before any open uses it.
    fn insert_backing(&self, io: &mut IoModes, ino: u64, kernel: inodes::LoggedBacking) {
        self.inodes.lock().backing(ino, Some(kernel));
        io.backings.insert(ino, Backing { kernel, handles: 1 });
    }

    /// A read handle an earlier daemon opened (the kernel keeps its handles across a
    /// takeover): opened again by its inode's path, under the same number. It reads the
    /// file's current version.
    #[allow(clippy::type_complexity)]
    fn reopen_old_handle(
        &self,
        fh: u64,
        ino: u64,
    ) -> std::result::Result<
        (
            Option<Arc<silt_client::Session>>,
            String,
            (Option<Arc<OpenFile>>, u64),
        ),
        Errno,
    > {
        if fh >= self.fh_base {
            return Err(Errno::EBADF);
        }
        let path = self.path_of(INodeNo(ino))?;
        let session = self.client.session(&path);
        let file = match self.block(self.client.open(&path)) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) if session.is_some() && e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(errno(&e)),
        };
        // A handle the log has was counted at the takeover; the count goes to this handle.
        let inherited = self.inherited_daemon_handles.lock().remove(&fh).is_some();
        let counted = inherited || self.open_cached(ino);
        let commits = self.client.commit_count();
        let mut hs = self.handles.lock();
        match hs.entry(fh) {
            std::collections::hash_map::Entry::Occupied(_) => {
                // Another read reopened it first.
                if counted {
                    self.release_cached(ino);
                }
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                metrics::FUSE_HANDLES.inc();
                v.insert(Handle {
                    file: Mutex::new((file, commits)),
                    live: Mutex::new(session),
                    path,
                    ino,
                    _pin: None,
                    passthrough: false,
                });
            }
        }
        let h = hs.get(&fh).ok_or(Errno::EBADF)?;
        let pinned = h.file.lock().clone();
        let live = h.live.lock().clone();
        Ok((live, h.path.clone(), pinned))
    }

    /// A handle an earlier daemon opened for writing: what it had not committed died with it,
    /// so flush and fsync answer EIO (close(2) reports the loss).
    fn lost_writer(&self, fh: u64) -> bool {
        fh < self.fh_base && self.inodes.lock().is_write_handle(fh)
    }

    fn block<T>(&self, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        self.client.runtime().block_on(f)
    }

    /// The `user.s3.*` attributes of the file `ino` (none for a directory).
    fn s3_xattrs(&self, ino: INodeNo) -> std::result::Result<Vec<(String, String)>, Errno> {
        let path = self.path_of(ino)?;
        let h = self
            .block(async {
                let e = self.client.stat(&path).await?;
                self.client.headers(&e).await
            })
            .map_err(|e| errno(&e))?;
        Ok(silt_ufs::xattrs::of(&h))
    }

    fn path_of(&self, ino: INodeNo) -> std::result::Result<String, Errno> {
        self.inodes.lock().path(ino.0).ok_or(Errno::ESTALE)
    }

    fn child_path(&self, parent: INodeNo, name: &OsStr) -> std::result::Result<String, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let name = name.to_str().ok_or(Errno::ENOENT)?;
        let dir = self.path_of(parent)?;
        Ok(silt_client::namespace::join(&dir, name))
    }

    /// The path of a name about to be made (create, mkdir, symlink, a rename's target): one
    /// that is not UTF-8 is `EINVAL` (store paths and keys are UTF-8; such a name can be
    /// neither looked up nor made, but saying `ENOENT` to a create reads as a missing parent).
    fn new_child_path(&self, parent: INodeNo, name: &OsStr) -> std::result::Result<String, Errno> {
        if name.len() <= NAME_MAX && name.to_str().is_none() {
            return Err(Errno::EINVAL);
        }
        self.child_path(parent, name)
    }

    fn attr(&self, ino: u64, e: &Entry) -> FileAttr {
        let is_dir = e.kind == EntryKind::Dir;
        let mtime = if is_dir {
            self.dir_mtime(&e.path, e.mtime)
        } else {
            e.mtime.unwrap_or(self.started)
        };
        let (uid, gid, mode) = silt_client::attrs::owner_and_mode(e);
        // Write bits only where writes are allowed (a directory: where something at or below
        // it may be written, so the kernel lets a create reach a writable prefix).
        let perm = if e.kind == EntryKind::Symlink {
            // A link's own bits mean nothing (Linux shows 0777); access is its target's.
            mode as u16
        } else if self.writable_attr(&e.path, is_dir) {
            mode as u16
        } else {
            (mode & !0o222) as u16
        };
        // ctime: the store's (a local file's, S3's x-amz-meta-ctime), never before the mtime
        // (a directory's moves with its entries).
        let ctime = e.posix.ctime.map_or(mtime, |c| c.max(mtime));
        FileAttr {
            ino: INodeNo(ino),
            size: e.size,
            blocks: e.size.div_ceil(512),
            atime: e.posix.atime.unwrap_or(mtime),
            mtime,
            ctime,
            crtime: mtime,
            kind: file_type(e.kind),
            perm,
            // A directory: its "." and its parent's entry, plus each subdirectory's "..",
            // while its listing is known; else 1, the convention for "not counted" (so
            // tools never rely on the count to skip subdirectories).
            nlink: match (is_dir, is_dir.then(|| self.client.cached_subdirs(&e.path))) {
                (true, Some(Some(n))) => 2 + n.min(u32::MAX as u64 - 2) as u32,
                (true, _) => 1,
                (false, _) => e.posix.nlink.unwrap_or(1).max(1),
            },
            uid,
            gid,
            rdev: e.posix.rdev,
            // stdio and cp size their buffers from st_blksize: one cache page per read.
            blksize: self.client.page_size().min(u32::MAX as u64) as u32,
            flags: 0,
        }
    }

    /// Kernel attribute and entry TTLs for `e`: never longer than its sync policy still
    /// trusts what Silt knows of it (`Client::kernel_ttl`).
    fn ttls(&self, e: &Entry) -> (Duration, Duration) {
        if e.posix.linked() {
            // Another name of the file may change it: the kernel asks every time.
            return (
                Duration::ZERO,
                self.opts
                    .entry_ttl
                    .min(self.client.kernel_ttl(&e.path, Duration::MAX, false)),
            );
        }
        let cap = self.client.kernel_ttl(&e.path, Duration::MAX, e.is_dir());
        (self.opts.attr_ttl.min(cap), self.opts.entry_ttl.min(cap))
    }

    fn stat_path(&self, path: &str) -> Result<Entry> {
        self.block(self.client.stat(path))
    }

    /// `stat_path`, with `None` for "no such file".
    fn stat_opt(&self, path: &str) -> Result<Option<Entry>> {
        match self.stat_path(path) {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether `path` shows write permission (see `attr`).
    fn writable_attr(&self, path: &str, is_dir: bool) -> bool {
        let rules = self.client.write_rules();
        if !rules.any_writable() {
            return false;
        }
        if is_dir {
            rules.writable_at_or_below(path)
        } else {
            rules.of(path).writable()
        }
    }

    fn write_handle(&self, fh: u64) -> Option<Arc<WriteHandle>> {
        self.writers.lock().get(&fh).cloned()
    }

    /// `stat` as the file's writers see it (`Client::stat_live`).
    fn stat_live(&self, path: &str) -> Result<(Entry, bool)> {
        self.block(self.client.stat_live(path))
    }

    /// Attribute and entry TTLs of `e` as `stat_live` answered it.
    fn live_ttls(&self, e: &Entry, live: bool) -> (Duration, Duration) {
        let (attr, entry) = self.ttls(e);
        if live {
            (Duration::ZERO, entry)
        } else {
            (attr, entry)
        }
    }

    /// Commits the handle's file (flush, fsync); a listing the kernel read while the file was
    /// being written may lack it.
    fn commit_handle(&self, h: &WriteHandle) -> Result<()> {
        if !h.writer.is_dirty() {
            return Ok(());
        }
        self.block(self.client.commit(&h.writer))?;
        self.reread_parent(&h.writer.path());
        Ok(())
    }

    /// The version a read handle reads now: the one it opened, unless the file was committed
    /// through this client since and its current version is another (a process reading a
    /// file it rewrote through another descriptor reads the new bytes, as POSIX has it).
    fn current_file(
        &self,
        fh: u64,
        attached: Option<&str>,
        opened_as: &str,
        (file, seen): (Option<Arc<OpenFile>>, u64),
    ) -> Result<Arc<OpenFile>> {
        let commits = self.client.commit_count();
        // Renamed since (the inode follows its name): the version is read at its new path,
        // even with no commit since, or a store asked at the old path finds nothing there.
        let moved = |f: &OpenFile| attached.is_some_and(|p| p != f.entry.path);
        if let (Some(f), true) = (&file, seen == commits) {
            if !moved(f) {
                return Ok(f.clone());
            }
        }
        // Unlinked or replaced by a rename: the handle keeps the version it has (POSIX: the
        // open file, not whatever the name holds now).
        let Some(path) = attached else {
            return file.ok_or_else(|| Error::not_found(format!("{opened_as}: no such file")));
        };
        let current = self.stat_opt(path)?;
        let newer = match (&current, &file) {
            (Some(e), Some(f)) => {
                e.object.as_ref().map(|o| o.id) != Some(f.object().id) || moved(f)
            }
            (Some(_), None) => true,
            (None, _) => false,
        };
        let file = match (newer, file) {
            (true, _) => Arc::new(self.block(self.client.open(path))?),
            (false, Some(f)) => f,
            (false, None) => return Err(Error::not_found(format!("{path}: no such file"))),
        };
        if let Some(h) = self.handles.lock().get(&fh) {
            *h.file.lock() = (Some(file.clone()), commits);
        }
        Ok(file)
    }

    /// Has the kernel read `path`'s parent directory again.
    fn reread_parent(&self, path: &str) {
        if let (Some((parent, _)), Some(queue)) = (
            silt_client::namespace::parent_and_name(path),
            self.state.invalidations.get(),
        ) {
            queue.push_reread(parent.to_string());
        }
    }

    /// Opens `path` (inode `ino`) for writing through the client and registers the handle
    /// (an open through the daemon as far as the kernel's io modes go).
    fn open_writer(&self, req: &Request, ino: u64, path: &str, opts: OpenOptions) -> Result<u64> {
        // Also when refused below: the next readers go through the daemon, so a writer
        // trying again finds no passthrough reader.
        self.inodes.lock().mark_written(ino);
        if !self.open_cached_waiting(ino) {
            // Open in passthrough: the kernel would refuse a daemon open with EIO.
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{path}: open for reading in passthrough mode"),
            ));
        }
        let writer = match self.block(self.client.open_write(path, opts)) {
            Ok(w) => w,
            Err(e) => {
                self.release_cached(ino);
                return Err(e);
            }
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let h = WriteHandle {
            ino,
            opener: process_of(req.pid()),
            writer,
        };
        metrics::FUSE_HANDLES.inc();
        self.writers.lock().insert(fh, Arc::new(h));
        {
            let mut inodes = self.inodes.lock();
            inodes.write_handle(fh, true);
            inodes.handle(fh, Some((ino, HandleMode::Daemon)));
        }
        // The kernel's pages of this inode are not a stored version any more.
        self.kernel_cached.lock().remove(&ino);
        Ok(fh)
    }

    /// Opens `ino` for writing (`open` with `O_WRONLY`/`O_RDWR`, or `O_TRUNC`).
    fn open_write(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if !self.client.write_type_of(&path).writable() {
            return reply.error(Errno::EROFS);
        }
        let opts = OpenOptions {
            truncate: flags.0 & libc::O_TRUNC != 0,
            append: flags.0 & libc::O_APPEND != 0,
            ..Default::default()
        };
        match self.open_writer(req, ino.0, &path, opts) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `setattr` of the size: through the handle's session if it is open for writing, else
    /// `truncate(2)` of the path (which joins the file's session if another handle has one).
    /// The attributes of a file unlinked (or renamed over) while open for writing: its
    /// handles' size (the temp-file pattern: open, unlink, write, fstat or ftruncate; the
    /// kernel may send these without the handle). `None` for any other file.
    fn detached_attr(&self, ino: INodeNo, fh: Option<FileHandle>, path: &str) -> Option<FileAttr> {
        let h = fh
            .and_then(|fh| self.write_handle(fh.0))
            .filter(|h| h.ino == ino.0)
            .or_else(|| {
                self.writers
                    .lock()
                    .values()
                    .find(|h| h.ino == ino.0)
                    .cloned()
            })
            .filter(|h| h.writer.is_detached())?;
        let e = Entry {
            path: path.to_string(),
            kind: EntryKind::File,
            size: h.writer.len(),
            mtime: None,
            mode: None,
            posix: Default::default(),
            object: None,
        };
        Some(self.attr(ino.0, &e))
    }

    /// The attributes of a file unlinked (or replaced by a rename) whose read handle holds a
    /// write session (opened during it, or handed it at the unlink): that handle reads the
    /// session (see `read`), so its size is the session's (`Client::session_entry`), not that of a
    /// stored version it may have opened too (a read past that size would end early). The
    /// handle `fh`, else any read handle of the inode holding a session. `None` otherwise (a
    /// file still open for writing: `detached_attr`, its writers' size, comes first).
    fn detached_read_attr(&self, ino: INodeNo, fh: Option<FileHandle>) -> Option<FileAttr> {
        if self.inodes.lock().attached_path(ino.0).is_some() {
            return None;
        }
        let session = {
            let handles = self.handles.lock();
            fh.and_then(|fh| handles.get(&fh.0))
                .filter(|h| h.ino == ino.0 && h.live.lock().is_some())
                .or_else(|| {
                    handles
                        .values()
                        .find(|h| h.ino == ino.0 && h.live.lock().is_some())
                })
                .and_then(|h| h.live.lock().clone())
        }?;
        let e = self.block(self.client.session_entry(&session)).ok()?;
        Some(self.attr(ino.0, &e))
    }

    /// Just before `path` stops naming its file (unlink, renamed over): the read handles of
    /// its inode keep what the name holds now (POSIX: the open file), not what they opened or
    /// last read. Its write session if one is open, returned with the inode, to hand them
    /// once the client has detached it (`hand_session_to_readers`); else each handle moves
    /// to the newest version (`current_file`) and drops a session it held from an earlier
    /// writer (committed since, maybe changed after).
    fn readers_before_detach(&self, path: &str) -> Option<(u64, Arc<silt_client::Session>)> {
        let ino = self.inodes.lock().ino(path)?;
        if let Some(session) = self.client.session(path) {
            return Some((ino, session));
        }
        let readers: Vec<_> = self
            .handles
            .lock()
            .iter()
            .filter(|(_, h)| h.ino == ino)
            .map(|(fh, h)| (*fh, h.path.clone(), h.file.lock().clone()))
            .collect();
        for (fh, opened_as, pinned) in readers {
            // On failure the handle stays as it was; its reads report what they find.
            if self
                .current_file(fh, Some(path), &opened_as, pinned)
                .is_ok()
            {
                if let Some(h) = self.handles.lock().get(&fh) {
                    *h.live.lock() = None;
                }
            }
        }
        None
    }

    /// A file unlinked or renamed over while open for writing here: every read handle of its
    /// inode reads that session from now on (see `read`), the file's bytes as its writers
    /// left them (POSIX: the open file), not a stored version or an older session it opened.
    fn hand_session_to_readers(&self, taken: Option<(u64, Arc<silt_client::Session>)>) {
        let Some((ino, session)) = taken else {
            return;
        };
        for h in self.handles.lock().values().filter(|h| h.ino == ino) {
            *h.live.lock() = Some(session.clone());
        }
    }

    fn truncate(&self, ino: u64, path: &str, fh: Option<FileHandle>, size: u64) -> Result<()> {
        if let Some(h) = fh.and_then(|fh| self.write_handle(fh.0)) {
            return self.block(self.client.truncate(&h.writer, size));
        }
        if !self.client.write_type_of(path).writable() {
            return self.block(self.client.truncate_path(path, size));
        }
        // A reader in passthrough reads the cached copy, which a truncate would not cut: as
        // an open for writing, it waits for such readers (and keeps new ones out meanwhile).
        self.inodes.lock().mark_written(ino);
        if !self.open_cached_waiting(ino) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{path}: open for reading in passthrough mode"),
            ));
        }
        let r = self.block(self.client.truncate_path(path, size));
        self.release_cached(ino);
        r
    }

    /// The listing readdir serves from `offset`: a pass through a directory starts at offset 0
    /// with a listing its sync policy trusts; later calls of the same pass continue in the
    /// listing the pass began with (offsets stay stable across the calls of a large directory
    /// unless the directory changed in between).
    fn dir_listing(
        &self,
        ino: INodeNo,
        offset: u64,
    ) -> std::result::Result<Arc<Vec<Entry>>, Errno> {
        let path = self.path_of(ino)?;
        let list = if offset == 0 {
            self.block(self.client.list_live(&path))
        } else {
            self.block(self.client.listing_continued(&path))
        };
        list.map_err(|e| errno(&e))
    }

    /// A directory's mtime tells the kernel whether the listing in its readdir cache is still
    /// current (the kernel drops the cache when the mtime it gets differs from the one it saw
    /// when filling it). The seconds are the directory's own (the store's, moved by changes
    /// through this client; the mount's start for an S3 prefix, which has none); the
    /// nanoseconds carry the cached listing's digest while the policy trusts it (equal exactly
    /// while the names and kinds are), else a value that changes with every answer, so the
    /// kernel asks readdir again, which revalidates the listing.
    fn dir_mtime(&self, path: &str, mtime: Option<SystemTime>) -> SystemTime {
        let base = mtime.unwrap_or(self.started);
        let secs = base.duration_since(UNIX_EPOCH).map_or(0, |t| t.as_secs());
        let nanos = match self.client.listing_digest(path) {
            Some(d) => (d % 1_000_000_000) as u32,
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |t| t.subsec_nanos()),
        };
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    /// Opens the backing file for passthrough if the whole object is on local disk, or lent
    /// by a worker on this host. Returns the backing, the guard that keeps the file's bytes
    /// in place while the handle lives, and where the file came from.
    fn try_passthrough(
        &self,
        ino: u64,
        file: &OpenFile,
    ) -> std::result::Result<Passthrough, &'static str> {
        if !self.state.passthrough_enabled.load(Ordering::Relaxed) {
            return Err(if self.opts.passthrough == PassthroughMode::Off {
                "passthrough disabled by configuration"
            } else {
                "kernel does not support passthrough"
            });
        }
        if self.client.write_type_of(&file.entry.path).writable()
            && self.inodes.lock().was_written(ino)
        {
            // The kernel refuses a daemon open of an inode with a passthrough backing, so a
            // writer must wait for every passthrough reader to close (`open_writer`): a file
            // written here (a checkpoint) is likely written again, a dataset file is not.
            return Err("written through this mount: read through the daemon");
        }
        let obj = file.object();
        let silt_client::LocalFile {
            file: local,
            guard: local_guard,
        } = self.client.pin_local_file(obj);
        if let Some((id, origin)) = self.share_backing(ino, obj.id, local.is_some())? {
            let guard = if local.is_some() {
                local_guard
            } else {
                Box::new(())
            };
            return Ok((id, guard, origin));
        }
        let (f, guard, lent, origin) = match local {
            Some(f) => (f, local_guard, false, "whole file in local disk tier"),
            None => {
                drop(local_guard);
                let held = self
                    .client
                    .hold_backing_blocking(obj)
                    .ok_or("not fully cached on local disk")?;
                let origin = "whole file in a same-host worker's disk tier";
                (held.file, held.guard, true, origin)
            }
        };
        let mut io = self.io.lock();
        // Another open may have registered one while we borrowed: share it, drop ours.
        if let Some((id, origin)) = share(&mut io, ino, obj.id, !lent)? {
            return Ok((id, guard, origin));
        }
        let id = self.register_backing(&f).map_err(|e| {
            silt_common::warn_limited!(
                "passthrough backing open failed",
                path = %file.entry.path,
                error = %e
            );
            "kernel refused the backing file"
        })?;
        let kernel = inodes::LoggedBacking {
            id,
            object: obj.id,
            lent,
            source: false,
        };
        self.insert_backing(&mut io, ino, kernel);
        Ok((id, guard, origin))
    }

    /// Fetches a file that passthrough could serve once whole, if it is small enough
    /// (`open_fill_max`) and a fill slot is free, so the kernel reads it without the daemon:
    /// no copy of each byte into the mount's page cache by the daemon, kernel read-ahead
    /// on a local file. The open waits for the whole file. Returns whether it fetched any.
    fn fill_for_passthrough(&self, ino: u64, file: &OpenFile) -> bool {
        let size = file.size();
        if size == 0
            || size > self.opts.open_fill_max
            // Open through the daemon: the kernel would refuse a passthrough open anyway.
            || self.io.lock().cached.get(&ino).is_some_and(|n| *n > 0)
            || !self.state.passthrough_enabled.load(Ordering::Relaxed)
            || self.client.write_type_of(&file.entry.path).writable()
            // In a full cache a fill could fetch a file the admission policy then refuses,
            // and the open's reads would fetch it again (B4 with a cache of half the data: hit
            // ratio 0.15 against 0.48, docs/benchmarks.md): a full cache opens as before.
            || !self.client.disk_takes_unevicted(size)
        {
            return false;
        }
        let most = (self.opts.threads / 2).max(1);
        if self
            .filling
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            })
            .is_err()
        {
            return false;
        }
        let r = {
            let _slot = FillSlot(&self.filling);
            self.block(self.client.fill(file))
        };
        if let Err(e) = &r {
            // The reads report it (or find the pages another way).
            tracing::debug!(path = %file.entry.path, error = %e, "fetch at open failed");
        }
        r.is_ok_and(|fetched| fetched > 0)
    }

    /// Hands the kernel the store's own file of this version (`source_passthrough`), where the
    /// store keeps its objects as files this host can open and the file still holds the
    /// version: the reader reads at the store's speed, with no byte through the daemon, and
    /// the cache is filled behind it (`fill_behind`) for the next open.
    fn try_source_passthrough(&self, ino: u64, file: &Arc<OpenFile>) -> Option<Passthrough> {
        if !self.opts.source_passthrough
            || !self.state.passthrough_enabled.load(Ordering::Relaxed)
            || self.client.write_type_of(&file.entry.path).writable()
        {
            return None;
        }
        let src = self
            .client
            .runtime()
            .block_on(self.client.source_file(file))?;
        let object = file.object().id;
        let mut io = self.io.lock();
        // `lent`: the store's file needs no pin, so a backing of this version is shared.
        if let Some((id, origin)) = share(&mut io, ino, object, false).ok()? {
            return Some((id, Box::new(()), origin));
        }
        let id = match self.register_backing(&src) {
            Ok(id) => id,
            Err(e) => {
                // A store on a file system the kernel cannot stack on (another FUSE mount).
                silt_common::warn_limited!(
                    "passthrough to the store's file refused",
                    path = %file.entry.path,
                    error = %e
                );
                return None;
            }
        };
        let kernel = inodes::LoggedBacking {
            id,
            object,
            lent: true,
            source: true,
        };
        self.insert_backing(&mut io, ino, kernel);
        drop(io);
        self.fill_behind(file.clone());
        Some((id, Box::new(()), FROM_SOURCE))
    }

    /// Fetches the pages of `file` the cache lacks in the background, admitted as a read's
    /// would be (the reads of a store's own file never reach the cache): once per version at
    /// a time, at most `threads` versions at once (past that the next open tries again).
    fn fill_behind(&self, file: Arc<OpenFile>) {
        let object = file.object().id;
        let Some(slot) = self.filling_behind.take(object, self.opts.threads) else {
            return;
        };
        metrics::FILLS_BEHIND_STARTED.inc();
        let client = self.client.clone();
        self.client.runtime().spawn(async move {
            if let Err(e) = client.fill(&file).await {
                // The next open of the file finds it not whole and tries again.
                tracing::debug!(path = %file.entry.path, error = %e, "fill behind a reader failed");
            }
            drop(slot);
            metrics::FILLS_BEHIND_FINISHED.inc();
        });
    }

    /// The inode's registered backing, if this open may share it (see `share`).
    fn share_backing(
        &self,
        ino: u64,
        object: ObjectId,
        pinned_locally: bool,
    ) -> std::result::Result<Option<(u32, &'static str)>, &'static str> {
        share(&mut self.io.lock(), ino, object, pinned_locally)
    }

    fn release_backing(&self, ino: u64) {
        let mut io = self.io.lock();
        if let Some(b) = io.backings.get_mut(&ino) {
            b.handles -= 1;
            if b.handles == 0 {
                if let Some(b) = io.backings.remove(&ino) {
                    self.inodes.lock().backing(ino, None);
                    if let Some(dev) = &self.dev {
                        close_raw_backing(dev, b.kernel.id);
                    }
                }
                self.io_released.notify_all();
            }
        }
    }

    /// Waits, up to `PASSTHROUGH_RELEASE_WAIT`, until `ino` has no passthrough backing of an
    /// object other than `object`. The kernel sends RELEASE after close(2) has returned, so
    /// a reader that closed the old version just before this open may still be counted.
    fn wait_other_version_released(&self, ino: u64, object: ObjectId) {
        let deadline = std::time::Instant::now() + PASSTHROUGH_RELEASE_WAIT;
        let mut io = self.io.lock();
        while io
            .backings
            .get(&ino)
            .is_some_and(|b| b.kernel.object != object)
        {
            if self.io_released.wait_until(&mut io, deadline).timed_out() {
                return;
            }
        }
    }

    /// `open_cached` for an open the kernel must serve through the daemon: a passthrough
    /// handle that is closed but not yet released (the kernel sends RELEASE after close(2)
    /// returns) is waited for, up to `PASSTHROUGH_RELEASE_WAIT`; a file still open in
    /// passthrough then is `false`.
    fn open_cached_waiting(&self, ino: u64) -> bool {
        let deadline = std::time::Instant::now() + PASSTHROUGH_RELEASE_WAIT;
        let mut io = self.io.lock();
        while io.backings.contains_key(&ino) {
            if self.io_released.wait_until(&mut io, deadline).timed_out() {
                return false;
            }
        }
        *io.cached.entry(ino).or_insert(0) += 1;
        true
    }

    /// Records a handle opened through the daemon; `false` if the inode has a passthrough
    /// backing, which the kernel would refuse a non-passthrough open for.
    fn open_cached(&self, ino: u64) -> bool {
        let mut io = self.io.lock();
        if io.backings.contains_key(&ino) {
            return false;
        }
        *io.cached.entry(ino).or_insert(0) += 1;
        true
    }

    fn release_cached(&self, ino: u64) {
        let mut io = self.io.lock();
        if let Some(n) = io.cached.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                io.cached.remove(&ino);
            }
        }
    }
}

impl fuser::Filesystem for SiltFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        // O_TRUNC comes with the open (one empty writer) instead of a setattr after it (which
        // would first copy the whole file in to cut it).
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        // More parallel read-ahead requests in flight: the prefetcher and kernel read-ahead
        // together keep the store busy.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let _ = config.set_max_readahead(self.opts.max_read as u32);
        // Lets a file opened with FOPEN_DIRECT_IO be mapped shared (through the page cache, as
        // any other); without it such an mmap fails with ENODEV.
        let direct_mmap = config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_ok();
        self.state
            .cold_direct_io
            .store(self.opts.cold_direct_io && direct_mmap, Ordering::Relaxed);
        if self.opts.cold_direct_io && !direct_mmap {
            tracing::warn!(
                "fuse_cold_direct_io ignored: this kernel cannot map such files shared (needs Linux >= 6.6)"
            );
        }
        let kernel_pt = config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH);
        self.state
            .kernel_passthrough
            .store(kernel_pt, Ordering::Relaxed);
        let want = self.opts.passthrough != PassthroughMode::Off;
        if want && kernel_pt {
            let ok = config.set_max_stack_depth(1).is_ok()
                && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
            self.state.passthrough_enabled.store(ok, Ordering::Relaxed);
        }
        if self.opts.passthrough == PassthroughMode::On
            && !self.state.passthrough_enabled.load(Ordering::Relaxed)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "passthrough=on but this kernel does not offer FUSE passthrough (needs Linux >= 6.9)",
            ));
        }
        tracing::info!(
            kernel_passthrough = kernel_pt,
            passthrough = self.state.passthrough_enabled.load(Ordering::Relaxed),
            "FUSE session initialised"
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _timer = FuseOp::Lookup.timer();
        let path = match self.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.stat_live(&path) {
            Ok((e, live)) => {
                let ino = self.inodes.lock().lookup(&path);
                let (attr_ttl, entry_ttl) = self.live_ttls(&e, live);
                reply.entry_with_ttls(&attr_ttl, &entry_ttl, &self.attr(ino, &e), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// No ioctls: files here are not terminals or devices. Python's `open()` asks every file
    /// whether it is a terminal (TCGETS); answering ENOTTY ("not a terminal") is the truthful
    /// reply. The library default logs a warning per call: one per file opened from Python.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let Some(path) = self.inodes.lock().forget(ino.0, nlookup) else {
            return;
        };
        // The kernel evicted the inode, and its caches with it.
        self.kernel_cached.lock().remove(&ino.0);
        // The parent's readdir cache still names the inode's number, which the next lookup
        // replaces: have the kernel read the parent again.
        if let (Some((parent, _)), Some(queue)) = (
            silt_client::namespace::parent_and_name(&path),
            self.state.invalidations.get(),
        ) {
            queue.push_reread(parent.to_string());
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _timer = FuseOp::Getattr.timer();
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // fstat of an open file: the version that handle reads now (`current_file`: the one
        // it opened, or the new one if the file was rewritten through this client since, as
        // its reads have it), without asking the store (unless the file is open for writing
        // here: then its live size). The kernel keeps one size per inode: the size of a
        // version the handle no longer reads would also be what `stat` of the path shows.
        // Unlinked or replaced since: the size its writers see while one has it open, else
        // that of the session a handle that opened while it was being written reads (see
        // `read`), not of a stored version the handle opened too.
        // An unlinked file has no names left (POSIX: fstat's st_nlink is 0).
        if let Some(attr) = self
            .detached_attr(ino, fh, &path)
            .or_else(|| self.detached_read_attr(ino, fh))
        {
            return reply.attr(&Duration::ZERO, &FileAttr { nlink: 0, ..attr });
        }
        if let Some(fh) = fh.filter(|_| self.client.session(&path).is_none()) {
            let known = self
                .handles
                .lock()
                .get(&fh.0)
                .map(|h| (h.path.clone(), h.file.lock().clone()));
            if let Some((opened_as, pinned @ (Some(_), _))) = known {
                let attached = self.inodes.lock().attached_path(ino.0);
                if let Ok(f) = self.current_file(fh.0, attached.as_deref(), &opened_as, pinned) {
                    return reply.attr(&self.ttls(&f.entry).0, &self.attr(ino.0, &f.entry));
                }
            }
        }
        // Unlinked or renamed over, still open: `fstat` comes without a handle (the kernel
        // passes none for it), so the attributes are those of the version a read handle of
        // the inode has, not a lookup of a name that is gone (ENOENT).
        if self.inodes.lock().attached_path(ino.0).is_none() {
            let held = self
                .handles
                .lock()
                .values()
                .find(|h| h.ino == ino.0)
                .and_then(|h| h.file.lock().0.clone());
            if let Some(f) = held {
                let attr = FileAttr {
                    nlink: 0,
                    ..self.attr(ino.0, &f.entry)
                };
                return reply.attr(&Duration::ZERO, &attr);
            }
        }
        match self.stat_live(&path) {
            Ok((e, live)) => reply.attr(&self.live_ttls(&e, live).0, &self.attr(ino.0, &e)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Sizes truncate (see `truncate`). Mode, owner and times go to the client
    /// (`Client::set_attrs`: POSIX permission rules, then the store or, for a file not
    /// committed yet, its first commit). Outside writable prefixes they are `EROFS`.
    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _timer = FuseOp::Setattr.timer();
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if let Some(size) = size {
            if let Err(e) = self.truncate(ino.0, &path, fh, size) {
                return reply.error(errno(&e));
            }
        }
        let changes =
            mode.is_some() || uid.is_some() || gid.is_some() || atime.is_some() || mtime.is_some();
        if changes {
            if !self.client.write_rules().writable_at_or_below(&path) {
                return reply.error(Errno::EROFS);
            }
            let now = SystemTime::now();
            let time = |t: Option<TimeOrNow>| match t {
                Some(TimeOrNow::Now) => Some(now),
                Some(TimeOrNow::SpecificTime(t)) => Some(t),
                None => None,
            };
            let is_now = |t: &Option<TimeOrNow>| t.is_none() || matches!(t, Some(TimeOrNow::Now));
            let change = silt_client::attrs::AttrChange {
                set: silt_ufs::SetAttrs {
                    mode: mode.map(|m| m & 0o7777),
                    uid,
                    gid,
                    atime: time(atime),
                    mtime: time(mtime),
                },
                times_now: is_now(&atime) && is_now(&mtime),
            };
            if let Err(e) = self.block(self.client.set_attrs(&path, &caller(req), &change)) {
                return reply.error(errno(&e));
            }
        }
        if let Some(attr) = self.detached_attr(ino, fh, &path) {
            return reply.attr(&Duration::ZERO, &attr);
        }
        match self.stat_live(&path) {
            Ok((e, live)) => reply.attr(&self.live_ttls(&e, live).0, &self.attr(ino.0, &e)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _timer = FuseOp::Open.timer();
        // `O_RDONLY|O_TRUNC` truncates too (the kernel sends O_TRUNC with the open).
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return self.open_write(req, ino, flags, reply);
        }
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // A file open for writing here is read from its session (see `read`); it may not be
        // in the store yet.
        let session = self.client.session(&path);
        let live = session.is_some();
        let file = match self.block(self.client.open(&path)) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) if live && e.kind() == ErrorKind::NotFound => None,
            Err(e) => return reply.error(errno(&e)),
        };
        // Only a file the store has can be passed through.
        let file = match (file, session) {
            (Some(f), None) => f,
            (file, session) => {
                if !self.open_cached_waiting(ino.0) {
                    self.state
                        .record(&path, "refused", "file open in passthrough");
                    return reply.error(Errno::EBUSY);
                }
                metrics::FUSE_OPENS_DAEMON.inc();
                self.state
                    .record(&path, "daemon", "file open for writing here");
                self.kernel_cached.lock().remove(&ino.0);
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                let commits = self.client.commit_count();
                metrics::FUSE_HANDLES.inc();
                self.handles.lock().insert(
                    fh,
                    Handle {
                        file: Mutex::new((file, commits)),
                        live: Mutex::new(session),
                        path,
                        ino: ino.0,
                        _pin: None,
                        passthrough: false,
                    },
                );
                self.inodes
                    .lock()
                    .handle(fh, Some((ino.0, HandleMode::Daemon)));
                return reply.opened(FileHandle(fh), FopenFlags::empty());
            }
        };
        // If this open learned of a change, the kernel must drop the old attributes (size)
        // before reading, or it would cut the new version at the old size.
        self.state.wait_for_invalidations();
        self.wait_other_version_released(ino.0, file.object().id);
        let filled = self.fill_for_passthrough(ino.0, &file);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let commits = self.client.commit_count();
        let passthrough = self
            .try_passthrough(ino.0, &file)
            .or_else(|reason| self.try_source_passthrough(ino.0, &file).ok_or(reason));
        match passthrough {
            Ok((backing, pin, origin)) => {
                let origin = if filled {
                    metrics::FUSE_OPENS_FILLED.inc();
                    "fetched whole at open"
                } else {
                    origin
                };
                metrics::FUSE_OPENS_PASSTHROUGH.inc();
                // The kernel reads it without asking us.
                let from_store = origin == FROM_SOURCE;
                if from_store {
                    metrics::FUSE_OPENS_SOURCE.inc();
                }
                self.client.count_passthrough_read(file.size(), from_store);
                self.state.record(&path, "passthrough", origin);
                metrics::FUSE_HANDLES.inc();
                self.handles.lock().insert(
                    fh,
                    Handle {
                        file: Mutex::new((Some(file), commits)),
                        live: Mutex::new(None),
                        path: path.clone(),
                        ino: ino.0,
                        _pin: Some(pin),
                        passthrough: true,
                    },
                );
                // Logged before the kernel learns of it: a daemon taking over must know
                // every handle the kernel reads through this backing.
                self.inodes
                    .lock()
                    .handle(fh, Some((ino.0, HandleMode::Passthrough)));
                // No KEEP_CACHE here: together with passthrough it makes open() fail (EIO).
                // SAFETY: `backing` is open on this mount's connection (registered by this
                // daemon or one before it, logged) and is closed only by `release_backing`
                // once no handle uses it; `into_raw` keeps this wrapper from closing it.
                let id = unsafe { reply.wrap_backing(backing) };
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                let _ = id.into_raw();
            }
            Err(reason) => {
                if !self.open_cached_waiting(ino.0) {
                    // Open in passthrough with a backing this open cannot use (another
                    // version): the kernel would fail a daemon open of it with EIO anyway.
                    self.state.record(&path, "refused", reason);
                    return reply.error(Errno::EBUSY);
                }
                metrics::FUSE_OPENS_DAEMON.inc();
                let id = file.object().id;
                let keep = self.kernel_cached.lock().insert(ino.0, id) == Some(id);
                // The kernel holds no page of this version: this open's reads go straight to
                // the reader (no page-cache fill); the next open of it caches as usual.
                let direct = !keep && self.state.cold_direct_io.load(Ordering::Relaxed);
                let mode = if direct { "direct" } else { "daemon" };
                self.state.record(&path, mode, reason);
                metrics::FUSE_HANDLES.inc();
                self.handles.lock().insert(
                    fh,
                    Handle {
                        file: Mutex::new((Some(file), commits)),
                        live: Mutex::new(None),
                        path: path.clone(),
                        ino: ino.0,
                        _pin: None,
                        passthrough: false,
                    },
                );
                self.inodes
                    .lock()
                    .handle(fh, Some((ino.0, HandleMode::Daemon)));
                let flags = if direct {
                    FopenFlags::FOPEN_DIRECT_IO
                } else if keep {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(fh), flags);
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let _timer = FuseOp::Read.timer();
        if let Some(h) = self.write_handle(fh.0) {
            // Open for reading and writing: what the file's handles wrote.
            return match self.block(self.client.read_written(&h.writer, offset, size as u64)) {
                Ok(bytes) => reply.data(&bytes),
                Err(e) => reply.error(errno(&e)),
            };
        }
        // A file open for writing here: its session's bytes, committed or not (the session
        // open now; for a file unlinked or replaced since, the one open when this handle
        // opened it or when the file lost its name, if any: those bytes are that file's).
        let known = self
            .handles
            .lock()
            .get(&fh.0)
            .map(|h| (h.live.lock().clone(), h.path.clone(), h.file.lock().clone()));
        let (held, path, pinned) = match known {
            Some(k) => k,
            None => match self.reopen_old_handle(fh.0, ino.0) {
                Ok(k) => k,
                Err(e) => return reply.error(e),
            },
        };
        // The file's path now (it follows renames); none once the file was unlinked or
        // replaced: a new file at its old name is not this handle's file.
        let attached = self.inodes.lock().attached_path(ino.0);
        // Still named: the session open now, if any (one that ended was committed, and a
        // later version may have followed it). Unlinked or replaced: the session it had.
        let session = match attached.as_deref() {
            Some(p) => self.client.session(p),
            None => held,
        };
        if let Some(s) = session {
            return match self.block(self.client.read_session(&s, offset, size as u64)) {
                Ok(bytes) => reply.data(&bytes),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let file = match self.current_file(fh.0, attached.as_deref(), &path, pinned) {
            Ok(f) => f,
            Err(e) => return reply.error(errno(&e)),
        };
        match self.client.read_blocking(&file, offset, size as u64) {
            Ok(bytes) => {
                metrics::FUSE_READ_BYTES.add(bytes.len() as u64);
                reply.data(&bytes)
            }
            Err(e) => {
                if e.kind() == ErrorKind::ContentChanged {
                    tracing::info!(path = %file.entry.path, "object changed while open: {e}");
                } else {
                    silt_common::warn_limited!(
                        per: e.kind(),
                        "read failed",
                        path = %file.entry.path,
                        offset,
                        size,
                        error = %e
                    );
                }
                // The version this handle has is gone from the store (deleted, here or behind
                // Silt's back) and its pages are not cached: stale, as for a replaced object.
                // ENOENT is no answer to read(2).
                if e.kind() == ErrorKind::NotFound {
                    return reply.error(Errno::ESTALE);
                }
                reply.error(errno(&e))
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Release.timer();
        let writer = self.writers.lock().remove(&fh.0);
        {
            let mut inodes = self.inodes.lock();
            inodes.write_handle(fh.0, false);
            inodes.handle(fh.0, None);
        }
        if let Some(h) = writer {
            metrics::FUSE_HANDLES.dec();
            // The last close of the file commits (normally done by its flush already).
            if let Err(e) = self.block(self.client.close(&h.writer)) {
                let path = h.writer.path();
                tracing::error!(path = %path, "closing a written file: {e}; its bytes are lost");
            }
            self.release_cached(h.ino);
            return reply.ok();
        }
        if let Some(h) = self.handles.lock().remove(&fh.0) {
            metrics::FUSE_HANDLES.dec();
            if h.passthrough {
                self.release_backing(h.ino);
            } else {
                self.release_cached(h.ino);
            }
        } else if let Some(ino) = self.inherited_daemon_handles.lock().remove(&fh.0) {
            // An earlier daemon's handle, never read here: its count goes.
            self.release_cached(ino);
        }
        reply.ok();
    }

    /// Every `close(2)` of a file open for writing commits it, so `close` reports a failed
    /// upload; except a close by another process than the opener's, which is nearly always a
    /// forked child closing its inherited copy at `exec` (close-on-exec) or exit, in the middle
    /// of the opener's writes: the opener's own close, or the release after the last close,
    /// commits then.
    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Flush.timer();
        let handle = self
            .write_handle(fh.0)
            .filter(|h| match (h.opener, process_of(req.pid())) {
                (Some(opener), Some(closer)) => opener == closer,
                _ => true,
            });
        if self.lost_writer(fh.0) {
            return reply.error(Errno::EIO);
        }
        match handle.map(|h| self.commit_handle(&h)) {
            Some(Err(e)) => {
                tracing::warn!("commit at close failed: {e}");
                reply.error(errno(&e))
            }
            _ => reply.ok(),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Fsync.timer();
        if self.lost_writer(fh.0) {
            return reply.error(Errno::EIO);
        }
        match self.write_handle(fh.0).map(|h| self.commit_handle(&h)) {
            Some(Err(e)) => reply.error(errno(&e)),
            _ => reply.ok(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let _timer = FuseOp::Write.timer();
        let Some(h) = self.write_handle(fh.0) else {
            // A handle of an earlier daemon: its unwritten bytes died with it.
            return reply.error(if fh.0 < self.fh_base {
                Errno::EIO
            } else {
                Errno::EBADF
            });
        };
        match self.block(self.client.write(&h.writer, offset, data)) {
            Ok(_) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `open(O_CREAT)` of a name the kernel does not know: a new empty file (committed at
    /// close), or, if the store has the file after all, an open of it as `open` would.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timer = FuseOp::Create.timer();
        let path = match self.new_child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if !self.client.write_type_of(&path).writable() {
            return reply.error(Errno::EROFS);
        }
        let opts = OpenOptions {
            create: true,
            exclusive: flags & libc::O_EXCL != 0,
            truncate: flags & libc::O_TRUNC != 0,
            append: flags & libc::O_APPEND != 0,
            create_attrs: new_attrs(req, mode),
            ..Default::default()
        };
        let ino = self.inodes.lock().peek_or_assign(&path);
        let fh = match self.open_writer(req, ino, &path, opts) {
            Ok(fh) => fh,
            Err(e) => return reply.error(errno(&e)),
        };
        let entry = match self.stat_live(&path) {
            Ok((e, _)) => e,
            Err(e) => {
                if let Some(h) = self.writers.lock().remove(&fh) {
                    metrics::FUSE_HANDLES.dec();
                    let mut inodes = self.inodes.lock();
                    inodes.write_handle(fh, false);
                    inodes.handle(fh, None);
                    drop(inodes);
                    self.release_cached(h.ino);
                }
                return reply.error(errno(&e));
            }
        };
        let ino = self.inodes.lock().lookup(&path);
        let (_, entry_ttl) = self.ttls(&entry);
        reply.created(
            &entry_ttl,
            &self.attr(ino, &entry),
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = FuseOp::Unlink.timer();
        let path = match self.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let session = self.readers_before_detach(&path);
        // The client detaches the file's write session (after a commit in flight), so no
        // write of it can recreate the file.
        if let Err(e) = self.block(self.client.remove_file(&path)) {
            return reply.error(errno(&e));
        }
        self.hand_session_to_readers(session);
        self.inodes.lock().detach(&path);
        reply.ok();
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Mkdir.timer();
        let path = match self.new_child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.block(self.client.mkdir_attrs(&path, &new_attrs(req, mode))) {
            Ok(e) => {
                let ino = self.inodes.lock().lookup(&path);
                let (attr_ttl, entry_ttl) = self.ttls(&e);
                reply.entry_with_ttls(&attr_ttl, &entry_ttl, &self.attr(ino, &e), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `symlink(2)`: the store keeps the link (`Client::symlink`); the kernel resolves it.
    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Symlink.timer();
        let path = match self.new_child_path(parent, link_name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // Store paths and keys are UTF-8; so are the targets they can keep.
        let Some(target) = target.to_str() else {
            return reply.error(Errno::EINVAL);
        };
        // The link is the caller's (its mode bits mean nothing).
        let owner = silt_ufs::SetAttrs {
            mode: None,
            ..new_attrs(req, 0)
        };
        match self.block(self.client.symlink(&path, target, &owner)) {
            Ok(e) => {
                let ino = self.inodes.lock().lookup(&path);
                let (attr_ttl, entry_ttl) = self.ttls(&e);
                reply.entry_with_ttls(&attr_ttl, &entry_ttl, &self.attr(ino, &e), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _timer = FuseOp::Readlink.timer();
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.block(self.client.readlink(&path)) {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A file's S3 headers as `user.s3.*` attributes, with `fuse_xattrs` (see its help for
    /// why it is off by default). Any other name is answered without asking the client.
    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _timer = FuseOp::Getxattr.timer();
        if !self.opts.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let Some(name) = name
            .to_str()
            .filter(|n| n.starts_with(silt_ufs::xattrs::PREFIX))
        else {
            return reply.error(Errno::ENODATA);
        };
        let value = match self.s3_xattrs(ino) {
            Ok(attrs) => attrs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v),
            Err(e) => return reply.error(e),
        };
        match value {
            Some(v) => reply_xattr(reply, size, v.as_bytes()),
            None => reply.error(Errno::ENODATA),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _timer = FuseOp::Listxattr.timer();
        if !self.opts.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        match self.s3_xattrs(ino) {
            Ok(attrs) => {
                let mut names = Vec::new();
                for (k, _) in attrs {
                    names.extend_from_slice(k.as_bytes());
                    names.push(0);
                }
                reply_xattr(reply, size, &names)
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = FuseOp::Rmdir.timer();
        let path = match self.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.block(self.client.rmdir(&path)) {
            Ok(()) => {
                self.inodes.lock().detach(&path);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `rename(2)`/`renameat2(2)`: see `Client::rename` for what moves how. Files open for
    /// writing at or below the old name are committed first and follow the rename.
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Rename.timer();
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            // RENAME_EXCHANGE (no store can swap two names atomically), RENAME_WHITEOUT.
            return reply.error(Errno::EINVAL);
        }
        let (from, to) = match (
            self.child_path(parent, name),
            self.new_child_path(newparent, newname),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        // What is at `to` is replaced (if it is another file).
        let (moved, over) = {
            let inodes = self.inodes.lock();
            (inodes.ino(&from), inodes.ino(&to))
        };
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let replaced = match over {
            // Under RENAME_NOREPLACE nothing is replaced: the rename fails if `to` exists.
            Some(over) if moved != Some(over) && !noreplace => self.readers_before_detach(&to),
            _ => None,
        };
        // Files open for writing at or below `from` follow the rename (`Client::rename`);
        // RENAME_NOREPLACE is decided by the client, with the check under the names' locks.
        let renamed = if noreplace {
            self.block(self.client.rename_noreplace(&from, &to))
        } else {
            self.block(self.client.rename(&from, &to))
        };
        if let Err(e) = renamed {
            return reply.error(errno(&e));
        }
        self.hand_session_to_readers(replaced);
        self.inodes.lock().rename(&from, &to);
        reply.ok();
    }

    /// `link(2)`: a real hard link where the store has them (a local directory), `EPERM`
    /// elsewhere (docs/SEMANTICS.md). Each name is its own inode here; the attributes of a
    /// file with several names are never cached by the kernel (TTL 0), so a change through
    /// one name shows through the others.
    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Link.timer();
        let (from, to) = match (self.path_of(ino), self.new_child_path(newparent, newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        match self.block(self.client.link(&from, &to)) {
            Ok(e) => {
                // The new name has an inode of its own (Silt numbers paths), so the kernel
                // keeps the source's cached attributes, link count 1 included: drop them
                // before the reply, so a stat of either name right after sees the new count
                // (offset -1: attributes only, no page locks).
                let source = self.inodes.lock().ino(&from);
                if let (Some(n), Some(src)) = (self.state.notifier.get(), source) {
                    let _ = n.inval_inode(INodeNo(src), -1, 0);
                }
                let ino = self.inodes.lock().lookup(&to);
                let (attr_ttl, entry_ttl) = self.ttls(&e);
                reply.entry_with_ttls(&attr_ttl, &entry_ttl, &self.attr(ino, &e), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `mknod(2)` (and `mkfifo`, a Unix socket's `bind`): the store keeps the FIFO, socket
    /// or device node (`Client::mknod`); the kernel opens it as what it is. A regular file
    /// asked this way is an empty file created as by `open(O_CREAT|O_EXCL)`.
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Mknod.timer();
        let path = match self.new_child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let attrs = new_attrs(req, mode);
        let made = match silt_ufs::SpecialKind::from_mode(mode) {
            Some(kind) => self.block(self.client.mknod(&path, kind, rdev, &attrs)),
            None if mode & silt_ufs::S_IFMT == libc::S_IFREG || mode & silt_ufs::S_IFMT == 0 => {
                self.block(async {
                    let opts = OpenOptions {
                        create: true,
                        exclusive: true,
                        create_attrs: attrs,
                        ..Default::default()
                    };
                    let w = self.client.open_write(&path, opts).await?;
                    self.client.close(&w).await?;
                    self.client.stat_live(&path).await.map(|(e, _)| e)
                })
            }
            None => return reply.error(Errno::EINVAL),
        };
        match made {
            Ok(e) => {
                let ino = self.inodes.lock().lookup(&path);
                let (attr_ttl, entry_ttl) = self.ttls(&e);
                reply.entry_with_ttls(&attr_ttl, &entry_ttl, &self.attr(ino, &e), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // No directory handles: ENOSYS makes the kernel stop sending opendir/releasedir for
        // this mount and keep each directory's entries in its readdir cache (as if opened with
        // FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE), so a second walk of an unchanged tree makes no
        // request at all. The cache stays true through the directory's mtime (`dir_mtime`)
        // and through notify invalidations when a listing changes.
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _timer = FuseOp::Readdir.timer();
        let list = match self.dir_listing(ino, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let mut i = offset;
        while i < list.len() as u64 + 2 {
            let full = match i {
                0 => reply.add(ino, 1, FileType::Directory, "."),
                1 => reply.add(ino, 2, FileType::Directory, ".."),
                _ => {
                    let e = &list[(i - 2) as usize];
                    // Plain readdir does not count as a lookup: use a stable ino without
                    // taking a reference.
                    let child_ino = self.inodes.lock().peek_or_assign(&e.path);
                    reply.add(INodeNo(child_ino), i + 1, file_type(e.kind), e.name())
                }
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _timer = FuseOp::Readdirplus.timer();
        let list = match self.dir_listing(ino, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let self_entry = match self
            .path_of(ino)
            .and_then(|p| self.stat_live(&p).map(|(e, _)| e).map_err(|e| errno(&e)))
        {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let self_ttl = self.ttls(&self_entry).1;
        let self_attr = self.attr(ino.0, &self_entry);
        let mut i = offset;
        while i < list.len() as u64 + 2 {
            let full = match i {
                0 | 1 => {
                    // The kernel takes no lookup reference for "." and "..".
                    let name = if i == 0 { "." } else { ".." };
                    reply.add(ino, i + 1, name, &self_ttl, &self_attr, Generation(0))
                }
                _ => {
                    let e = &list[(i - 2) as usize];
                    // Asked of the client before the inode table is locked. A file being
                    // written (its live size is in the listing) is not cached by the kernel.
                    let ttl = if !e.is_dir() && self.client.session(&e.path).is_some() {
                        Duration::ZERO
                    } else {
                        self.ttls(e).1
                    };
                    let mut attr = self.attr(0, e);
                    let mut inodes = self.inodes.lock();
                    let child = inodes.peek_or_assign(&e.path);
                    attr.ino = INodeNo(child);
                    let full =
                        reply.add(INodeNo(child), i + 1, e.name(), &ttl, &attr, Generation(0));
                    if !full {
                        // Every entry the kernel receives counts as one lookup.
                        inodes.lookup(&e.path);
                    }
                    full
                }
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _timer = FuseOp::Statfs.timer();
        let stats = self.client.cache_stats();
        let (cap, used) = stats
            .tiers
            .iter()
            .filter(|t| t.name != "memory")
            .fold((0u64, 0u64), |(c, u), t| (c + t.capacity, u + t.used));
        const BS: u64 = 4096;
        let files = self.inodes.lock().len() as u64;
        reply.statfs(
            cap / BS,
            cap.saturating_sub(used) / BS,
            cap.saturating_sub(used) / BS,
            files,
            0,
            BS as u32,
            255,
            BS as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let _timer = FuseOp::Access.timer();
        if mask.contains(fuser::AccessFlags::W_OK) {
            let writable = self
                .path_of(ino)
                .is_ok_and(|p| self.client.write_rules().writable_at_or_below(&p));
            if !writable {
                return reply.error(Errno::EROFS);
            }
        }
        reply.ok()
    }
}

/// Tells the kernel to forget what it caches about changed paths: attributes and pages of a
/// changed inode (attributes only for a metadata change), and the directory entry of a path
/// that appeared, disappeared or was invalidated, with its parent's readdir cache (once per
/// parent and batch); for a policy change, everything it was given under the prefix. Paths
/// the kernel was never given are skipped; errors (the kernel already dropped the inode) are
/// expected and ignored.
/// The kernel's file type of an entry.
fn file_type(kind: EntryKind) -> FileType {
    match kind {
        EntryKind::Dir => FileType::Directory,
        EntryKind::File => FileType::RegularFile,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Special(SpecialKind::Fifo) => FileType::NamedPipe,
        EntryKind::Special(SpecialKind::Socket) => FileType::Socket,
        EntryKind::Special(SpecialKind::CharDevice) => FileType::CharDevice,
        EntryKind::Special(SpecialKind::BlockDevice) => FileType::BlockDevice,
    }
}

fn invalidate_kernel(notifier: &fuser::Notifier, inodes: &Mutex<Inodes>, changes: &[Change]) {
    let mut parents = HashSet::new();
    for c in changes {
        if c.kind == ChangeKind::Policy {
            let known = inodes.lock().under(&c.path);
            for path in known {
                invalidate_path(
                    notifier,
                    inodes,
                    &path,
                    ChangeKind::Invalidated,
                    &mut parents,
                );
            }
        } else {
            invalidate_path(notifier, inodes, &c.path, c.kind, &mut parents);
        }
    }
    for parent in parents {
        let _ = notifier.inval_inode(INodeNo(parent), 0, 0);
    }
}

/// Invalidates `path` itself and its entry in its parent; adds the parent to `parents` when
/// the parent's listing changed.
fn invalidate_path(
    notifier: &fuser::Notifier,
    inodes: &Mutex<Inodes>,
    path: &str,
    kind: ChangeKind,
    parents: &mut HashSet<u64>,
) {
    let parent_and_name = silt_client::namespace::parent_and_name(path);
    let (ino, parent) = {
        let t = inodes.lock();
        (t.ino(path), parent_and_name.and_then(|(d, _)| t.ino(d)))
    };
    if let Some(ino) = ino {
        // Offset -1: attributes only; (0, 0): attributes and every cached page.
        let offset = if kind == ChangeKind::Metadata { -1 } else { 0 };
        let _ = notifier.inval_inode(INodeNo(ino), offset, 0);
    }
    // The names stay for changes of a file's attributes or bytes (and bytes freed).
    if !matches!(
        kind,
        ChangeKind::Metadata | ChangeKind::Content | ChangeKind::Freed
    ) {
        if let (Some(parent), Some((_, name))) = (parent, parent_and_name) {
            let _ = notifier.inval_entry(INodeNo(parent), OsStr::new(name));
            parents.insert(parent);
        }
    }
}

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
    client: Arc<Client>,
    writers: Arc<Mutex<HashMap<u64, Arc<WriteHandle>>>>,
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
        let writers: Vec<Arc<WriteHandle>> = self.writers.lock().values().cloned().collect();
        let mut first_err = None;
        for h in writers {
            if h.writer.is_dirty() {
                if let Err(e) = self
                    .client
                    .runtime()
                    .block_on(self.client.commit(&h.writer))
                {
                    tracing::error!(path = %h.writer.path(), "commit before the handover failed: {e}");
                    first_err.get_or_insert(e);
                }
            }
        }
        // Not joined: the threads end with the process; the holder keeps the connection.
        self.session.take();
        first_err.map_or(Ok(()), Err)
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
    let mut fs = SiltFs::new(client.clone(), opts, state);
    match dev.try_clone() {
        Ok(d) => fs = fs.with_device(d),
        Err(e) => tracing::warn!(
            "duplicating the FUSE device: {e}; passthrough files open across a takeover of this mount will fail to open again"
        ),
    }
    let fs = fs.restarted(table, generation);
    let inodes = fs.inodes.clone();
    let writers = fs.writers.clone();
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
        client,
        writers,
        took_over: !fresh,
    })
}

/// Answers a getxattr or listxattr: the size asked for (`size` 0), the bytes, or `ERANGE`.
fn reply_xattr(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    if size == 0 {
        reply.size(len)
    } else if len <= size {
        reply.data(bytes)
    } else {
        reply.error(Errno::ERANGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fuse_source_passthrough`'s promise: each version is filled once at a time, at most
    /// `fuse_threads` at once; a slot frees when its fill ends.
    #[test]
    fn fills_behind_are_once_per_version_and_bounded() {
        let slots = Arc::new(BehindSlots::default());
        let a = slots.take(ObjectId(1), 2).expect("a free slot");
        assert!(
            slots.take(ObjectId(1), 2).is_none(),
            "one version filled twice"
        );
        let b = slots.take(ObjectId(2), 2).expect("a second slot");
        assert!(slots.take(ObjectId(3), 2).is_none(), "past the bound");
        drop(a);
        let c = slots.take(ObjectId(3), 2).expect("a freed slot");
        assert!(slots.take(ObjectId(1), 2).is_none(), "past the bound again");
        drop((b, c));
        let again = slots
            .take(ObjectId(1), 2)
            .expect("the version may be filled again");
        // No bound below one: a mount with `fuse_threads = 0` still fills.
        drop(again);
        assert!(slots.take(ObjectId(9), 0).is_some());
    }
}
