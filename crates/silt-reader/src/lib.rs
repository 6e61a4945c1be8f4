//! The page reader inside every client (and every `silt worker`): owns the page store and
//! fetches missing pages through its `Fetcher` (the under-stores on a single node and on a
//! worker, the router to the owning workers in a cluster client, whose page store is then its
//! memory-only near cache). Called `Worker` before, which read as the cluster member.
//!
//! Fetching. Request size and page size are separate: a run of consecutive missing pages is
//! fetched with one ranged GET of up to `request_size` bytes (8 MiB by default) and split into
//! pages, because object stores pay a large fixed cost per request — on the loopback S3 server
//! measured here, 1 MiB ranges moved half the bytes per second that 8 MiB ranges did at the
//! same concurrency. Every missing page is claimed in an in-flight table before its GET is
//! issued, so concurrent readers and the prefetcher of any page in a run wait for that one
//! request instead of issuing their own (single-flight at page granularity). Fetches run as
//! spawned tasks: a reader that gives up does not cancel a request others wait on. Bytes in
//! flight are bounded by `buffer_memory` and requests by `fetch_concurrency`, so memory stays
//! bounded however many readers miss at once.

use std::collections::HashMap;
use std::ops::{Range, RangeInclusive};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use silt_cache::{PageStore, PageStoreStats, Source};
use silt_common::metrics;
use silt_common::{Error, ErrorKind, ObjectId, PageKey, Result};
use silt_ufs::{DynStore, ObjectMeta};
use tokio::sync::{watch, Semaphore};

/// The part of page `index` (pages of `page_size` bytes) that lies in the byte range
/// `[offset, end)`, which must overlap the page.
pub fn page_slice(page_size: u64, index: u64, page: &Bytes, offset: u64, end: u64) -> Bytes {
    let base = index * page_size;
    let from = offset.saturating_sub(base) as usize;
    let to = ((end - base) as usize).min(page.len());
    page.slice(from.min(to)..to)
}

/// Where the bytes of a read came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSource {
    Memory,
    Disk,
    UnderStore,
}

impl From<Source> for ReadSource {
    fn from(s: Source) -> Self {
        match s {
            Source::Memory => ReadSource::Memory,
            Source::Disk(_) => ReadSource::Disk,
        }
    }
}

/// Page reader tuning knobs (from `Config`).
#[derive(Debug, Clone)]
pub struct PageReaderOptions {
    pub fetch_concurrency: usize,
    pub buffer_memory: u64,
    /// Largest single ranged request to an under-store (rounded down to whole pages, at least
    /// one page).
    pub request_size: u64,
}

/// One version of one object, as the worker needs it to fetch pages.
#[derive(Clone)]
pub struct ObjectRef {
    pub store: DynStore,
    pub meta: ObjectMeta,
    pub id: ObjectId,
}

impl std::fmt::Debug for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectRef")
            .field("store", &self.store.uri())
            .field("path", &self.meta.path)
            .field("id", &self.id)
            .finish()
    }
}

impl ObjectRef {
    pub fn new(store: DynStore, meta: ObjectMeta) -> Self {
        let id = ObjectId::new(store.uri(), &meta.path, &meta.content_fingerprint());
        ObjectRef { store, meta, id }
    }

    pub fn size(&self) -> u64 {
        self.meta.size
    }
}

type FlightResult = std::result::Result<Bytes, (ErrorKind, String)>;
type Waiter = watch::Receiver<Option<FlightResult>>;

impl PageReaderOptions {
    /// The worker part of Silt's configuration.
    pub fn from_config(cfg: &silt_common::config::Config) -> Self {
        PageReaderOptions {
            fetch_concurrency: cfg.fetch_concurrency,
            buffer_memory: cfg.buffer_memory,
            request_size: cfg.request_size,
        }
    }
}

