//! Every metric name Silt exports, defined once. Counters are process-wide atomics; the
//! report and (later) the Prometheus exporter read them through [`all`].

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub fn inc(&self) {
        self.add(1)
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

/// One exported metric: its stable name, help text and counter.
pub struct MetricDef {
    pub name: &'static str,
    pub help: &'static str,
    pub counter: &'static Counter,
}

macro_rules! define_metrics {
    ($($ident:ident = $name:literal, $help:literal;)*) => {
        $(
            #[doc = $help]
            pub static $ident: Counter = Counter::new();
        )*
        /// Every metric, in definition order.
        pub fn all() -> &'static [MetricDef] {
            static ALL: &[MetricDef] = &[
                $(MetricDef { name: $name, help: $help, counter: &$ident },)*
            ];
            ALL
        }
    };
}

define_metrics! {
    READ_BYTES_MEMORY = "silt_read_bytes_memory_total", "Bytes served to readers from the memory tier.";
    READ_BYTES_DISK = "silt_read_bytes_disk_total", "Bytes served to readers from a disk tier.";
    READ_BYTES_UFS = "silt_read_bytes_ufs_total", "Bytes served to readers that had to come from the under-store.";
    READ_BYTES_RESIDENT = "silt_read_bytes_resident_total", "Bytes served to readers from files resident only in Silt (cache-only, or back and not yet uploaded).";
    WRITE_COMMITS = "silt_write_commits_total", "Files written through Silt and committed (closed or fsynced with new bytes), any write type.";
    WRITE_PERSISTED = "silt_write_persisted_total", "`back` files uploaded to the under-store and dropped from the write-ahead log.";
    WRITE_PERSIST_FAILURES = "silt_write_persist_failures_total", "Failed upload attempts of `back` files (each is retried with backoff; `silt fs status` shows the reason).";
    PAGE_HITS = "silt_page_hits_total", "Page lookups answered by the page store (any tier).";
    PAGE_MISSES = "silt_page_misses_total", "Page lookups that had to fetch from the under-store.";
    SINGLEFLIGHT_JOINS = "silt_singleflight_joins_total", "Page misses that joined a fetch already in flight instead of issuing their own.";
    PREFETCH_PAGES = "silt_prefetch_pages_total", "Pages fetched ahead of the reader by the sequential prefetcher.";
    UFS_REQUESTS = "silt_ufs_requests_total", "Requests issued to under-stores (reads, stats, listings).";
    UFS_READ_BYTES = "silt_ufs_read_bytes_total", "Bytes read from under-stores.";
    PAGE_BUFFERS_ALLOCATED = "silt_page_buffers_allocated_total", "Page-sized fetch buffers allocated because the pool had none idle.";
    PAGE_BUFFERS_REUSED = "silt_page_buffers_reused_total", "Page-sized fetch buffers taken from the pool (freed by evicted pages) instead of allocated.";
    UFS_ERRORS = "silt_ufs_errors_total", "Under-store requests that failed.";
    CHECKSUM_FAILURES = "silt_checksum_failures_total", "Pages read from disk whose checksum did not match (dropped and refetched).";
    DISK_DIRECT_WRITES = "silt_disk_direct_writes_total", "Pages written to a disk tier with O_DIRECT (straight from the fetch buffer, not through the page cache).";
    PAGES_EVICTED = "silt_pages_evicted_total", "Pages evicted from any tier.";
    META_CACHE_HITS = "silt_meta_cache_hits_total", "Stat or listing lookups answered by the metadata cache.";
    META_CACHE_MISSES = "silt_meta_cache_misses_total", "Stat or listing lookups that went to the under-store.";
    META_SWEEPS = "silt_meta_sweeps_total", "Directory trees loaded with one recursive listing of the under-store (bulk listing).";
    META_CONTENT_CHANGES = "silt_meta_content_changes_total", "Paths whose content changed or that disappeared in the under-store, as noticed by a revalidation (their old pages are dropped).";
    META_METADATA_CHANGES = "silt_meta_metadata_changes_total", "Paths whose attributes alone changed (mode, mtime next to an ETag): cached pages kept.";
    META_STALE_SERVED = "silt_meta_stale_served_total", "Lookups answered from expired metadata because the revalidation failed (store error or timeout; never under `always`).";
    FUSE_OPENS_PASSTHROUGH = "silt_fuse_opens_passthrough_total", "Opens served in FUSE passthrough mode (reads bypass the daemon).";
    FUSE_OPENS_DAEMON = "silt_fuse_opens_daemon_total", "Opens served through the daemon's read path.";
    FUSE_READ_BYTES = "silt_fuse_read_bytes_total", "Bytes returned by the daemon to FUSE read requests.";
    REMOTE_READS = "silt_remote_reads_total", "Page-group reads a client sent to the owning worker (or a failover candidate).";
    REMOTE_READ_BYTES = "silt_remote_read_bytes_total", "Bytes a client received from workers.";
    REMOTE_FD_READS = "silt_remote_fd_reads_total", "Same-host reads served by reading a worker's cache file through a passed file descriptor.";
    FAILOVERS = "silt_failovers_total", "Reads from a worker that failed or timed out and moved on to the next candidate.";
    FAILOVER_UFS_READS = "silt_failover_ufs_reads_total", "Reads a client served from the under-store because no candidate worker answered.";
    RPC_READS_SERVED = "silt_rpc_reads_served_total", "Read requests a worker served to clients.";
    RPC_BYTES_SERVED = "silt_rpc_bytes_served_total", "Bytes a worker sent to clients (not counting passed file descriptors).";
    RPC_FILES_LENT = "silt_rpc_files_lent_total", "Cache files a worker lent to same-host clients for FUSE passthrough (pinned until the client lets go).";
    RPC_AUTH_FAILURES = "silt_rpc_auth_failures_total", "Connections to a worker refused because they did not prove cluster membership (no, wrong or replayed proof of the cluster secret, or none in time).";
    WRITE_SPILLED_BYTES = "silt_write_spilled_bytes_total", "Bytes of write-buffer chunks placed on a spill disk (moved out of memory under pressure, or allocated there when memory was full), a whole chunk each.";
    WRITE_NOSPACE = "silt_write_nospace_total", "Write-buffer chunks refused with ENOSPC because neither memory nor any spill tier had room.";
    GATEWAY_REQUESTS = "silt_gateway_requests_total", "HTTP requests the S3 gateway answered.";
    GATEWAY_ERRORS = "silt_gateway_errors_total", "S3 gateway requests answered with an error status (4xx, 5xx; 304 is not one).";
    GATEWAY_DENIED = "silt_gateway_denied_total", "S3 gateway requests refused with 403 (bad signature, unknown key, expired URL, no right to the operation or bucket, unsigned without --anonymous).";
    GATEWAY_READ_BYTES = "silt_gateway_read_bytes_total", "Object bytes the S3 gateway sent in GetObject bodies.";
    GATEWAY_WRITE_BYTES = "silt_gateway_write_bytes_total", "Object bytes the S3 gateway received in PutObject and UploadPart bodies (counted as they arrive, also for uploads refused afterwards).";
    GATEWAY_OBJECTS_WRITTEN = "silt_gateway_objects_written_total", "Objects the S3 gateway committed (PutObject, CopyObject, CompleteMultipartUpload).";
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_unique_and_prometheus_shaped() {
        let mut names: Vec<_> = super::all().iter().map(|m| m.name).collect();
        for n in &names {
            assert!(n.starts_with("silt_") && n.ends_with("_total"), "{n}");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        }
        let len = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), len);
    }
}

#[cfg(test)]
mod doc_tests {
    #[test]
    fn metrics_doc_lists_every_metric() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/METRICS.md"
        ))
        .expect("docs/METRICS.md");
        for m in super::all() {
            assert!(
                doc.contains(&format!("| `{}` |", m.name)),
                "docs/METRICS.md lacks {}",
                m.name
            );
        }
    }
}
