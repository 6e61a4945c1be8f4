//! Write sessions: the one model of a file being written, shared by every front end.
//!
//! A file open for writing in this client has exactly one [`Session`], whatever the number of
//! handles ([`FileWriter`]s) open on it: every handle writes into, reads from and truncates
//! the same buffer, so any sequence of POSIX calls over several descriptors of one process
//! gives the POSIX answer (`pwrite` through fd1 and fd2 then two closes keeps both writes; two
//! `O_APPEND` writers interleave whole writes; a handle sees another's unclosed writes; an
//! `ftruncate` through one handle is the file's size for all of them).
//!
//! - **Commit** (`Client::commit`: close, fsync, flush) makes the session's bytes what its
//!   write type promises (`write.rs`). Commits of one session run one at a time, in order,
//!   and the buffer is frozen while one reads it: a write arriving during an upload goes to a
//!   copy, so the upload sends one consistent state and the newer bytes stay dirty.
//! - **Last close** commits what is still dirty and ends the session (its table entry goes
//!   only after that commit, so nothing can slip between them).
//! - **Unlink** (`remove_file`) and a **rename over** the file wait for a commit in flight,
//!   then detach the session: it is never committed again (its handles go on reading and
//!   writing the orphaned buffer, as POSIX lets an unlinked open file live). No upload of an
//!   older state can land after the unlink: the session's order lock is held across both.
//! - **Rename** of the file (or of a directory above it) commits its dirty bytes, renames in
//!   the store and moves the session to the new name: later writes and commits go there.
//! - **Listings and stats** show live sessions (`stat_live`, `list_live`): a new file exists
//!   from its create on, with the size its handles see.
//!
//! Across clients (processes, hosts) there is no coordination: each commit writes the whole
//! object and the last commit wins (docs/SEMANTICS.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use silt_cache::WriteBuffer;
use silt_common::config::is_at_or_under;
use silt_common::write::WriteType;
use silt_common::{Error, ErrorKind, Result};
use silt_ufs::{DynStore, EntryKind};

use crate::namespace::{parent_and_name, Resolved};
use crate::{Client, Entry, OpenFile, Precondition};

/// How a file is opened for writing ([`Client::open_write`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Create the file if it does not exist (`O_CREAT`).
    pub create: bool,
    /// Fail if it exists (`O_EXCL`, with `create`).
    pub exclusive: bool,
    /// Cut it to zero bytes (`O_TRUNC`).
    pub truncate: bool,
    /// Every write goes at the end (`O_APPEND`).
    pub append: bool,
    /// Load the current bytes now instead of at the first write or read (the library's
    /// `create` does; a FUSE open that may write nothing, like `touch`, does not).
    pub load_now: bool,
    /// A write type for this open (`None`: the prefix's). A file already open for writing
    /// keeps the type of its session.
    pub write_type: Option<WriteType>,
    /// The mode, owner and group a file this open creates gets (`create`; the caller's
    /// credentials and the mode after the umask). Written with its first commit.
    pub create_attrs: silt_ufs::SetAttrs,
}

/// Where a session's bytes go: its namespace path and the store path under its mount.
#[derive(Clone)]
pub(crate) struct Target {
    pub path: String,
    pub rel: String,
    pub store: DynStore,
    pub write_type: WriteType,
}

/// The mutable part of a session, under its state lock (held briefly, never across I/O).
pub(crate) struct State {
    /// `None` until the file's current bytes are loaded (lazily: see [`OpenOptions`]).
    pub buf: Option<WriteBuffer>,
    /// `buf` is also read by someone else (a commit uploading it, or the committed
    /// cache-only file it became): a change goes to a copy first.
    pub shared: bool,
    /// Bytes the store (or Silt, for cache-only and back) does not have yet.
    pub dirty: bool,
    /// Counts replacements of `buf`, so a commit knows whether the buffer it froze is
    /// still the session's.
    pub generation: u64,
}

/// One file being written through this client (module docs).
pub struct Session {
    id: u64,
    table: Weak<SessionTable>,
    pub(crate) target: Mutex<Target>,
    pub(crate) state: Mutex<State>,
    /// Held by whatever changes the file's stored state (loading, commits, the unlink or
    /// rename that ends or moves the session), so they happen one at a time and in order.
    pub(crate) order: tokio::sync::Mutex<()>,
    /// Open handles that may write.
    writers: AtomicUsize,
    /// Live size once loaded (read without the state lock by stat and listings).
    size: AtomicU64,
    loaded: AtomicBool,
    /// Unlinked, or replaced by a rename: never committed again.
    detached: AtomicBool,
    /// When a handle last changed the bytes (ns since the epoch; 0: not since the open).
    modified: AtomicU64,
    /// Attributes set before the file reached the store (a new file's mode and owner, a
    /// chmod of it before its first commit): written with the next commit.
    pending: Mutex<silt_ufs::SetAttrs>,
    /// The S3 headers its commits give the file (a gateway upload's); none: the file has none
    /// (a write replaces an object's headers, as a PUT does).
    headers: Mutex<Option<Arc<silt_ufs::Headers>>>,
    /// What must hold of the stored file for its next commit to happen (an upload's S3
    /// conditions), checked at the commit (`Client::set_precondition`).
    precondition: Mutex<Option<Precondition>>,
}

impl Session {
    pub fn path(&self) -> String {
        self.target.lock().path.clone()
    }

    pub fn write_type(&self) -> WriteType {
        self.target.lock().write_type
    }