/// Where a worker gets the bytes of pages it does not hold.
///
/// Invariant: `fetch` returns exactly the bytes `range` of the version `obj` names (so
/// `range.end - range.start` bytes), or an error; never bytes of another version. The worker
/// caches what it returns.
#[async_trait::async_trait]
pub trait Fetcher: Send + Sync {
    async fn fetch(&self, obj: &ObjectRef, range: Range<u64>) -> Result<Bytes>;
    /// `fetch`, cut into pieces of `page_size` bytes, each its own allocation (see
    /// `UnderStore::read_pieces`). This default cuts `fetch`'s answer.
    async fn fetch_pages(
        &self,
        obj: &ObjectRef,
        range: Range<u64>,
        page_size: u64,
    ) -> Result<Vec<Bytes>> {
        let bytes = self.fetch(obj, range).await?;
        Ok(silt_ufs::pieces(std::iter::once(bytes), page_size))
    }
    /// A version of an object is gone from the store (changed or deleted): whoever else holds
    /// its pages may drop them. Best effort; the pages could never be served for another
    /// version anyway (they are keyed by content fingerprint).
    async fn forget(&self, _object: Arc<ObjectRef>) {}
    /// Whether misses go to other workers rather than to the under-store (how a client's
    /// reads are labelled in `silt_client_read_seconds`).
    fn remote(&self) -> bool {
        false
    }
}

/// A local file holding an object's bytes at their own offsets, guaranteed to stay so while
/// `guard` lives (a same-host worker leases a private copy of its cache file, so its guard
/// holds nothing).
pub struct LeasedCopy {
    pub file: std::fs::File,
    pub guard: Box<dyn Send + Sync>,
}

/// Bytes of one whole object read from a file on this host, without the client (the SDK's
/// local reads): the process's own cache file, or a same-host worker's, leased while this lives.
pub trait LocalRead: Send + Sync {
    /// Fills `buf` with the bytes at `offset` (the range must lie inside the object). Blocks.
    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// The file itself, for a reader that maps it (zero-copy views): `None` where it cannot.
    /// The file stays as it is while `self` lives (its pages are pinned where it is cached).
    fn map_source(&self) -> Option<MapSource<'_>> {
        None
    }
}

/// Checks consecutive pages of `buf` (whole pages but maybe the file's last) against `crcs`,
/// one per page: `Corrupted` at the first that differs (counted in
/// `silt_checksum_failures_total`), or when `crcs` has fewer entries than `buf` has pages.
pub fn check_pages(buf: &[u8], page_size: u64, crcs: &[u32]) -> Result<()> {
    let ps = usize::try_from(page_size)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| Error::invalid(format!("page size {page_size}")))?;
    if buf.len().div_ceil(ps) > crcs.len() {
        return Err(Error::new(
            ErrorKind::Corrupted,
            "more pages than checksums to check them against",
        ));
    }
    for (page, crc) in buf.chunks(ps).zip(crcs) {
        if crc32c::crc32c(page) != *crc {
            silt_common::metrics::CHECKSUM_FAILURES.inc();
            return Err(Error::new(ErrorKind::Corrupted, "page checksum mismatch"));
        }
    }
    Ok(())
}

/// A whole object's local file for mapping (see [`LocalRead::map_source`]).
pub struct MapSource<'a> {
    pub file: &'a std::fs::File,
    /// The object's size: the file holds exactly its bytes from offset 0.
    pub size: u64,
    /// Page size and each page's CRC-32C: every mapped page must be checked before its bytes
    /// are handed out. `None`: the file was verified when it was taken (this process's own
    /// cache file, as the kernel reads it in passthrough).
    pub pages: Option<(u64, &'a [u32])>,
}

impl MapSource<'_> {
    /// Checks `bytes`, the file's whole pages from page `first` on (the last may be the
    /// file's short one), against their checksums; nothing to check without `pages`.
    pub fn check(&self, first: u64, bytes: &[u8]) -> Result<()> {
        let Some((ps, crcs)) = self.pages else {
            return Ok(());
        };
        let from = usize::try_from(first).unwrap_or(usize::MAX).min(crcs.len());
        check_pages(bytes, ps, &crcs[from..])
    }
}

/// Where a client without the object on its own disk can still get a local file for it.
/// `None`: not possible now (not on this host, not complete, no answer).
#[async_trait::async_trait]
pub trait BackingSource: Send + Sync {
    /// A file of its own for FUSE passthrough (a private copy: nothing the leasing worker does later
    /// changes it).
    async fn lease_copy(&self, obj: &ObjectRef) -> Option<LeasedCopy>;

    /// The leasing worker's own cache file, pinned there while the reader lives, each read checking
    /// the pages it touches (no copy).
    async fn local_reader(&self, _obj: &ObjectRef) -> Option<Box<dyn LocalRead>> {
        None
    }

    /// Bytes `offset..offset + buf.len()` of `obj` written into `buf` by the source itself (a
    /// same-host worker's cache file read in place), keeping none of them in this process;
    /// `false` (`buf` unspecified) when it cannot: the caller reads through its pages.
    async fn read_into(&self, _obj: &ObjectRef, _offset: u64, _buf: &mut [u8]) -> bool {
        false
    }
}

