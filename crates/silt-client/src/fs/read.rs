//! Read handles: which version each reads, and whether a local file serves it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use silt_common::{metrics, Error, ErrorKind, ObjectId, Result};

use super::inodes::{HandleMode, LoggedBacking};
use super::{bad_handle, Answer, Attr, FileSystem, LOCAL_RELEASE_WAIT};
use crate::{OpenFile, Session};

pub(crate) struct ReadHandle {
    /// The version this handle reads (`None`: a file not in the store yet, see `live`), with
    /// the client's commit count when it was chosen; replaced when the file was rewritten
    /// through this client since (see `current_file`).
    pub(crate) file: Mutex<(Option<Arc<OpenFile>>, u64)>,
    /// The write session of the file when this handle opened it, or when the file was
    /// unlinked or renamed over while open for writing (`hand_session_to_readers`): read once
    /// the file has no name (its bytes outlive an unlink, as an open file does).
    live: Mutex<Option<Arc<Session>>>,
    path: String,
    ino: u64,
    /// Keeps the version's disk pages from eviction while the front end reads its local file.
    _pin: Option<Box<dyn Send + Sync>>,
    local: bool,
}

impl ReadHandle {
    fn new(
        ino: u64,
        path: String,
        file: (Option<Arc<OpenFile>>, u64),
        live: Option<Arc<Session>>,
        pin: Option<Box<dyn Send + Sync>>,
        local: bool,
    ) -> Self {
        ReadHandle {
            file: Mutex::new(file),
            live: Mutex::new(live),
            path,
            ino,
            _pin: pin,
            local,
        }
    }
}

/// How an open read handle is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenedAs {
    /// The front end reads the local file it registered as `id` (FUSE passthrough); `origin`
    /// says where the file came from, `filled` whether the open fetched it whole first,
    /// `from_store` whether it is the store's own file.
    LocalFile {
        id: u32,
        origin: &'static str,
        filled: bool,
        from_store: bool,
    },
    /// Reads come to the core (`FileSystem::read`). `keep_cache`: pages the front end cached
    /// of this inode are of the version opened; `new_version`: the first open of a stored
    /// version here (not a file open for writing, which has none); `reason`: why no local
    /// file.
    Core {
        keep_cache: bool,
        new_version: bool,
        reason: &'static str,
    },
}

/// A read handle opened.
#[derive(Debug, Clone)]
pub struct Opened {
    pub fh: u64,
    pub path: String,
    pub how: OpenedAs,
}

/// One local file registered with the front end, shared by every local-file handle of an
/// inode. Its id lives in the inode log until the last handle is released, when it is
/// closed: never by a process's exit, so a process taking over goes on with it.
struct Registered {
    logged: LoggedBacking,
    handles: usize,
}

/// Where a local-file handle reading the store's own file got it.
const FROM_SOURCE: &str = "the store's own file (the cache filled behind)";

/// How each open inode is read: through registered local files or through the core, never
/// both (Linux's FUSE io modes refuse either next to the other with EIO, so the choice is
/// made under one lock from this record); and which version the front end's cache holds.
#[derive(Default)]
pub struct LocalFiles {
    state: Mutex<LocalState>,
    /// Signalled when an inode's last local-file handle is released.
    released: Condvar,
}

#[derive(Default)]
struct LocalState {
    registered: HashMap<u64, Registered>,
    /// Handles read through the core, per inode.
    core: HashMap<u64, usize>,
    /// The version whose pages the front end may hold cached, per inode.
    cached: HashMap<u64, ObjectId>,
    /// Handles an earlier process opened through the core and this one has not reopened:
    /// counted in `core` from the start. fh -> inode.
    inherited: HashMap<u64, u64>,
}

fn busy(path: &str) -> Error {
    Error::new(
        ErrorKind::Busy,
        format!("{path}: open for reading from a local file (passthrough)"),
    )
}

