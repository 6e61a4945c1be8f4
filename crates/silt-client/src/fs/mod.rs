//! The file-system core: inode numbers, open handles and every POSIX rule a front end needs,
//! over [`Client`]. The FUSE mount (`silt-fuse`) translates kernel requests to these calls
//! and their answers back, and nothing else; a test drives the same calls without a kernel
//! (`tests/fs_model.rs`).
//!
//! # Contract
//!
//! What a front end may rely on:
//!
//! - **Inodes.** A path keeps its number for as long as the core lives and the path names the
//!   same file, also after [`FileSystem::forget`]; a rename moves a path and everything below
//!   it with their numbers; an unlinked or replaced path is *detached*: its number lives on
//!   for open handles, a new file at the path gets a new one (see [`inodes`]).
//! - **Handles and versions.** A read handle reads the version it opened, unless the file was
//!   committed through this client since and its current version is another (a process
//!   reading a file it rewrote through another descriptor reads the new bytes, as POSIX has
//!   it). A handle follows its file across renames. A file unlinked or replaced while open
//!   keeps its bytes for its handles: the version they had, or the write session the file had
//!   when it lost its name (its writers' bytes, committed or not). A file open for writing
//!   here is read from its write session.
//! - **Writes.** Every handle open for writing holds a [`FileWriter`] of the file's one write
//!   session; [`FileSystem::flush`] by the opening process and [`FileSystem::fsync`] commit,
//!   [`FileSystem::release`] closes (the last close commits). A handle an earlier process
//!   opened for writing (a takeover) lost its unwritten bytes: its flush, fsync and writes
//!   fail (`EIO`).
//! - **Local files.** When a front end can hand a reader a local file (FUSE passthrough:
//!   [`Frontend::reads_local_files`]), an open of a version wholly on this host's disk (or
//!   leased by a same-host worker, or the store's own file for `file://`) is served that way;
//!   a small file is fetched whole first where the cache takes it without evicting
//!   (`fuse_open_fill_max`). An inode is read either through local files or through the
//!   core, never both at once (Linux's FUSE io modes): an open for writing, or a truncate,
//!   meeting a local-file reader waits for its release up to two seconds, then fails `EBUSY`.
//!   A file written through this core since it started is read through the core from then on.
//! - **Names.** A name over 255 bytes is `ENAMETOOLONG`; a name to be made that is not UTF-8
//!   is `EINVAL`; `rename` with `noreplace` is atomic against other renames and creates
//!   through this client (`Client::rename_noreplace`).
//! - **Changes.** Every change is told to the owner this client is attached to by the client
//!   itself (`ChangeSink`); a front end subscribes to changes to drop its own caches
//!   (`Client::subscribe`) and calls nothing to report them.

pub mod inodes;
mod read;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use silt_common::{metrics, Error, ErrorKind, Result};
use silt_ufs::EntryKind;

use crate::attrs::Caller;
use crate::{Client, Entry, FileWriter, OpenOptions};
use inodes::{HandleMode, Inodes};
pub use read::{Opened, OpenedAs};

/// Longest name of one path component.
pub const NAME_MAX: usize = 255;

/// How long an open the front end would refuse next to a local-file reader waits for that
/// reader to be released; past it, `EBUSY`.
const LOCAL_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// What the front end gives the core: a way to hand readers local files, and a way to know
/// its caches have caught up with Silt's changes.
pub trait Frontend: Send + Sync {
    /// Whether readers can be handed local files now (FUSE: passthrough negotiated and on).
    fn reads_local_files(&self) -> bool;
    /// Why not, when [`Frontend::reads_local_files`] is false.
    fn why_no_local_files(&self) -> &'static str {
        "the front end reads no local files"
    }
    /// Registers `file` for readers to read directly; its id (FUSE: the kernel's backing id).
    fn register_local_file(&self, file: &std::fs::File) -> std::io::Result<u32>;
    /// Closes a registered file that no handle reads any more.
    fn close_local_file(&self, id: u32);
    /// Returns once every change Silt learned so far has reached the front end's caches (an
    /// open that learned of a change must not be served the old size).
    fn caught_up(&self) {}
}

