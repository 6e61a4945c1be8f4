//! The client library every front end (FUSE, CLI, later the SDK and the S3 gateway) uses:
//! namespace resolution, the metadata cache, open files with sequential-read prefetch, and
//! parallel ranged fetches through the worker.
//!
//! Consistency: an open file is pinned to the version (content fingerprint) it was opened
//! at; every page it reads belongs to that version, and if the under-store object changed,
//! reads fail with `ContentChanged` (ESTALE) instead of mixing versions. Metadata is
//! trusted for `metadata_ttl`; after that the next stat or listing goes to the store.

mod meta;
pub mod namespace;
mod prefetch;
mod snapshot;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::stream::{self, StreamExt};
use parking_lot::Mutex;
use silt_common::metrics;
use silt_common::{Error, ErrorKind, Result};
use silt_ufs::{EntryKind, ObjectMeta};
use silt_worker::{BackingSource, HeldFile, ObjectRef, ReadSource, Worker};
use tokio::runtime::Handle;

use meta::{Cached, MetaCache};
use namespace::{join, Resolved};
pub use namespace::{MountPoint, Namespace};
use prefetch::SeqState;

/// Client tuning (from `Config`).
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub metadata_ttl: Duration,
    /// Answer a lookup in a directory whose listing is not cached by listing the directory
    /// (one paginated LIST, shared by concurrent callers) instead of a HEAD per name.
    pub lookup_lists_parent: bool,
    pub prefetch_max: u64,
    pub fetch_concurrency: usize,
}

/// A file or directory of the namespace.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Namespace path (`/data/x.jpg`).
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mtime: Option<SystemTime>,
    pub mode: Option<u32>,
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
            object: Some(Arc::new(ObjectRef::new(store.clone(), meta))),
        }
    }
}

/// A file opened for reading, pinned to one version of its object.
pub struct OpenFile {
    pub entry: Entry,
    obj: Arc<ObjectRef>,
    seq: Mutex<SeqState>,
}

impl OpenFile {
    pub fn object(&self) -> &ObjectRef {
        &self.obj
    }
    pub fn size(&self) -> u64 {
        self.obj.size()
    }
}

/// Progress of a preload.
#[derive(Debug, Clone, Default)]
pub struct LoadProgress {
    pub files_total: u64,
    pub bytes_total: u64,
    pub pages_done: u64,
    pub pages_total: u64,
    pub bytes_done: u64,
    /// Bytes that were already cached (skipped).
    pub bytes_cached: u64,
}

type ListFlight = std::result::Result<Arc<Vec<Entry>>, (ErrorKind, String)>;

pub struct Client {
    ns: Namespace,
    worker: Arc<Worker>,
    meta: MetaCache,
    /// Concurrent listings of one directory share one store request.
    listings: silt_cache::SingleFlight<String, ListFlight>,
    opts: ClientOptions,
    rt: Handle,
    /// Same-host workers that can lend their cache files (cluster clients).
    backing: Option<Arc<dyn BackingSource>>,
}

fn parent_and_name(path: &str) -> Option<(&str, &str)> {
    if path == "/" {
        return None;
    }
    let idx = path.rfind('/')?;
    let parent = if idx == 0 { "/" } else { &path[..idx] };
    Some((parent, &path[idx + 1..]))
}

fn count_source(source: ReadSource, n: u64) {
    match source {
        ReadSource::Memory => metrics::READ_BYTES_MEMORY.add(n),
        ReadSource::Disk => metrics::READ_BYTES_DISK.add(n),
        ReadSource::UnderStore => metrics::READ_BYTES_UFS.add(n),
    }
}

impl Client {
    /// `rt` runs background prefetches; blocking entry points use it too.
    pub fn new(ns: Namespace, worker: Arc<Worker>, opts: ClientOptions, rt: Handle) -> Self {
        Client {
            ns,
            meta: MetaCache::new(opts.metadata_ttl),
            listings: silt_cache::SingleFlight::new(),
            worker,
            opts,
            rt,
            backing: None,
        }
    }

    /// Lets opens use files lent by `source` (a same-host worker's cache) for passthrough.
    pub fn with_backing_source(mut self, source: Arc<dyn BackingSource>) -> Self {
        self.backing = Some(source);
        self
    }

