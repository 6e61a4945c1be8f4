//! Files whose only copy is inside Silt: `cache-only` files (until their TTL ends or they are
//! removed) and `back` files between their acknowledgement and their upload, and the
//! directories made under a `cache-only` prefix. This crate holds their table ([`Resident`])
//! and types; the client's store layer that answers for them in front of a mount's store
//! (`silt_client::resident::ResidentStore`) and the workers that keep replicated cache-only
//! files (`silt_cluster::replica`) both build on it, neither on the other.
//!
//! A resident file's version is a tag of Silt's own (`silt-...`) that no store produces: its
//! pages are never fetched from the store, and reads of it bypass the page cache (its bytes
//! are already local — the memory-first write buffer or the log record).
//!
//! Directories made under a `cache-only` prefix are resident too (the store never sees them):
//! each lasts until its `rmdir` (or the process ends, as its files do), whether or not files
//! lie below it, as a directory of a file system does. A task that makes its directories once
//! and then moves and removes files in them (Spark's `blockmgr-*/NN`) relies on that.
//!
//! Invariants: a resident file shadows a store object at the same path; a directory exists if
//! the store has it, it is a resident directory, or a resident file or directory lies below it;
//! an expired cache-only file is gone (stat says `NotFound`, listings omit it) and its memory
//! is given back when it is next seen or swept.
//!
//! In a cluster with `cache_only_replicas = N > 0`, cache-only files are kept by N workers
//! instead (a [`ResidentRemote`], implemented in `silt-cluster`): the table then holds only a
//! *pointer* per file ([`ResidentData::Remote`]), and stats, listings and reads ask the
//! workers, so every client of the cluster sees the files any of them wrote.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::RwLock;
use silt_cache::WriteBuffer;
use silt_common::io::ReadAt;
use silt_common::{Error, ErrorKind, Result};
use silt_ufs::{EntryKind, Headers, ObjectMeta};

use silt_common::clock::Clock;

/// Prefix of the version tag of resident files.
pub const RESIDENT_TAG: &str = "silt-";

/// Whether `meta` describes a resident file (its bytes are in Silt, not in the store).
pub fn is_resident(meta: &ObjectMeta) -> bool {
    meta.etag
        .as_deref()
        .is_some_and(|e| e.starts_with(RESIDENT_TAG))
}

/// A replicated cache-only file as the workers keeping it describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteMeta {
    pub size: u64,
    /// Its version tag (`silt-...`, made by the client that wrote it).
    pub tag: String,
    pub mtime: Option<SystemTime>,
    /// What is left of its life (`None`: until removed).
    pub expires_in: Option<Duration>,
}

/// Where cache-only files are kept when the writing client does not keep them itself: the
/// workers of a cluster (`silt_cluster::replica`). Paths are namespace paths.
#[async_trait]
pub trait ResidentRemote: Send + Sync {
    /// Keeps the `meta.size` bytes of `data` as the file `path` on its replicas; an error
    /// unless every replica acknowledged.
    async fn put(&self, path: &str, meta: &RemoteMeta, data: &dyn ReadAt) -> Result<()>;
    /// Exactly the bytes `range` (inside the file) of version `tag` of `path`;
    /// `ContentChanged` when no replica holds that version any more.
    async fn read(&self, path: &str, tag: &str, range: Range<u64>) -> Result<Bytes>;
    /// The file at `path`, if a replica holds one.
    async fn stat(&self, path: &str) -> Result<Option<RemoteMeta>>;
    /// Every file strictly below directory `dir`, with its path.
    async fn list(&self, dir: &str) -> Result<Vec<(String, RemoteMeta)>>;
    /// Removes the file at `path` from every worker that holds it.
    async fn delete(&self, path: &str) -> Result<()>;
}

/// A pointer to a file kept by [`ResidentRemote`] workers.
pub struct RemoteFile {
    remote: Arc<dyn ResidentRemote>,
    /// Namespace path.
    path: String,
    tag: String,
    rt: tokio::runtime::Handle,
}