    /// The size every handle sees, once the bytes are loaded.
    pub fn live_size(&self) -> Option<u64> {
        self.loaded
            .load(Ordering::Acquire)
            .then(|| self.size.load(Ordering::Acquire))
    }

    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }

    pub fn is_dirty(&self) -> bool {
        self.state.lock().dirty
    }

    /// The entry a stat shows for the file while the session lives: `stored` (the store's
    /// entry, if any) with the live size.
    fn live_entry(&self, stored: Option<Entry>) -> Option<Entry> {
        let size = self.live_size();
        let modified = match self.modified.load(Ordering::Acquire) {
            0 => None,
            ns => Some(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns)),
        };
        let pending = *self.pending.lock();
        let with_pending = |mut e: Entry| {
            e.mode = pending.mode.or(e.mode);
            e.posix.uid = pending.uid.or(e.posix.uid);
            e.posix.gid = pending.gid.or(e.posix.gid);
            e.posix.atime = pending.atime.or(e.posix.atime);
            e.mtime = pending.mtime.or(e.mtime);
            e
        };
        match stored {
            Some(mut e) if !e.is_dir() => {
                if let Some(size) = size {
                    e.size = size;
                }
                e.mtime = modified.or(e.mtime);
                Some(with_pending(e))
            }
            Some(_) => None,
            None => Some(with_pending(Entry {
                path: self.path(),
                kind: EntryKind::File,
                size: size.unwrap_or(0),
                mtime: modified,
                mode: None,
                posix: Default::default(),
                object: None,
            })),
        }
    }

    /// Sets the buffer's length under the state lock and keeps `size` in step.
    fn note_len(&self, len: u64) {
        self.size.store(len, Ordering::Release);
    }
}

/// Now, in ns since the epoch (a session's `modified`).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The live sessions of a client, by current path.
#[derive(Default)]
pub(crate) struct SessionTable {
    by_path: Mutex<HashMap<String, Arc<Session>>>,
    /// Quick "none at all" check for the read path.
    count: AtomicUsize,
    next_id: AtomicU64,
    /// Commits made through this client: a reader pinned to a version checks whether the
    /// file it reads was rewritten here since it opened.
    commits: AtomicU64,
}

impl SessionTable {
    pub fn get(&self, path: &str) -> Option<Arc<Session>> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.by_path.lock().get(path).cloned()
    }

    /// Sessions at or below `path`, ordered by id (the order every multi-session lock takes).
    pub fn at_or_under(&self, path: &str) -> Vec<Arc<Session>> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut v: Vec<_> = self
            .by_path
            .lock()
            .iter()
            .filter(|(p, _)| is_at_or_under(p, path))
            .map(|(_, s)| s.clone())
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// Sessions of files directly in directory `dir`.
    fn children(&self, dir: &str) -> Vec<Arc<Session>> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.by_path
            .lock()
            .iter()
            .filter(|(p, _)| parent_and_name(p).is_some_and(|(d, _)| d == dir))
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// Removes `s` from the table if no writer holds it (a writer joins under the same lock).
    fn remove_idle(&self, s: &Arc<Session>) {
        let mut map = self.by_path.lock();
        let path = s.path();
        let idle = s.writers.load(Ordering::Acquire) == 0;
        if idle && map.get(&path).is_some_and(|cur| Arc::ptr_eq(cur, s)) {
            map.remove(&path);
            self.count.store(map.len(), Ordering::Release);
        }
    }

    /// Removes `s` from the table if it is still the session at its path.
    fn remove(&self, s: &Arc<Session>) {
        let mut map = self.by_path.lock();
        let path = s.path();
        if map.get(&path).is_some_and(|cur| Arc::ptr_eq(cur, s)) {
            map.remove(&path);
            self.count.store(map.len(), Ordering::Release);
        }
    }

    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Acquire)
    }

    pub fn note_commit(&self) {
        self.commits.fetch_add(1, Ordering::AcqRel);
    }
}

/// One open handle on a session. [`Client::close`] closes it (once; later calls do nothing);
/// dropping it unclosed closes it without the last-close commit (what was not committed is
/// lost, as when a process is killed).
pub struct FileWriter {
    session: Arc<Session>,
    append: bool,
    closed: AtomicBool,
}

impl FileWriter {
    /// The file's namespace path now (it follows renames).
    pub fn path(&self) -> String {
        self.session.path()
    }