/// A front end that hands out no local files: every read comes to the core.
pub struct NoLocalFiles;

impl Frontend for NoLocalFiles {
    fn reads_local_files(&self) -> bool {
        false
    }
    fn register_local_file(&self, _: &std::fs::File) -> std::io::Result<u32> {
        Err(std::io::Error::other("no local files here"))
    }
    fn close_local_file(&self, _: u32) {}
}

/// Options of the core (from `Config`'s `fuse_*` keys).
#[derive(Debug, Clone)]
pub struct FsOptions {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    /// Bounds concurrent whole-file fetches: at most half at open, this many behind readers.
    pub threads: usize,
    /// A read open of a file of at most this many bytes not yet whole on local disk fetches
    /// it whole first, then hands it over as a local file (`fuse_open_fill_max`; 0: never).
    pub open_fill_max: u64,
    /// A read open of a file not whole on local disk, from a store whose objects are files
    /// this host can open (`file://`), hands over the store's own file and fills the cache
    /// behind the reader (`fuse_source_passthrough`).
    pub source_passthrough: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            threads: 4,
            open_fill_max: 0,
            source_passthrough: false,
        }
    }
}

/// A file's attributes as a POSIX front end shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: EntryKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// Attributes and how long a front end may cache them and the name's entry.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub attr: Attr,
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
}

/// A `setattr`'s changes (`None`: unchanged; a time of `Some(None)`: now).
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Option<SystemTime>>,
    pub mtime: Option<Option<SystemTime>>,
}

/// A file open for writing (or reading and writing): the client's handle on the file's
/// write session.
pub(crate) struct WriteHandle {
    pub(crate) ino: u64,
    /// The process that opened the file (see `flush`), if known.
    opener: Option<u32>,
    pub(crate) writer: FileWriter,
}

/// The file-system core (see the module docs for its contract).
pub struct FileSystem {
    client: Arc<Client>,
    opts: FsOptions,
    frontend: Arc<dyn Frontend>,
    inodes: Arc<Mutex<Inodes>>,
    handles: Mutex<HashMap<u64, read::ReadHandle>>,
    /// Handles open for writing, by fh (numbered with the read handles).
    writers: Mutex<HashMap<u64, Arc<WriteHandle>>>,
    local: read::LocalFiles,
    next_fh: AtomicU64,
    /// The first handle number of this core: smaller ones were handed out by an earlier
    /// process serving the same mount (a takeover).
    fh_base: u64,
    /// Opens fetching their file whole right now (`open_fill_max`).
    filling: AtomicUsize,
    filling_behind: Arc<read::BehindSlots>,
    started: SystemTime,
}

fn stale(ino: u64) -> Error {
    Error::new(ErrorKind::Stale, format!("inode {ino} names nothing here"))
}

fn read_only(path: &str) -> Error {
    Error::new(ErrorKind::ReadOnly, format!("{path}: not writable here"))
}

fn bad_handle(fh: u64) -> Error {
    Error::new(ErrorKind::BadHandle, format!("no open handle {fh}"))
}

/// Who creates an entry: its owner (unless the store's default owner). Only the ids: a
/// creation checks no group membership, so a front end need not look the caller's groups up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl From<&Caller> for Owner {
    fn from(c: &Caller) -> Owner {
        Owner {
            uid: c.uid,
            gid: c.gid,
        }
    }
}

/// What a file or directory created by `who` gets: `mode` (the umask applied) and the
/// caller's owner and group where they differ from Silt's own.
fn new_attrs(who: Owner, mode: u32) -> silt_ufs::SetAttrs {
    let (uid, gid) = crate::attrs::default_owner();
    silt_ufs::SetAttrs {
        mode: Some(mode & 0o7777),
        uid: (who.uid != uid).then_some(who.uid),
        gid: (who.gid != gid).then_some(who.gid),
        ..Default::default()
    }
}