impl RemoteFile {
    fn read(&self, offset: u64, len: usize) -> Result<Bytes> {
        let fut = self
            .remote
            .read(&self.path, &self.tag, offset..offset + len as u64);
        let b = match tokio::runtime::Handle::try_current() {
            // A FUSE thread, outside the runtime.
            Err(_) => self.rt.block_on(fut),
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{}: replicated cache-only files are read synchronously only off a current-thread runtime",
                        self.path
                    ),
                ))
            }
            Ok(_) => tokio::task::block_in_place(|| self.rt.block_on(fut)),
        }?;
        if b.len() != len {
            return Err(Error::new(
                ErrorKind::Corrupted,
                format!(
                    "{}: a replica sent {} bytes, expected {len}",
                    self.path,
                    b.len()
                ),
            ));
        }
        Ok(b)
    }
}

/// Where a resident file's bytes are.
#[derive(Clone)]
pub enum ResidentData {
    /// The memory-first write buffer it was written into (cache-only).
    Buffer(WriteBuffer),
    /// Its write-ahead log record, fsynced (back).
    Log(Arc<File>),
    /// On the workers replicating it (cache-only in a cluster): read over the network.
    Remote(Arc<RemoteFile>),
}

impl ResidentData {
    pub fn read(&self, offset: u64, len: usize) -> Result<Bytes> {
        match self {
            ResidentData::Buffer(b) => b.read_at(offset, len),
            ResidentData::Log(f) => f.as_ref().read_at(offset, len),
            ResidentData::Remote(r) => r.read(offset, len),
        }
    }
}

impl ReadAt for ResidentData {
    fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        self.read(offset, len)
    }

    fn is_hole(&self, offset: u64, len: u64) -> bool {
        match self {
            ResidentData::Buffer(b) => b.is_hole(offset, len),
            ResidentData::Log(f) => f.as_ref().is_hole(offset, len),
            ResidentData::Remote(_) => false,
        }
    }

    fn hole_end(&self, offset: u64, end: u64) -> u64 {
        match self {
            ResidentData::Buffer(b) => b.hole_end(offset, end),
            ResidentData::Log(f) => f.as_ref().hole_end(offset, end),
            ResidentData::Remote(_) => offset,
        }
    }
}

/// Why a file is resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residence {
    /// Cache-only, gone at `expires` (never, if `None`).
    CacheOnly { expires: Option<Instant> },
    /// Written `back`, waiting for the upload of log record `seq`.
    Back { seq: u64 },
}

pub struct ResidentFile {
    /// Path relative to the store root; etag = the resident tag.
    pub meta: ObjectMeta,
    pub data: ResidentData,
    pub residence: Residence,
    /// Its S3 headers (a gateway upload's), if it has any.
    pub headers: Option<Arc<Headers>>,
}

impl ResidentFile {
    /// A pointer to a file kept by workers, not bytes of this process.
    pub fn is_remote(&self) -> bool {
        matches!(self.data, ResidentData::Remote(_))
    }
}

/// Every resident file of the client, by namespace path.
pub struct Resident {
    files: RwLock<BTreeMap<String, Arc<ResidentFile>>>,
    /// Directories kept here (made under `cache-only`), by namespace path.
    /// With the time each was made (its mtime: the store never saw it).
    dirs: RwLock<BTreeMap<String, SystemTime>>,
    clock: Clock,
    next_tag: AtomicU64,
    /// Where cache-only files go instead of this table (set once, in a cluster client).
    remote: OnceLock<Arc<dyn ResidentRemote>>,
}

impl Resident {
    pub fn new(clock: Clock) -> Self {
        // Tags unique across restarts too: a restarted client must not reuse a tag whose
        // pages or kernel cache may still be around.
        let start = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Resident {
            files: RwLock::new(BTreeMap::new()),
            dirs: RwLock::new(BTreeMap::new()),
            clock,
            next_tag: AtomicU64::new(start),
            remote: OnceLock::new(),
        }
    }

    /// Keeps cache-only files on `remote` from now on (once; a second call is ignored).
    pub fn set_remote(&self, remote: Arc<dyn ResidentRemote>) {
        let _ = self.remote.set(remote);
    }

