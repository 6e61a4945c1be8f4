//! The client library every front end (FUSE, the Python SDK, the S3 gateway, CSI, the CLI)
//! adapts: namespace resolution, the metadata cache with its sync policies, open files with
//! sequential-read prefetch, parallel ranged fetches through the page reader, writes, and the
//! POSIX file-system core over all of it (`fs`).
//!
//! Consistency: an open file is pinned to the version (content fingerprint) it was opened
//! at; every page it reads belongs to that version, and if the under-store object changed,
//! reads fail with `ContentChanged` (ESTALE) instead of mixing versions. Metadata is trusted
//! as the path's sync policy says (`never`, `interval=D`, `always`); what changed is reported
//! to listeners (the FUSE layer invalidates the kernel's caches) and the pages of replaced
//! versions are dropped.

pub mod attrs;
mod dirs;
pub mod fs;
mod meta;
mod names;
pub mod namespace;
mod persist;
mod prefetch;
pub mod resident;
mod session;
mod snapshot;
mod wal;
mod write;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::stream::{self, StreamExt};
use parking_lot::{Mutex, RwLock};
use silt_common::metrics::{self, ReadFrom};
use silt_common::sync::{SyncPolicy, SyncRules};
use silt_common::write::{WriteRules, WriteType};
use silt_common::{Error, ErrorKind, ObjectId, Result};
use silt_reader::{BackingSource, LeasedCopy, ObjectRef, PageReader, ReadSource};
use silt_ufs::{EntryKind, ObjectMeta};

/// See `Client::pin_local_file`.
pub struct LocalFile {
    /// The data file, opened (and checked unchanged since it was verified, see
    /// `PageStore::complete_file`).
    pub file: Option<std::fs::File>,
    pub guard: Box<dyn Send + Sync>,
}
use tokio::runtime::Handle;

use meta::{age, build_tree, Lookup, MetaCache};
pub use meta::{Change, ChangeKind};
pub use names::Precondition;
use namespace::{join, parent_and_name, Resolved};
pub use namespace::{MountPoint, Namespace};
pub use persist::FileState;
use prefetch::SeqState;
pub use session::{FileWriter, OpenOptions, Session};
pub use silt_common::clock::Clock;
use silt_common::config::is_at_or_under;
pub use silt_reader::{LocalRead, MapSource};
pub use write::{WriteSetup, WriteStats};

/// Client tuning (from `Config`).
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Sync policy per namespace prefix.
    pub sync: SyncRules,
    /// Trust of a "no such file" answer (capped by the path's policy).
    pub negative_ttl: Duration,
    /// Largest tree loaded with one recursive listing; 0: a listing per directory.
    pub bulk_list_max: usize,
    /// Answer a lookup in a directory whose listing is not cached by listing the directory
    /// (one paginated LIST, shared by concurrent callers) instead of a HEAD per name.
    pub lookup_lists_parent: bool,
    pub prefetch_max: u64,
    pub fetch_concurrency: usize,
    /// Longest time a file's cached pages are served, per namespace prefix (longest prefix
    /// wins); counted from the first open of the version by this client.
    pub cache_ttl: Vec<(String, Duration)>,
    /// Time source of metadata ages (a manual clock in tests).
    pub clock: Clock,
}

impl ClientOptions {
    /// The client part of Silt's configuration (metadata ages from the monotonic clock).
    pub fn from_config(cfg: &silt_common::config::Config) -> Self {
        ClientOptions {
            sync: SyncRules::new(cfg.sync_policy, cfg.sync_rules.clone()),
            negative_ttl: cfg.negative_ttl,
            bulk_list_max: cfg.bulk_list_max,
            lookup_lists_parent: cfg.lookup_lists_parent,
            prefetch_max: cfg.prefetch_max,
            fetch_concurrency: cfg.fetch_concurrency,
            cache_ttl: cfg.cache_ttl_rules.clone(),
            clock: Clock::system(),
        }
    }
}

/// A file or directory of the namespace.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Namespace path (`/data/x.jpg`).
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mtime: Option<SystemTime>,
    /// Permission bits (`0o7777`), if known (else `attrs::default_mode`).
    pub mode: Option<u32>,
    /// Owner, group, atime and ctime, where the store keeps them (else the defaults in
    /// `attrs.rs`).
    pub posix: silt_ufs::Posix,
    /// The store object, for files and directories inside a mount (None for synthetic dirs).
    pub object: Option<Arc<ObjectRef>>,
}

impl Entry {
    pub fn name(&self) -> &str {
        if self.path == "/" {
            return "";
        }
        self.path.rsplit('/').next().unwrap_or("")
    }

    pub fn is_dir(&self) -> bool {
        self.kind == EntryKind::Dir
    }

    fn synthetic_dir(path: String) -> Self {
        Entry {
            path,
            kind: EntryKind::Dir,
            size: 0,
            mtime: None,
            mode: None,
            posix: Default::default(),
            object: None,
        }
    }

    fn from_meta(path: String, store: &silt_ufs::DynStore, meta: ObjectMeta) -> Self {
        Entry {
            path,
            kind: meta.kind,
            size: meta.size,
            mtime: meta.mtime,
            mode: meta.mode,
            posix: meta.posix,
            object: Some(Arc::new(ObjectRef::new(store.clone(), meta))),
        }
    }
}

/// A file opened for reading, pinned to one version of its object.
pub struct OpenFile {
    pub entry: Entry,
    obj: Arc<ObjectRef>,
    seq: Mutex<SeqState>,
    /// A file resident in Silt: its bytes, held for as long as the file is open (an upload or
    /// a replacement meanwhile does not take them away).
    resident: Option<Arc<resident::ResidentFile>>,
    /// Keeps the version's cached pages while it is open (see [`OpenVersions`]).
    _hold: Option<VersionHold>,
}

/// Versions open for reading through this client. An open file's bytes outlive its name
/// (POSIX; temporary files, log rotation): before the store loses a version that is open (a
/// delete, a rename from or over its path), the version is read whole into the cache and
/// kept there, pinned, and its pages are dropped when its last reader closes.
#[derive(Default)]
struct OpenVersions {
    open: Mutex<std::collections::HashMap<ObjectId, OpenVersion>>,
}

/// One version open for reading.
struct OpenVersion {
    readers: usize,
    obj: Arc<ObjectRef>,
    /// Forget its pages once no reader is left (it was removed or replaced).
    forget: bool,
    /// Its pages pinned and admitted, once the store may lose it.
    kept: Option<(silt_cache::PinGuard, silt_cache::PinGuard)>,
}

impl OpenVersions {
    fn hold(self: &Arc<Self>, worker: &Arc<PageReader>, obj: &Arc<ObjectRef>) -> VersionHold {
        self.open
            .lock()
            .entry(obj.id)
            .or_insert_with(|| OpenVersion {
                readers: 0,
                obj: obj.clone(),
                forget: false,
                kept: None,
            })
            .readers += 1;
        VersionHold {
            versions: self.clone(),
            worker: worker.clone(),
            id: obj.id,
        }
    }

    /// Whether `obj` is open; if so its pages are forgotten when the last reader closes.
    fn defer_forget(&self, obj: &Arc<ObjectRef>) -> bool {
        match self.open.lock().get_mut(&obj.id) {
            Some(e) => {
                e.forget = true;
                true
            }
            None => false,
        }
    }

    /// The open versions of `store`'s file `rel` (with `below`, also of every file under
    /// the directory `rel`) not kept yet, now marked kept with `guards` of each.
    fn to_keep(
        &self,
        store: &silt_ufs::DynStore,
        rel: &str,
        below: bool,
        guards: impl Fn(ObjectId) -> (silt_cache::PinGuard, silt_cache::PinGuard),
    ) -> Vec<Arc<ObjectRef>> {
        let mut open = self.open.lock();
        let mut out = Vec::new();
        for v in open.values_mut() {
            let p = v.obj.meta.path.as_str();
            let at = p == rel || (below && is_at_or_under(p, rel));
            if at
                && v.kept.is_none()
                && std::ptr::addr_eq(Arc::as_ptr(&v.obj.store), Arc::as_ptr(store))
            {
                v.kept = Some(guards(v.obj.id));
                out.push(v.obj.clone());
            }
        }
        out
    }
}

struct VersionHold {
    versions: Arc<OpenVersions>,
    worker: Arc<PageReader>,
    id: ObjectId,
}

impl Drop for VersionHold {
    fn drop(&mut self) {
        let forget = {
            let mut open = self.versions.open.lock();
            match open.get_mut(&self.id) {
                Some(e) if e.readers > 1 => {
                    e.readers -= 1;
                    None
                }
                // The pins go with it.
                Some(_) => open.remove(&self.id).filter(|e| e.forget).map(|e| e.obj),
                None => None,
            }
        };
        if let Some(obj) = forget {
            self.worker.forget_object(&obj);
        }
    }
}

impl OpenFile {
    pub fn object(&self) -> &ObjectRef {
        &self.obj
    }
    pub fn size(&self) -> u64 {
        self.obj.size()
    }
}