/// Reads straight from the object's under-store (a worker of the cluster, or a single node).
pub struct StoreFetcher;

#[async_trait::async_trait]
impl Fetcher for StoreFetcher {
    async fn fetch(&self, obj: &ObjectRef, range: Range<u64>) -> Result<Bytes> {
        obj.store.read(&obj.meta.path, range, &obj.meta).await
    }

    async fn fetch_pages(
        &self,
        obj: &ObjectRef,
        range: Range<u64>,
        page_size: u64,
    ) -> Result<Vec<Bytes>> {
        obj.store
            .read_pieces(&obj.meta.path, range, &obj.meta, page_size)
            .await
    }
}

/// What a fetch task needs, shared with the worker.
struct Shared {
    pages: Arc<PageStore>,
    fetcher: Arc<dyn Fetcher>,
    inflight: Mutex<HashMap<PageKey, Waiter>>,
    requests: Semaphore,
    /// Budget of fetch buffers, in KiB (semaphore permits are u32).
    buffer_kib: Semaphore,
    buffer_kib_total: u32,
    request_pages: u64,
}

pub struct PageReader {
    shared: Arc<Shared>,
    /// Fetch tasks are spawned here, also when a FUSE thread (outside the runtime) asks.
    rt: tokio::runtime::Handle,
}

/// Permits are KiB so that large budgets fit a u32.
fn kib(bytes: u64) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as u64) as u32
}

/// Pages a caller must wait for: (index, receiver).
type Claims = Vec<(u64, Waiter)>;

impl PageReader {
    pub fn new(
        pages: Arc<PageStore>,
        opts: &PageReaderOptions,
        rt: tokio::runtime::Handle,
    ) -> Self {
        Self::with_fetcher(pages, opts, rt, Arc::new(StoreFetcher))
    }

    /// A worker whose misses go to `fetcher` instead of the under-store (a cluster client's
    /// near cache fetches from the owning workers).
    pub fn with_fetcher(
        pages: Arc<PageStore>,
        opts: &PageReaderOptions,
        rt: tokio::runtime::Handle,
        fetcher: Arc<dyn Fetcher>,
    ) -> Self {
        let ps = pages.page_size();
        let total = kib(opts.buffer_memory).max(kib(opts.request_size.max(ps)));
        PageReader {
            shared: Arc::new(Shared {
                request_pages: (opts.request_size / ps).max(1),
                pages,
                fetcher,
                inflight: Mutex::new(HashMap::new()),
                requests: Semaphore::new(opts.fetch_concurrency.max(1)),
                buffer_kib: Semaphore::new(total as usize),
                buffer_kib_total: total,
            }),
            rt,
        }
    }

    /// Drops every cached page of one object version, here and (through the fetcher) on the
    /// workers that hold it.
    pub fn forget_object(&self, object: &Arc<ObjectRef>) {
        self.shared.pages.remove_object(object.id);
        let fetcher = self.shared.fetcher.clone();
        let object = object.clone();
        self.rt.spawn(async move { fetcher.forget(object).await });
    }

    pub fn page_store(&self) -> &Arc<PageStore> {
        &self.shared.pages
    }

    pub fn page_size(&self) -> u64 {
        self.shared.pages.page_size()
    }

    /// Pages fetched by one under-store request at most.
    pub fn request_pages(&self) -> u64 {
        self.shared.request_pages
    }

    /// Number of pages of an object of `size` bytes.
    pub fn page_count(&self, size: u64) -> u64 {
        size.div_ceil(self.page_size())
    }

    /// The cached page, if any (no I/O beyond a local disk read; never blocks on the network).
    pub fn cached_page(&self, object: ObjectId, index: u64) -> Option<(Bytes, ReadSource)> {
        let got = self.shared.pages.get(&PageKey::new(object, index));
        if got.is_some() {
            metrics::PAGE_HITS.inc();
        }
        got.map(|(b, s)| (b, s.into()))
    }

    /// Page `index` of `obj`, from the cache or fetched from the under-store.
    pub async fn read_page(&self, obj: &ObjectRef, index: u64) -> Result<(Bytes, ReadSource)> {
        let mut pages = self.read_pages(obj, index..=index).await?;
        pages
            .pop()
            .ok_or_else(|| Error::internal("read_pages returned nothing"))
    }