    /// The size every handle of the file sees (0 until its bytes are loaded).
    pub fn len(&self) -> u64 {
        self.session.live_size().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether there are bytes the store (or Silt, for cache-only and back) does not have yet.
    pub fn is_dirty(&self) -> bool {
        self.session.is_dirty()
    }

    pub fn write_type(&self) -> WriteType {
        self.session.write_type()
    }

    /// Unlinked or replaced by a rename: its writes are never committed.
    pub fn is_detached(&self) -> bool {
        self.session.is_detached()
    }

    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Lets go of the handle; the last writer gone ends the session. Returns whether this
    /// was the last writer.
    fn let_go(&self) -> bool {
        if self.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.session.writers.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        if self.let_go() {
            if let Some(t) = self.session.table.upgrade() {
                t.remove_idle(&self.session);
            }
        }
    }
}

impl Client {
    /// Opens `path` for writing (module docs): joins the file's live session if it has one,
    /// else starts one. `NotFound` without `create`, `AlreadyExists` with `exclusive`,
    /// `IsADirectory` for a directory, `ReadOnly` where no write rule allows writing.
    pub async fn open_write(&self, path: &str, opts: OpenOptions) -> Result<FileWriter> {
        let target = self.writable_target(path, opts.write_type)?;
        let table = &self.writes.sessions;
        let existing = table.get(&target.path);
        let session = match existing {
            Some(_) if opts.exclusive && opts.create => {
                // O_EXCL means something only with O_CREAT (Linux ignores it otherwise).
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{}: file exists", target.path),
                ));
            }
            // Joined under the table's lock (or started anew if it ended meanwhile).
            Some(_) => self.join_or_start(target, false)?,
            None => {
                // A name the cache holds for missing may have been written in the store since
                // the listing that says so: a create that keeps what is there (no truncate) or
                // must be the only one (O_EXCL) asks the store (a `>>` or a `truncate -s`
                // would otherwise replace a file it never saw). A cache-only file never
                // reaches the store: its name is the cache's to give.
                let looked = match self.stat(&target.path).await {
                    Err(e)
                        if e.kind() == ErrorKind::NotFound
                            && opts.create
                            && (opts.exclusive || !opts.truncate)
                            && target.write_type != WriteType::CacheOnly =>
                    {
                        self.stat_store(&target.path).await
                    }
                    r => r,
                };
                let stored = match looked {
                    // Before the directory check: an exclusive create of any existing name,
                    // a directory's too, is EEXIST (open(2)).
                    Ok(_) if opts.exclusive && opts.create => {
                        return Err(Error::new(
                            ErrorKind::AlreadyExists,
                            format!("{}: file exists", target.path),
                        ))
                    }
                    Ok(e) if e.is_dir() => {
                        return Err(Error::new(
                            ErrorKind::IsADirectory,
                            format!("{}: is a directory", target.path),
                        ))
                    }
                    Ok(e) => Some(e),
                    Err(e) if e.kind() == ErrorKind::NotFound && opts.create => None,
                    Err(e) => return Err(e),
                };
                let new_file = stored.is_none();
                if new_file {
                    // A file cannot hold entries: refused now, not at the first commit (a
                    // cache-only or `back` file never asks the store, which would refuse).
                    self.check_no_file_above(&target.path).await?;
                }
                let s = self.join_or_start(target, new_file)?;
                if new_file {
                    *s.pending.lock() = opts.create_attrs;
                }
                s
            }
        };
        let w = FileWriter {
            session,
            append: opts.append,
            closed: AtomicBool::new(false),
        };
        if opts.truncate {
            self.truncate(&w, 0).await?;
        } else if opts.load_now {
            self.load_session(&w.session).await?;
        }
        Ok(w)
    }

    /// Gives the file `w` writes the S3 headers `headers` from its next commit on (an upload
    /// through the gateway): each store keeps them in its own form (`silt_ufs::Headers`), and
    /// every front end reads them with [`Client::headers`].
    pub fn set_headers(&self, w: &FileWriter, headers: silt_ufs::Headers) {
        *w.session.headers.lock() = (!headers.is_empty()).then(|| Arc::new(headers));
    }

    /// Makes the next commit of the file `w` writes happen only if `condition` holds of the
    /// stored file then (S3's conditional writes: the gateway's `If-None-Match: *` and
    /// `If-Match`). It is checked at the commit, against the store, under the lock every
    /// commit, unlink and rename of the name through this client takes: no write of this
    /// client lands between the check and the commit. A change by another client or behind
    /// Silt's back in that instant is not seen (the stores' own conditional writes are not
    /// used). A failed condition fails the commit (`PreconditionFailed`, or `NotFound` for
    /// `If-Match` of a missing file) and changes nothing.
    pub fn set_precondition(&self, w: &FileWriter, condition: Precondition) {
        *w.session.precondition.lock() = Some(condition);
    }

    /// Checks `condition` against what the store holds at `path` now.
    async fn check_precondition(&self, path: &str, condition: &Precondition) -> Result<()> {
        let current = match self.stat_store(path).await {
            Ok(e) => Some(e),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let failed = || {
            Err(Error::new(
                ErrorKind::PreconditionFailed,
                format!("{path}: the file is not as the write's condition requires"),
            ))
        };
        match (condition, current) {
            (Precondition::Absent, Some(_)) => failed(),
            (Precondition::Absent, None) => Ok(()),
            (Precondition::Matches(_), None) => Err(Error::not_found(format!(
                "{path}: no such file (the write's condition names a version of it)"
            ))),
            (Precondition::Matches(ok), Some(e)) if !ok(&e) => failed(),
            (Precondition::Matches(_), Some(_)) => Ok(()),
        }
    }

    /// Starts a **whole-object upload** of `path` (the S3 gateway's PutObject, a completed
    /// multipart upload): a session of its own, empty, that no open joins and nothing reads
    /// until its commit, which replaces the file whole. Two uploads of one path, or an
    /// upload and an open session of it, are then like writers in two clients: each commit
    /// writes a whole object and the last one wins. Dropping the writer unclosed (a body cut
    /// off) leaves the file as it was. `IsADirectory` for a directory, `NotADirectory`
    /// where a file of the namespace sits above `path` (a file cannot hold entries).
    pub async fn open_upload(
        &self,
        path: &str,
        create_attrs: silt_ufs::SetAttrs,
    ) -> Result<FileWriter> {
        let target = self.writable_target(path, None)?;
        let new_file = match self.stat_live(&target.path).await {
            Ok((e, _)) if e.is_dir() => {
                return Err(Error::new(
                    ErrorKind::IsADirectory,
                    format!("{}: is a directory", target.path),
                ))
            }
            Ok(_) => false,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.check_no_file_above(&target.path).await?;
                true
            }
            Err(e) => return Err(e),
        };
        let s = Arc::new(Session {
            id: self.writes.sessions.next_id.fetch_add(1, Ordering::Relaxed),
            // In no table: nothing finds it by path.
            table: Weak::new(),
            target: Mutex::new(target.clone()),
            state: Mutex::new(State {
                buf: Some(self.arena()?.buffer(&target.path)),
                shared: false,
                dirty: true,
                generation: 0,
            }),
            order: tokio::sync::Mutex::new(()),
            writers: AtomicUsize::new(1),
            size: AtomicU64::new(0),
            loaded: AtomicBool::new(true),
            detached: AtomicBool::new(false),
            modified: AtomicU64::new(now_ns()),
            pending: Mutex::new(if new_file {
                create_attrs
            } else {
                silt_ufs::SetAttrs::default()
            }),
            headers: Mutex::new(None),
            precondition: Mutex::new(None),
        });
        Ok(FileWriter {
            session: s,
            append: false,
            closed: AtomicBool::new(false),
        })
    }

    /// `NotADirectory` if a file (stored, or open for writing here) is an ancestor of
    /// `path` inside its mount.
    async fn check_no_file_above(&self, path: &str) -> Result<()> {
        let mut dir = path;
        while let Some((parent, _)) = parent_and_name(dir) {
            if parent == "/" || parent.is_empty() {
                return Ok(());
            }
            match self.stat_live(parent).await {
                Ok((e, _)) if e.is_dir() => return Ok(()),
                Ok(_) => {
                    return Err(Error::new(
                        ErrorKind::NotADirectory,
                        format!("{path}: {parent} is a file"),
                    ))
                }
                Err(e) if e.kind() == ErrorKind::NotFound => dir = parent,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The live session at `target.path` with one more writer, or a new one (`new_file`: the
    /// store has no such file, so it starts loaded, empty and dirty: it exists once closed).
    fn join_or_start(&self, target: Target, new_file: bool) -> Result<Arc<Session>> {
        let table = &self.writes.sessions;
        let mut map = table.by_path.lock();
        if let Some(s) = map.get(&target.path) {
            // Started by a concurrent open meanwhile.
            s.writers.fetch_add(1, Ordering::AcqRel);
            return Ok(s.clone());
        }
        let buf = if new_file {
            Some(self.arena()?.buffer(&target.path))
        } else {
            None
        };
        let s = Arc::new(Session {
            id: table.next_id.fetch_add(1, Ordering::Relaxed),
            table: Arc::downgrade(table),
            target: Mutex::new(target.clone()),
            state: Mutex::new(State {
                buf,
                shared: false,
                dirty: new_file,
                generation: 0,
            }),
            order: tokio::sync::Mutex::new(()),
            writers: AtomicUsize::new(1),
            size: AtomicU64::new(0),
            loaded: AtomicBool::new(new_file),
            detached: AtomicBool::new(false),
            // A new file's times are its creation's (POSIX: create sets them to now).
            modified: AtomicU64::new(if new_file { now_ns() } else { 0 }),
            pending: Mutex::new(silt_ufs::SetAttrs::default()),
            headers: Mutex::new(None),
            precondition: Mutex::new(None),
        });
        if new_file {
            self.dir_times.touch_parent_of(&target.path);
        }
        map.insert(target.path, s.clone());
        table.count.store(map.len(), Ordering::Release);
        Ok(s)
    }

    fn arena(&self) -> Result<&silt_cache::Arena> {
        self.writes
            .arena
            .as_ref()
            .ok_or_else(|| Error::internal("writable client without a write arena"))
    }

    /// Loads the file's current bytes into the session (read through the cache), once.
    async fn load_session(&self, s: &Arc<Session>) -> Result<()> {
        if s.loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        let _order = s.order.lock().await;
        if s.loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        let path = s.path();
        let buf = self.arena()?.buffer(&path);
        // A `back` version uploaded between the open's stat and its look at the resident file
        // is "replaced, retry": the next stat finds the stored version.
        let mut opened = self.open(&path).await;
        for _ in 0..3 {
            match &opened {
                Err(e) if e.kind() == ErrorKind::ContentChanged => opened = self.open(&path).await,
                _ => break,
            }
        }
        let loaded_locally = match &opened {
            Ok(file) => self.load_local(file, &buf).await?,
            Err(_) => false,
        };
        match opened {
            Ok(_) if loaded_locally => {}
            Ok(file) => {
                // Whatever a local load left (the file changed under it) goes first.
                buf.set_len(0)?;
                let chunk = (self.worker.page_size() * 16).max(1 << 20);
                let mut off = 0;
                while off < file.size() {
                    let b = self.read(&file, off, chunk).await?;
                    if b.is_empty() {
                        break;
                    }
                    // Zero pages stay holes (a sparse file loads in the space of its data).
                    let ps = self.worker.page_size().max(1) as usize;
                    for (i, page) in b.chunks(ps).enumerate() {
                        if page.iter().any(|&x| x != 0) {
                            buf.write_at(off + (i * ps) as u64, page)
                                .map_err(|e| e.context(format!("{path}: loading")))?;
                        }
                    }
                    off += b.len() as u64;
                }
                buf.set_len(file.size())?;
            }
            // Removed in the store meanwhile: the file starts empty (and exists once closed).
            Err(e) if e.kind() == ErrorKind::NotFound => s.state.lock().dirty = true,
            Err(e) => return Err(e),
        }
        let mut st = s.state.lock();
        s.note_len(buf.len());
        st.buf = Some(buf);
        st.generation += 1;
        s.loaded.store(true, Ordering::Release);
        Ok(())
    }

    /// Loads `file`'s bytes into `buf` from the store's own file where the store keeps its
    /// files on this host (a local directory): its data only, found with `SEEK_DATA` /
    /// `SEEK_HOLE`, so a terabyte hole costs nothing and no zeros pass through the cache. The
    /// version is checked after the load (size and mtime, a local file's fingerprint). `false`
    /// when there is no such file or it changed meanwhile: the caller loads through the cache.
    async fn load_local(&self, file: &OpenFile, buf: &WriteBuffer) -> Result<bool> {
        let obj = file.object();
        let Some(local) = obj.store.local_file(&obj.meta.path, &obj.meta).await else {
            return Ok(false);
        };
        let (buf, size, want) = (buf.clone(), obj.size(), obj.meta.clone());
        let page = self.worker.page_size().max(1) as usize;
        let path = file.entry.path.clone();
        tokio::task::spawn_blocking(move || -> Result<bool> {
            let loading = |e: std::io::Error| Error::from(e).context(format!("{path}: loading"));
            load_data_extents(&local, &buf, size, page).map_err(loading)?;
            buf.set_len(size)?;
            let md = local.metadata().map_err(loading)?;
            Ok(md.len() == size && md.modified().ok() == want.mtime)
        })
        .await
        .map_err(|e| Error::internal(format!("loading task: {e}")))?
    }

    /// Runs `f` on the session's buffer for a change: copied first if shared, marked dirty.
    fn change<R>(&self, s: &Session, f: impl FnOnce(&WriteBuffer) -> Result<R>) -> Result<R> {
        let mut st = s.state.lock();
        let Some(buf) = st.buf.clone() else {
            return Err(Error::internal(format!(
                "{}: written before its bytes were loaded",
                s.path()
            )));
        };
        let buf = if st.shared {
            let copy = self.copy_buffer(&s.path(), &buf)?;
            st.buf = Some(copy.clone());
            st.shared = false;
            st.generation += 1;
            copy
        } else {
            buf
        };
        let r = f(&buf)?;
        st.dirty = true;
        s.note_len(buf.len());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos().max(1) as u64);
        s.modified.store(now, Ordering::Release);
        Ok(r)
    }

    /// A private copy of `buf` (its reader, an upload or a committed cache-only file, keeps
    /// the original).
    fn copy_buffer(&self, path: &str, buf: &WriteBuffer) -> Result<WriteBuffer> {
        let copy = self.arena()?.buffer(path);
        let len = buf.len();
        // Holes stay holes: a sparse file's copy costs only its data.
        let step = self.worker.page_size().max(1 << 20);
        silt_common::io::copy_sparse(buf, len, step, |off, piece| copy.write_at(off, piece))?;
        copy.set_len(len)?;
        Ok(copy)
    }

    /// Writes `data` at `offset` (at the end for an `O_APPEND` handle), loading the file's
    /// bytes first if needed; returns the offset written at. A gap reads back as zeros.
    pub async fn write(&self, w: &FileWriter, offset: u64, data: &[u8]) -> Result<u64> {
        self.load_session(&w.session).await?;
        self.write_loaded(w, offset, data)
    }

    /// `write` for a handle whose bytes are loaded (the library's `create` loads them).
    /// `NoSpace` when no tier has room.
    pub fn write_at(&self, w: &FileWriter, offset: u64, data: &[u8]) -> Result<()> {
        self.write_loaded(w, offset, data).map(drop)
    }

    fn write_loaded(&self, w: &FileWriter, offset: u64, data: &[u8]) -> Result<u64> {
        let s = &w.session;
        self.change(s, |buf| {
            // The end is read under the state lock: appends of two handles never overlap.
            let at = if w.append { buf.len() } else { offset };
            buf.write_at(at, data)
                .map_err(|e| e.context(format!("{}: writing", s.path())))?;
            Ok(at)
        })
    }

    /// Cuts or extends the file to `len` bytes, for every handle of it.
    pub async fn truncate(&self, w: &FileWriter, len: u64) -> Result<()> {
        let s = &w.session;
        if len == 0 && !s.loaded.load(Ordering::Acquire) {
            // Nothing to load for an empty file.
            let _order = s.order.lock().await;
            if !s.loaded.load(Ordering::Acquire) {
                let mut st = s.state.lock();
                st.buf = Some(self.arena()?.buffer(&s.path()));
                st.generation += 1;
                st.dirty = true;
                s.note_len(0);
                s.loaded.store(true, Ordering::Release);
                return Ok(());
            }
        }
        // Past the largest size: refused before the file's bytes are loaded.
        let max = self.arena()?.max_file_size();
        if len > max {
            return Err(Error::new(
                ErrorKind::FileTooLarge,
                format!(
                    "truncating {} to {len} bytes: past the largest file size, max_file_size = {max} bytes",
                    s.path()
                ),
            ));
        }
        self.load_session(s).await?;
        self.set_len(w, len)
    }

    /// `truncate` for a handle whose bytes are loaded.
    pub fn set_len(&self, w: &FileWriter, len: u64) -> Result<()> {
        let s = &w.session;
        self.change(s, |buf| {
            buf.set_len(len)
                .map_err(|e| e.context(format!("{}: truncating", s.path())))
        })
    }

    /// Reads what the file's handles have written (loading its bytes first if needed).
    pub async fn read_written(&self, w: &FileWriter, offset: u64, len: u64) -> Result<Bytes> {
        self.read_session(&w.session, offset, len).await
    }

    /// Reads a session's bytes (a reader of a file open for writing here sees what its
    /// writers wrote, committed or not).
    pub async fn read_session(&self, s: &Arc<Session>, offset: u64, len: u64) -> Result<Bytes> {
        self.load_session(s).await?;
        let buf = s.state.lock().buf.clone();
        let Some(buf) = buf else {
            return Err(Error::internal("a loaded session without its buffer"));
        };
        let end = offset.saturating_add(len).min(buf.len());
        if offset >= end {
            return Ok(Bytes::new());
        }
        buf.read_at(offset, (end - offset) as usize)
    }

    /// The entry of a session's file as its handles see it, from the session alone (its bytes
    /// loaded first, as `read_session` does): the size its reads end at. For a file unlinked
    /// or replaced by a rename while open (POSIX: still whole, with its writers' bytes, until
    /// its last descriptor closes), the only entry it has: the store's at its old name is gone
    /// or another file's, and a stored version a reader opened before is not what it reads.
    pub async fn session_entry(&self, s: &Arc<Session>) -> Result<Entry> {
        self.load_session(s).await?;
        s.live_entry(None)
            .ok_or_else(|| Error::internal("a session without an entry"))
    }

    /// The live session of the file at `path`, if one is open for writing here.
    pub fn session(&self, path: &str) -> Option<Arc<Session>> {
        self.writes.sessions.get(path)
    }

    /// How many commits this client has made: it changes whenever a file written here may
    /// have a new version (a reader pinned to an older one may look again).
    pub(crate) fn commit_count(&self) -> u64 {
        self.writes.sessions.commits()
    }

    /// Makes the file what its write type promises (`write.rs`) if it has unsaved bytes;
    /// returns its entry. If that fails nothing changed and the bytes stay dirty (a later
    /// commit tries again). A detached (unlinked) file is not committed.
    pub async fn commit(&self, w: &FileWriter) -> Result<Entry> {
        let before = self.commit_count();
        let e = self.commit_session(&w.session).await?;
        if self.commit_count() != before {
            self.tell_changed(&e.path).await;
        }
        Ok(e)
    }

    pub(crate) async fn commit_session(&self, s: &Arc<Session>) -> Result<Entry> {
        let _order = s.order.lock().await;
        self.commit_ordered(s).await
    }

    /// `commit_session` for a caller holding the session's order lock.
    async fn commit_ordered(&self, s: &Arc<Session>) -> Result<Entry> {
        let frozen = {
            let mut st = s.state.lock();
            match (&st.buf, st.dirty && !s.is_detached()) {
                (Some(buf), true) => {
                    let frozen = (buf.clone(), st.generation);
                    st.shared = true;
                    st.dirty = false;
                    Some(frozen)
                }
                _ => None,
            }
        };
        let Some((buf, generation)) = frozen else {
            let path = s.path();
            return match self.stat(&path).await {
                Ok(e) => Ok(s.live_entry(Some(e)).unwrap_or_else(|| Entry {
                    path,
                    kind: EntryKind::File,
                    size: 0,
                    mtime: None,
                    mode: None,
                    posix: Default::default(),
                    object: None,
                })),
                Err(e) if e.kind() == ErrorKind::NotFound || s.is_detached() => s
                    .live_entry(None)
                    .ok_or_else(|| Error::not_found(format!("{path}: no such file"))),
                Err(e) => Err(e),
            };
        };
        let target = s.target.lock().clone();
        let len = buf.len();
        let pending = *s.pending.lock();
        let headers = s.headers.lock().clone();
        let precondition = s.precondition.lock().clone();
        // Every commit holds its name's lock, so a conditional one is decided with no other
        // change of the name through this client in between.
        let name = self.names.lock(&target.path).await;
        let result = async {
            if let Some(c) = &precondition {
                self.check_precondition(&target.path, c).await?;
            }
            // Not knowing the stored attributes fails the commit (the bytes stay dirty):
            // writing defaults would silently reset the file's mode and owner.
            let attrs = self.attrs_for_write(&target, pending).await?;
            self.commit_buffer(&target, &buf, len, &attrs, headers.as_ref())
                .await
        }
        .await;
        drop(name);
        if result.is_ok() {
            // Stored now; a later chmod of the file goes to the store.
            let mut p = s.pending.lock();
            if *p == pending {
                *p = silt_ufs::SetAttrs::default();
            }
        }
        {
            let mut st = s.state.lock();
            let same = st.generation == generation;
            match &result {
                Err(_) => {
                    st.dirty = true;
                    if same {
                        st.shared = false;
                    }
                }
                // A cache-only file's buffer is the file now; an upload is done reading it.
                Ok(_) if same => st.shared = target.write_type == WriteType::CacheOnly,
                Ok(_) => {}
            }
        }
        self.writes.sessions.note_commit();
        let entry = result?;
        Ok(s.live_entry(Some(entry.clone())).unwrap_or(entry))
    }

    /// The attributes a commit writes: those set before the file reached the store, and,
    /// where a write replaces them (S3), the stored version's (a rewrite keeps mode, owner
    /// and group; the mtime becomes the write's).
    async fn attrs_for_write(
        &self,
        target: &Target,
        pending: silt_ufs::SetAttrs,
    ) -> Result<silt_ufs::SetAttrs> {
        if !target.store.capabilities().write_replaces_attrs {
            return Ok(pending);
        }
        let kept = match self.stat(&target.path).await {
            Ok(e) if !e.is_dir() => silt_ufs::SetAttrs {
                mode: e.mode,
                uid: e.posix.uid,
                gid: e.posix.gid,
                atime: None,
                mtime: None,
            },
            // Nothing stored there (yet): the defaults, and what was set before the commit.
            Ok(_) => silt_ufs::SetAttrs::default(),
            Err(e) if e.kind() == ErrorKind::NotFound => silt_ufs::SetAttrs::default(),
            Err(e) => return Err(e.context("reading the attributes a rewrite keeps")),
        };
        Ok(kept.then(pending))
    }

    /// Changes attributes of `path` (`chmod`, `chown`, `utimensat`) for `caller`, under the
    /// POSIX rules of `attrs::check_change`. A file not in the store yet (created here, not
    /// committed) keeps them for its first commit; otherwise the store changes them
    /// (`UnderStore::set_attrs`). Returns the entry as a stat now shows it.
    pub async fn set_attrs(
        &self,
        path: &str,
        caller: &crate::attrs::Caller,
        change: &crate::attrs::AttrChange,
    ) -> Result<Entry> {
        let path = Self::normalize(path)?;
        // Ordered with the file's commits: a change must neither land under an upload in
        // flight (on S3 it rewrites the object: old bytes would undo the upload) nor be
        // missed by the next commit.
        let session = self.session(&path);
        let _order = match &session {
            Some(s) => Some(s.order.lock().await),
            None => None,
        };
        let (cur, _) = self.stat_live(&path).await?;
        let set = crate::attrs::check_change(caller, &cur, change)?;
        if set.is_empty() {
            return Ok(cur);
        }
        let writable = if cur.is_dir() {
            self.write_rules().writable_at_or_below(&path)
        } else {
            self.write_type_of(&path).writable()
        };
        if !writable {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{path}: read-only"),
            ));
        }
        if let Some(s) = &session {
            if cur.object.is_none() {
                {
                    let mut p = s.pending.lock();
                    *p = p.then(set);
                }
                return self.stat_live(&path).await.map(|(e, _)| e);
            }
        }
        let (mount, rel) = match self.ns.resolve(&path)? {
            Resolved::Store { mount, rel } => (mount, rel),
            Resolved::Synthetic { .. } => {
                return Err(Error::new(
                    ErrorKind::NotPermitted,
                    format!("{path}: not inside a mount (its attributes are fixed)"),
                ))
            }
        };
        let asked = self.opts.clock.now();
        let meta = mount.store.set_attrs(&rel, &set).await.map_err(|e| {
            if e.kind() == ErrorKind::Unsupported {
                // POSIX has no "the file system cannot": EPERM is what chmod(1) reports.
                Error::new(ErrorKind::NotPermitted, e.to_string())
            } else {
                e
            }
        })?;
        if set.atime.is_some() || set.mtime.is_some() {
            self.dir_times.forget(&path);
        }
        let entry = Entry::from_meta(path.clone(), &mount.store, meta);
        let changes = self.meta.put_stat(asked, entry);
        self.apply(&changes);
        drop(_order);
        self.tell_changed(&path).await;
        self.stat_live(&path).await.map(|(e, _)| e)
    }

    /// Closes a handle: the last writer of a file commits what is still dirty and ends the
    /// session. A failed last commit ends it too (reported here; the bytes are lost).
    pub async fn close(&self, w: &FileWriter) -> Result<()> {
        if !w.let_go() {
            return Ok(());
        }
        let s = w.session.clone();
        let _order = s.order.lock().await;
        // A writer that joined meanwhile keeps the session (and commits at its close).
        if s.writers.load(Ordering::Acquire) > 0 {
            return Ok(());
        }
        let before = self.commit_count();
        let r = self.commit_ordered(&s).await.map(drop);
        self.writes.sessions.remove_idle(&s);
        drop(_order);
        if r.is_ok() && self.commit_count() != before && !s.is_detached() {
            self.tell_changed(&s.path()).await;
        }
        r
    }

    /// `stat` as the file's writers see it: a file open for writing here has their size, and
    /// a new one exists from its create on. The flag says a live session answered (its size
    /// changes with every write: a kernel must not cache it).
    pub async fn stat_live(&self, path: &str) -> Result<(Entry, bool)> {
        let path = Self::normalize(path)?;
        let session = self.session(&path);
        let stored = match self.stat(&path).await {
            Ok(e) => Some(e),
            Err(e) if e.kind() == ErrorKind::NotFound && session.is_some() => None,
            Err(e) => return Err(e),
        };
        match session.and_then(|s| s.live_entry(stored.clone())) {
            Some(e) => Ok((e, true)),
            None => stored
                .map(|e| (self.dir_times.apply(e), false))
                .ok_or_else(|| Error::not_found(format!("{path}: no such file or directory"))),
        }
    }

    /// `list` with the live sizes of files open for writing here and the new files not
    /// committed yet.
    pub async fn list_live(&self, path: &str) -> Result<Arc<Vec<Entry>>> {
        let list = self.list(path).await?;
        let dir = Self::normalize(path)?;
        let live = self.writes.sessions.children(&dir);
        let moved = !self.dir_times.is_empty() && list.iter().any(|e| e.is_dir());
        if live.is_empty() && !moved {
            return Ok(list);
        }
        let mut v: Vec<Entry> = list
            .iter()
            .map(|e| self.dir_times.apply(e.clone()))
            .collect();
        for s in live {
            let p = s.path();
            let Some((_, name)) = parent_and_name(&p) else {
                continue;
            };
            match v.binary_search_by(|e| e.name().cmp(name)) {
                Ok(i) => {
                    if let Some(e) = s.live_entry(Some(v[i].clone())) {
                        v[i] = e;
                    }
                }
                Err(i) => {
                    if let Some(e) = s.live_entry(None) {
                        v.insert(i, e);
                    }
                }
            }
        }
        Ok(Arc::new(v))
    }

    /// Truncates the file at `path` (`truncate(2)`): through its live session if it has one
    /// (every handle sees the new size; committed at their close), else as a rewrite now.
    pub async fn truncate_path(&self, path: &str, len: u64) -> Result<()> {
        let w = self
            .open_write(
                path,
                OpenOptions {
                    truncate: len == 0,
                    ..Default::default()
                },
            )
            .await?;
        let others = w.session.writers.load(Ordering::Acquire) > 1;
        let r = match self.truncate(&w, len).await {
            Ok(()) if others => Ok(()),
            Ok(()) => self.commit(&w).await.map(drop),
            Err(e) => Err(e),
        };
        let closed = self.close(&w).await;
        r.and(closed)
    }

    /// Deletes a file (`unlink`): a session of it is detached first (after any commit in
    /// flight), so nothing written before can land after the delete.
    pub async fn remove_file(&self, path: &str) -> Result<()> {
        let path = Self::normalize(path)?;
        let r = self.remove_file_inner(&path).await;
        if r.is_ok() {
            self.dir_times.touch_parent_of(&path);
            self.tell_changed(&path).await;
        }
        r
    }

    async fn remove_file_inner(&self, path: &str) -> Result<()> {
        let path = path.to_string();
        let Some(s) = self.session(&path) else {
            let _name = self.names.lock(&path).await;
            return self.remove_stored(&path).await;
        };
        // Its descriptors go on reading it (POSIX): bytes a session has not loaded yet are
        // loaded while its name still holds them; once detached, the name is another file's.
        self.load_session(&s).await?;
        let _order = s.order.lock().await;
        s.detached.store(true, Ordering::Release);
        self.writes.sessions.remove(&s);
        let removed = {
            let _name = self.names.lock(&path).await;
            self.remove_stored(&path).await
        };
        match removed {
            // A new file not committed yet: only its handles had it.
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => {
                s.detached.store(false, Ordering::Release);
                self.writes.sessions.reinsert(&s);
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    }

    /// Makes directory `path`; a file being created there (not committed yet) exists.
    pub async fn mkdir(&self, path: &str) -> Result<Entry> {
        let p = Self::normalize(path)?;
        if self.session(&p).is_some() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{p}: file exists (open for writing)"),
            ));
        }
        let e = self.mkdir_stored(&p).await?;
        self.dir_times.touch_parent_of(&p);
        self.tell_changed(&p).await;
        Ok(e)
    }

    /// `mkdir` giving the directory `attrs` (the caller's mode after the umask, owner and
    /// group) where the store keeps them (a local directory; an S3 prefix keeps none).
    pub async fn mkdir_attrs(&self, path: &str, attrs: &silt_ufs::SetAttrs) -> Result<Entry> {
        let e = self.mkdir(path).await?;
        if attrs.is_empty() {
            return Ok(e);
        }
        let Ok(Resolved::Store { mount, rel }) = self.ns.resolve(&e.path) else {
            return Ok(e);
        };
        let asked = self.opts.clock.now();
        match mount.store.set_attrs(&rel, attrs).await {
            Ok(meta) => {
                let entry = Entry::from_meta(e.path.clone(), &mount.store, meta);
                let changes = self.meta.put_stat(asked, entry.clone());
                self.apply(&changes);
                self.tell_changed(&entry.path).await;
                Ok(entry)
            }
            Err(err) => {
                tracing::debug!(path = %e.path, "new directory keeps default attributes: {err}");
                Ok(e)
            }
        }
    }

    /// Removes the empty directory `path`; a file being created below it makes it not empty.
    pub async fn rmdir(&self, path: &str) -> Result<()> {
        let p = Self::normalize(path)?;
        if self.session(&p).is_some() {
            return Err(Error::new(
                ErrorKind::NotADirectory,
                format!("{p}: not a directory (a file open for writing)"),
            ));
        }
        if self
            .writes
            .sessions
            .at_or_under(&p)
            .iter()
            .any(|s| s.path() != p)
        {
            return Err(Error::new(
                ErrorKind::NotEmpty,
                format!("{p}: directory not empty (a file in it is open for writing)"),
            ));
        }
        self.rmdir_stored(&p).await?;
        // A directory made later at this path is another one: none of this one's times.
        self.dir_times.forget_under(&p);
        self.dir_times.touch_parent_of(&p);
        self.tell_changed(&p).await;
        Ok(())
    }

    /// Renames a file or directory (`Client::rename_stored` for the store side). Files open
    /// for writing at or below `from` commit their dirty bytes first and follow the rename;
    /// a file open for writing at `to` is replaced (detached, as by an unlink).
    pub async fn rename(&self, from: &str, to: &str) -> Result<Entry> {
        self.rename_with(from, to, false).await
    }

    /// `rename` that fails with `AlreadyExists` if anything is at `to` (`RENAME_NOREPLACE`),
    /// decided under the names' locks: no commit, unlink or rename of `to` through this
    /// client lands between the check and the rename, and a file being created there (not
    /// committed yet) counts. Something put at `to` behind Silt's back in that instant is
    /// replaced (no store renames conditionally).
    pub async fn rename_noreplace(&self, from: &str, to: &str) -> Result<Entry> {
        self.rename_with(from, to, true).await
    }

    async fn rename_with(&self, from: &str, to: &str, noreplace: bool) -> Result<Entry> {
        let from = Self::normalize(from)?;
        let to = Self::normalize(to)?;
        // Before anything is committed (commits are not undone), and again under the locks.
        if noreplace {
            // POSIX's order: a missing source is ENOENT before an existing target is EEXIST.
            self.stat_live(&from).await?;
            self.nothing_at(&to).await?;
        }
        if from == to {
            // A file being written counts as there, committed or not (cache-only files are
            // not in the store before their first commit).
            return self.stat_live(&from).await.map(|(e, _)| e);
        }
        let table = &self.writes.sessions;
        let moving = table.at_or_under(&from);
        let below_to: Vec<_> = table
            .at_or_under(&to)
            .into_iter()
            .filter(|s| !is_at_or_under(&s.path(), &from))
            .collect();
        if !moving.is_empty() || !below_to.is_empty() {
            // Commits below are not undone: a rename that will fail must fail before them
            // (and a file being created in the target directory makes it not empty).
            self.rename_precheck(&from, &to).await?;
        }
        // A file open for writing that the rename replaces keeps its bytes for its descriptors
        // (as at `remove_file`): loaded now, while its name still holds them.
        for s in &below_to {
            self.load_session(s).await?;
        }
        // Every involved session's order lock, in id order (as every multi-session lock).
        let mut all: Vec<&Arc<Session>> = moving.iter().chain(below_to.iter()).collect();
        all.sort_by_key(|s| s.id);
        let mut guards = Vec::with_capacity(all.len());
        for s in &all {
            guards.push(s.order.lock().await);
        }
        // Where each moving session goes, known (and allowed) before anything changes.
        let mut targets = Vec::with_capacity(moving.len());
        for s in &moving {
            let new = format!("{to}{}", &s.path()[from.len()..]);
            let write_type = s.write_type();
            let mut target = self.writable_target(&new, Some(write_type))?;
            target.write_type = write_type;
            targets.push(target);
        }
        for s in &moving {
            self.commit_ordered(s).await?;
        }
        let entry = {
            let _names = self.names.lock_two(&from, &to).await;
            if noreplace {
                self.nothing_at(&to).await?;
            }
            self.rename_stored(&from, &to).await?
        };
        self.dir_times.rename(&from, &to);
        self.dir_times.touch_parent_of(&from);
        self.dir_times.touch_parent_of(&to);
        for s in &below_to {
            s.detached.store(true, Ordering::Release);
            table.remove(s);
        }
        for (s, target) in moving.iter().zip(targets) {
            table.remove(s);
            *s.target.lock() = target;
            table.reinsert(s);
        }
        drop(guards);
        // What the SDK's rename told the owner: both directories, and what lies in `to` (a
        // directory may have replaced an empty one the owner had listed).
        self.tell_changed(&from).await;
        self.tell_changed(&to).await;
        self.tell_changed_within(&to).await;
        Ok(entry)
    }
}

