//! Every metric name Silt exports, defined once: counters ([`all`]), latency histograms
//! ([`histograms`], [`UFS_REQUEST_SECONDS`]) and gauges ([`gauges`]). Counters and histograms
//! are process-wide atomics (fixed buckets, nothing allocated when a value is recorded);
//! most gauges are read from the running process when scraped, so only their names live
//! here. `silt report` and the Prometheus endpoint ([`Exposition`]) read them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    UFS_RECEIVES_DIRECT = "silt_ufs_receives_direct_total", "Ranged S3 GETs received straight into page buffers (s3_direct_receive).";
    UFS_RECEIVES_DECLINED = "silt_ufs_receives_declined_total", "Ranged S3 GETs whose answer the direct receive did not handle (an error status, a transfer coding, another range, a broken connection) and that were asked again through the HTTP client.";
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
    FUSE_OPENS_FILLED = "silt_fuse_opens_filled_total", "Passthrough opens of a file the open fetched whole first (`fuse_open_fill_max`; also counted in `silt_fuse_opens_passthrough_total`).";
    FUSE_OPENS_SOURCE = "silt_fuse_opens_source_total", "Passthrough opens of the under-store's own file (`fuse_source_passthrough`; also counted in `silt_fuse_opens_passthrough_total`).";
    FILLS_BEHIND_STARTED = "silt_fills_behind_started_total", "Background fetches of a whole file into the cache behind a reader of the store's own file (`fuse_source_passthrough`).";
    FILLS_BEHIND_FINISHED = "silt_fills_behind_finished_total", "Those background fetches that ended (fetched, refused by admission or failed): equal to the started ones when none is in flight.";
    FUSE_OPENS_DAEMON = "silt_fuse_opens_daemon_total", "Opens served through the daemon's read path (also those without the page cache, `fuse_cold_direct_io`: `direct` in `silt report`'s recent opens).";
    FUSE_READ_BYTES = "silt_fuse_read_bytes_total", "Bytes returned by the daemon to FUSE read requests.";
    REMOTE_READS = "silt_remote_reads_total", "Page-group reads a client sent to the owning worker (or a failover candidate).";
    REMOTE_READ_BYTES = "silt_remote_read_bytes_total", "Bytes a client received from workers.";
    REMOTE_FD_READS = "silt_remote_fd_reads_total", "Same-host reads served by reading a worker's cache file through a passed file descriptor.";
    FAILOVERS = "silt_failovers_total", "Reads from a worker that failed or timed out and moved on to the next candidate.";
    FAILOVER_UFS_READS = "silt_failover_ufs_reads_total", "Reads a client served from the under-store because no candidate worker answered.";
    RPC_READS_SERVED = "silt_rpc_reads_served_total", "Read requests a worker served to clients.";
    RPC_BYTES_SERVED = "silt_rpc_bytes_served_total", "Bytes a worker sent to clients (not counting passed file descriptors).";
    RPC_FILES_LEASED = "silt_rpc_files_leased_total", "Cache files a worker leased to same-host clients for FUSE passthrough (pinned until the client lets go).";
    RPC_AUTH_FAILURES = "silt_rpc_auth_failures_total", "Connections to a worker refused because they did not prove cluster membership (no, wrong or replayed proof of the cluster secret, or none in time).";
    WRITE_SPILLED_BYTES = "silt_write_spilled_bytes_total", "Bytes of write-buffer chunks placed on a spill disk (moved out of memory under pressure, or allocated there when memory was full), a whole chunk each.";
    WRITE_NOSPACE = "silt_write_nospace_total", "Write-buffer chunks refused with ENOSPC because neither memory nor any spill tier had room.";
    GATEWAY_REQUESTS = "silt_gateway_requests_total", "HTTP requests the S3 gateway answered.";
    GATEWAY_ERRORS = "silt_gateway_errors_total", "S3 gateway requests answered with an error status (4xx, 5xx; 304 is not one).";
    GATEWAY_DENIED = "silt_gateway_denied_total", "S3 gateway requests refused with 403 (bad signature, unknown key, expired URL, no right to the operation or bucket, unsigned without --anonymous).";
    GATEWAY_READ_BYTES = "silt_gateway_read_bytes_total", "Object bytes the S3 gateway sent in GetObject bodies.";
    GATEWAY_WRITE_BYTES = "silt_gateway_write_bytes_total", "Object bytes the S3 gateway received in PutObject and UploadPart bodies (counted as they arrive, also for uploads refused afterwards).";
    GATEWAY_OBJECTS_WRITTEN = "silt_gateway_objects_written_total", "Objects the S3 gateway committed (PutObject, CopyObject, CompleteMultipartUpload).";
    CSI_CALL_ERRORS = "silt_csi_call_errors_total", "CSI calls the plugin answered with an error status.";
    CSI_MOUNT_RESTARTS = "silt_csi_mount_restarts_total", "Volume mount processes the CSI plugin started again after they died (the pods' mounts waited meanwhile).";
}