/// The S3 headers of object versions, by version: a version's headers never change, so an
/// entry is never stale; it only goes when the cache is full (all at once: a HEAD of an
/// object asked for again then asks its store once more).
#[derive(Default)]
struct HeadersCache {
    by_version: Mutex<std::collections::HashMap<ObjectId, Arc<silt_ufs::Headers>>>,
}

/// Versions whose headers the cache keeps at most (~200 bytes each when small).
const HEADERS_CACHED: usize = 65_536;

impl HeadersCache {
    fn get(&self, id: ObjectId) -> Option<Arc<silt_ufs::Headers>> {
        self.by_version.lock().get(&id).cloned()
    }

    fn put(&self, id: ObjectId, h: Arc<silt_ufs::Headers>) {
        let mut m = self.by_version.lock();
        if m.len() >= HEADERS_CACHED {
            m.clear();
        }
        m.insert(id, h);
    }
}

/// Progress of a preload (also the control socket's `load` progress frame).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoadProgress {
    pub files_total: u64,
    pub bytes_total: u64,
    pub pages_done: u64,
    pub pages_total: u64,
    pub bytes_done: u64,
    /// Bytes that were already cached (skipped).
    pub bytes_cached: u64,
}

/// How much of a path is in this process's cache (`Client::cache_usage`, `pin`, `free`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheUsage {
    pub files: u64,
    pub bytes: u64,
    /// Bytes whose pages are cached in some tier.
    pub cached_bytes: u64,
    /// Bytes of files the user pinned.
    pub pinned_bytes: u64,
}

impl CacheUsage {
    /// Adds `other`'s counts to these (the usage of two sets of files with none in common).
    pub fn add(&mut self, other: &CacheUsage) {
        self.files += other.files;
        self.bytes += other.bytes;
        self.cached_bytes += other.cached_bytes;
        self.pinned_bytes += other.pinned_bytes;
    }
}

/// What `sync` or `invalidate` found, for the CLI.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncReport {
    /// Entries the store answered about (sync), or records dropped (invalidate).
    pub checked: u64,
    pub added: u64,
    pub removed: u64,
    pub content_changed: u64,
    pub metadata_changed: u64,
    pub invalidated: u64,
    /// Object versions whose cached pages were dropped.
    pub objects_dropped: u64,
    /// The first changes, path by path.
    pub changes: Vec<(String, ChangeKind)>,
}

const REPORT_PATHS: usize = 100;

impl SyncReport {
    fn merge(&mut self, o: SyncReport) {
        self.checked += o.checked;
        self.added += o.added;
        self.removed += o.removed;
        self.content_changed += o.content_changed;
        self.metadata_changed += o.metadata_changed;
        self.invalidated += o.invalidated;
        self.objects_dropped += o.objects_dropped;
        let room = REPORT_PATHS.saturating_sub(self.changes.len());
        self.changes.extend(o.changes.into_iter().take(room));
    }

    fn add(&mut self, changes: &[Change]) {
        for c in changes {
            match c.kind {
                ChangeKind::Added => self.added += 1,
                ChangeKind::Removed => self.removed += 1,
                ChangeKind::Content => self.content_changed += 1,
                ChangeKind::Metadata => self.metadata_changed += 1,
                ChangeKind::Invalidated => self.invalidated += 1,
                ChangeKind::Policy | ChangeKind::Freed => {}
            }
            self.objects_dropped += c.old_object.is_some() as u64;
            if self.changes.len() < REPORT_PATHS {
                self.changes.push((c.path.clone(), c.kind));
            }
        }
    }
}

/// The sync policy of a path, for `silt fs stat` and `silt fs sync-policy`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyInfo {
    pub policy: String,
    /// The prefix of the rule that sets it (`/` for the default).
    pub rule: String,
    /// Seconds since the store last answered about the path, if anything is cached.
    pub checked_secs_ago: Option<f64>,
}

type ListFlight = std::result::Result<Arc<Vec<Entry>>, (ErrorKind, String)>;

/// A listing just cached (a directory's, or the top of a tree), with what changed.
#[derive(Default)]
struct Fetched {
    own: Arc<Vec<Entry>>,
    changes: Vec<Change>,
    /// Entries the store returned.
    entries: usize,
}

/// Told about every change Silt learns of (the FUSE layer invalidates kernel caches).
pub type ChangeListener = Arc<dyn Fn(&[Change]) + Send + Sync>;

/// A file of this process's disk tier holding a whole version, its pages kept while it lives
/// (`Client::local_reader`).
struct OwnCacheFile {
    file: std::fs::File,
    size: u64,
    _guard: Box<dyn Send + Sync>,
}

impl LocalRead for OwnCacheFile {
    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::from(e).context("reading a local cache file"))
    }

    fn map_source(&self) -> Option<silt_reader::MapSource<'_>> {
        Some(silt_reader::MapSource {
            file: &self.file,
            size: self.size,
            pages: None,
        })
    }
}

/// Who hears of the changes a client makes in the stores. An SDK client or gateway attached to
/// a `silt up` has one (`silt-node` sets it): the owner revalidates the directory before the
/// call that changed it returns, so the owner's mount (its kernel's caches too) shows the
/// change at once. Other clients have none: their peers revalidate by their sync policy
/// (docs/SEMANTICS.md). Front ends never call it: every change made through the client
/// (a commit that wrote, unlink, mkdir, rmdir, rename, attributes, links, special files)
/// tells it, whichever front end asked.
#[async_trait::async_trait]
pub trait ChangeSink: Send + Sync {
    /// Something in directory `dir` changed through this client; returns once the sink
    /// revalidated it (or gave up: a sink's failure is not the change's).
    async fn changed_within(&self, dir: &str);

    /// Anything below directory `dir` may have changed (a recursive `sync` through this
    /// client); returns once the sink revalidated the tree. By default, `dir` alone.
    async fn changed_below(&self, dir: &str) {
        self.changed_within(dir).await
    }

    /// The cached bytes of the files at or below `path` were freed through this client
    /// (`silt fs free`): the owner drops its mount's kernel copy too, so a read after the free
    /// is a cold one there as well.
    async fn freed(&self, _path: &str) {}
}

/// One Silt client: the namespace of mounts, read through a page reader (the cache), written
/// under the write rules. Its contract with every front end:
///
/// - **Paths** are absolute namespace paths; every call resolves them to a mount and its store
///   and normalises them (a bad path is `InvalidInput`, never a panic).
/// - **Reads** of an `OpenFile` see one version: every byte comes from the version it was opened
///   at, or the read fails `ContentChanged`; pages come from the cache first, then the store.
/// - **Writes** go through one write session per file (`open_write`, `write`, `commit`,
///   `close`), shared by every writer of the file in this client; a commit is atomic per file,
///   and `Precondition`s (`set_precondition`) and `rename_noreplace` are decided under the
///   names' locks at the commit or rename, never by a check before.
/// - **Metadata** is trusted as its path's sync policy says; what changes through the client
///   or is learned from the store is told to subscribers (`subscribe`) and, for a client
///   attached to an owner, to the owner (`ChangeSink`): a front end reports nothing itself.
/// - **The cache** is private: front ends ask the client (`page_size`, `cache_stats`,
///   `keep_cached`, `fill`, `local_reader`), never the page store.
/// - A front end with POSIX handles uses [`fs::FileSystem`] over the client rather than the
///   calls above one by one (its contract: the `fs` module).
pub struct Client {
    ns: Namespace,
    /// S3 headers of object versions seen lately (see [`Client::headers`]).
    headers_cache: HeadersCache,
    worker: Arc<PageReader>,
    meta: MetaCache,
    sync: RwLock<SyncRules>,
    /// Concurrent listings of one directory share one store request.
    listings: silt_cache::SingleFlight<String, ListFlight>,
    /// Recursive listings in flight, by root: a walker needing a directory below one waits
    /// for it instead of listing on its own. The receiver turns `true` when it ends.
    sweeps: Mutex<std::collections::HashMap<String, tokio::sync::watch::Receiver<bool>>>,
    /// Directories whose tree had more than `bulk_list_max` entries: listed one at a time.
    too_big: Mutex<HashSet<String>>,
    listeners: Mutex<Vec<ChangeListener>>,
    /// The lock of each name a commit, unlink or rename changes (`names.rs`).
    names: names::NameLocks,
    /// Who hears of the changes this client makes (`set_change_sink`).
    change_sink: std::sync::OnceLock<Arc<dyn ChangeSink>>,
    opts: ClientOptions,
    rt: Handle,
    /// Same-host workers that can lease their cache files (cluster clients).
    backing: Option<Arc<dyn BackingSource>>,
    /// How files written through this client are kept, per prefix (`write.rs`).
    writes: write::Writes,
    /// Serialises snapshot saves (periodic and final share one temporary file); true once
    /// the clean (final) save was made, after which periodic saves stop.
    snapshot_saves: Mutex<bool>,
    /// Directory times moved by changes through this client (`attrs.rs`).
    dir_times: attrs::DirTimes,
    /// Each version under a `cache_ttl` prefix opened here: when it was first opened (or its
    /// pages last dropped), and its TTL.
    ttl_since: Mutex<std::collections::HashMap<ObjectId, TtlEntry>>,
    /// Versions open for reading (their pages outlive a removal until closed).
    open_versions: Arc<OpenVersions>,
}