impl FileSystem {
    pub fn new(client: Arc<Client>, opts: FsOptions, frontend: Arc<dyn Frontend>) -> Self {
        FileSystem {
            client,
            opts,
            frontend,
            inodes: Arc::new(Mutex::new(Inodes::new())),
            handles: Mutex::new(HashMap::new()),
            writers: Mutex::new(HashMap::new()),
            local: read::LocalFiles::default(),
            next_fh: AtomicU64::new(1),
            fh_base: 1,
            filling: AtomicUsize::new(0),
            filling_behind: Arc::new(read::BehindSlots::default()),
            started: SystemTime::now(),
        }
    }

    /// This core goes on serving a mount an earlier process served: the inode table from its
    /// log, handle numbers above every earlier process's (the takeover `generation` in the
    /// high bits), and the local files readers still read adopted.
    pub fn restarted(mut self, inodes: Inodes, generation: u64) -> Self {
        let inherited = inodes.passthrough_state();
        let daemon_handles = inodes.daemon_handles();
        self.inodes = Arc::new(Mutex::new(inodes));
        self.fh_base = (generation << 40).max(1);
        self.next_fh = AtomicU64::new(self.fh_base);
        for (ino, b, fhs) in inherited {
            self.adopt_local_file(ino, b, &fhs);
        }
        self.local.inherit_core_handles(daemon_handles);
        self
    }

    /// The inode table (the front end's invalidations map paths to numbers with it).
    pub fn inodes(&self) -> &Arc<Mutex<Inodes>> {
        &self.inodes
    }

    fn block<T>(&self, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        self.client.runtime().block_on(f)
    }

    pub fn path_of(&self, ino: u64) -> Result<String> {
        self.inodes.lock().path(ino).ok_or_else(|| stale(ino))
    }

    /// The path of `name` in directory `parent`.
    pub fn child_path(&self, parent: u64, name: &OsStr) -> Result<String> {
        if name.len() > NAME_MAX {
            return Err(Error::new(
                ErrorKind::NameTooLong,
                format!("a name of {} bytes (at most {NAME_MAX})", name.len()),
            ));
        }
        let name = name
            .to_str()
            .ok_or_else(|| Error::not_found("a name that is not UTF-8"))?;
        let dir = self.path_of(parent)?;
        Ok(crate::namespace::join(&dir, name))
    }

    /// The path of a name about to be made (create, mkdir, symlink, a rename's target): one
    /// that is not UTF-8 is `EINVAL` (store paths and keys are UTF-8; such a name can be
    /// neither looked up nor made, but `ENOENT` to a create reads as a missing parent).
    pub fn new_child_path(&self, parent: u64, name: &OsStr) -> Result<String> {
        if name.len() <= NAME_MAX && name.to_str().is_none() {
            return Err(Error::invalid("names here are UTF-8"));
        }
        self.child_path(parent, name)
    }

    /// The attributes of `e` under inode `ino`.
    pub fn attr(&self, ino: u64, e: &Entry) -> Attr {
        let is_dir = e.kind == EntryKind::Dir;
        let mtime = if is_dir {
            self.dir_mtime(&e.path, e.mtime)
        } else {
            e.mtime.unwrap_or(self.started)
        };
        let (uid, gid, mode) = crate::attrs::owner_and_mode(e);
        // Write bits only where writes are allowed (a directory: where something at or below
        // it may be written, so a create may reach a writable prefix).
        let perm = if e.kind == EntryKind::Symlink || self.writable_attr(&e.path, is_dir) {
            // A link's own bits mean nothing (Linux shows 0777); access is its target's.
            mode as u16
        } else {
            (mode & !0o222) as u16
        };
        // ctime: the store's (a local file's, S3's x-amz-meta-ctime), never before the mtime.
        let ctime = e.posix.ctime.map_or(mtime, |c| c.max(mtime));
        Attr {
            ino,
            size: e.size,
            blocks: e.size.div_ceil(512),
            atime: e.posix.atime.unwrap_or(mtime),
            mtime,
            ctime,
            kind: e.kind,
            perm,
            // A directory: its "." and its parent's entry, plus each subdirectory's "..",
            // while its listing is known; else 1, the convention for "not counted".
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
        }
    }