/// How many latency buckets a histogram has (besides `+Inf`).
pub const BUCKETS: usize = 20;

/// Upper bounds of the latency buckets in seconds, as the exposition prints them (`le`).
/// From 10 µs (a page served from memory through FUSE) to 30 s (an under-store request at its
/// default deadline), about 2.5 × apart: fine enough to tell a memory hit from a disk hit from
/// a network round trip.
pub const BUCKET_BOUNDS: [&str; BUCKETS] = [
    "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
    "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30",
];

/// [`BUCKET_BOUNDS`] in nanoseconds (a unit test keeps the two equal).
const BUCKET_NS: [u64; BUCKETS] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// A latency histogram with the fixed [`BUCKET_BOUNDS`]: recording is a bucket search over
/// 20 constants and two relaxed atomic adds, no lock and no allocation.
#[derive(Debug)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    counts: [AtomicU64; BUCKETS + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub const fn new() -> Self {
        Histogram {
            counts: [const { AtomicU64::new(0) }; BUCKETS + 1],
            sum_ns: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn observe(&self, d: Duration) {
        self.observe_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    #[inline]
    pub fn observe_ns(&self, ns: u64) {
        let i = BUCKET_NS.partition_point(|&bound| bound < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Records the time since `start`.
    #[inline]
    pub fn since(&self, start: Instant) {
        self.observe(start.elapsed());
    }

    /// A guard that records the time until it is dropped.
    #[inline]
    pub fn timer(&self) -> Timer<'_> {
        Timer {
            histogram: self,
            start: Instant::now(),
        }
    }

    /// The cumulative bucket counts (`+Inf` last, which is the count) and the sum. Buckets
    /// are read one by one while others record, so the sum may lag the counts by the
    /// observations in flight; the counts themselves are always cumulative.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = [0; BUCKETS + 1];
        let mut n = 0;
        for (c, b) in cumulative.iter_mut().zip(&self.counts) {
            n += b.load(Ordering::Relaxed);
            *c = n;
        }
        HistogramSnapshot {
            cumulative,
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// A histogram's counts at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Observations at or below each bound of [`BUCKET_BOUNDS`], then all of them (`+Inf`).
    pub cumulative: [u64; BUCKETS + 1],
    pub sum_seconds: f64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.cumulative[BUCKETS]
    }
}

/// Records the time from its creation to its drop in a histogram.
#[must_use = "the time is recorded when the timer is dropped"]
pub struct Timer<'a> {
    histogram: &'a Histogram,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.histogram.since(self.start);
    }
}

/// Histograms of one name, told apart by one label with a fixed set of values.
pub struct HistogramFamily {
    pub name: &'static str,
    pub help: &'static str,
    pub label: &'static str,
    /// The label's values, one histogram each.
    pub values: &'static [&'static str],
    hists: &'static [Histogram],
}

impl HistogramFamily {
    /// The histogram of each label value, in the order of `values`.
    pub fn histograms(&self) -> impl Iterator<Item = (&'static str, &'static Histogram)> {
        self.values.iter().copied().zip(self.hists.iter())
    }
}

macro_rules! define_histograms {
    ($($ident:ident: $kind:ident = $name:literal, $label:literal, $help:literal {
        $($var:ident = $value:literal),+ $(,)?
    })*) => {
        $(
            #[doc = concat!("Values of the `", $label, "` label of `", $name, "`.")]
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            pub enum $kind {
                $($var),+
            }

            impl $kind {
                pub const ALL: &'static [$kind] = &[$($kind::$var),+];

                pub const fn label(self) -> &'static str {
                    match self {
                        $($kind::$var => $value),+
                    }
                }

                #[inline]
                pub fn histogram(self) -> &'static Histogram {
                    &$ident.hists[self as usize]
                }

                /// A guard recording the time until it drops in this value's histogram.
                #[inline]
                pub fn timer(self) -> Timer<'static> {
                    self.histogram().timer()
                }
            }

            #[doc = $help]
            pub static $ident: HistogramFamily = {
                const N: usize = <[&str]>::len(&[$($value),+]);
                static HISTS: [Histogram; N] = [const { Histogram::new() }; N];
                HistogramFamily {
                    name: $name,
                    help: $help,
                    label: $label,
                    values: &[$($value),+],
                    hists: &HISTS,
                }
            };
        )*

        /// Every histogram family with a fixed label set, in definition order (the under-store
        /// requests, labelled by mount too, are [`UFS_REQUEST_SECONDS`]).
        pub fn histograms() -> &'static [&'static HistogramFamily] {
            static ALL: &[&HistogramFamily] = &[$(&$ident),*];
            ALL
        }
    };
}