/// A version under a `cache_ttl` prefix (see `Client::expire_cached`).
struct TtlEntry {
    since: std::time::Instant,
    ttl: Duration,
    obj: Arc<ObjectRef>,
}

/// The namespace path of a store path `rel` under a mount at `mount_path`.
pub(crate) fn ns_path(mount_path: &str, rel: &str) -> String {
    if rel.is_empty() {
        mount_path.to_string()
    } else {
        join(mount_path, rel)
    }
}

/// The sorted listing of directory `path` from the store's entries of its children.
fn listing_from(path: &str, mount: &MountPoint, metas: Vec<ObjectMeta>) -> Arc<Vec<Entry>> {
    let mut entries: Vec<Entry> = metas
        .into_iter()
        .filter(|m| !m.name().is_empty())
        .map(|m| Entry::from_meta(join(path, m.name()), &mount.store, m))
        .collect();
    entries.sort_by(|a, b| a.name().cmp(b.name()));
    entries.dedup_by(|a, b| a.name() == b.name());
    Arc::new(entries)
}

/// Every directory's listing below (and including) `path` from one recursive listing.
fn tree_from(
    path: &str,
    mount: &MountPoint,
    metas: Vec<ObjectMeta>,
) -> Vec<(String, Arc<Vec<Entry>>)> {
    let entries = metas
        .into_iter()
        .filter(|m| !m.name().is_empty())
        .map(|m| Entry::from_meta(ns_path(&mount.path, &m.path), &mount.store, m))
        .collect();
    let prefix_len = mount.path.len();
    build_tree(path, entries, |d| {
        let rel = d[prefix_len..].trim_start_matches('/');
        Entry::from_meta(d.to_string(), &mount.store, ObjectMeta::dir(rel))
    })
}