impl LocalFiles {
    pub(super) fn inherit_core_handles(&self, handles: Vec<(u64, u64)>) {
        let mut s = self.state.lock();
        for &(_, ino) in &handles {
            *s.core.entry(ino).or_insert(0) += 1;
        }
        s.inherited = handles.into_iter().collect();
    }

    /// The front end holds no page of a stored version of `ino` any more (it forgot the
    /// inode, or the inode is being written here): its next open gets no `keep_cache`.
    pub(super) fn forget(&self, ino: u64) {
        self.state.lock().cached.remove(&ino);
    }

    /// Counts a handle read through the core; `false` if the inode has a local file, which
    /// the front end would refuse such a handle for.
    fn open_core(&self, ino: u64) -> bool {
        let mut s = self.state.lock();
        if s.registered.contains_key(&ino) {
            return false;
        }
        *s.core.entry(ino).or_insert(0) += 1;
        true
    }

    /// `open_core` for a handle that must be read through the core: a local-file handle
    /// closed but not yet released (FUSE sends RELEASE after close(2) returns) is waited for,
    /// up to `LOCAL_RELEASE_WAIT`; a file still read from a local file then is `EBUSY`.
    pub(super) fn open_core_waiting(&self, ino: u64, path: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + LOCAL_RELEASE_WAIT;
        let mut s = self.state.lock();
        while s.registered.contains_key(&ino) {
            if self.released.wait_until(&mut s, deadline).timed_out() {
                return Err(busy(path));
            }
        }
        *s.core.entry(ino).or_insert(0) += 1;
        Ok(())
    }

    pub(super) fn release_core(&self, ino: u64) {
        let mut s = self.state.lock();
        if let Some(n) = s.core.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                s.core.remove(&ino);
            }
        }
    }

    /// Waits, up to `LOCAL_RELEASE_WAIT`, until `ino` has no local file of a version other
    /// than `object` (a reader that closed the old version just before may still count).
    fn wait_other_version_released(&self, ino: u64, object: ObjectId) {
        let deadline = std::time::Instant::now() + LOCAL_RELEASE_WAIT;
        let mut s = self.state.lock();
        while s
            .registered
            .get(&ino)
            .is_some_and(|b| b.logged.object != object)
        {
            if self.released.wait_until(&mut s, deadline).timed_out() {
                return;
            }
        }
    }
}