    /// Attribute and entry TTLs for `e`: never longer than its sync policy still trusts what
    /// Silt knows of it (`Client::kernel_ttl`).
    pub fn ttls(&self, e: &Entry) -> (Duration, Duration) {
        if e.posix.linked() {
            // Another name of the file may change it: asked every time.
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

    fn answer(&self, ino: u64, e: &Entry, live: bool) -> Answer {
        let (attr_ttl, entry_ttl) = self.ttls(e);
        Answer {
            attr: self.attr(ino, e),
            // A file being written here changes under its writers: never cached.
            attr_ttl: if live { Duration::ZERO } else { attr_ttl },
            entry_ttl,
        }
    }

    /// The answer for a name just made or found: its inode counted as looked up.
    fn entry_answer(&self, path: &str, e: &Entry, live: bool) -> Answer {
        let ino = self.inodes.lock().lookup(path);
        self.answer(ino, e, live)
    }

    fn stat_opt(&self, path: &str) -> Result<Option<Entry>> {
        self.block(self.client.stat_opt(path))
    }

    fn stat_live(&self, path: &str) -> Result<(Entry, bool)> {
        self.block(self.client.stat_live(path))
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

    /// `lookup`: `name` in directory `parent`, counted as one lookup of its inode.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Answer> {
        let path = self.child_path(parent, name)?;
        let (e, live) = self.stat_live(&path)?;
        Ok(self.entry_answer(&path, &e, live))
    }

    /// The front end dropped `n` lookups of `ino`; the inode's path if it was dropped (its
    /// parent's listing still names the old number: the front end rereads it).
    pub fn forget(&self, ino: u64, n: u64) -> Option<String> {
        let path = self.inodes.lock().forget(ino, n)?;
        self.local.forget(ino);
        Some(path)
    }

    /// `getattr`, with the handle `fh` when the caller has one open (`fstat`).
    ///
    /// An open file answers for the version that handle reads now (see the contract), without
    /// asking the store (unless it is open for writing here: then its live size). A file
    /// unlinked or replaced while open answers for what its handles read, with no names left
    /// (`nlink` 0), not a lookup of a name that is gone.
    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> Result<Answer> {
        let path = self.path_of(ino)?;
        if let Some(attr) = self
            .detached_attr(ino, fh, &path)
            .or_else(|| self.detached_read_attr(ino, fh))
        {
            return Ok(Self::unlinked(attr));
        }
        let named = self.inodes.lock().attached_path(ino).is_some();
        if let Some(a) = fh
            .filter(|_| self.client.session(&path).is_none())
            .and_then(|fh| self.handle_answer(ino, fh))
        {
            return Ok(if named { a } else { Self::unlinked(a.attr) });
        }
        if !named {
            if let Some(f) = self.held_version(ino) {
                return Ok(Self::unlinked(self.attr(ino, &f.entry)));
            }
        }
        let (e, live) = self.stat_live(&path)?;
        Ok(self.answer(ino, &e, live))
    }

    fn unlinked(attr: Attr) -> Answer {
        Answer {
            attr: Attr { nlink: 0, ..attr },
            attr_ttl: Duration::ZERO,
            entry_ttl: Duration::ZERO,
        }
    }

    /// `setattr`: a size truncates (through the handle's session if `fh` is open for
    /// writing, else the path's), mode, owner and times go to `Client::set_attrs` (POSIX
    /// rules, for the caller `who` gives, asked only then); outside writable prefixes those
    /// are `EROFS`.
    pub fn setattr(
        &self,
        ino: u64,
        fh: Option<u64>,
        who: impl FnOnce() -> Caller,
        set: &SetAttr,
    ) -> Result<Answer> {
        let path = self.path_of(ino)?;
        if let Some(size) = set.size {
            self.truncate(ino, &path, fh, size)?;
        }
        let changes = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if changes {
            if !self.client.write_rules().writable_at_or_below(&path) {
                return Err(read_only(&path));
            }
            let now = SystemTime::now();
            let time = |t: Option<Option<SystemTime>>| t.map(|t| t.unwrap_or(now));
            let is_now = |t: &Option<Option<SystemTime>>| !matches!(t, Some(Some(_)));
            let change = crate::attrs::AttrChange {
                set: silt_ufs::SetAttrs {
                    mode: set.mode.map(|m| m & 0o7777),
                    uid: set.uid,
                    gid: set.gid,
                    atime: time(set.atime),
                    mtime: time(set.mtime),
                },
                times_now: is_now(&set.atime) && is_now(&set.mtime),
            };
            self.block(self.client.set_attrs(&path, &who(), &change))?;
        }
        if let Some(attr) = self.detached_attr(ino, fh, &path) {
            return Ok(Answer {
                attr,
                attr_ttl: Duration::ZERO,
                entry_ttl: Duration::ZERO,
            });
        }
        let (e, live) = self.stat_live(&path)?;
        Ok(self.answer(ino, &e, live))
    }

    fn write_handle(&self, fh: u64) -> Option<Arc<WriteHandle>> {
        self.writers.lock().get(&fh).cloned()
    }

    /// The attributes of a file unlinked (or renamed over) while open for writing: its
    /// handles' size (the temp-file pattern: open, unlink, write, fstat or ftruncate).
    /// `None` for any other file.
    fn detached_attr(&self, ino: u64, fh: Option<u64>, path: &str) -> Option<Attr> {
        let h = fh
            .and_then(|fh| self.write_handle(fh))
            .filter(|h| h.ino == ino)
            .or_else(|| self.writers.lock().values().find(|h| h.ino == ino).cloned())
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
        Some(self.attr(ino, &e))
    }

    /// `setattr` of the size: through the handle's session if it is open for writing, else
    /// `truncate(2)` of the path (which joins the file's session if another handle has one).
    fn truncate(&self, ino: u64, path: &str, fh: Option<u64>, size: u64) -> Result<()> {
        if let Some(h) = fh.and_then(|fh| self.write_handle(fh)) {
            return self.block(self.client.truncate(&h.writer, size));
        }
        if !self.client.write_type_of(path).writable() {
            return self.block(self.client.truncate_path(path, size));
        }
        // A local-file reader reads the cached copy, which a truncate would not cut: as an
        // open for writing, it waits for such readers (and keeps new ones out meanwhile).
        self.inodes.lock().mark_written(ino);
        self.local.open_core_waiting(ino, path)?;
        let r = self.block(self.client.truncate_path(path, size));
        self.local.release_core(ino);
        r
    }

    /// Opens `ino` for writing (`O_WRONLY`/`O_RDWR`, or `O_TRUNC`) by process `opener`.
    pub fn open_write(&self, ino: u64, opener: Option<u32>, opts: OpenOptions) -> Result<u64> {
        let path = self.path_of(ino)?;
        if !self.client.write_type_of(&path).writable() {
            return Err(read_only(&path));
        }
        self.open_writer(ino, &path, opener, opts)
    }

    fn open_writer(
        &self,
        ino: u64,
        path: &str,
        opener: Option<u32>,
        opts: OpenOptions,
    ) -> Result<u64> {
        // Also when refused below: the next readers go through the core, so a writer trying
        // again finds no local-file reader.
        self.inodes.lock().mark_written(ino);
        self.local.open_core_waiting(ino, path)?;
        let writer = match self.block(self.client.open_write(path, opts)) {
            Ok(w) => w,
            Err(e) => {
                self.local.release_core(ino);
                return Err(e);
            }
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        metrics::FUSE_HANDLES.inc();
        self.writers.lock().insert(
            fh,
            Arc::new(WriteHandle {
                ino,
                opener,
                writer,
            }),
        );
        {
            let mut inodes = self.inodes.lock();
            inodes.write_handle(fh, true);
            inodes.handle(fh, Some((ino, HandleMode::Daemon)));
        }
        // The front end's cached pages of this inode are not a stored version any more.
        self.local.forget(ino);
        Ok(fh)
    }

    /// `open(O_CREAT)` of `name` in `parent` by `who` (process `opener`): a new empty file
    /// (committed at close), or the file the store has after all, opened as `open_write`.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        who: Owner,
        opener: Option<u32>,
        mode: u32,
        opts: OpenOptions,
    ) -> Result<(Answer, u64)> {
        let path = self.new_child_path(parent, name)?;
        if !self.client.write_type_of(&path).writable() {
            return Err(read_only(&path));
        }
        let opts = OpenOptions {
            create: true,
            create_attrs: new_attrs(who, mode),
            ..opts
        };
        let ino = self.inodes.lock().peek_or_assign(&path);
        let fh = self.open_writer(ino, &path, opener, opts)?;
        match self.stat_live(&path) {
            Ok((e, _)) => Ok((self.entry_answer(&path, &e, false), fh)),
            Err(e) => {
                self.drop_writer(fh);
                Err(e)
            }
        }
    }

    /// Forgets write handle `fh` without closing its writer; `Some` if it was one.
    fn drop_writer(&self, fh: u64) -> Option<Arc<WriteHandle>> {
        let h = self.writers.lock().remove(&fh)?;
        metrics::FUSE_HANDLES.dec();
        {
            let mut inodes = self.inodes.lock();
            inodes.write_handle(fh, false);
            inodes.handle(fh, None);
        }
        self.local.release_core(h.ino);
        Some(h)
    }

    /// Whether `fh` is a handle an earlier process opened for writing: what it had not
    /// committed died with it.
    fn lost_writer(&self, fh: u64) -> bool {
        fh < self.fh_base && self.inodes.lock().is_write_handle(fh)
    }

    fn lost(fh: u64) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!("handle {fh}: its unwritten bytes died with the process that opened it"),
        )
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<()> {
        let Some(h) = self.write_handle(fh) else {
            // A handle of an earlier process: its unwritten bytes died with it.
            return Err(if fh < self.fh_base {
                Self::lost(fh)
            } else {
                bad_handle(fh)
            });
        };
        self.block(self.client.write(&h.writer, offset, data))
            .map(|_| ())
    }

    /// Commits the handle's file; a listing the front end read while the file was being
    /// written may lack it (`Err` with the path to reread is not needed: `Ok(Some(dir))`).
    fn commit_handle(&self, h: &WriteHandle) -> Result<Option<String>> {
        if !h.writer.is_dirty() {
            return Ok(None);
        }
        self.block(self.client.commit(&h.writer))?;
        Ok(crate::namespace::parent_and_name(&h.writer.path()).map(|(d, _)| d.to_string()))
    }

    /// Every `close(2)` of a file open for writing commits it, so `close` reports a failed
    /// upload; except a close by another process than the opener's (`closer`), which is
    /// nearly always a forked child closing its inherited copy at `exec` or exit, in the
    /// middle of the opener's writes: the opener's own close, or the release, commits then.
    /// `Ok(Some(dir))`: a directory whose listing the front end should read again.
    pub fn flush(&self, fh: u64, closer: impl FnOnce() -> Option<u32>) -> Result<Option<String>> {
        if self.lost_writer(fh) {
            return Err(Self::lost(fh));
        }
        // The closing process is asked only of a write handle (every close of every read
        // handle flushes).
        let handle = self
            .write_handle(fh)
            .filter(|h| match (h.opener, closer()) {
                (Some(opener), Some(closer)) => opener == closer,
                _ => true,
            });
        match handle {
            Some(h) => self.commit_handle(&h).inspect_err(|e| {
                tracing::warn!("commit at close failed: {e}");
            }),
            None => Ok(None),
        }
    }

    /// `fsync`: commits a handle open for writing (see `flush`).
    pub fn fsync(&self, fh: u64) -> Result<Option<String>> {
        if self.lost_writer(fh) {
            return Err(Self::lost(fh));
        }
        match self.write_handle(fh) {
            Some(h) => self.commit_handle(&h),
            None => Ok(None),
        }
    }

    /// The last reference to handle `fh` is gone: a writer closes (the last close of the
    /// file commits; a failure is logged, the bytes are lost), a reader lets its version and
    /// local file go.
    pub fn release(&self, fh: u64) {
        if let Some(h) = self.drop_writer(fh) {
            if let Err(e) = self.block(self.client.close(&h.writer)) {
                let path = h.writer.path();
                tracing::error!(path = %path, "closing a written file: {e}; its bytes are lost");
            }
            return;
        }
        self.inodes.lock().handle(fh, None);
        self.release_reader(fh);
    }

    /// Commits every file open for writing (before a planned handover); the first error.
    pub fn commit_all(&self) -> Result<()> {
        let writers: Vec<Arc<WriteHandle>> = self.writers.lock().values().cloned().collect();
        let mut first_err = None;
        for h in writers {
            if h.writer.is_dirty() {
                if let Err(e) = self.block(self.client.commit(&h.writer)) {
                    tracing::error!(path = %h.writer.path(), "commit before the handover failed: {e}");
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        let path = self.child_path(parent, name)?;
        let session = self.readers_before_detach(&path);
        // The client detaches the file's write session (after a commit in flight), so no
        // write of it can recreate the file.
        self.block(self.client.remove_file(&path))?;
        self.hand_session_to_readers(session);
        self.inodes.lock().detach(&path);
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        let path = self.child_path(parent, name)?;
        self.block(self.client.rmdir(&path))?;
        self.inodes.lock().detach(&path);
        Ok(())
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, who: Owner, mode: u32) -> Result<Answer> {
        let path = self.new_child_path(parent, name)?;
        let e = self.block(self.client.mkdir_attrs(&path, &new_attrs(who, mode)))?;
        Ok(self.entry_answer(&path, &e, false))
    }

    /// `symlink(2)`: the store keeps the link (`Client::symlink`), the caller's.
    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &std::path::Path,
        who: Owner,
    ) -> Result<Answer> {
        let path = self.new_child_path(parent, name)?;
        // Store paths and keys are UTF-8; so are the targets they can keep.
        let target = target
            .to_str()
            .ok_or_else(|| Error::invalid("link targets here are UTF-8"))?;
        let owner = silt_ufs::SetAttrs {
            mode: None,
            ..new_attrs(who, 0)
        };
        let e = self.block(self.client.symlink(&path, target, &owner))?;
        Ok(self.entry_answer(&path, &e, false))
    }

    pub fn readlink(&self, ino: u64) -> Result<String> {
        let path = self.path_of(ino)?;
        self.block(self.client.readlink(&path))
    }

    /// `rename(2)`/`renameat2(2)` (`noreplace`: fail if `newname` exists, checked atomically
    /// by the client). Files open for writing at or below the old name are committed first
    /// and follow the rename; a replaced file's readers keep what it held.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        noreplace: bool,
    ) -> Result<()> {
        let from = self.child_path(parent, name)?;
        let to = self.new_child_path(newparent, newname)?;
        let (moved, over) = {
            let inodes = self.inodes.lock();
            (inodes.ino(&from), inodes.ino(&to))
        };
        let replaced = match over {
            // Under `noreplace` nothing is replaced: the rename fails if `to` exists.
            Some(over) if moved != Some(over) && !noreplace => self.readers_before_detach(&to),
            _ => None,
        };
        if noreplace {
            self.block(self.client.rename_noreplace(&from, &to))?;
        } else {
            self.block(self.client.rename(&from, &to))?;
        }
        self.hand_session_to_readers(replaced);
        self.inodes.lock().rename(&from, &to);
        Ok(())
    }

    /// `link(2)`: a real hard link where the store has them, `EPERM` elsewhere. Each name is
    /// an inode of its own here, so a front end caching attributes drops those of `ino` (its
    /// link count changed).
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Answer> {
        let from = self.path_of(ino)?;
        let to = self.new_child_path(newparent, newname)?;
        let e = self.block(self.client.link(&from, &to))?;
        Ok(self.entry_answer(&to, &e, false))
    }

    /// `mknod(2)`: the store keeps the FIFO, socket or device node; a regular file asked
    /// this way is an empty file created as by `open(O_CREAT|O_EXCL)`.
    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        who: Owner,
        mode: u32,
        rdev: u32,
    ) -> Result<Answer> {
        let path = self.new_child_path(parent, name)?;
        let attrs = new_attrs(who, mode);
        let e = match silt_ufs::SpecialKind::from_mode(mode) {
            Some(kind) => self.block(self.client.mknod(&path, kind, rdev, &attrs))?,
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
                })?
            }
            None => return Err(Error::invalid(format!("mknod of mode {mode:o}"))),
        };
        Ok(self.entry_answer(&path, &e, false))
    }

    /// The `user.s3.*` attributes of file `ino` (none for a directory).
    pub fn s3_xattrs(&self, ino: u64) -> Result<Vec<(String, String)>> {
        let path = self.path_of(ino)?;
        let h = self.block(async {
            let e = self.client.stat(&path).await?;
            self.client.headers(&e).await
        })?;
        Ok(silt_ufs::xattrs::of(&h))
    }

    /// The listing a directory pass serves from `offset`: a pass starts at offset 0 with a
    /// listing its sync policy trusts; later calls continue in the listing the pass began
    /// with (offsets stay stable unless the directory changed in between).
    pub fn listing(&self, ino: u64, offset: u64) -> Result<Arc<Vec<Entry>>> {
        let path = self.path_of(ino)?;
        if offset == 0 {
            self.block(self.client.list_live(&path))
        } else {
            self.block(self.client.listing_continued(&path))
        }
    }

    /// The number a listed entry goes by, not counted as a lookup.
    pub fn peek_ino(&self, path: &str) -> u64 {
        self.inodes.lock().peek_or_assign(path)
    }

    /// A listed entry with its attributes and inode number (`readdirplus`), counted as one
    /// lookup at once (under the same lock that gave the number, so nothing in between can
    /// drop or move it); an entry the front end could not hand on gives it back
    /// (`not_handed_on`).
    pub fn listed(&self, e: &Entry) -> (Attr, Duration, u64) {
        // A file being written (its live size is in the listing) is never cached.
        let ttl = if !e.is_dir() && self.client.session(&e.path).is_some() {
            Duration::ZERO
        } else {
            self.ttls(e).1
        };
        let ino = self.inodes.lock().lookup(&e.path);
        (self.attr(ino, e), ttl, ino)
    }

    /// The entry `listed` gave `ino` for did not reach the kernel (its buffer was full): its
    /// lookup is given back.
    pub fn not_handed_on(&self, ino: u64) {
        self.forget(ino, 1);
    }

    /// A directory's mtime tells a kernel whether its readdir cache is still current (it
    /// drops the cache when the mtime differs from the one it saw when filling it). The
    /// seconds are the directory's own (the core's start for an S3 prefix, which has none);
    /// the nanoseconds carry the cached listing's digest while the policy trusts it (equal
    /// while the names and kinds are), else a value that changes with every answer.
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

    /// `statfs`: (capacity, free) bytes of the cache's disk tiers, and the inodes known.
    pub fn statfs(&self) -> (u64, u64, u64) {
        let stats = self.client.cache_stats();
        let (cap, used) = stats
            .tiers
            .iter()
            .filter(|t| t.name != "memory")
            .fold((0u64, 0u64), |(c, u), t| (c + t.capacity, u + t.used));
        (
            cap,
            cap.saturating_sub(used),
            self.inodes.lock().len() as u64,
        )
    }

    /// `access(W_OK)`: `EROFS` where nothing at or below `ino` may be written.
    pub fn check_writable(&self, ino: u64) -> Result<()> {
        let path = self.path_of(ino)?;
        if self.client.write_rules().writable_at_or_below(&path) {
            Ok(())
        } else {
            Err(read_only(&path))
        }
    }
}