    pub fn remote(&self) -> Option<&Arc<dyn ResidentRemote>> {
        self.remote.get()
    }

    /// The pointer to the remote file `rm` at namespace path `path` (store path `rel`).
    /// Must be called inside the runtime (reads through it block on it).
    pub fn remote_file(&self, path: &str, rel: &str, rm: &RemoteMeta) -> Option<ResidentFile> {
        let remote = self.remote.get()?.clone();
        Some(ResidentFile {
            meta: ObjectMeta {
                path: rel.trim_matches('/').to_string(),
                kind: EntryKind::File,
                size: rm.size,
                mtime: rm.mtime,
                etag: Some(rm.tag.clone()),
                version: None,
                mode: None,
                posix: Default::default(),
            },
            data: ResidentData::Remote(Arc::new(RemoteFile {
                remote,
                path: path.to_string(),
                tag: rm.tag.clone(),
                rt: tokio::runtime::Handle::current(),
            })),
            residence: Residence::CacheOnly {
                expires: rm.expires_in.map(|d| self.clock.now() + d),
            },
            headers: None,
        })
    }

    /// Records the remote file `rm` at `path` unless the same version is recorded; its
    /// metadata.
    pub fn note_remote(&self, path: &str, rel: &str, rm: &RemoteMeta) -> Option<ObjectMeta> {
        if let Some(f) = self.get(path) {
            if f.is_remote() && f.meta.etag.as_deref() == Some(rm.tag.as_str()) {
                return Some(f.meta.clone());
            }
        }
        let f = self.remote_file(path, rel, rm)?;
        let meta = f.meta.clone();
        self.insert(path.to_string(), f);
        Some(meta)
    }

    /// Metadata for a new resident file at store path `rel` of `size` bytes.
    pub fn new_meta(&self, rel: &str, size: u64) -> ObjectMeta {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        ObjectMeta {
            path: rel.to_string(),
            kind: EntryKind::File,
            size,
            mtime: Some(SystemTime::now()),
            etag: Some(format!("{RESIDENT_TAG}{tag:x}")),
            version: None,
            mode: None,
            posix: Default::default(),
        }
    }

    pub fn live(&self, f: &ResidentFile) -> bool {
        match f.residence {
            Residence::CacheOnly {
                expires: Some(at), ..
            } => self.clock.now() < at,
            _ => true,
        }
    }

    /// Adds (or replaces) the file at namespace path `path`; returns the one it replaced.
    pub fn insert(&self, path: String, file: ResidentFile) -> Option<Arc<ResidentFile>> {
        self.files.write().insert(path, Arc::new(file))
    }

    /// The live resident file at `path`.
    pub fn get(&self, path: &str) -> Option<Arc<ResidentFile>> {
        let f = self.files.read().get(path).cloned()?;
        if self.live(&f) {
            return Some(f);
        }
        self.remove_if(path, |g| Arc::ptr_eq(g, &f));
        None
    }

    /// Removes the file at `path` if `pred` holds for it; returns it.
    pub fn remove_if(
        &self,
        path: &str,
        pred: impl FnOnce(&Arc<ResidentFile>) -> bool,
    ) -> Option<Arc<ResidentFile>> {
        let mut files = self.files.write();
        if !files.get(path).is_some_and(pred) {
            return None;
        }
        files.remove(path)
    }

    pub fn remove(&self, path: &str) -> Option<Arc<ResidentFile>> {
        self.remove_if(path, |_| true)
    }

    /// Live files strictly below directory `dir`, with their paths.
    pub fn below(&self, dir: &str) -> Vec<(String, Arc<ResidentFile>)> {
        let prefix = dir_prefix(dir);
        self.files
            .read()
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
            .filter(|(_, f)| self.live(f))
            .map(|(p, f)| (p.clone(), f.clone()))
            .collect()
    }

