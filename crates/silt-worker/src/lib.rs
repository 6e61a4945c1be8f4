//! The worker: owns the page store and fetches missing pages from under-stores.
//!
//! On one machine (`silt up`, `silt mount`) the client calls the worker in-process; the cluster
//! issue puts a wire protocol between them without changing this API.
//!
//! A page miss goes through a single-flight table, so concurrent readers (and the
//! prefetcher) of one page issue one under-store request; fetches are bounded by a request
//! semaphore (`fetch_concurrency`) and a byte budget (`buffer_memory`) so memory stays bounded
//! however many readers miss at once.

use std::sync::Arc;

use bytes::Bytes;
use silt_cache::{PageStore, PageStoreStats, SingleFlight, Source};
use silt_common::metrics;
use silt_common::{Error, ErrorKind, ObjectId, PageKey, Result};
use silt_ufs::{DynStore, ObjectMeta};
use tokio::sync::Semaphore;

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

/// Worker tuning knobs (from `Config`).
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub fetch_concurrency: usize,
    pub buffer_memory: u64,
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

pub struct Worker {
    pages: Arc<PageStore>,
    flights: SingleFlight<PageKey, FlightResult>,
    requests: Arc<Semaphore>,
    /// Budget of fetch buffers, in KiB (semaphore permits are u32).
    buffer_kib: Arc<Semaphore>,
    buffer_kib_total: u32,
}

/// Permits are KiB so that large budgets fit a u32.
fn kib(bytes: u64) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as u64) as u32
}

impl Worker {
    pub fn new(pages: Arc<PageStore>, opts: &WorkerOptions) -> Self {
        let total = kib(opts.buffer_memory).max(kib(pages.page_size()));
        Worker {
            pages,
            flights: SingleFlight::new(),
            requests: Arc::new(Semaphore::new(opts.fetch_concurrency.max(1))),
            buffer_kib: Arc::new(Semaphore::new(total as usize)),
            buffer_kib_total: total,
        }
    }

    pub fn page_store(&self) -> &Arc<PageStore> {
        &self.pages
    }

    pub fn page_size(&self) -> u64 {
        self.pages.page_size()
    }

    /// Number of pages of an object of `size` bytes.
    pub fn page_count(&self, size: u64) -> u64 {
        size.div_ceil(self.page_size())
    }

    /// The cached page, if any (no I/O beyond a local disk read; never blocks on the network).
    pub fn cached_page(&self, object: ObjectId, index: u64) -> Option<(Bytes, ReadSource)> {
        let got = self.pages.get(&PageKey::new(object, index));
        if got.is_some() {
            metrics::PAGE_HITS.inc();
        }
        got.map(|(b, s)| (b, s.into()))
    }

    /// Page `index` of `obj`, from the cache or fetched from the under-store (single-flight).
    pub async fn read_page(&self, obj: &ObjectRef, index: u64) -> Result<(Bytes, ReadSource)> {
        if let Some(hit) = self.cached_page(obj.id, index) {
            return Ok(hit);
        }
        metrics::PAGE_MISSES.inc();
        let key = PageKey::new(obj.id, index);
        let (result, joined) = self
            .flights
            .run(key, || self.fetch_page(obj.clone(), index))
            .await;
        if joined {
            metrics::SINGLEFLIGHT_JOINS.inc();
        }
        match result {
            Ok(bytes) => Ok((bytes, ReadSource::UnderStore)),
            Err((kind, msg)) => Err(Error::new(kind, msg)),
        }
    }

    fn page_range(&self, size: u64, index: u64) -> std::ops::Range<u64> {
        let ps = self.page_size();
        let start = index * ps;
        start..(start + ps).min(size)
    }

    /// Fetches one page from the under-store and stores it. Runs once per page at a time.
    fn fetch_page(
        &self,
        obj: ObjectRef,
        index: u64,
    ) -> impl std::future::Future<Output = FlightResult> + Send + 'static {
        let range = self.page_range(obj.size(), index);
        let pages = self.pages.clone();
        let requests = self.requests.clone();
        let budget = self.buffer_kib.clone();
        let want = kib(range.end - range.start).clamp(1, self.buffer_kib_total);
        async move {
            if range.start >= range.end {
                return Err((
                    ErrorKind::InvalidInput,
                    format!("page {index} is past the end of {}", obj.meta.path),
                ));
            }
            let closed = |_| (ErrorKind::Internal, "worker is shutting down".to_string());
            let _buffer = budget.acquire_many_owned(want).await.map_err(closed)?;
            let _request = requests.acquire_owned().await.map_err(closed)?;
            // The page may have arrived while we waited for permits.
            if let Some((bytes, _)) = pages.get(&PageKey::new(obj.id, index)) {
                return Ok(bytes);
            }
            let len = range.end - range.start;
            let bytes = obj
                .store
                .read(&obj.meta.path, range, &obj.meta)
                .await
                .map_err(|e| (e.kind(), e.to_string()))?;
            if bytes.len() as u64 != len {
                // The store returned fewer bytes than the object's size promises: it changed.
                return Err((
                    ErrorKind::ContentChanged,
                    format!(
                        "{} returned {} bytes for page {index}, expected {len}: object changed",
                        obj.meta.path,
                        bytes.len()
                    ),
                ));
            }
            if let Err(e) = pages.put(PageKey::new(obj.id, index), bytes.clone(), obj.size()) {
                tracing::warn!(path = %obj.meta.path, index, error = %e, "could not cache page");
            }
            Ok(bytes)
        }
    }

    pub fn stats(&self) -> PageStoreStats {
        self.pages.stats()
    }
}