/// The pieces as one buffer (no copy for one piece).
fn concat(chunks: Vec<Bytes>) -> Bytes {
    if chunks.len() <= 1 {
        return chunks.into_iter().next().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in &chunks {
        out.extend_from_slice(c);
    }
    out.freeze()
}

fn count_source(source: ReadSource, n: u64) {
    match source {
        ReadSource::Memory => metrics::READ_BYTES_MEMORY.add(n),
        ReadSource::Disk => metrics::READ_BYTES_DISK.add(n),
        ReadSource::UnderStore => metrics::READ_BYTES_UFS.add(n),
    }
}

fn not_found(path: &str) -> Error {
    Error::not_found(format!("{path}: no such file or directory"))
}

impl Client {
    /// `rt` runs background prefetches; blocking entry points use it too.
    pub fn new(ns: Namespace, worker: Arc<PageReader>, opts: ClientOptions, rt: Handle) -> Self {
        let clock = opts.clock.clone();
        Client {
            ns,
            meta: MetaCache::new(),
            sync: RwLock::new(opts.sync.clone()),
            listings: silt_cache::SingleFlight::new(),
            sweeps: Mutex::new(Default::default()),
            too_big: Mutex::new(HashSet::new()),
            listeners: Mutex::new(Vec::new()),
            names: names::NameLocks::new(),
            change_sink: std::sync::OnceLock::new(),
            worker,
            opts,
            rt,
            backing: None,
            writes: write::Writes::read_only(clock),
            snapshot_saves: Mutex::new(false),
            dir_times: Default::default(),
            ttl_since: Mutex::new(Default::default()),
            open_versions: Default::default(),
            headers_cache: HeadersCache::default(),
        }
    }

    /// The cache TTL of a namespace path, if a `cache_ttl` prefix covers it.
    fn cache_ttl_of(&self, path: &str) -> Option<Duration> {
        self.opts
            .cache_ttl
            .iter()
            .filter(|(prefix, _)| is_at_or_under(path, prefix))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, ttl)| *ttl)
    }

    /// Drops the cached pages of `obj` (here and on the workers) once they have been served
    /// longer than the TTL of `path`, so the next read fetches them again.
    fn expire_cached(&self, path: &str, obj: &Arc<ObjectRef>) {
        let Some(ttl) = self.cache_ttl_of(path) else {
            return;
        };
        let now = self.opts.clock.now();
        let mut since = self.ttl_since.lock();
        let e = since.entry(obj.id).or_insert_with(|| TtlEntry {
            since: now,
            ttl,
            obj: obj.clone(),
        });
        if now.saturating_duration_since(e.since) > ttl {
            e.since = now;
            drop(since);
            self.worker.forget_object(obj);
        }
    }

    /// Drops the cached pages of every version under a `cache_ttl` prefix whose TTL has run
    /// out since it was first opened here, opened again or not (so a prefix's pages free their
    /// space, not only stop being served); the next open starts its TTL over. Returns how many
    /// versions it dropped. The daemon calls this periodically (`Node::keep_sweeping_ttl`).
    pub fn sweep_expired(&self) -> usize {
        let now = self.opts.clock.now();
        let expired: Vec<Arc<ObjectRef>> = {
            let mut since = self.ttl_since.lock();
            let ids: Vec<ObjectId> = since
                .iter()
                .filter(|(_, e)| now.saturating_duration_since(e.since) > e.ttl)
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| since.remove(id).map(|e| e.obj))
                .collect()
        };
        for obj in &expired {
            self.worker.forget_object(obj);
        }
        expired.len()
    }

    /// The shortest `cache_ttl`, if any rule is set.
    pub fn shortest_cache_ttl(&self) -> Option<Duration> {
        self.opts.cache_ttl.iter().map(|(_, ttl)| *ttl).min()
    }

    /// The write type of a namespace path (`ReadOnly` for a path that is not valid).
    pub fn write_type_of(&self, path: &str) -> WriteType {
        Self::normalize(path).map_or(WriteType::ReadOnly, |p| self.writes.rules.of(&p))
    }

    pub fn write_rules(&self) -> &WriteRules {
        &self.writes.rules
    }

    /// Lets opens use files leased by `source` (a same-host worker's cache) for passthrough.
    pub fn with_backing_source(mut self, source: Arc<dyn BackingSource>) -> Self {
        self.backing = Some(source);
        self
    }

    /// Makes `sink` hear of every change this client makes in the stores, once the change
    /// succeeded and before the call that made it returns (see [`ChangeSink`]). Set once;
    /// a second sink is ignored.
    pub fn set_change_sink(&self, sink: Arc<dyn ChangeSink>) {
        let _ = self.change_sink.set(sink);
    }

    /// Tells the change sink, if any, that `path` changed: its directory is revalidated.
    pub(crate) async fn tell_changed(&self, path: &str) {
        if let Some(sink) = self.change_sink.get() {
            let dir = parent_and_name(path).map_or("/", |(d, _)| d);
            sink.changed_within(dir).await;
        }
    }

    /// Tells the change sink, if any, that what lies in directory `dir` changed.
    pub(crate) async fn tell_changed_within(&self, dir: &str) {
        if let Some(sink) = self.change_sink.get() {
            sink.changed_within(dir).await;
        }
    }

    /// Tells the change sink, if any, that anything below directory `dir` may have changed.
    async fn tell_changed_below(&self, dir: &str) {
        if let Some(sink) = self.change_sink.get() {
            sink.changed_below(dir).await;
        }
    }

    /// Calls `listener` with every batch of changes Silt learns of.
    pub fn subscribe(&self, listener: ChangeListener) {
        self.listeners.lock().push(listener);
    }

    /// The object's whole data file in this host's own disk tier, for a caller that wants to
    /// open it directly (FUSE passthrough). The guard pins every disk page of the object and
    /// is taken before the completeness check, so nothing is evicted between the check and
    /// the caller's use; keep it while the file is in use. `file` is `None` when the file is not
    /// whole in one local tier (then drop the guard).
    pub fn pin_local_file(&self, obj: &ObjectRef) -> LocalFile {
        let store = self.worker.page_store();
        let guard = Box::new(store.pin(obj.id));
        LocalFile {
            file: store
                .complete_file(obj.id, obj.size())
                .map(|complete| complete.file),
            guard,
        }
    }

    /// A reader of `obj`'s bytes straight from a file on this host, without the client: its
    /// version whole in this process's disk tier (verified when taken, its pages kept while
    /// the reader lives), else a same-host worker's cache file leased for as long (each read
    /// checks the pages it touches). `None`: read through the client. Blocks (outside the
    /// runtime, like a FUSE thread or the Python SDK's reads).
    pub fn local_reader(&self, obj: &ObjectRef) -> Option<Box<dyn LocalRead>> {
        let own = self.pin_local_file(obj);
        if let Some(file) = own.file {
            return Some(Box::new(OwnCacheFile {
                file,
                size: obj.size(),
                _guard: own.guard,
            }));
        }
        let source = self.backing.as_ref()?;
        self.rt.block_on(source.local_reader(obj))
    }

    /// A local file for `obj` held for the caller, if a backing source can lease one. Blocks
    /// (for FUSE threads outside the runtime).
    pub(crate) fn lease_copy_blocking(&self, obj: &ObjectRef) -> Option<LeasedCopy> {
        let source = self.backing.as_ref()?;
        self.rt.block_on(source.lease_copy(obj))
    }

    /// Saves the metadata cache to `path` (after a clean unmount) so the next start can reuse
    /// what is still trusted; see `snapshot` for the rules. Returns the records written.
    pub fn save_metadata(&self, path: &std::path::Path) -> std::io::Result<usize> {
        Ok(self.save_snapshot(path, true)?.unwrap_or(0))
    }

    /// The periodic save while running (so a crash restart is warm too): skipped, `None`,
    /// when the cache has not changed since generation `*since` (which it then advances), or
    /// once the clean save was made (it must stay the last).
    pub fn save_metadata_if_changed(
        &self,
        path: &std::path::Path,
        since: &mut u64,
    ) -> std::io::Result<Option<usize>> {
        let generation = self.meta.generation();
        if generation == *since {
            return Ok(None);
        }
        let n = self.save_snapshot(path, false)?;
        *since = generation;
        Ok(n)
    }

    /// `None` when a periodic save comes after the clean one.
    fn save_snapshot(&self, path: &std::path::Path, clean: bool) -> std::io::Result<Option<usize>> {
        let mut final_saved = self.snapshot_saves.lock();
        if *final_saved {
            return Ok(None);
        }
        *final_saved = clean;
        let now = self.opts.clock.now();
        let contents = self
            .meta
            .contents(|p, at| self.policy_of(p).trusts(age(now, at)));
        snapshot::save(path, &self.ns, contents, clean).map(Some)
    }

    /// Loads (and removes) a snapshot written by `save_metadata`. Returns records restored.
    pub fn restore_metadata(&self, path: &std::path::Path) -> std::io::Result<usize> {
        snapshot::restore(
            path,
            &self.ns,
            // A periodic snapshot may predate this client's own last changes: only paths it
            // cannot change are taken from one.
            |p, age, clean| {
                (clean || !self.write_rules().writable_at_or_below(p))
                    && self.policy_of(p).trusts(age)
            },
            |at, e| self.meta.put_stat_at(at, e),
            |at, dir, l| self.meta.put_list_at(at, dir, l),
        )
    }

    /// Cached (stats, listings, negative entries).
    pub fn metadata_sizes(&self) -> (usize, usize, usize) {
        self.meta.sizes()
    }

    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    pub fn options(&self) -> &ClientOptions {
        &self.opts
    }

    /// The page reader and its page store. For `silt-node`, which built them (serving them to
    /// same-host clients, the cluster's residency questions); front ends use the calls below
    /// (`scripts/check-crates.py` fails on a front end that reaches past the client).
    pub fn page_reader(&self) -> &Arc<PageReader> {
        &self.worker
    }

    /// The cache's page size.
    pub fn page_size(&self) -> u64 {
        self.worker.page_size()
    }

    /// Pages of a file of `size` bytes.
    pub fn page_count(&self, size: u64) -> u64 {
        self.worker.page_count(size)
    }

    /// The cache's tiers, counts and evictions now.
    pub fn cache_stats(&self) -> silt_cache::PageStoreStats {
        self.worker.stats()
    }

    /// Page fetches in flight now.
    pub fn fetches_in_flight(&self) -> usize {
        self.worker.in_flight()
    }

    /// Sets the memory tier's quota (`silt memory --cache`): evicts down to it at once.
    pub fn set_cache_memory(&self, bytes: u64) {
        self.worker.page_store().set_memory_capacity(bytes);
    }

    /// Keeps the cached pages of `object` from eviction while the guard lives (a file the
    /// kernel reads in passthrough from the cache's own file).
    pub(crate) fn keep_cached(&self, object: ObjectId) -> impl Send + Sync + 'static {
        self.worker.page_store().pin(object)
    }

    /// Whether a disk tier can take `size` more bytes without evicting anything (below its
    /// low watermark with them added).
    pub(crate) fn disk_takes_unevicted(&self, size: u64) -> bool {
        self.worker.page_store().disk_takes_unevicted(size)
    }

    /// Counts the pages of a file the kernel reads in passthrough, never asking Silt: all hits
    /// when it reads the cache's own file, all misses when it reads the store's.
    pub(crate) fn count_passthrough_read(&self, size: u64, from_store: bool) {
        let pages = self.page_count(size);
        if from_store {
            metrics::PAGE_MISSES.add(pages);
        } else {
            metrics::PAGE_HITS.add(pages);
        }
    }

    pub fn runtime(&self) -> &Handle {
        &self.rt
    }

    fn normalize(path: &str) -> Result<String> {
        silt_common::config::normalize_ns_path(path).ok_or_else(|| {
            Error::invalid(format!("{path:?} is not an absolute path without . or .."))
        })
    }

    /// The sync policy of a (normalised) path (asked on every lookup: no allocation).
    pub fn policy_of(&self, path: &str) -> SyncPolicy {
        self.sync.read().policy_for(path).0
    }

    /// The sync rules in force (the configured ones and those set since).
    pub fn sync_rules(&self) -> SyncRules {
        self.sync.read().clone()
    }

    /// Sets the sync policy of `path` and everything below it (until the process stops; the
    /// `sync_rules` option makes it permanent).
    pub fn set_sync_policy(&self, path: &str, policy: SyncPolicy) -> Result<PolicyInfo> {
        let path = Self::normalize(path)?;
        self.sync.write().set(path.clone(), policy);
        self.apply(&[Change {
            path: path.clone(),
            kind: ChangeKind::Policy,
            old_object: None,
        }]);
        self.policy_info(&path)
    }

    /// The policy of `path`, the rule that sets it and when the store last answered about it.
    pub fn policy_info(&self, path: &str) -> Result<PolicyInfo> {
        let path = Self::normalize(path)?;
        let (policy, rule) = {
            let rules = self.sync.read();
            let (p, rule) = rules.policy_for(&path);
            (p, rule.to_string())
        };
        let now = self.opts.clock.now();
        Ok(PolicyInfo {
            policy: policy.to_string(),
            rule,
            checked_secs_ago: self
                .meta
                .checked_at(&path)
                .map(|at| age(now, at).as_secs_f64()),
        })
    }

    /// Before the store loses `rel` (with `below`, everything under it too): each version of
    /// it open for reading here is read whole into the cache and pinned there until its last
    /// reader closes, so its descriptors go on reading it after the unlink or rename (POSIX),
    /// on every store. A page that cannot be read now (the store failing) is left to a later
    /// read, which then fails as the store does.
    pub(crate) async fn keep_open_bytes(&self, store: &silt_ufs::DynStore, rel: &str, below: bool) {
        let pages = self.worker.page_store().clone();
        let kept = self
            .open_versions
            .to_keep(store, rel, below, |id| (pages.pin(id), pages.prefer(id)));
        for obj in kept {
            let count = self.worker.page_count(obj.size());
            let step = self.worker.request_pages().max(1) * 8;
            let mut first = 0;
            while first < count {
                let last = (first + step).min(count) - 1;
                if let Err(e) = self.worker.read_pages(&obj, first..=last).await {
                    tracing::warn!(path = %obj.meta.path, error = %e, "an open file's bytes could not all be kept before its removal");
                    break;
                }
                first = last + 1;
            }
        }
    }

    /// The S3 headers of the file version `entry` names (as a stat or an open gave it):
    /// `Content-Type` and the other standard headers, user metadata, checksums and part sizes,
    /// as a gateway upload stored them, or as the store has them for an object written by an
    /// S3 client behind Silt's back. Empty for a directory, and for a file written through
    /// the mount or the SDK (a write replaces an object's headers). `ContentChanged` if the
    /// store holds another version now. Every front end reads them here: the gateway's
    /// GET/HEAD, the mount's `user.s3.*` extended attributes, the SDK's `info()`.
    pub async fn headers(&self, entry: &Entry) -> Result<Arc<silt_ufs::Headers>> {
        let Some(obj) = &entry.object else {
            return Ok(Arc::default());
        };
        if let Some(h) = self.headers_cache.get(obj.id) {
            return Ok(h);
        }
        let h = Arc::new(
            obj.store
                .headers(&obj.meta.path, &obj.meta)
                .await
                .map_err(|e| e.context(&entry.path))?,
        );
        self.headers_cache.put(obj.id, h.clone());
        Ok(h)
    }

    /// Acts on what changed: counts it, drops the pages of replaced versions and tells the
    /// listeners.
    fn apply(&self, changes: &[Change]) {
        if changes.is_empty() {
            return;
        }
        for c in changes {
            match c.kind {
                ChangeKind::Content | ChangeKind::Removed => metrics::META_CONTENT_CHANGES.inc(),
                ChangeKind::Metadata => metrics::META_METADATA_CHANGES.inc(),
                ChangeKind::Added
                | ChangeKind::Invalidated
                | ChangeKind::Policy
                | ChangeKind::Freed => {}
            }
            if let Some(obj) = &c.old_object {
                if !self.open_versions.defer_forget(obj) {
                    self.worker.forget_object(obj);
                }
            }
        }
        let listeners = self.listeners.lock().clone();
        for l in listeners {
            l(changes);
        }
    }

    /// Stat a namespace path.
    pub async fn stat(&self, path: &str) -> Result<Entry> {
        let path = Self::normalize(path)?;
        let policy = self.policy_of(&path);
        let now = self.opts.clock.now();
        let negative = policy.negative_trust(self.opts.negative_ttl);
        // Under `always`, a directory already known stands until its parent is read again
        // (readdir re-lists): an open checks its file, not every directory above it.
        let trust =
            |at, is_dir| (is_dir && policy == SyncPolicy::Always) || policy.trusts(age(now, at));
        let stale = match self.meta.stat(&path, trust, |at| age(now, at) < negative) {
            // A resident file past its TTL: ask again (the store may hold the path too).
            Lookup::Found(e) if self.resident_gone(&e) => {
                let changes = self.meta.invalidate(&path);
                self.apply(&changes);
                None
            }
            // A file with other names (hard links) may have changed through one of them.
            Lookup::Found(e) if e.posix.linked() => Some(e),
            Lookup::Found(e) => {
                metrics::META_CACHE_HITS.inc();
                return Ok(e);
            }
            Lookup::Missing => {
                metrics::META_CACHE_HITS.inc();
                return Err(not_found(&path));
            }
            // Counted below, only where the store is asked (synthetic dirs never are).
            Lookup::Unknown { stale } => stale,
        };
        let (mount, rel) = match self.ns.resolve(&path)? {
            Resolved::Synthetic { .. } => return Ok(Entry::synthetic_dir(path)),
            Resolved::Store { mount, rel } => (mount, rel),
        };
        // Under `always` a listing would be refetched per lookup: ask about the path alone.
        let linked = stale.as_ref().is_some_and(|e| e.posix.linked());
        if policy != SyncPolicy::Always
            && self.opts.lookup_lists_parent
            && !rel.is_empty()
            && !linked
        {
            if let Some(found) = self.stat_from_parent_listing(&path).await {
                return found;
            }
        }
        match self.ask_store(path, mount, &rel).await {
            Err(e) if e.kind() != ErrorKind::NotFound => self.stale_or(policy, stale, e),
            answer => answer,
        }
    }

    /// `stat`, asked of the store now whatever the cache holds, the answer recorded: for a
    /// create that must not take for new a name the store has (written behind Silt's back
    /// since the cached listing was made).
    pub(crate) async fn stat_store(&self, path: &str) -> Result<Entry> {
        let path = Self::normalize(path)?;
        let (mount, rel) = match self.ns.resolve(&path)? {
            Resolved::Synthetic { .. } => return Ok(Entry::synthetic_dir(path)),
            Resolved::Store { mount, rel } => (mount, rel),
        };
        self.ask_store(path, mount, &rel).await
    }

    /// The store's answer about `path` (`rel` in `mount`), recorded: the entry, or its
    /// absence. Other errors are not recorded.
    async fn ask_store(&self, path: String, mount: &MountPoint, rel: &str) -> Result<Entry> {
        metrics::META_CACHE_MISSES.inc();
        // Records carry the instant the store was asked: an answer is never newer than that.
        let asked = self.opts.clock.now();
        match mount.store.stat(rel).await {
            Ok(meta) => {
                let entry = Entry::from_meta(path, &mount.store, meta);
                let changes = self.meta.put_stat(asked, entry.clone());
                self.apply(&changes);
                Ok(entry)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let changes = self.meta.put_missing(asked, &path);
                self.apply(&changes);
                Err(not_found(&path))
            }
            Err(e) => Err(e.context(&path)),
        }
    }

    /// Whether `e` names a version Silt held that it holds no longer (expired, removed or
    /// uploaded elsewhere).
    fn resident_gone(&self, e: &Entry) -> bool {
        e.object.as_ref().is_some_and(|o| {
            resident::is_resident(&o.meta)
                && self
                    .writes
                    .resident
                    .get(&e.path)
                    .is_none_or(|f| f.meta.etag != o.meta.etag)
        })
    }

    /// The last answer when the store cannot give a new one, except under `always` (which
    /// promises the store's current answer or an error).
    fn stale_or<T>(&self, policy: SyncPolicy, stale: Option<T>, err: Error) -> Result<T> {
        match stale {
            Some(s) if policy != SyncPolicy::Always => {
                metrics::META_STALE_SERVED.inc();
                silt_common::warn_limited!(
                    "serving cached metadata: revalidation failed",
                    error = %err
                );
                Ok(s)
            }
            _ => Err(err),
        }
    }

    /// Answers a stat from the parent directory's listing, loading it if needed. `None` when
    /// the parent cannot be listed (then the caller asks the store about the path itself).
    async fn stat_from_parent_listing(&self, path: &str) -> Option<Result<Entry>> {
        let (parent, name) = parent_and_name(path)?;
        let list = self.list(parent).await.ok()?;
        Some(match list.binary_search_by(|e| e.name().cmp(name)) {
            Ok(i) => Ok(list[i].clone()),
            Err(_) => Err(not_found(path)),
        })
    }

    /// The direct children of a directory, sorted by name.
    pub async fn list(&self, path: &str) -> Result<Arc<Vec<Entry>>> {
        let path = Self::normalize(path)?;
        if let Some(l) = self.trusted_listing(&path) {
            metrics::META_CACHE_HITS.inc();
            return Ok(l);
        }
        if self.wait_for_sweep(&path).await {
            if let Some(l) = self.trusted_listing(&path) {
                metrics::META_CACHE_HITS.inc();
                return Ok(l);
            }
        }
        let (result, _) = self
            .listings
            .run(path.clone(), || async {
                self.load_listing(&path)
                    .await
                    .map_err(|e| (e.kind(), e.to_string()))
            })
            .await;
        result.map_err(|(kind, msg)| Error::new(kind, msg))
    }

    /// How long the kernel may keep what it is told about `path` now: `configured`, capped by
    /// what is left of the policy's trust in the answers it comes from (the path's own, and for
    /// a directory its listing too, which the kernel's readdir cache holds). So the kernel
    /// never keeps an answer longer than Silt would.
    pub fn kernel_ttl(&self, path: &str, configured: Duration, is_dir: bool) -> Duration {
        let Ok(path) = Self::normalize(path) else {
            return Duration::ZERO;
        };
        let policy = self.policy_of(&path);
        let ttl = policy.kernel_ttl(configured);
        let Some(trust) = policy.trust().filter(|t| !t.is_zero()) else {
            return ttl;
        };
        match self.meta.answered_at(&path, is_dir) {
            Some(at) => ttl.min(trust.saturating_sub(age(self.opts.clock.now(), at))),
            None => ttl,
        }
    }

    /// A digest of the names and kinds in `path`'s cached listing, if its sync policy still
    /// trusts it: equal digests, same directory contents. No store request.
    pub fn listing_digest(&self, path: &str) -> Option<u64> {
        let path = Self::normalize(path).ok()?;
        let policy = self.policy_of(&path);
        let now = self.opts.clock.now();
        self.meta
            .list_digest(&path, |at| policy.trusts(age(now, at)))
    }

    /// How many subdirectories `path`'s cached listing holds, if one is cached (any age): a
    /// directory's link count is 2 plus that. No store request.
    pub fn cached_subdirs(&self, path: &str) -> Option<u64> {
        let path = Self::normalize(path).ok()?;
        let (list, _) = self.meta.list(&path, |_| true)?;
        Some(list.iter().filter(|e| e.is_dir()).count() as u64)
    }

    /// `path`'s cached listing whatever its age, else a listing as `list` gives it: for a
    /// reader continuing a pass through a directory it began with `list`.
    pub async fn listing_continued(&self, path: &str) -> Result<Arc<Vec<Entry>>> {
        let normalized = Self::normalize(path)?;
        if let Some((l, _)) = self.meta.list(&normalized, |_| true) {
            return Ok(l);
        }
        self.list(path).await
    }

    fn trusted_listing(&self, path: &str) -> Option<Arc<Vec<Entry>>> {
        let policy = self.policy_of(path);
        let now = self.opts.clock.now();
        match self.meta.list(path, |at| policy.trusts(age(now, at))) {
            Some((l, true)) => Some(l),
            _ => None,
        }
    }

    /// Waits for a recursive listing in flight that covers `path`; whether there was one.
    async fn wait_for_sweep(&self, path: &str) -> bool {
        let rx = {
            let sweeps = self.sweeps.lock();
            sweeps
                .iter()
                .filter(|(root, _)| is_at_or_under(path, root))
                .map(|(_, rx)| rx.clone())
                .next()
        };
        match rx {
            Some(mut rx) => {
                // An error means the sweep ended without saying so (its task was dropped).
                let _ = rx.wait_for(|done| *done).await;
                true
            }
            None => false,
        }
    }

    async fn load_listing(&self, path: &str) -> Result<Arc<Vec<Entry>>> {
        // A caller that joined late may find the listing already cached.
        if let Some(l) = self.trusted_listing(path) {
            return Ok(l);
        }
        let policy = self.policy_of(path);
        let (mount, rel) = match self.ns.resolve(path)? {
            // Built from the mount table, not the store: not a cache miss, nothing to cache.
            Resolved::Synthetic { children } => {
                return Ok(Arc::new(
                    children
                        .into_iter()
                        .map(|c| Entry::synthetic_dir(join(path, &c)))
                        .collect(),
                ))
            }
            Resolved::Store { mount, rel } => (mount, rel),
        };
        metrics::META_CACHE_MISSES.inc();
        let bulk = policy != SyncPolicy::Always
            && self.opts.bulk_list_max > 0
            && mount.store.capabilities().native_recursive_list
            && !self.too_big.lock().contains(path);
        let result = if bulk {
            match self
                .sweep(path, mount, &rel, self.opts.bulk_list_max, true)
                .await
            {
                Ok(Some(f)) => return Ok(f.own),
                Ok(None) => {
                    tracing::info!(
                        path,
                        max = self.opts.bulk_list_max,
                        "tree too big for one listing: listing its directories one at a time"
                    );
                    self.too_big.lock().insert(path.to_string());
                    self.list_one(path, mount, &rel).await
                }
                Err(e) => Err(e),
            }
        } else {
            self.list_one(path, mount, &rel).await
        };
        match result {
            Ok(f) => Ok(f.own),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let changes = self.meta.put_missing(self.opts.clock.now(), path);
                self.apply(&changes);
                Err(e)
            }
            Err(e) => {
                // `|_| true`: any age will do; still `false` for a listing `invalidate` forgot.
                let stale = self
                    .meta
                    .list(path, |_| true)
                    .and_then(|(l, usable)| usable.then_some(l));
                self.stale_or(policy, stale, e)
            }
        }
    }

    /// One directory, one (paginated) listing, cached.
    async fn list_one(&self, path: &str, mount: &MountPoint, rel: &str) -> Result<Fetched> {
        let asked = self.opts.clock.now();
        let metas = mount
            .store
            .list(rel, false)
            .await
            .map_err(|e| e.context(path))?;
        let own = listing_from(path, mount, metas);
        let changes = self.meta.put_list(asked, path, own.clone());
        self.apply(&changes);
        Ok(Fetched {
            entries: own.len(),
            own,
            changes,
        })
    }

    /// Loads the whole tree below `path` with one recursive listing (at most `max` entries)
    /// and caches every directory's listing; `keep_trusted`: listings already cached and still
    /// trusted stay (a sweep fills what is missing or expired; `sync` replaces everything).
    /// `None`: the tree is bigger than `max`. Walkers needing a directory below `path` wait
    /// for it meanwhile.
    async fn sweep(
        &self,
        path: &str,
        mount: &MountPoint,
        rel: &str,
        max: usize,
        keep_trusted: bool,
    ) -> Result<Option<Fetched>> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.sweeps.lock().insert(path.to_string(), rx);
        // Ends the sweep for waiters however this returns (also when the future is dropped),
        // and unregisters it unless another sweep of the same root replaced it.
        struct Done<'a>(&'a Client, &'a str, tokio::sync::watch::Sender<bool>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut sweeps = self.0.sweeps.lock();
                if sweeps
                    .get(self.1)
                    .is_some_and(|rx| rx.same_channel(&self.2.subscribe()))
                {
                    sweeps.remove(self.1);
                }
                let _ = self.2.send(true);
            }
        }
        let _done = Done(self, path, tx);
        metrics::META_SWEEPS.inc();
        let asked = self.opts.clock.now();
        let Some(metas) = mount
            .store
            .list_tree(rel, max)
            .await
            .map_err(|e| e.context(path))?
        else {
            return Ok(None);
        };
        let entries = metas.len();
        let tree = tree_from(path, mount, metas);
        let own = tree
            .iter()
            .find(|(d, _)| d == path)
            .map(|(_, l)| l.clone())
            .unwrap_or_default();
        let now = self.opts.clock.now();
        let changes = self.meta.put_tree(asked, path, tree, |d, at| {
            keep_trusted && self.policy_of(d).trusts(age(now, at))
        });
        self.apply(&changes);
        Ok(Some(Fetched {
            own,
            changes,
            entries,
        }))
    }

    /// Revalidates `path` now, whatever its policy: one HEAD, and for a directory its listing
    /// (`recursive`: the whole tree in one recursive listing). Each result is cached only
    /// whole, so on failure the cached view is left as it was and the error returned.
    pub async fn sync(&self, path: &str, recursive: bool) -> Result<SyncReport> {
        let path = Self::normalize(path)?;
        // An attached client's store answers from its owner's metadata: the owner
        // revalidates first (the path, or with `recursive` the tree below it).
        if recursive {
            self.tell_changed_below(&path).await;
        } else {
            self.tell_changed_within(&path).await;
        }
        let mut report = SyncReport::default();
        let (mount, rel) = match self.ns.resolve(&path)? {
            Resolved::Synthetic { .. } => {
                // Nothing of its own: sync the mounts below it.
                if recursive {
                    let below: Vec<String> = self
                        .ns
                        .mounts()
                        .iter()
                        .filter(|m| is_at_or_under(&m.path, &path))
                        .map(|m| m.path.clone())
                        .collect();
                    for m in below {
                        let r = Box::pin(self.sync(&m, true)).await?;
                        report.merge(r);
                    }
                }
                return Ok(report);
            }
            Resolved::Store { mount, rel } => (mount, rel),
        };
        metrics::META_CACHE_MISSES.inc();
        let asked = self.opts.clock.now();
        report.checked = 1;
        let meta = match mount.store.stat(&rel).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let changes = self.meta.put_missing(asked, &path);
                report.add(&changes);
                self.apply(&changes);
                return Ok(report);
            }
            Err(e) => return Err(e.context(&path)),
        };
        let is_dir = meta.kind == EntryKind::Dir;
        let own = Entry::from_meta(path.clone(), &mount.store, meta);
        if is_dir {
            let fetched = if recursive {
                self.too_big.lock().retain(|d| !is_at_or_under(d, &path));
                self.sweep(&path, mount, &rel, usize::MAX, false)
                    .await?
                    .unwrap_or_default()
            } else {
                self.list_one(&path, mount, &rel).await?
            };
            report.checked += fetched.entries as u64;
            report.add(&fetched.changes);
        }
        let mut changes = self.meta.put_stat(asked, own);
        // It exists, so its parents do: cached listings above learn of any they lacked (a
        // write elsewhere that made its directories, e.g. an attached client's).
        self.note_parents(&path, &rel, &mount.store, asked, &mut changes);
        report.add(&changes);
        self.apply(&changes);
        Ok(report)
    }

    /// Drops what Silt knows about `path` and below: metadata (stats, listings, negative
    /// entries, the parent's listing) and the cached pages of every version it knew of. A
    /// file not in the metadata cache is asked about (one HEAD) to find its cached pages.
    pub async fn invalidate(&self, path: &str) -> Result<SyncReport> {
        let path = Self::normalize(path)?;
        // As in `sync`: what is asked next is asked of an owner that revalidated.
        self.tell_changed_within(&path).await;
        let mut changes = self.meta.invalidate(&path);
        self.too_big.lock().retain(|d| !is_at_or_under(d, &path));
        self.dir_times.forget_under(&path);
        if changes.is_empty() {
            if let Ok(Resolved::Store { mount, rel }) = self.ns.resolve(&path) {
                if let Ok(meta) = mount.store.stat(&rel).await {
                    if meta.kind == EntryKind::File {
                        let e = Entry::from_meta(path.clone(), &mount.store, meta);
                        changes.push(Change {
                            path: path.clone(),
                            kind: ChangeKind::Invalidated,
                            old_object: e.object.clone(),
                        });
                    }
                }
            }
        }
        let mut report = SyncReport {
            checked: changes.len() as u64,
            ..Default::default()
        };
        report.add(&changes);
        self.apply(&changes);
        Ok(report)
    }

    /// Opens a file for reading, pinning the version it has now.
    pub async fn open(&self, path: &str) -> Result<OpenFile> {
        let entry = self.stat(path).await?;
        if entry.is_dir() {
            return Err(Error::new(
                ErrorKind::IsADirectory,
                format!("{}: is a directory", entry.path),
            ));
        }
        if entry.kind == EntryKind::Symlink {
            // The kernel resolves links before opening; the client never follows one.
            return Err(Error::invalid(format!(
                "{}: is a symbolic link (resolve it first)",
                entry.path
            )));
        }
        if entry.kind.is_special() {
            // A FIFO, socket or device is opened by the kernel; it has no bytes to read here.
            return Err(Error::invalid(format!(
                "{}: is a special file (a FIFO, socket or device)",
                entry.path
            )));
        }
        let obj = entry
            .object
            .clone()
            .ok_or_else(|| Error::internal(format!("{}: file without an object", entry.path)))?;
        let resident = if resident::is_resident(&obj.meta) {
            match self.writes.resident.get(&entry.path) {
                Some(f) if f.meta.etag == obj.meta.etag => Some(f),
                _ => {
                    return Err(Error::new(
                        ErrorKind::ContentChanged,
                        format!(
                            "{}: the version Silt held was replaced or uploaded; retry",
                            entry.path
                        ),
                    ))
                }
            }
        } else {
            None
        };
        let hold = match resident {
            None => {
                self.expire_cached(&entry.path, &obj);
                Some(self.open_versions.hold(&self.worker, &obj))
            }
            Some(_) => None,
        };
        Ok(OpenFile {
            entry,
            obj,
            seq: Mutex::new(SeqState::default()),
            resident,
            _hold: hold,
        })
    }

    fn prefetch(&self, file: &OpenFile, offset: u64, end: u64) {
        let ps = self.worker.page_size();
        let range = file.seq.lock().observe(
            offset,
            end,
            file.size(),
            ps,
            self.opts.prefetch_max,
            self.worker.request_pages() * ps,
        );
        let Some(range) = range else { return };
        let first = range.start / ps;
        let last = (range.end - 1) / ps;
        self.worker.prefetch(&file.obj, first..=last);
    }

    /// Reads up to `len` bytes at `offset` (fewer only at end of file).
    pub async fn read(&self, file: &OpenFile, offset: u64, len: u64) -> Result<Bytes> {
        Ok(concat(self.read_chunks(file, offset, len).await?))
    }

    /// `read` as the cached pieces themselves, in order (no copy into one buffer): for a
    /// caller that copies them into its own buffer anyway (the Python SDK into `bytes`).
    pub async fn read_chunks(&self, file: &OpenFile, offset: u64, len: u64) -> Result<Vec<Bytes>> {
        let size = file.size();
        if offset >= size || len == 0 {
            return Ok(Vec::new());
        }
        let began = Instant::now();
        let end = (offset + len).min(size);
        if let Some(b) = self.read_resident(file, offset, end) {
            ReadFrom::Resident.histogram().since(began);
            return b.map(|b| vec![b]);
        }
        let (first, last) = self.page_span(offset, end);
        let looked = self.worker.cached_pages(file.obj.id, first..=last);
        self.read_looked(file, offset, end, looked, began).await
    }

    /// The bytes `[offset, offset + buf.len())` of the file written into `buf` (the range must
    /// lie inside the file): the SDK's reads into its own `bytes`. Pages this process holds
    /// are copied; otherwise whole pages (a whole file) are read from a same-host owner's
    /// cache file straight into `buf` (`BackingSource::read_into`: no page of this process
    /// allocated, filled or kept, so a fresh loader process touches its bytes once); else
    /// through the pages, as `read`.
    pub async fn read_into(&self, file: &OpenFile, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= file.size())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{}: read past the end of the file",
                    file.entry.path
                ))
            })?;
        if len == 0 {
            return Ok(());
        }
        let began = Instant::now();
        let chunks = match self.read_resident(file, offset, end) {
            Some(b) => {
                ReadFrom::Resident.histogram().since(began);
                vec![b?]
            }
            None => {
                let (first, last) = self.page_span(offset, end);
                let looked = self.worker.cached_pages(file.obj.id, first..=last);
                // Whole pages only: a piece of one is read the usual way, its page kept here
                // for the reads of its neighbours (pyarrow's small ranged reads).
                let ps = self.worker.page_size();
                let whole_pages =
                    offset.is_multiple_of(ps) && (end.is_multiple_of(ps) || end == file.size());
                let source = self
                    .backing
                    .as_ref()
                    .filter(|_| whole_pages && looked.iter().any(Option::is_none));
                if let Some(source) = source {
                    if source.read_into(&file.obj, offset, buf).await {
                        ReadFrom::Worker.histogram().since(began);
                        count_source(ReadSource::UnderStore, len);
                        return Ok(());
                    }
                }
                self.read_looked(file, offset, end, looked, began).await?
            }
        };
        let mut at = 0;
        for c in chunks {
            let Some(dst) = buf.get_mut(at..at + c.len()) else {
                return Err(Error::internal("a read gave more bytes than asked for"));
            };
            dst.copy_from_slice(&c);
            at += c.len();
        }
        if at != buf.len() {
            return Err(Error::internal("a read gave fewer bytes than asked for"));
        }
        Ok(())
    }

    /// Where a read's bytes came from, for `silt_client_read_seconds`: the slowest source
    /// of any of its pages.
    fn read_from<'a>(&self, sources: impl Iterator<Item = &'a ReadSource>) -> ReadFrom {
        let mut from = ReadFrom::Memory;
        for s in sources {
            match s {
                ReadSource::Memory => {}
                ReadSource::Disk => from = ReadFrom::Disk,
                ReadSource::UnderStore if self.worker.fetches_remotely() => {
                    return ReadFrom::Worker
                }
                ReadSource::UnderStore => return ReadFrom::Store,
            }
        }
        from
    }

    /// Pages `[first, last]` holding the bytes `[offset, end)` (`end > offset`).
    fn page_span(&self, offset: u64, end: u64) -> (u64, u64) {
        let ps = self.worker.page_size();
        (offset / ps, (end - 1) / ps)
    }

    /// The bytes `[offset, end)` as pieces, given the cache's answer for their pages
    /// (`PageReader::cached_pages`, looked at once per read: each look counts for admission).
    async fn read_looked(
        &self,
        file: &OpenFile,
        offset: u64,
        end: u64,
        looked: Vec<Option<(Bytes, ReadSource)>>,
        began: Instant,
    ) -> Result<Vec<Bytes>> {
        self.prefetch(file, offset, end);
        let ps = self.worker.page_size();
        let (first, _) = self.page_span(offset, end);
        let pages = self
            .worker
            .fill_missing(&file.obj, first, looked)
            .await
            .map_err(|e| e.context(&file.entry.path))?;
        self.read_from(pages.iter().map(|(_, s)| s))
            .histogram()
            .since(began);
        Ok(pages
            .iter()
            .enumerate()
            .map(|(i, (page, src))| {
                let b = silt_reader::page_slice(ps, first + i as u64, page, offset, end);
                count_source(*src, b.len() as u64);
                b
            })
            .collect())
    }

    /// The bytes `[offset, end)` of a file resident in Silt (cache-only, or back and not yet
    /// uploaded), straight from where it is kept: no page cache, no runtime. `None` for a
    /// store object.
    fn read_resident(&self, file: &OpenFile, offset: u64, end: u64) -> Option<Result<Bytes>> {
        let f = file.resident.as_ref()?;
        let b = resident::read_resident(f, offset..end).map_err(|e| e.context(&file.entry.path));
        if let Ok(b) = &b {
            metrics::READ_BYTES_RESIDENT.add(b.len() as u64);
        }
        Some(b)
    }

    fn assemble(
        ps: u64,
        first: u64,
        offset: u64,
        end: u64,
        pages: Vec<(Bytes, ReadSource)>,
    ) -> Bytes {
        let slice = |i: usize, page: &Bytes| {
            silt_reader::page_slice(ps, first + i as u64, page, offset, end)
        };
        if pages.len() == 1 {
            let (page, src) = &pages[0];
            let b = slice(0, page);
            count_source(*src, b.len() as u64);
            return b;
        }
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        for (i, (page, src)) in pages.iter().enumerate() {
            let b = slice(i, page);
            count_source(*src, b.len() as u64);
            out.extend_from_slice(&b);
        }
        out.freeze()
    }

    /// Blocking read for threads outside the runtime (FUSE): cache hits never touch the
    /// runtime; misses block on it.
    pub fn read_blocking(&self, file: &OpenFile, offset: u64, len: u64) -> Result<Bytes> {
        let size = file.size();
        if offset >= size || len == 0 {
            return Ok(Bytes::new());
        }
        let began = Instant::now();
        let end = (offset + len).min(size);
        if let Some(b) = self.read_resident(file, offset, end) {
            ReadFrom::Resident.histogram().since(began);
            return b;
        }
        let (first, last) = self.page_span(offset, end);
        let looked = self.worker.cached_pages(file.obj.id, first..=last);
        if looked.iter().all(Option::is_some) {
            let pages: Vec<(Bytes, ReadSource)> = looked.into_iter().flatten().collect();
            let from = self.read_from(pages.iter().map(|(_, s)| s));
            let b = Self::assemble(self.worker.page_size(), first, offset, end, pages);
            self.prefetch(file, offset, end);
            from.histogram().since(began);
            return Ok(b);
        }
        Ok(concat(self.rt.block_on(
            self.read_looked(file, offset, end, looked, began),
        )?))
    }

    /// Every file below `path` (or `path` itself if it is a file), walking listings.
    pub async fn walk_files(&self, path: &str) -> Result<Vec<Entry>> {
        let root = self.stat(path).await?;
        if root.kind == EntryKind::File {
            return Ok(vec![root]);
        }
        if !root.is_dir() {
            return Ok(Vec::new());
        }
        let mut files = Vec::new();
        let mut dirs = vec![root.path];
        while let Some(dir) = dirs.pop() {
            for e in self.list(&dir).await?.iter() {
                // Links are not followed (their targets may be anywhere, or loop).
                match e.kind {
                    EntryKind::Dir => dirs.push(e.path.clone()),
                    EntryKind::File => files.push(e.clone()),
                    EntryKind::Symlink | EntryKind::Special(_) => {}
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// How much of the files at or below `path` is cached here, and pinned.
    pub async fn cache_usage(&self, path: &str) -> Result<CacheUsage> {
        Ok(self.usage_of(&self.walk_files(path).await?))
    }

    /// How much of `files` (from `walk_files`) is in this process's cache, and pinned.
    pub fn usage_of(&self, files: &[Entry]) -> CacheUsage {
        let store = self.worker.page_store();
        let ps = self.worker.page_size();
        let mut u = CacheUsage::default();
        for f in files {
            u.files += 1;
            u.bytes += f.size;
            let Some(obj) = &f.object else { continue };
            u.pinned_bytes += store.pinned_bytes_in(obj.id, 0..f.size);
            for i in 0..f.size.div_ceil(ps) {
                if store.contains(&silt_common::PageKey::new(obj.id, i)) {
                    u.cached_bytes += ps.min(f.size - i * ps);
                }
            }
        }
        u
    }

    /// Pins every file at or below `path` in this process's cache (their pages are never
    /// evicted), then loads them. Refused as a whole, pinning nothing, when they would not
    /// fit the disk tiers (see `PageStore::pin_user`).
    pub async fn pin(&self, path: &str) -> Result<CacheUsage> {
        let files = self.walk_files(path).await?;
        let objects: Vec<(ObjectId, std::ops::Range<u64>)> = files
            .iter()
            .filter_map(|f| f.object.as_ref().map(|o| (o.id, 0..o.size())))
            .collect();
        self.worker
            .page_store()
            .pin_user(&objects)
            .map_err(|e| e.context(path))?;
        self.load_files(&files, self.opts.fetch_concurrency, true, |_| {})
            .await?;
        Ok(self.usage_of(&files))
    }

    /// Unpins every file at or below `path`; how many were pinned.
    pub async fn unpin(&self, path: &str) -> Result<u64> {
        let files = self.walk_files(path).await?;
        let ids: Vec<ObjectId> = files
            .iter()
            .filter_map(|f| f.object.as_ref().map(|o| o.id))
            .collect();
        Ok(self.worker.page_store().unpin_user(&ids) as u64)
    }

    /// Drops the cached pages (and pins) of every file at or below `path` now, here and on
    /// the workers that hold them; what was cached before.
    pub async fn free(&self, path: &str) -> Result<CacheUsage> {
        let files = self.walk_files(path).await?;
        let before = self.usage_of(&files);
        for obj in files.iter().filter_map(|f| f.object.as_ref()) {
            self.worker.forget_object(obj);
        }
        self.freed(path, &files).await;
        Ok(before)
    }

    /// Tells the listeners that the cached bytes of `files` (those at or below `path`) are
    /// gone (`free`), so a mount drops its kernel's copy too, and the owner this client is
    /// attached to, for its mount: a read after `silt fs free` is a cold one everywhere.
    pub async fn freed(&self, path: &str, files: &[Entry]) {
        self.freed_here(files);
        if let Some(sink) = self.change_sink.get() {
            sink.freed(path).await;
        }
    }

    /// `freed` for this client's listeners only (the owner's side of an attached free).
    pub fn freed_here(&self, files: &[Entry]) {
        let changes: Vec<Change> = files
            .iter()
            .map(|f| Change {
                path: f.path.clone(),
                kind: ChangeKind::Freed,
                old_object: None,
            })
            .collect();
        self.apply(&changes);
    }

    /// Preloads every file below `path` into the cache, pages from many files in flight at
    /// once (never one job per file). Already cached pages are skipped, so a rerun resumes.
    pub async fn load(
        &self,
        path: &str,
        progress: impl FnMut(&LoadProgress),
    ) -> Result<LoadProgress> {
        let paths = [path.to_string()];
        self.load_paths(&paths, self.opts.fetch_concurrency, progress)
            .await
    }

    /// Fetches every page of `file`'s version the cache lacks (`load` of one open file), e.g.
    /// so a mount can hand the kernel the whole local copy. Unlike `load`, the pages are
    /// admitted as a read's would be: a full cache keeps them only where the admission policy
    /// says so. A file resident in Silt (written here, not uploaded) has nothing to fetch.
    /// Returns the bytes fetched.
    pub async fn fill(&self, file: &OpenFile) -> Result<u64> {
        if file.resident.is_some() {
            return Ok(0);
        }
        let mut entry = file.entry.clone();
        entry.size = file.size();
        entry.object = Some(file.obj.clone());
        self.load_files(&[entry], self.opts.fetch_concurrency, false, |_| {})
            .await
            .map(|p| p.bytes_done)
    }

    /// The under-store's own file of `file`'s version, opened read-only, where the store keeps
    /// its objects as files this host can open (`file://`, a local or NFS directory) and the
    /// file still holds that version: a reader can read it without the cache (see
    /// `UnderStore::local_file`). `None` for a file resident in Silt and everywhere else.
    pub(crate) async fn source_file(&self, file: &OpenFile) -> Option<std::fs::File> {
        if file.resident.is_some() {
            return None;
        }
        file.obj
            .store
            .local_file(&file.obj.meta.path, &file.obj.meta)
            .await
    }

    /// `load` of every file at or below each of `paths` as one job (pages of all of them in
    /// flight together, not one path after another), with at most `concurrency` fetches in
    /// flight.
    pub async fn load_paths(
        &self,
        paths: &[String],
        concurrency: usize,
        progress: impl FnMut(&LoadProgress),
    ) -> Result<LoadProgress> {
        let files = self.walk_paths(paths).await?;
        self.load_files(&files, concurrency, true, progress).await
    }

    /// `walk_files` of each path, in order.
    pub async fn walk_paths(&self, paths: &[String]) -> Result<Vec<Entry>> {
        let mut files = Vec::new();
        for p in paths {
            files.extend(self.walk_files(p).await?);
        }
        Ok(files)
    }

    /// `asked`: the user asked for these files (`silt load`, a pin): cached even where the
    /// cache is full of pages read as often. Otherwise admitted as a read's pages would be.
    async fn load_files(
        &self,
        files: &[Entry],
        concurrency: usize,
        asked: bool,
        mut progress: impl FnMut(&LoadProgress),
    ) -> Result<LoadProgress> {
        let ps = self.worker.page_size();
        let mut p = LoadProgress {
            files_total: files.len() as u64,
            bytes_total: files.iter().map(|f| f.size).sum(),
            ..Default::default()
        };
        // Runs of consecutive missing pages, each one request long.
        let per_request = self.worker.request_pages();
        let mut work: Vec<(Arc<ObjectRef>, u64, u64, u64)> = Vec::new();
        for f in files {
            let Some(obj) = f.object.clone() else {
                continue;
            };
            for i in 0..f.size.div_ceil(ps) {
                let len = ps.min(f.size - i * ps);
                if self
                    .worker
                    .page_store()
                    .contains(&silt_common::PageKey::new(obj.id, i))
                {
                    p.bytes_cached += len;
                    continue;
                }
                p.pages_total += 1;
                match work.last_mut() {
                    Some((o, first, last, bytes))
                        if o.id == obj.id && *last + 1 == i && i - *first < per_request =>
                    {
                        *last = i;
                        *bytes += len;
                    }
                    _ => work.push((obj.clone(), i, i, len)),
                }
            }
        }
        progress(&p);
        let mut results = stream::iter(work)
            .map(|(obj, first, last, bytes)| {
                let worker = self.worker.clone();
                async move {
                    let _prefer = asked.then(|| worker.page_store().prefer(obj.id));
                    worker
                        .read_pages(&obj, first..=last)
                        .await
                        .map(|_| (last - first + 1, bytes))
                        .map_err(|e| e.context(&obj.meta.path))
                }
            })
            .buffer_unordered(concurrency.max(1));
        while let Some(r) = results.next().await {
            let (pages, bytes) = r?;
            p.bytes_done += bytes;
            p.pages_done += pages;
            progress(&p);
        }
        Ok(p)
    }
}