    /// Records the directory `path` as kept here (a `mkdir` under `cache-only`).
    pub fn add_dir(&self, path: &str) {
        self.dirs
            .write()
            .entry(path.to_string())
            .or_insert_with(SystemTime::now);
    }

    /// Whether `path` is a directory kept here.
    pub fn has_dir(&self, path: &str) -> bool {
        self.dirs.read().contains_key(path)
    }

    /// The directory kept here at `path` (store path `rel`), with the time it was made.
    pub fn dir_meta(&self, path: &str, rel: &str) -> ObjectMeta {
        let mut m = ObjectMeta::dir(rel);
        m.mtime = self.dirs.read().get(path).copied();
        m
    }

    /// Directories kept here strictly below `dir`.
    pub fn dirs_below(&self, dir: &str) -> Vec<String> {
        let prefix = dir_prefix(dir);
        self.dirs
            .read()
            .range(prefix.clone()..)
            .map(|(p, _)| p)
            .take_while(|p| p.starts_with(&prefix))
            .cloned()
            .collect()
    }

    /// Forgets the directory `path` kept here; whether it was.
    pub fn remove_dir(&self, path: &str) -> bool {
        self.dirs.write().remove(path).is_some()
    }

    /// Moves directory `from` (if kept here) and the directories kept below it to `to`.
    pub fn rename_dirs(&self, from: &str, to: &str) {
        let mut dirs = self.dirs.write();
        let prefix = dir_prefix(from);
        let moving: Vec<String> = dirs
            .range(prefix.clone()..)
            .map(|(p, _)| p)
            .take_while(|p| p.starts_with(&prefix))
            .cloned()
            .collect();
        if let Some(made) = dirs.remove(from) {
            dirs.insert(to.to_string(), made);
        }
        for d in moving {
            if let Some(made) = dirs.remove(&d) {
                dirs.insert(format!("{to}{}", &d[from.len()..]), made);
            }
        }
    }

    /// Drops expired cache-only files (their memory and spill space go back); how many.
    pub fn sweep(&self) -> usize {
        let mut files = self.files.write();
        let before = files.len();
        files.retain(|_, f| self.live(f));
        before - files.len()
    }

    /// (files, bytes) resident now: cache-only and waiting for upload.
    pub fn usage(&self) -> (u64, u64, u64, u64) {
        let files = self.files.read();
        let (mut c, mut cb, mut b, mut bb) = (0, 0, 0, 0);
        for f in files.values().filter(|f| self.live(f) && !f.is_remote()) {
            match f.residence {
                Residence::CacheOnly { .. } => (c, cb) = (c + 1, cb + f.meta.size),
                Residence::Back { .. } => (b, bb) = (b + 1, bb + f.meta.size),
            }
        }
        (c, cb, b, bb)
    }
}

/// `dir` with one trailing slash: the prefix of every path strictly below it.
pub fn dir_prefix(dir: &str) -> String {
    if dir == "/" {
        "/".to_string()
    } else {
        format!("{dir}/")
    }
}

/// The bytes `range` of a resident file, clamped to its size.
pub fn read_resident(f: &ResidentFile, range: Range<u64>) -> Result<Bytes> {
    let end = range.end.min(f.meta.size);
    if range.start >= end {
        return Ok(Bytes::new());
    }
    let len = usize::try_from(end - range.start)
        .map_err(|_| Error::invalid(format!("{}: read too large", f.meta.path)))?;
    f.data.read(range.start, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory kept here (the store never saw it) shows the time it was made, not
    /// none (which the mount showed as a constant of its own), and keeps it when moved.
    #[test]
    fn a_kept_directory_has_its_making_time() {
        let r = Resident::new(Clock::default());
        let before = SystemTime::now();
        r.add_dir("/data/b");
        let made = r.dir_meta("/data/b", "b").mtime.expect("a time");
        assert!(made >= before && made <= SystemTime::now(), "{made:?}");
        r.rename_dirs("/data/b", "/data/c");
        assert_eq!(r.dir_meta("/data/c", "c").mtime, Some(made));
        assert_eq!(r.dir_meta("/data/c", "c").kind, EntryKind::Dir);
    }
}