    /// Pages `range` of `obj`, in order: cached ones from the page store, missing ones fetched
    /// with as few requests as the request size allows.
    pub async fn read_pages(
        &self,
        obj: &ObjectRef,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(Bytes, ReadSource)>> {
        self.check_pages(obj, *range.start(), *range.end())?;
        let looked = self.cached_pages(obj.id, range.clone());
        self.fill_missing(obj, *range.start(), looked).await
    }

    fn check_pages(&self, obj: &ObjectRef, first: u64, last: u64) -> Result<()> {
        if last >= self.page_count(obj.size()) || first > last {
            return Err(Error::invalid(format!(
                "pages {first}..={last} are past the end of {} ({} bytes)",
                obj.meta.path,
                obj.size()
            )));
        }
        Ok(())
    }

    /// The cached pages of `range`, `None` for each missing one. Each look counts as a read
    /// of the page (for the cache's admission): look once per read, then hand the result to
    /// [`PageReader::fill_missing`] rather than calling [`PageReader::read_pages`] again.
    pub fn cached_pages(
        &self,
        object: ObjectId,
        range: RangeInclusive<u64>,
    ) -> Vec<Option<(Bytes, ReadSource)>> {
        range.map(|i| self.cached_page(object, i)).collect()
    }

    /// Pages `first..first + looked.len()` of `obj` in order, given what
    /// [`PageReader::cached_pages`] found: the missing ones fetched (or joined if in flight).
    pub async fn fill_missing(
        &self,
        obj: &ObjectRef,
        first: u64,
        looked: Vec<Option<(Bytes, ReadSource)>>,
    ) -> Result<Vec<(Bytes, ReadSource)>> {
        let last = (first + looked.len() as u64).wrapping_sub(1);
        self.check_pages(obj, first, last)?;
        let mut out = looked;
        let missing: Vec<u64> = (first..=last)
            .filter(|&i| out[(i - first) as usize].is_none())
            .collect();
        for (i, mut rx) in self.claim_and_fetch(obj, &missing, false).0 {
            let result = rx
                .wait_for(Option::is_some)
                .await
                .map_err(|_| Error::internal("page fetch task ended without a result"))?
                .clone();
            match result {
                Some(Ok(bytes)) => {
                    out[(i - first) as usize] = Some((bytes, ReadSource::UnderStore))
                }
                Some(Err((kind, msg))) => return Err(Error::new(kind, msg)),
                None => return Err(Error::internal("page fetch without a result")),
            }
        }
        out.into_iter()
            .map(|p| p.ok_or_else(|| Error::internal("a page was neither cached nor fetched")))
            .collect()
    }

    /// Starts fetching the pages of `range` that are neither cached nor in flight, without
    /// waiting (read-ahead). Returns how many pages it started.
    pub fn prefetch(&self, obj: &ObjectRef, range: RangeInclusive<u64>) -> u64 {
        let last = (*range.end()).min(self.page_count(obj.size()).saturating_sub(1));
        let wanted: Vec<u64> = (*range.start()..=last)
            .filter(|&i| !self.shared.pages.contains(&PageKey::new(obj.id, i)))
            .collect();
        let (_, started) = self.claim_and_fetch(obj, &wanted, true);
        metrics::PREFETCH_PAGES.add(started);
        started
    }

    /// Claims every page of `missing` not already in flight (joining the others), spawns one
    /// fetch per run of consecutive claimed pages (split at the request size), and returns a
    /// receiver for every page of `missing` and how many pages this call claimed. `ahead`:
    /// fetched before any read asked (kept until read: `PageStore::put_prefetched`).
    fn claim_and_fetch(&self, obj: &ObjectRef, missing: &[u64], ahead: bool) -> (Claims, u64) {
        let sh = &self.shared;
        let mut waits = Vec::with_capacity(missing.len());
        let mut claimed: Vec<(u64, watch::Sender<Option<FlightResult>>)> = Vec::new();
        {
            let mut inflight = sh.inflight.lock();
            for &i in missing {
                let key = PageKey::new(obj.id, i);
                if let Some(rx) = inflight.get(&key) {
                    metrics::SINGLEFLIGHT_JOINS.inc();
                    waits.push((i, rx.clone()));
                    continue;
                }
                let (tx, rx) = watch::channel(None);
                // Arrived since the caller looked: serve it from the cache.
                if let Some((bytes, _)) = sh.pages.get_again(&key) {
                    let _ = tx.send(Some(Ok(bytes)));
                    waits.push((i, rx));
                    continue;
                }
                metrics::PAGE_MISSES.inc();
                inflight.insert(key, rx.clone());
                waits.push((i, rx));
                claimed.push((i, tx));
            }
        }
        // Runs of consecutive indices, each at most `request_pages` long.
        let mut runs: Vec<Vec<(u64, watch::Sender<Option<FlightResult>>)>> = Vec::new();
        for (i, tx) in claimed {
            match runs.last_mut() {
                Some(run)
                    if run.last().is_some_and(|(j, _)| *j + 1 == i)
                        && (run.len() as u64) < sh.request_pages =>
                {
                    run.push((i, tx))
                }
                _ => runs.push(vec![(i, tx)]),
            }
        }
        let claimed_pages = runs.iter().map(|r| r.len() as u64).sum();
        for run in runs {
            self.rt
                .spawn(fetch_run(sh.clone(), obj.clone(), run, ahead));
        }
        (waits, claimed_pages)
    }

    pub fn stats(&self) -> PageStoreStats {
        self.shared.pages.stats()
    }

    /// Whether this worker's misses go to other workers (a cluster client's near cache).
    pub fn fetches_remotely(&self) -> bool {
        self.shared.fetcher.remote()
    }

    /// Pages currently being fetched.
    pub fn in_flight(&self) -> usize {
        self.shared.inflight.lock().len()
    }
}

/// Fetches one run of consecutive pages with a single ranged request, caches them and
/// answers their waiters.
async fn fetch_run(
    sh: Arc<Shared>,
    obj: ObjectRef,
    run: Vec<(u64, watch::Sender<Option<FlightResult>>)>,
    ahead: bool,
) {
    let ps = sh.pages.page_size();
    let size = obj.size();
    let (first, last) = match (run.first(), run.last()) {
        (Some((f, _)), Some((l, _))) => (*f, *l),
        _ => return,
    };
    let range = first * ps..((last + 1) * ps).min(size);
    // Each page its own allocation (`Fetcher::fetch_pages`), so the memory tier never pins a
    // whole request buffer for one surviving page.
    let result = fetch_range(&sh, &obj, range.clone()).await;
    // Cache every page before waking anyone (and outside the in-flight lock: puts write to disk).
    let pages: Vec<FlightResult> = run
        .iter()
        .map(|(i, _)| match &result {
            Ok(fetched) => {
                // fetch_range checked there is one page per index of the run.
                let Some(page) = fetched.get((i - first) as usize).cloned() else {
                    return Err((
                        ErrorKind::Internal,
                        "a fetched run missed a page".to_string(),
                    ));
                };
                let key = PageKey::new(obj.id, *i);
                let put = if ahead {
                    sh.pages.put_prefetched(key, page.clone(), size)
                } else {
                    sh.pages.put(key, page.clone(), size)
                };
                if let Err(e) = put {
                    silt_common::warn_limited!(
                        "could not cache page",
                        path = %obj.meta.path,
                        index = i,
                        error = %e
                    );
                }
                Ok(page)
            }
            Err(e) => Err(e.clone()),
        })
        .collect();
    let mut inflight = sh.inflight.lock();
    for ((i, tx), page) in run.into_iter().zip(pages) {
        inflight.remove(&PageKey::new(obj.id, i));
        let _ = tx.send(Some(page));
    }
}

async fn fetch_range(
    sh: &Shared,
    obj: &ObjectRef,
    range: std::ops::Range<u64>,
) -> std::result::Result<Vec<Bytes>, (ErrorKind, String)> {
    let len = range.end - range.start;
    let closed = |_| (ErrorKind::Internal, "worker is shutting down".to_string());
    let _buffer = sh
        .buffer_kib
        .acquire_many(kib(len).clamp(1, sh.buffer_kib_total))
        .await
        .map_err(closed)?;
    let _request = sh.requests.acquire().await.map_err(closed)?;
    let ps = sh.pages.page_size();
    let pages = sh
        .fetcher
        .fetch_pages(obj, range.clone(), ps)
        .await
        .map_err(|e| (e.kind(), e.to_string()))?;
    let got: u64 = pages.iter().map(|p| p.len() as u64).sum();
    if got != len || pages.len() as u64 != len.div_ceil(ps) {
        // Fewer bytes than the object's size promises: it changed under us.
        return Err((
            ErrorKind::ContentChanged,
            format!(
                "{} returned {got} bytes for {range:?}, expected {len}: object changed",
                obj.meta.path,
            ),
        ));
    }
    Ok(pages)
}