    /// A local file for `obj` held for the caller, if a backing source can lend one. Blocks
    /// (for FUSE threads outside the runtime).
    pub fn hold_backing_blocking(&self, obj: &ObjectRef) -> Option<HeldFile> {
        let source = self.backing.as_ref()?;
        self.rt.block_on(source.hold(obj))
    }

    /// Saves the metadata cache to `path` (after a clean unmount) so the next start can reuse
    /// what is still fresh; see `snapshot` for the rules. Returns the records written.
    pub fn save_metadata(&self, path: &std::path::Path) -> std::io::Result<usize> {
        snapshot::save(path, &self.ns, self.meta.contents())
    }

    /// Loads (and removes) a snapshot written by `save_metadata`. Returns records restored.
    pub fn restore_metadata(&self, path: &std::path::Path) -> std::io::Result<usize> {
        snapshot::restore(
            path,
            &self.ns,
            self.opts.metadata_ttl,
            |at, e| self.meta.put_stat_at(at, e),
            |at, dir, l| self.meta.put_list_at(at, dir, l),
        )
    }

    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    pub fn runtime(&self) -> &Handle {
        &self.rt
    }

    fn normalize(path: &str) -> Result<String> {
        silt_common::config::normalize_ns_path(path).ok_or_else(|| {
            Error::invalid(format!("{path:?} is not an absolute path without . or .."))
        })
    }

    /// Stat a namespace path.
    pub async fn stat(&self, path: &str) -> Result<Entry> {
        let path = Self::normalize(path)?;
        match self.meta.stat(&path, parent_and_name(&path)) {
            Cached::Found(e) => {
                metrics::META_CACHE_HITS.inc();
                return Ok(e);
            }
            Cached::Missing => {
                metrics::META_CACHE_HITS.inc();
                return Err(Error::not_found(format!(
                    "{path}: no such file or directory"
                )));
            }
            // Counted below, only where the store is asked (synthetic dirs never are).
            Cached::Unknown => {}
        }
        let entry = match self.ns.resolve(&path)? {
            Resolved::Synthetic { .. } => Entry::synthetic_dir(path.clone()),
            Resolved::Store { mount, rel } => {
                if self.opts.lookup_lists_parent && !rel.is_empty() {
                    if let Some(found) = self.stat_from_parent_listing(&path).await {
                        return found;
                    }
                }
                metrics::META_CACHE_MISSES.inc();
                let meta = mount.store.stat(&rel).await.map_err(|e| e.context(&path))?;
                Entry::from_meta(path.clone(), &mount.store, meta)
            }
        };
        self.meta.put_stat(entry.clone());
        Ok(entry)
    }

    /// Answers a stat from the parent directory's listing, loading it if needed. `None` when
    /// the parent cannot be listed (then the caller asks the store about the path itself).
    async fn stat_from_parent_listing(&self, path: &str) -> Option<Result<Entry>> {
        let (parent, name) = parent_and_name(path)?;
        let list = self.list(parent).await.ok()?;
        Some(match list.binary_search_by(|e| e.name().cmp(name)) {
            Ok(i) => Ok(list[i].clone()),
            Err(_) => Err(Error::not_found(format!(
                "{path}: no such file or directory"
            ))),
        })
    }