/// Counts one more handle on the inode's local file and returns it, with where it came from,
/// if there is one for this version the new handle may use: a leased copy, the store's own
/// file, or a local file this open has pinned. `Err` when one exists that it may not use.
fn share(
    s: &mut LocalState,
    ino: u64,
    object: ObjectId,
    pinned_locally: bool,
) -> std::result::Result<Option<(u32, &'static str)>, &'static str> {
    if s.core.get(&ino).is_some_and(|n| *n > 0) {
        return Err("file open through the daemon by another handle");
    }
    let Some(b) = s.registered.get_mut(&ino) else {
        return Ok(None);
    };
    if b.logged.object != object {
        return Err("older version of the file still open");
    }
    if !(b.logged.leased || pinned_locally) {
        return Err("not fully cached on local disk");
    }
    b.handles += 1;
    let origin = if b.logged.source {
        FROM_SOURCE
    } else {
        "shared with an open handle"
    };
    Ok(Some((b.logged.id, origin)))
}

/// A local-file open: its registered id, the guard keeping its bytes in place, its origin.
type LocalOpen = (u32, Box<dyn Send + Sync>, &'static str);

/// One of `FileSystem::filling`'s slots, given back when dropped.
struct FillSlot<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for FillSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The versions being filled behind readers of the store's own file: each version once at a
/// time, at most a given number at once.
#[derive(Default)]
pub(crate) struct BehindSlots(Mutex<HashSet<ObjectId>>);

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

struct BehindSlot {
    slots: Arc<BehindSlots>,
    object: ObjectId,
}

impl Drop for BehindSlot {
    fn drop(&mut self) {
        self.slots.0.lock().remove(&self.object);
    }
}

impl FileSystem {
    fn insert_reader(&self, fh: u64, h: ReadHandle) {
        let (ino, local) = (h.ino, h.local);
        metrics::FUSE_HANDLES.inc();
        self.handles.lock().insert(fh, h);
        // Logged before the front end learns of it: a process taking over must know every
        // handle read through a local file.
        let mode = if local {
            HandleMode::Passthrough
        } else {
            HandleMode::Daemon
        };
        self.inodes.lock().handle(fh, Some((ino, mode)));
    }

    /// The write session of `path` if it is open for writing here (a reader reads it), and
    /// the stored version (none when the file being written is not stored yet).
    #[allow(clippy::type_complexity)]
    fn session_and_version(
        &self,
        path: &str,
    ) -> Result<(Option<Arc<Session>>, Option<Arc<OpenFile>>)> {
        let session = self.client.session(path);
        let file = match self.block(self.client.open(path)) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) if session.is_some() && e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok((session, file))
    }

    /// Opens `ino` for reading.
    pub fn open_read(&self, ino: u64) -> Result<Opened> {
        let path = self.path_of(ino)?;
        let (session, file) = self.session_and_version(&path)?;
        // Only a file the store has can be read from a local file.
        let file = match (file, session) {
            (Some(f), None) => f,
            (file, session) => {
                self.local.open_core_waiting(ino, &path)?;
                self.local.forget(ino);
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                let commits = self.client.commit_count();
                let h = ReadHandle::new(ino, path.clone(), (file, commits), session, None, false);
                self.insert_reader(fh, h);
                let how = OpenedAs::Core {
                    keep_cache: false,
                    new_version: false,
                    reason: "file open for writing here",
                };
                return Ok(Opened { fh, path, how });
            }
        };
        // If this open learned of a change, the front end must drop the old attributes (size)
        // before reading, or it would cut the new version at the old size.
        self.frontend.caught_up();
        self.local
            .wait_other_version_released(ino, file.object().id);
        let filled = self.fill_for_local_file(ino, &file);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let commits = self.client.commit_count();
        let local = self
            .try_local_file(ino, &file)
            .or_else(|reason| self.try_source_file(ino, &file).ok_or(reason));
        match local {
            Ok((id, pin, origin)) => {
                let origin = if filled {
                    "fetched whole at open"
                } else {
                    origin
                };
                let from_store = origin == FROM_SOURCE;
                self.client.count_passthrough_read(file.size(), from_store);
                let h = ReadHandle::new(
                    ino,
                    path.clone(),
                    (Some(file), commits),
                    None,
                    Some(pin),
                    true,
                );
                self.insert_reader(fh, h);
                let how = OpenedAs::LocalFile {
                    id,
                    origin,
                    filled,
                    from_store,
                };
                Ok(Opened { fh, path, how })
            }
            Err(reason) => {
                if self.local.open_core_waiting(ino, &path).is_err() {
                    // Read from a local file this open cannot use (another version): the front
                    // end would fail a core open of it anyway.
                    return Err(Error::new(ErrorKind::Busy, format!("{path}: {reason}")));
                }
                let id = file.object().id;
                let keep_cache = self.local.state.lock().cached.insert(ino, id) == Some(id);
                let h =
                    ReadHandle::new(ino, path.clone(), (Some(file), commits), None, None, false);
                self.insert_reader(fh, h);
                let how = OpenedAs::Core {
                    keep_cache,
                    new_version: !keep_cache,
                    reason,
                };
                Ok(Opened { fh, path, how })
            }
        }
    }

    /// Reads `size` bytes at `offset` through handle `fh` of inode `ino`.
    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u64) -> Result<Bytes> {
        if let Some(h) = self.write_handle(fh) {
            // Open for reading and writing: what the file's handles wrote.
            return self.block(self.client.read_written(&h.writer, offset, size));
        }
        // A file open for writing here: its session's bytes, committed or not (the session
        // open now; for a file unlinked or replaced since, the one open when this handle
        // opened it or when the file lost its name, if any: those bytes are that file's).
        let known = self
            .handles
            .lock()
            .get(&fh)
            .map(|h| (h.live.lock().clone(), h.path.clone(), h.file.lock().clone()));
        let (held, path, pinned) = match known {
            Some(k) => k,
            None => self.reopen_old_handle(fh, ino)?,
        };
        // The file's path now (it follows renames); none once the file was unlinked or
        // replaced: a new file at its old name is not this handle's file.
        let attached = self.inodes.lock().attached_path(ino);
        let session = match attached.as_deref() {
            Some(p) => self.client.session(p),
            None => held,
        };
        if let Some(s) = session {
            return self.block(self.client.read_session(&s, offset, size));
        }
        let file = self.current_file(fh, attached.as_deref(), &path, pinned)?;
        match self.client.read_blocking(&file, offset, size) {
            Ok(bytes) => {
                metrics::FUSE_READ_BYTES.add(bytes.len() as u64);
                Ok(bytes)
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
                // The version this handle has is gone from the store and its pages are not
                // cached: stale, as for a replaced object. ENOENT is no answer to read(2).
                if e.kind() == ErrorKind::NotFound {
                    return Err(Error::new(ErrorKind::Stale, e.to_string()));
                }
                Err(e)
            }
        }
    }

    pub(super) fn release_reader(&self, fh: u64) {
        if let Some(h) = self.handles.lock().remove(&fh) {
            metrics::FUSE_HANDLES.dec();
            if h.local {
                self.release_local_file(h.ino);
            } else {
                self.local.release_core(h.ino);
            }
            return;
        }
        let inherited = self.local.state.lock().inherited.remove(&fh);
        if let Some(ino) = inherited {
            // An earlier process's handle, never read here: its count goes.
            self.local.release_core(ino);
        }
    }

    /// A read handle an earlier process opened (the front end keeps its handles across a
    /// takeover): opened again by its inode's path, under the same number. It reads the
    /// file's current version.
    #[allow(clippy::type_complexity)]
    fn reopen_old_handle(
        &self,
        fh: u64,
        ino: u64,
    ) -> Result<(Option<Arc<Session>>, String, (Option<Arc<OpenFile>>, u64))> {
        if fh >= self.fh_base {
            return Err(bad_handle(fh));
        }
        let path = self.path_of(ino)?;
        let (session, file) = self.session_and_version(&path)?;
        // A handle the log has was counted at the takeover; the count goes to this handle.
        let inherited = self.local.state.lock().inherited.remove(&fh).is_some();
        let counted = inherited || self.local.open_core(ino);
        let commits = self.client.commit_count();
        let mut hs = self.handles.lock();
        match hs.entry(fh) {
            std::collections::hash_map::Entry::Occupied(_) => {
                // Another read reopened it first.
                if counted {
                    self.local.release_core(ino);
                }
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                metrics::FUSE_HANDLES.inc();
                v.insert(ReadHandle::new(
                    ino,
                    path,
                    (file, commits),
                    session,
                    None,
                    false,
                ));
            }
        }
        let h = hs.get(&fh).ok_or_else(|| bad_handle(fh))?;
        let pinned = h.file.lock().clone();
        let live = h.live.lock().clone();
        Ok((live, h.path.clone(), pinned))
    }

    /// The version a read handle reads now: the one it opened, unless the file was committed
    /// through this client since and its current version is another.
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

    /// `fstat` through read handle `fh`: the version it reads now (`None` if it is not a
    /// read handle of `ino` holding a version).
    pub(super) fn handle_answer(&self, ino: u64, fh: u64) -> Option<Answer> {
        let (opened_as, pinned) = self
            .handles
            .lock()
            .get(&fh)
            .map(|h| (h.path.clone(), h.file.lock().clone()))?;
        pinned.0.as_ref()?;
        let attached = self.inodes.lock().attached_path(ino);
        let f = self
            .current_file(fh, attached.as_deref(), &opened_as, pinned)
            .ok()?;
        Some(self.answer(ino, &f.entry, false))
    }

    /// The version some read handle of `ino` holds.
    pub(super) fn held_version(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.handles
            .lock()
            .values()
            .find(|h| h.ino == ino)
            .and_then(|h| h.file.lock().0.clone())
    }

    /// The attributes of a file unlinked (or replaced by a rename) whose read handle holds a
    /// write session: that handle reads the session, so its size is the session's, not that
    /// of a stored version it may have opened too. The handle `fh`, else any read handle of
    /// the inode holding a session.
    pub(super) fn detached_read_attr(&self, ino: u64, fh: Option<u64>) -> Option<Attr> {
        if self.inodes.lock().attached_path(ino).is_some() {
            return None;
        }
        let session = {
            let handles = self.handles.lock();
            fh.and_then(|fh| handles.get(&fh))
                .filter(|h| h.ino == ino && h.live.lock().is_some())
                .or_else(|| {
                    handles
                        .values()
                        .find(|h| h.ino == ino && h.live.lock().is_some())
                })
                .and_then(|h| h.live.lock().clone())
        }?;
        let e = self.block(self.client.session_entry(&session)).ok()?;
        Some(self.attr(ino, &e))
    }

    /// Just before `path` stops naming its file (unlink, renamed over): the read handles of
    /// its inode keep what the name holds now (POSIX: the open file). Its write session if
    /// one is open, returned with the inode, to hand them once the client has detached it
    /// (`hand_session_to_readers`); else each handle moves to the newest version and drops a
    /// session it held from an earlier writer.
    pub(super) fn readers_before_detach(&self, path: &str) -> Option<(u64, Arc<Session>)> {
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
    /// inode reads that session from now on.
    pub(super) fn hand_session_to_readers(&self, taken: Option<(u64, Arc<Session>)>) {
        let Some((ino, session)) = taken else {
            return;
        };
        for h in self.handles.lock().values().filter(|h| h.ino == ino) {
            *h.live.lock() = Some(session.clone());
        }
    }

    /// Takes over a local file an earlier process left registered on inode `ino`, with its
    /// handles `fhs`: the front end goes on reading that file for them and refuses another
    /// for the inode, so later opens of the same version share it, its cache pages stay
    /// pinned while a handle lives, and the last release closes it. A local file no handle
    /// holds any more is closed now.
    pub(super) fn adopt_local_file(&self, ino: u64, b: LoggedBacking, fhs: &[u64]) {
        if fhs.is_empty() {
            self.frontend.close_local_file(b.id);
            self.inodes.lock().backing(ino, None);
            return;
        }
        let path = self.inodes.lock().path(ino).unwrap_or_default();
        let mut handles = self.handles.lock();
        for &fh in fhs {
            let pin: Option<Box<dyn Send + Sync>> = (!b.leased)
                .then(|| Box::new(self.client.keep_cached(b.object)) as Box<dyn Send + Sync>);
            metrics::FUSE_HANDLES.inc();
            handles.insert(
                fh,
                ReadHandle::new(ino, path.clone(), (None, 0), None, pin, true),
            );
        }
        self.local.state.lock().registered.insert(
            ino,
            Registered {
                logged: b,
                handles: fhs.len(),
            },
        );
    }

    /// Registers `ino`'s local file `logged` with its first handle (under the state's lock),
    /// logged before any open uses it.
    fn insert_local_file(&self, s: &mut LocalState, ino: u64, logged: LoggedBacking) {
        self.inodes.lock().backing(ino, Some(logged));
        s.registered.insert(ino, Registered { logged, handles: 1 });
    }

    fn release_local_file(&self, ino: u64) {
        let mut s = self.local.state.lock();
        if let Some(b) = s.registered.get_mut(&ino) {
            b.handles -= 1;
            if b.handles == 0 {
                if let Some(b) = s.registered.remove(&ino) {
                    self.inodes.lock().backing(ino, None);
                    self.frontend.close_local_file(b.logged.id);
                }
                self.local.released.notify_all();
            }
        }
    }

    /// A local file for the handle if the whole version is on this host's disk, or leased by a
    /// worker on this host: its id, the guard keeping its bytes in place while the handle
    /// lives, and where it came from. `Err`: why not.
    fn try_local_file(
        &self,
        ino: u64,
        file: &OpenFile,
    ) -> std::result::Result<LocalOpen, &'static str> {
        if !self.frontend.reads_local_files() {
            return Err(self.frontend.why_no_local_files());
        }
        if self.client.write_type_of(&file.entry.path).writable()
            && self.inodes.lock().was_written(ino)
        {
            // A writer must wait for every local-file reader to close (`open_writer`): a
            // file written here (a checkpoint) is likely written again, a dataset file is not.
            return Err("written through this mount: read through the daemon");
        }
        let obj = file.object();
        let crate::LocalFile {
            file: local,
            guard: local_guard,
        } = self.client.pin_local_file(obj);
        let shared = share(&mut self.local.state.lock(), ino, obj.id, local.is_some())?;
        if let Some((id, origin)) = shared {
            let guard = if local.is_some() {
                local_guard
            } else {
                Box::new(())
            };
            return Ok((id, guard, origin));
        }
        let (f, guard, leased, origin) = match local {
            Some(f) => (f, local_guard, false, "whole file in local disk tier"),
            None => {
                drop(local_guard);
                let held = self
                    .client
                    .lease_copy_blocking(obj)
                    .ok_or("not fully cached on local disk")?;
                let origin = "whole file in a same-host worker's disk tier";
                (held.file, held.guard, true, origin)
            }
        };
        let mut s = self.local.state.lock();
        // Another open may have registered one while we borrowed: share it, drop ours.
        if let Some((id, origin)) = share(&mut s, ino, obj.id, !leased)? {
            return Ok((id, guard, origin));
        }
        let id = self.frontend.register_local_file(&f).map_err(|e| {
            silt_common::warn_limited!(
                "passthrough backing open failed",
                path = %file.entry.path,
                error = %e
            );
            "kernel refused the backing file"
        })?;
        let logged = LoggedBacking {
            id,
            object: obj.id,
            leased,
            source: false,
        };
        self.insert_local_file(&mut s, ino, logged);
        Ok((id, guard, origin))
    }

    /// Fetches a file that a local file could serve once whole, if it is small enough
    /// (`open_fill_max`) and a fill slot is free: no copy of each byte through the core, and
    /// the front end's read-ahead on a local file. The open waits for the whole file.
    /// Returns whether it fetched any.
    fn fill_for_local_file(&self, ino: u64, file: &OpenFile) -> bool {
        let size = file.size();
        if size == 0
            || size > self.opts.open_fill_max
            // Read through the core: the front end would refuse a local file anyway.
            || self.local.state.lock().core.get(&ino).is_some_and(|n| *n > 0)
            || !self.frontend.reads_local_files()
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

    /// The store's own file of this version (`source_passthrough`), where the store keeps its
    /// objects as files this host can open and the file still holds the version: the reader
    /// reads at the store's speed, and the cache is filled behind it for the next open.
    fn try_source_file(&self, ino: u64, file: &Arc<OpenFile>) -> Option<LocalOpen> {
        if !self.opts.source_passthrough
            || !self.frontend.reads_local_files()
            || self.client.write_type_of(&file.entry.path).writable()
        {
            return None;
        }
        let src = self
            .client
            .runtime()
            .block_on(self.client.source_file(file))?;
        let object = file.object().id;
        let mut s = self.local.state.lock();
        // `leased`: the store's file needs no pin, so a registration of this version is shared.
        if let Some((id, origin)) = share(&mut s, ino, object, false).ok()? {
            return Some((id, Box::new(()), origin));
        }
        let id = match self.frontend.register_local_file(&src) {
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
        let logged = LoggedBacking {
            id,
            object,
            leased: true,
            source: true,
        };
        self.insert_local_file(&mut s, ino, logged);
        drop(s);
        self.fill_behind(file.clone());
        Some((id, Box::new(()), FROM_SOURCE))
    }

    /// Fetches the pages of `file` the cache lacks in the background, admitted as a read's
    /// would be: once per version at a time, at most `threads` versions at once.
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