define_histograms! {
    FUSE_OP_SECONDS: FuseOp = "silt_fuse_op_seconds", "op", "Time the daemon took to answer one FUSE request, by operation (passthrough reads and the kernel's own cache hits never reach it)." {
        Lookup = "lookup", Getattr = "getattr", Setattr = "setattr", Open = "open", Read = "read",
        Write = "write", Flush = "flush", Fsync = "fsync", Release = "release", Create = "create",
        Unlink = "unlink", Mkdir = "mkdir", Rmdir = "rmdir", Rename = "rename", Link = "link",
        Symlink = "symlink", Readlink = "readlink", Readdir = "readdir", Readdirplus = "readdirplus",
        Statfs = "statfs", Access = "access", Mknod = "mknod", Getxattr = "getxattr",
        Listxattr = "listxattr",
    }
    CLIENT_READ_SECONDS: ReadFrom = "silt_client_read_seconds", "source", "Time of one read through the client (FUSE, SDK, gateway), by where its bytes came from: all pages in memory, some on a local disk tier, some from workers (cluster clients) or from the under-store (single nodes), or a file resident only in Silt." {
        Memory = "memory", Disk = "disk", Worker = "worker", Store = "store", Resident = "resident",
    }
    WORKER_RPC_SECONDS: RpcOp = "silt_worker_rpc_seconds", "op", "Time a worker took to serve one request from a client, by operation (a `read` passing a file descriptor includes the client's read of it; `lease` is not timed: it lasts as long as the client holds the file; `store` is every call of the worker's own under-store for a same-host client)." {
        Read = "read", Load = "load", Prefetch = "prefetch", Pin = "pin", Unpin = "unpin",
        Cached = "cached", Stats = "stats", Forget = "forget", LeaseCopy = "lease_copy", Changed = "changed",
        Resident = "resident", Store = "store",
    }
    CSI_CALL_SECONDS: CsiCall = "silt_csi_call_seconds", "call", "Time the CSI plugin took to answer one call, by call (a stage includes starting the volume's mount process; identity and capability calls are `other`)." {
        Stage = "stage", Unstage = "unstage", Publish = "publish", Unpublish = "unpublish",
        Stats = "stats", Create = "create", Delete = "delete", Validate = "validate",
        Other = "other",
    }
}

/// Kinds of under-store request, the `op` label of [`UFS_REQUEST_SECONDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UfsOp {
    Read,
    Stat,
    List,
    Write,
    Delete,
    Rename,
}

impl UfsOp {
    pub const ALL: &'static [UfsOp] = &[
        UfsOp::Read,
        UfsOp::Stat,
        UfsOp::List,
        UfsOp::Write,
        UfsOp::Delete,
        UfsOp::Rename,
    ];

    pub const fn label(self) -> &'static str {
        match self {
            UfsOp::Read => "read",
            UfsOp::Stat => "stat",
            UfsOp::List => "list",
            UfsOp::Write => "write",
            UfsOp::Delete => "delete",
            UfsOp::Rename => "rename",
        }
    }
}

const UFS_OP_LABELS: [&str; 6] = [
    UfsOp::Read.label(),
    UfsOp::Stat.label(),
    UfsOp::List.label(),
    UfsOp::Write.label(),
    UfsOp::Delete.label(),
    UfsOp::Rename.label(),
];

/// Histograms of one name labelled by a key known only at run time (the mount an under-store
/// serves) and a fixed label. Each key registers once, when its store opens; recording then
/// touches only that key's own histograms.
pub struct KeyedFamily {
    pub name: &'static str,
    pub help: &'static str,
    pub key_label: &'static str,
    pub label: &'static str,
    pub values: &'static [&'static str],
    sets: parking_lot::Mutex<Vec<(String, Arc<[Histogram]>)>>,
}