impl Client {
    /// `AlreadyExists` if anything is at `path` in the live view (a file being created too).
    async fn nothing_at(&self, path: &str) -> Result<()> {
        match self.stat_live(path).await {
            Ok(_) => Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{path}: file exists (a rename that replaces nothing)"),
            )),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The errors `rename_stored` would give for reasons other than the store's, from the live
    /// view (files being created count).
    async fn rename_precheck(&self, from: &str, to: &str) -> Result<()> {
        let fail = |kind, why: &str| Err(Error::new(kind, format!("rename {from} to {to}: {why}")));
        if is_at_or_under(to, from) {
            return fail(
                ErrorKind::InvalidInput,
                "a directory cannot move into itself",
            );
        }
        let (src, _) = self.stat_live(from).await?;
        let dst = match self.stat_live(to).await {
            Ok((e, _)) => Some(e),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        match (src.is_dir(), dst) {
            (false, Some(d)) if d.is_dir() => {
                fail(ErrorKind::IsADirectory, "the target is a directory")
            }
            (true, Some(d)) if !d.is_dir() => {
                fail(ErrorKind::NotADirectory, "the target is not a directory")
            }
            (true, Some(_)) if !self.list_live(to).await?.is_empty() => {
                fail(ErrorKind::NotEmpty, "the target is not empty")
            }
            _ => Ok(()),
        }
    }
}

impl SessionTable {
    /// Puts `s` back at its current path (after a failed unlink, or a rename).
    fn reinsert(&self, s: &Arc<Session>) {
        if s.is_detached() {
            return;
        }
        let mut map = self.by_path.lock();
        map.insert(s.path(), s.clone());
        self.count.store(map.len(), Ordering::Release);
    }
}

/// Copies the data extents of the first `size` bytes of `f` into `buf` at the same offsets,
/// `page` bytes at a time, leaving holes (and all-zero pages) as holes.
fn load_data_extents(
    f: &std::fs::File,
    buf: &WriteBuffer,
    size: u64,
    page: usize,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let seek = |from: u64, whence: libc::c_int| -> std::io::Result<Option<u64>> {
        let from = libc::off_t::try_from(from).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: lseek on a descriptor `f` owns for the whole call; no memory is passed.
        let at = unsafe { libc::lseek(f.as_raw_fd(), from, whence) };
        if at >= 0 {
            return Ok(Some(at as u64));
        }
        match std::io::Error::last_os_error() {
            // No data past `from`.
            e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
            e => Err(e),
        }
    };
    let mut chunk = vec![0u8; page * 16];
    let mut off = 0;
    while off < size {
        let Some(data) = seek(off, libc::SEEK_DATA)?.filter(|&d| d < size) else {
            break;
        };
        let end = seek(data, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        // Whole pages, aligned to the file's: the buffer keeps pages.
        let mut at = data - data % page as u64;
        while at < end {
            let n = ((end - at) as usize).min(chunk.len());
            let got = &mut chunk[..n];
            f.read_exact_at(got, at)?;
            for (i, p) in got.chunks(page).enumerate() {
                if p.iter().any(|&x| x != 0) {
                    buf.write_at(at + (i * page) as u64, p)
                        .map_err(|e| std::io::Error::other(e.to_string()))?;
                }
            }
            at += n as u64;
        }
        off = end;
    }
    Ok(())
}