    /// The direct children of a directory, sorted by name.
    pub async fn list(&self, path: &str) -> Result<Arc<Vec<Entry>>> {
        let path = Self::normalize(path)?;
        if let Some(l) = self.meta.list(&path) {
            metrics::META_CACHE_HITS.inc();
            return Ok(l);
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

    async fn load_listing(&self, path: &str) -> Result<Arc<Vec<Entry>>> {
        let path = path.to_string();
        // A caller that joined late may find the listing already cached.
        if let Some(l) = self.meta.list(&path) {
            return Ok(l);
        }
        let mut entries: Vec<Entry> = match self.ns.resolve(&path)? {
            // Built from the mount table, not the store: not a cache miss.
            Resolved::Synthetic { children } => children
                .into_iter()
                .map(|c| Entry::synthetic_dir(join(&path, &c)))
                .collect(),
            Resolved::Store { mount, rel } => {
                metrics::META_CACHE_MISSES.inc();
                let metas = mount
                    .store
                    .list(&rel, false)
                    .await
                    .map_err(|e| e.context(&path))?;
                metas
                    .into_iter()
                    .filter(|m| !m.name().is_empty())
                    .map(|m| {
                        let child = join(&path, m.name());
                        Entry::from_meta(child, &mount.store, m)
                    })
                    .collect()
            }
        };
        entries.sort_by(|a, b| a.name().cmp(b.name()));
        entries.dedup_by(|a, b| a.name() == b.name());
        let entries = Arc::new(entries);
        self.meta.put_list(&path, entries.clone());
        Ok(entries)
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
        let obj = entry
            .object
            .clone()
            .ok_or_else(|| Error::internal(format!("{}: file without an object", entry.path)))?;
        Ok(OpenFile {
            entry,
            obj,
            seq: Mutex::new(SeqState::default()),
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
        let size = file.size();
        if offset >= size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + len).min(size);
        self.prefetch(file, offset, end);
        let ps = self.worker.page_size();
        let first = offset / ps;
        let last = (end - 1) / ps;
        let pages = self
            .worker
            .read_pages(&file.obj, first..=last)
            .await
            .map_err(|e| e.context(&file.entry.path))?;
        Ok(Self::assemble(ps, first, offset, end, pages))
    }

    /// The bytes `[offset, end)` if every page is cached; `None` otherwise. No network.
    fn read_cached(&self, file: &OpenFile, offset: u64, end: u64) -> Option<Bytes> {
        let ps = self.worker.page_size();
        let first = offset / ps;
        let last = (end - 1) / ps;
        let mut pages = Vec::with_capacity((last - first + 1) as usize);
        for i in first..=last {
            pages.push(self.worker.cached_page(file.obj.id, i)?);
        }
        Some(Self::assemble(ps, first, offset, end, pages))
    }

    fn assemble(
        ps: u64,
        first: u64,
        offset: u64,
        end: u64,
        pages: Vec<(Bytes, ReadSource)>,
    ) -> Bytes {
        let slice = |i: usize, page: &Bytes| {
            silt_worker::page_slice(ps, first + i as u64, page, offset, end)
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
        let end = (offset + len).min(size);
        if let Some(b) = self.read_cached(file, offset, end) {
            self.prefetch(file, offset, end);
            return Ok(b);
        }
        self.rt.block_on(self.read(file, offset, len))
    }

    /// Every file below `path` (or `path` itself if it is a file), walking listings.
    pub async fn walk_files(&self, path: &str) -> Result<Vec<Entry>> {
        let root = self.stat(path).await?;
        if !root.is_dir() {
            return Ok(vec![root]);
        }
        let mut files = Vec::new();
        let mut dirs = vec![root.path];
        while let Some(dir) = dirs.pop() {
            for e in self.list(&dir).await?.iter() {
                if e.is_dir() {
                    dirs.push(e.path.clone());
                } else {
                    files.push(e.clone());
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// Preloads every file below `path` into the cache, pages from many files in flight at
    /// once (never one job per file). Already cached pages are skipped, so a rerun resumes.
    pub async fn load(
        &self,
        path: &str,
        mut progress: impl FnMut(&LoadProgress),
    ) -> Result<LoadProgress> {
        let files = self.walk_files(path).await?;
        let ps = self.worker.page_size();
        let mut p = LoadProgress {
            files_total: files.len() as u64,
            bytes_total: files.iter().map(|f| f.size).sum(),
            ..Default::default()
        };
        // Runs of consecutive missing pages, each one request long.
        let per_request = self.worker.request_pages();
        let mut work: Vec<(Arc<ObjectRef>, u64, u64, u64)> = Vec::new();
        for f in &files {
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
                    worker
                        .read_pages(&obj, first..=last)
                        .await
                        .map(|_| (last - first + 1, bytes))
                        .map_err(|e| e.context(&obj.meta.path))
                }
            })
            .buffer_unordered(self.opts.fetch_concurrency.max(1));
        while let Some(r) = results.next().await {
            let (pages, bytes) = r?;
            p.bytes_done += bytes;
            p.pages_done += pages;
            progress(&p);
        }
        Ok(p)
    }
}