impl KeyedFamily {
    /// The histograms of `key`, one per value of `values` (the same ones for a key registered
    /// again).
    pub fn register(&self, key: &str) -> Arc<[Histogram]> {
        let mut sets = self.sets.lock();
        if let Some((_, h)) = sets.iter().find(|(k, _)| k == key) {
            return h.clone();
        }
        let h: Arc<[Histogram]> = self.values.iter().map(|_| Histogram::new()).collect();
        sets.push((key.to_string(), h.clone()));
        h
    }

    /// Every registered key with its histograms, in registration order.
    pub fn keyed(&self) -> Vec<(String, Arc<[Histogram]>)> {
        self.sets.lock().clone()
    }
}

/// Under-store requests by mount and kind (see [`UfsOp`]); index a registered set with
/// `op as usize`.
pub static UFS_REQUEST_SECONDS: KeyedFamily = KeyedFamily {
    name: "silt_ufs_request_seconds",
    help: "Time of one request to an under-store, its retries included, by mount (the namespace path the store is mounted at) and kind of request.",
    key_label: "mount",
    label: "op",
    values: &UFS_OP_LABELS,
    sets: parking_lot::const_mutex(Vec::new()),
};

/// A gauge kept up to date as things happen (most gauges are read from the process when
/// scraped instead: see [`gauges`]).
#[derive(Debug)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub const fn new() -> Self {
        Gauge(AtomicI64::new(0))
    }
    #[inline]
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub fn inc(&self) {
        self.add(1)
    }
    #[inline]
    pub fn dec(&self) {
        self.add(-1)
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for Gauge {
    fn default() -> Self {
        Self::new()
    }
}

/// FUSE file handles open now (the value of [`FUSE_OPEN_HANDLES`]).
pub static FUSE_HANDLES: Gauge = Gauge::new();
/// Volumes the CSI plugin has staged now (the value of [`CSI_VOLUMES_STAGED`]).
pub static CSI_STAGED: Gauge = Gauge::new();
/// Pods' target paths the CSI plugin has published now (the value of [`CSI_VOLUMES_PUBLISHED`]).
pub static CSI_PUBLISHED: Gauge = Gauge::new();

/// A gauge's name, help and label names; the exporter supplies its values.
#[derive(Debug)]
pub struct GaugeDef {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

macro_rules! define_gauges {
    ($($ident:ident = $name:literal [$($label:literal),*], $help:literal;)*) => {
        $(
            #[doc = $help]
            pub static $ident: GaugeDef = GaugeDef {
                name: $name,
                help: $help,
                labels: &[$($label),*],
            };
        )*
        /// Every gauge, in definition order.
        pub fn gauges() -> &'static [&'static GaugeDef] {
            static ALL: &[&GaugeDef] = &[$(&$ident),*];
            ALL
        }
    };
}

define_gauges! {
    INFO = "silt_info" ["version", "role"], "Always 1; its labels name this process's version and role (single node, worker, cluster client, attached client, gateway).";
    START_TIME_SECONDS = "silt_start_time_seconds" [], "When this process started, in seconds since the Unix epoch.";
    MOUNT_INFO = "silt_mount_info" ["mount", "store"], "Always 1 for each entry of the namespace: the path it is mounted at and its under-store URI.";
    TIER_CAPACITY_BYTES = "silt_tier_capacity_bytes" ["tier"], "Quota of each cache tier of this process (memory, disk0, disk1, ...).";
    TIER_USED_BYTES = "silt_tier_used_bytes" ["tier"], "Bytes of cached pages in each tier.";
    TIER_PAGES = "silt_tier_pages" ["tier"], "Pages held in each tier.";
    PINNED_BYTES = "silt_pinned_bytes" [], "Bytes of user pins (`silt fs pin`) in this process's page store.";
    PAGES_IN_FLIGHT = "silt_pages_in_flight" [], "Pages being fetched now (from the under-store, or from workers for a cluster client).";
    WRITE_MEMORY_USED_BYTES = "silt_write_memory_used_bytes" [], "Memory holding written data now (files being written, cache-only files); absent when nothing is writable.";
    WRITE_MEMORY_CEILING_BYTES = "silt_write_memory_ceiling_bytes" [], "Ceiling of that memory (`write_memory`, or as lowered by `silt memory`).";
    WRITE_SPILL_USED_BYTES = "silt_write_spill_used_bytes" [], "Bytes of written data on spill disks now.";
    PENDING_UPLOAD_FILES = "silt_pending_upload_files" [], "`back` files waiting for (or in) their upload to the under-store.";
    PENDING_UPLOAD_BYTES = "silt_pending_upload_bytes" [], "Bytes of those files.";
    FUSE_OPEN_HANDLES = "silt_fuse_open_handles" [], "File handles open on this process's FUSE mount.";
    CLUSTER_MEMBERS = "silt_cluster_members" [], "Workers in the membership view, i.e. alive as far as etcd (or the static list) says; 1 for a single node, which is its own worker.";
    CLUSTER_MEMBERS_SUSPECT = "silt_cluster_members_suspect" [], "Workers of the view this process saw fail within `worker_retry_after` (tried last until then).";
    CSI_VOLUMES_STAGED = "silt_csi_volumes_staged" [], "Volumes the CSI plugin has staged on this node (one client mount process each); the plugin's own metric.";
    CSI_VOLUMES_PUBLISHED = "silt_csi_volumes_published" [], "Pods' target paths the CSI plugin has bind-mounted on this node; the plugin's own metric.";
}

/// Prometheus text exposition format (version 0.0.4) of the metrics: `# HELP` and `# TYPE`
/// once per name, then its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

/// The `Content-Type` of [`Exposition`]'s text.
pub const EXPOSITION_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    fn head(&mut self, name: &str, help: &str, kind: &str) {
        self.out.push_str("# HELP ");
        self.out.push_str(name);
        self.out.push(' ');
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
        let _ = writeln!(self.out, "\n# TYPE {name} {kind}");
    }

    fn sample(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        value: &dyn std::fmt::Display,
    ) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.out.push_str("\\\\"),
                        '"' => self.out.push_str("\\\""),
                        '\n' => self.out.push_str("\\n"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// Every counter of [`all`].
    pub fn counters(&mut self) {
        for m in all() {
            self.head(m.name, m.help, "counter");
            self.sample(m.name, "", &[], &m.counter.get());
        }
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let s = h.snapshot();
        let mut with_le: Vec<(&str, &str)> = Vec::with_capacity(labels.len() + 1);
        with_le.extend_from_slice(labels);
        with_le.push(("le", ""));
        let le = with_le.len() - 1;
        for (bound, n) in BUCKET_BOUNDS
            .iter()
            .chain(["+Inf"].iter())
            .zip(s.cumulative)
        {
            with_le[le].1 = bound;
            self.sample(name, "_bucket", &with_le, &n);
        }
        self.sample(name, "_sum", labels, &s.sum_seconds);
        self.sample(name, "_count", labels, &s.count());
    }

    /// Every histogram: the families of [`histograms`] and [`UFS_REQUEST_SECONDS`].
    pub fn histograms(&mut self) {
        for f in histograms() {
            self.head(f.name, f.help, "histogram");
            for (value, h) in f.histograms() {
                self.histogram(f.name, &[(f.label, value)], h);
            }
        }
        let f = &UFS_REQUEST_SECONDS;
        self.head(f.name, f.help, "histogram");
        for (key, hists) in f.keyed() {
            for (value, h) in f.values.iter().zip(hists.iter()) {
                self.histogram(f.name, &[(f.key_label, &key), (f.label, value)], h);
            }
        }
    }

    /// A gauge with its samples: the values of `def.labels` (in that order) and the value.
    pub fn gauge<'a>(
        &mut self,
        def: &GaugeDef,
        samples: impl IntoIterator<Item = (&'a [&'a str], f64)>,
    ) {
        self.head(def.name, def.help, "gauge");
        for (values, v) in samples {
            let labels: Vec<(&str, &str)> = def
                .labels
                .iter()
                .copied()
                .zip(values.iter().copied())
                .collect();
            self.sample(def.name, "", &labels, &v);
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Every metric name of every kind: counters, histograms, gauges.
pub fn all_names() -> Vec<&'static str> {
    all()
        .iter()
        .map(|m| m.name)
        .chain(histograms().iter().map(|f| f.name))
        .chain([UFS_REQUEST_SECONDS.name])
        .chain(gauges().iter().map(|g| g.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prometheus_shaped() {
        let mut names = all_names();
        for n in &names {
            assert!(n.starts_with("silt_"), "{n}");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        }
        for m in all() {
            assert!(m.name.ends_with("_total"), "{}", m.name);
        }
        for f in histograms() {
            assert!(f.name.ends_with("_seconds"), "{}", f.name);
        }
        for g in gauges() {
            assert!(!g.name.ends_with("_total"), "{}", g.name);
        }
        let len = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), len);
    }

    #[test]
    fn bucket_bounds_agree_and_grow() {
        for (text, ns) in BUCKET_BOUNDS.iter().zip(BUCKET_NS) {
            let secs: f64 = text.parse().unwrap();
            assert_eq!((secs * 1e9).round() as u64, ns, "{text}");
        }
        assert!(BUCKET_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_inclusive() {
        let h = Histogram::new();
        h.observe_ns(10_000); // exactly the first bound: counted in it (le is "<=")
        h.observe_ns(10_001);
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(3600)); // past every bound: only in +Inf
        let s = h.snapshot();
        assert_eq!(s.cumulative[0], 1);
        assert_eq!(s.cumulative[1], 2);
        assert_eq!(s.cumulative[BUCKETS - 1], 3);
        assert_eq!(s.count(), 4);
        assert!(s.cumulative.windows(2).all(|w| w[0] <= w[1]));
        assert!(
            (s.sum_seconds - 3600.003020001).abs() < 1e-6,
            "{}",
            s.sum_seconds
        );
    }

    #[test]
    fn exposition_escapes_label_values_and_writes_every_bucket() {
        let mut e = Exposition::new();
        e.gauge(&MOUNT_INFO, [(&["/a\"b\nc\\", "s3://x"][..], 1.0)]);
        let family = &UFS_REQUEST_SECONDS;
        let h = family.register("/test-exposition");
        h[UfsOp::Stat as usize].observe(Duration::from_micros(30));
        assert!(Arc::ptr_eq(&h, &family.register("/test-exposition")));
        e.histograms();
        let text = e.finish();
        assert!(
            text.contains("silt_mount_info{mount=\"/a\\\"b\\nc\\\\\",store=\"s3://x\"} 1\n"),
            "{text}"
        );
        let mount = "silt_ufs_request_seconds_bucket{mount=\"/test-exposition\",op=\"stat\"";
        assert_eq!(text.matches(mount).count(), BUCKETS + 1);
        assert!(
            text.contains(&format!("{mount},le=\"0.00005\"}} 1\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{mount},le=\"0.000025\"}} 0\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{mount},le=\"+Inf\"}} 1\n")),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE silt_fuse_op_seconds histogram")
                .count(),
            1
        );
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
        for name in super::all_names() {
            assert!(
                doc.contains(&format!("| `{name}` |")),
                "docs/METRICS.md lacks {name}"
            );
        }
    }

    /// Every metric the Grafana dashboard queries exists (a histogram through its
    /// `_bucket`, `_sum` or `_count` series), and the dashboard is well formed.
    #[test]
    fn grafana_dashboard_queries_only_metrics_that_exist() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana/silt.json"
        ))
        .expect("deploy/grafana/silt.json");
        let dash: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let names = super::all_names();
        let histograms: Vec<&str> = super::histograms()
            .iter()
            .map(|f| f.name)
            .chain([super::UFS_REQUEST_SECONDS.name])
            .collect();
        let panels = dash["panels"].as_array().expect("panels");
        let mut ids = std::collections::HashSet::new();
        let mut queried = std::collections::HashSet::new();
        for p in panels {
            assert!(ids.insert(p["id"].as_u64().expect("a panel id")), "{p}");
            if p["type"] == "row" {
                continue;
            }
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{}", p["title"]);
            for t in targets {
                let expr = t["expr"].as_str().expect("expr");
                let mut rest = expr;
                while let Some(at) = rest.find("silt_") {
                    let tail = &rest[at..];
                    let end = tail
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(tail.len());
                    let token = &tail[..end];
                    let name = ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|s| {
                            token
                                .strip_suffix(s)
                                .filter(|base| histograms.contains(base))
                        })
                        .unwrap_or(token);
                    assert!(
                        names.contains(&name),
                        "the dashboard queries {token}, which Silt does not export: {expr}"
                    );
                    queried.insert(name.to_string());
                    rest = &tail[end..];
                }
            }
        }
        // The figures are all on it: latencies, hit ratio, tiers, members.
        for must in [
            "silt_fuse_op_seconds",
            "silt_client_read_seconds",
            "silt_ufs_request_seconds",
            "silt_worker_rpc_seconds",
            "silt_page_hits_total",
            "silt_tier_used_bytes",
            "silt_cluster_members",
        ] {
            assert!(queried.contains(must), "the dashboard shows no {must}");
        }
    }
}
