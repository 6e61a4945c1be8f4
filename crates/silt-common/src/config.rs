//! The one table of configuration options.
//!
//! Every option has one name used everywhere: `page_size` in the config file,
//! `--page-size` on the command line and `SILT_PAGE_SIZE` in the environment. Precedence,
//! lowest first: built-in default, config file, environment, flag. Defaults are written as
//! text in [`OPTIONS`] and parsed by the same code as user input, so the documented default
//! is the real one (`docs/CONFIGURATION.md` is checked against this table by a test).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::secret::{read_secret_file, Secret};
use crate::size::parse_size;
use crate::sync::{parse_sync_rules, SyncPolicy, SyncRule};
use crate::write::{parse_jobs, parse_write_rules, JobSpec, WriteRule, WriteType};
use crate::{Error, Result};

/// One configuration option.
pub struct OptionSpec {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

/// Every option Silt understands.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec { name: "state_dir", default: "/var/lib/silt", help: "Directory for local state: the control socket, the lock and (by default) the disk cache tier." },
    OptionSpec { name: "mountpoint", default: "/mnt/silt", help: "Where `silt up` mounts the namespace; `none`: no FUSE mount (the node serves same-host clients such as the Python SDK, its gateway and its control socket, and needs no privilege)." },
    OptionSpec { name: "mounts", default: "", help: "Namespace entries PATH=URI, comma-separated or one flag each (e.g. /data=s3://bucket/prefix, /local=file:///srv/data)." },
    OptionSpec { name: "page_size", default: "1MiB", help: "Cache page size. 1 MiB measured best for cold reads and memory overhead on this project's machines (docs/benchmarks.md)." },
    OptionSpec { name: "memory_capacity", default: "1GiB", help: "Quota of the memory tier (0 disables it)." },
    OptionSpec { name: "disk_tiers", default: "auto", help: "Disk tiers as DIR:QUOTA, comma-separated, fastest first. `auto` = STATE_DIR/cache:10GiB; `none` disables disk caching." },
    OptionSpec { name: "high_watermark", default: "0.95", help: "Fraction of a tier's quota at which eviction starts." },
    OptionSpec { name: "low_watermark", default: "0.85", help: "Fraction of a tier's quota eviction brings usage down to. The page buffers one memory-tier eviction frees (high minus low) stay in the process for the next fetches, within the tier's quota." },
    OptionSpec { name: "disk_direct_io", default: "false", help: "Write whole cache pages to the disk tiers with O_DIRECT, straight from the fetch buffer: a cold read then costs less daemon CPU (no copy into the page cache: measured 0.85 against 2.0 CPU s/GB, and 0.79–0.88 against 0.97–1.02 after the page-buffer changes) and the page cache keeps no extra copy of what the memory tier holds; but the disk tier is then not in the page cache, so a cached file's first read after a restart comes from the disk (B1 warm 0.04 against 0.90 of the local page cache, docs/benchmarks.md). Worth it when the data is larger than memory or read once. A file system that refuses O_DIRECT is written through the page cache either way." },
    OptionSpec { name: "eviction_policy", default: "tinylfu", help: "Page admission and eviction: `tinylfu` (LRU order; a full tier takes a page only if it was read more often lately than the page it would evict, so a working set larger than the cache keeps a stable resident part and a scan cannot flush a hot set) or `lru` (always admit, evict the least recently used)." },
    OptionSpec { name: "sync_policy", default: "interval=1h", help: "When cached metadata (stats, listings) is revalidated against the under-store: `never` (immutable data sets), `interval=D` (on access once older than D), `always` (every open, stat and directory read asks the store). Promises in docs/SEMANTICS.md." },
    OptionSpec { name: "cache_ttl_rules", default: "", help: "Longest time cached pages are served per namespace prefix, PATH=DURATION comma-separated (e.g. /data/tmp=1h): a file opened once its version was first opened longer ago is fetched again, and a sweep (every quarter of the shortest TTL, 1 s to 1 min) drops the pages of versions whose TTL ran out whether or not they are opened again. Counted per client process from the first open." },
    OptionSpec { name: "sync_rules", default: "", help: "Sync policy per namespace prefix, PATH=POLICY comma-separated (e.g. /data/imagenet=never,/data/logs=always); the longest prefix wins, other paths use `sync_policy`." },
    OptionSpec { name: "negative_ttl", default: "10s", help: "How long a \"no such file\" answer from the store is trusted (never longer than the path's sync policy)." },
    OptionSpec { name: "bulk_list_max", default: "100000", help: "Load a directory tree with one recursive listing of the store (on S3 split by subdirectory, listed side by side) when it has at most this many entries; a bigger tree is listed a directory at a time. 0 disables bulk listing." },
    OptionSpec { name: "ufs_list_page", default: "1000", help: "Entries asked for per page of an object-store listing (S3 max-keys; 1000 is S3's largest)." },
    OptionSpec { name: "lookup_lists_parent", default: "true", help: "Answer a lookup in a directory whose listing is not cached by listing that directory once (shared by concurrent lookups) instead of one HEAD per name. Turn off for huge flat directories read a few files at a time." },
    OptionSpec { name: "write_type", default: "read-only", help: "How files written through the mount or the client are stored: `read-only` (EROFS), `through` (to the under-store on close, cached as written), `store-only` (to the under-store on close, not cached), `cache-only` (kept only in Silt, memory first, for `cache_only_ttl`), `back` (acknowledged once in the local write-ahead log, persisted in the background). Promises in docs/SEMANTICS.md." },
    OptionSpec { name: "write_rules", default: "", help: "Write type per namespace prefix, PATH=TYPE comma-separated (e.g. /data/shuffle=cache-only,/data/out=back); the longest prefix wins, other paths use `write_type`." },
    OptionSpec { name: "write_memory", default: "512MiB", help: "Ceiling of memory holding written data (files being written, cache-only files); past it, data spills to the disk tiers. Can be lowered at run time (`silt memory --write SIZE`)." },
    OptionSpec { name: "write_file_memory", default: "64MiB", help: "Memory one file being written may hold at priority 1; each priority level above adds half of it (seed 004: 64 MiB, +32 MiB per level). Beyond it the file spills." },
    OptionSpec { name: "max_file_size", default: "5TiB", help: "Largest file Silt lets anyone write (S3's largest object by default): a write or truncate past it fails at once with EFBIG. Files are sparse until uploaded, so a large size costs nothing until S3 materialises it." },
    OptionSpec { name: "write_jobs", default: "", help: "Jobs sharing write memory, PATH=QUOTA@PRIORITY comma-separated (e.g. /shuffle/etl=2GiB@7): files under PATH count against QUOTA; under pressure, lower priorities (1-9) spill first. Other paths: priority 5, no quota but `write_memory`." },
    OptionSpec { name: "cache_only_ttl", default: "24h", help: "How long a cache-only file lives after it was written (0: until removed or Silt stops)." },
    OptionSpec { name: "cache_only_replicas", default: "0", help: "Cluster clients: how many workers keep each cache-only file (chosen by rendezvous hashing of its path; a close fails unless that many acknowledge). 0: the writing client keeps it itself." },
    OptionSpec { name: "upload_delay", default: "0s", help: "How long a `back` file waits in the write-ahead log before its upload starts (lets short-lived files die unuploaded)." },
    OptionSpec { name: "attr_ttl", default: "1h", help: "Kernel attribute cache TTL given to FUSE." },
    OptionSpec { name: "entry_ttl", default: "1h", help: "Kernel directory-entry cache TTL given to FUSE." },
    OptionSpec { name: "prefetch_max", default: "64MiB", help: "Largest read-ahead window of the sequential prefetcher; the window starts at two pages and doubles while reads stay sequential." },
    OptionSpec { name: "request_size", default: "8MiB", help: "Largest ranged request to an under-store: runs of consecutive missing pages are fetched with one request of up to this size (object stores pay a large fixed cost per request)." },
    OptionSpec { name: "fetch_concurrency", default: "32", help: "Most concurrent ranged requests to under-stores; also the most uploads of closed `through`/`store-only` files at once (each holds an 8 MiB part in memory), so many writers closing together wait instead of growing memory." },
    OptionSpec { name: "buffer_memory", default: "256MiB", help: "Bound on bytes in flight from under-stores (fetch buffers); readers wait when it is reached." },
    OptionSpec { name: "fuse_threads", default: "8", help: "FUSE worker threads (1 to 1024, and fewer than the system lets a process start)." },
    OptionSpec { name: "fuse_max_read", default: "1MiB", help: "Largest FUSE read request asked of the kernel." },
    OptionSpec { name: "fuse_cold_direct_io", default: "false", help: "The first open of each file version on a mount reads without the kernel's page cache (FOPEN_DIRECT_IO): each read's bytes go from Silt straight into the reader's buffer, not into the mount's page cache and from there to the reader, and a scan read once fills no page cache. Measured on a cold read of 4 x 1 GiB (B1F, docs/benchmarks.md): 0.9-1.6 against 1.6-3.5 daemon CPU s/GB and 1.0-1.7 against 0.4-0.9 GB/s, side by side in each run. With `disk_direct_io` too, no cold byte is copied into any page cache: 0.79-0.81 daemon CPU s/GB in B1F (0.66 by hand), the cheapest cold path for a scan read once. Later opens of the same version use the page cache (or passthrough) as usual. No kernel read-ahead on that first open: each read(2) is one request to Silt, so a reader that asks a few KiB at a time is several times slower (dd bs=8k: 178 against 746 MB/s); stdio, Python and cat size their reads from st_blksize (one cache page) and are not. Needs Linux >= 6.6 (shared mmap of such a file); ignored with a warning before." },
    OptionSpec { name: "fuse_xattrs", default: "false", help: "The mount shows each file's S3 headers (what an S3 client stored with it through the gateway or in the store: Content-Type, user metadata, checksums) as read-only extended attributes `user.s3.content-type`, `user.s3.meta.KEY`, ... (getxattr, listxattr). Off by default: once a FUSE file system answers getxattr, the kernel asks it for `security.capability` before every write (about one more round trip per write() call), and a first listxattr of a file on an object store costs a HEAD. Off, getxattr and listxattr are ENOSYS, which the kernel remembers." },
    OptionSpec { name: "fuse_source_passthrough", default: "false", help: "A read open of a file that is not whole in the local disk tier, from a store whose objects are files this host can open (file://: a local or NFS directory), hands the kernel the store's own file (FUSE passthrough) and fetches the file into the cache behind the reader, admitted as a read's pages are: the first read runs at the store's own speed with no byte through the daemon, and the next open reads the local copy. The file is checked to hold the version Silt knows at the open; unlike a read through the daemon, a file then changed in place is read as it is then (as reading the directory directly would), not refused as changed. The background fetch reads the file a second time (from the page cache where it still is) and costs its CPU after the reader is done, also when the admission policy then keeps none of it; at most fuse_threads files are fetched at once. Needs passthrough (Linux >= 6.9) and a store the kernel can stack on (not another FUSE mount); files under a writable prefix and other stores are read as without the option. Measured (docs/benchmarks.md): B1F cold, 4 readers of 1 GiB files, 7.8 GB/s (0.45 of reading the files directly) at 1.05 daemon CPU s/GB fills included; with disk_direct_io 10.0 GB/s (0.58) at 0.42 s/GB; by default 0.57 GB/s at 2.8 s/GB." },
    OptionSpec { name: "fuse_open_fill_max", default: "0", help: "A read open of a file of at most this size that is not yet whole in the local disk tier fetches it whole before the open returns, then gives the kernel that local copy (FUSE passthrough): the daemon no longer copies each byte into the mount's page cache, and the reader gets the kernel's read-ahead on a local file. The open waits for the whole file, so a reader that wants only a file's first bytes waits for all of it. At most half the FUSE threads fetch at once (other opens are served as usual). Needs passthrough (Linux >= 6.9) and a disk tier of at least twice the file's size that stays below its low watermark with the file added: a full cache opens as without the option (there a fill could fetch a file the admission policy then refuses, and its reads would fetch it again: B4 hit ratio 0.15 against 0.48). Files under a writable prefix are never fetched this way. The fetched pages are admitted as a read's would be, and a file the cache does not keep whole is read through the daemon. Measured (docs/benchmarks.md): B1F cold 4 readers 0.92 GB/s at 1.71 daemon CPU s/GB against 0.46 at 3.72 by default; B2 cold (small files) 1.68 and 1.81 against 1.30 and 1.33 of the direct reader with 8MiB (two runs); but an open that does not read fetches the file too (B3P open+fstat p50 0.93 against 0.095 ms, one GET per cold open). 0 disables it." },
    OptionSpec { name: "passthrough", default: "auto", help: "FUSE passthrough for files fully present in the local disk tier: `auto` (use when the kernel supports it), `on` (fail start-up if unsupported), `off`." },
    OptionSpec { name: "allow_other", default: "true", help: "Let users other than the mounting one use the mount." },
    OptionSpec { name: "s3_endpoint", default: "", help: "S3 endpoint URL (empty: AWS default for the region)." },
    OptionSpec { name: "s3_region", default: "us-east-1", help: "S3 region." },
    OptionSpec { name: "s3_path_style", default: "true", help: "Address buckets as ENDPOINT/BUCKET (true) or BUCKET.ENDPOINT (false)." },
    OptionSpec { name: "s3_list_attrs", default: "false", help: "HEAD every file an S3 listing returns, to show the mode, owner and times kept in its user metadata (x-amz-meta-mode etc., as s3fs-fuse writes them): one request per listed file. Off: files known only from a listing show 0644 and Silt's owner (a HEAD of the file, as with lookup_lists_parent = false, shows its own)." },
    OptionSpec { name: "s3_direct_receive", default: "true", help: "Receive ranged GETs from a plain http:// S3 endpoint straight into the page buffers that become cached pages (one copy, the kernel's) on keep-alive connections of Silt's own, with the request the HTTP client signs. An answer it does not handle (an error status, a transfer coding, another range, a broken connection) is asked for again through the HTTP client, which maps errors, retries and speaks TLS; https:// endpoints always go through it. A body read wakes once 256 KiB (or the rest of the body) have arrived, not for every few packets: a store sending less than that within ufs_timeout counts as not answering. Off: every read through the HTTP client (its buffers, then a copy into pages)." },
    OptionSpec { name: "s3_access_key_id", default: "", help: "S3 access key; empty: AWS_ACCESS_KEY_ID or the AWS config/credentials files." },
    OptionSpec { name: "s3_secret_access_key", default: "", help: "S3 secret key; empty: `s3_secret_access_key_file`, else AWS_SECRET_ACCESS_KEY or the AWS config/credentials files. Never logged. As a flag it is visible to every local user (`ps`): prefer the file or the environment." },
    OptionSpec { name: "s3_secret_access_key_file", default: "", help: "File holding the S3 secret key (owner-only; surrounding whitespace ignored)." },
    OptionSpec { name: "ufs_timeout", default: "30s", help: "Deadline of one under-store request. A read waits at most `ufs_timeout × (ufs_retries + 1)` plus backoff; once a request ran out of it with no other request answered meanwhile, the store counts as stalled: requests fail at once (`ETIMEDOUT`) for one `ufs_timeout`, then one at a time probes it, until it answers." },
    OptionSpec { name: "ufs_retries", default: "3", help: "Retries of a retryable under-store failure (with backoff)." },
    OptionSpec { name: "etcd", default: "", help: "etcd endpoints (http://HOST:PORT, comma-separated) for cluster membership and the shared mount table. Empty: no etcd." },
    OptionSpec { name: "cluster_name", default: "silt", help: "Key prefix of this cluster in etcd (/NAME/members/, /NAME/mounts): several clusters can share one etcd." },
    OptionSpec { name: "workers", default: "", help: "Static cluster: workers as ID=HOST:PORT, comma-separated (instead of etcd). Empty with no etcd: a single node." },
    OptionSpec { name: "cluster_secret", default: "", help: "Secret every member of the cluster proves it holds on every worker connection (at least 16 bytes; the same on every process). Never logged. As a flag it is visible to every local user (`ps`): prefer `cluster_secret_file` or the environment." },
    OptionSpec { name: "cluster_secret_file", default: "", help: "File holding the cluster secret (owner-only; surrounding whitespace ignored). Empty with no `cluster_secret`: STATE_DIR/cluster-secret, which a single node generates at its first start (docs/SECURITY.md)." },
    OptionSpec { name: "cluster_tls", default: "false", help: "Encrypt worker TCP connections with TLS 1.3: a client connects in TLS, a worker accepts only TLS on its TCP port (it always accepts TLS when asked, so turn it on for clients first, then workers). The cluster secret proves both ends, bound to the TLS session, so no certificates are configured (docs/SECURITY.md). Same-host Unix sockets stay plaintext." },
    OptionSpec { name: "cluster_unix_socket", default: "true", help: "Reach a worker on this host (and network namespace) over its Unix socket, which passes open cache files instead of copying bytes. false: over TCP like a remote worker (e.g. to measure the network path)." },
    OptionSpec { name: "listen", default: "0.0.0.0:29998", help: "Address `silt worker` serves its RPC on." },
    OptionSpec { name: "advertise", default: "", help: "Address other processes reach this worker at (empty: `listen`, which must then not be 0.0.0.0)." },
    OptionSpec { name: "worker_id", default: "", help: "Stable identity of a worker in the cluster (empty: generated once and kept in STATE_DIR/worker-id), so a restarted worker keeps its share and its warm cache." },
    OptionSpec { name: "member_ttl", default: "10s", help: "etcd lease of a worker: a worker that stops renewing it (killed, cut off) leaves the membership after this long." },
    OptionSpec { name: "worker_timeout", default: "3s", help: "Deadline of one read from a worker; past it (or on a refused or broken connection) the client tries the next candidate, then the under-store." },
    OptionSpec { name: "worker_retry_after", default: "10s", help: "How long a worker that failed a read is tried last, so one dead worker costs one timeout, not one per read." },
    OptionSpec { name: "placement_group", default: "8MiB", help: "Bytes of a file placed together on one worker: smaller files live whole on one worker, larger ones spread group by group. Must be equal on every process of a cluster." },
    OptionSpec { name: "failover_candidates", default: "2", help: "Workers tried for a page group (the owner, then the next by rendezvous rank) before reading from the under-store." },
    OptionSpec { name: "metrics_listen", default: "auto", help: "Address of the Prometheus endpoint (GET /metrics, docs/METRICS.md): HOST:PORT (port 0: a free one, printed), `off`, or `auto`: 127.0.0.1:9464 for `silt up` and `silt worker` (skipped with a warning when that port is taken, so several daemons can share a host), off for `silt mount`, `silt gateway` and `silt csi`. Same as `web_listen`: one port serves both." },
    OptionSpec { name: "web_listen", default: "auto", help: "Address of the status web page (members, mounts, tiers, loads, uploads, a namespace browser): HOST:PORT (port 0: a free one, printed), `off`, or `auto`: 127.0.0.1:9465 for `silt up` and `silt worker` (skipped with a warning when taken), off for `silt mount` and `silt gateway`. It shows names from the namespace to whoever reaches it: keep it on loopback or behind a proxy that authenticates." },
    OptionSpec { name: "log", default: "info", help: "Log filter (tracing `EnvFilter` syntax, e.g. `info,silt_client=debug`)." },
    OptionSpec { name: "log_format", default: "text", help: "Log lines on stderr: `text` (for people) or `json` (one JSON object a line, for a log pipeline: timestamp, level, target, message, fields, spans, role, pid, worker). The `silt: ...` status lines stay plain text either way." },
    OptionSpec { name: "log_repeat_interval", default: "10s", help: "Warnings that can repeat per page or per request (a full disk, a failing store or worker) are logged at most once per this interval for each place and cause; the next line says how many were suppressed (field `suppressed`). 0 logs every one." },
];

/// Options whose values are secrets: never shown, and a warning when given as a flag.
pub const SECRET_OPTIONS: &[&str] = &["s3_secret_access_key", "cluster_secret"];

/// Whether FUSE passthrough is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassthroughMode {
    Auto,
    On,
    Off,
}

/// How log lines are written (`log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Where an operations endpoint (metrics, web page) listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// The role's default: on at a fixed loopback port for `silt up` and workers (skipped with
    /// a warning when taken), off for the other roles.
    Auto,
    Off,
    /// `HOST:PORT`, given by the user: failing to bind it fails the start.
    Addr(String),
}

/// The loopback address `metrics_listen = auto` uses where it is on.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// The loopback address `web_listen = auto` uses where it is on.
pub const DEFAULT_WEB_LISTEN: &str = "127.0.0.1:9465";

impl Listen {
    fn parse(key: &str, v: &str) -> Result<Listen> {
        match v {
            "auto" => Ok(Listen::Auto),
            "off" | "none" | "" => Ok(Listen::Off),
            _ => {
                check_addr(key, v).map_err(|_| {
                    Error::invalid(format!(
                        "{key}: expected HOST:PORT (e.g. 127.0.0.1:9464), off or auto, got {v:?}"
                    ))
                })?;
                Ok(Listen::Addr(v.to_string()))
            }
        }
    }

    /// The address to bind for a role whose default is on (`default_on`, with `default` as the
    /// address) or off, and whether it was asked for explicitly.
    pub fn resolve(&self, default_on: bool, default: &str) -> Option<(String, bool)> {
        match self {
            Listen::Auto if default_on => Some((default.to_string(), false)),
            Listen::Auto | Listen::Off => None,
            Listen::Addr(a) => Some((a.clone(), true)),
        }
    }
}

/// A disk tier: a directory and its quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskTierSpec {
    pub dir: PathBuf,
    pub quota: u64,
}

/// One namespace entry: the path in Silt's namespace and the under-store URI mounted there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub path: String,
    pub uri: String,
}

/// Typed configuration; see [`OPTIONS`] for meanings.
#[derive(Debug, Clone)]
pub struct Config {
    pub state_dir: PathBuf,
    pub mountpoint: PathBuf,
    pub mounts: Vec<MountSpec>,
    pub page_size: u64,
    pub memory_capacity: u64,
    disk_tiers_raw: String,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub eviction_policy: String,
    pub disk_direct_io: bool,
    pub sync_policy: SyncPolicy,
    pub sync_rules: Vec<SyncRule>,
    pub cache_ttl_rules: Vec<(String, Duration)>,
    pub write_type: WriteType,
    pub write_rules: Vec<WriteRule>,
    pub write_memory: u64,
    pub write_file_memory: u64,
    pub max_file_size: u64,
    pub write_jobs: Vec<JobSpec>,
    pub cache_only_ttl: Duration,
    pub cache_only_replicas: usize,
    pub upload_delay: Duration,
    pub negative_ttl: Duration,
    pub bulk_list_max: usize,
    pub ufs_list_page: usize,
    pub lookup_lists_parent: bool,
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub prefetch_max: u64,
    pub request_size: u64,
    pub fetch_concurrency: usize,
    pub buffer_memory: u64,
    pub fuse_threads: usize,
    pub fuse_max_read: u64,
    pub fuse_cold_direct_io: bool,
    pub fuse_open_fill_max: u64,
    pub fuse_source_passthrough: bool,
    pub fuse_xattrs: bool,
    pub passthrough: PassthroughMode,
    pub allow_other: bool,
    pub s3_endpoint: String,
    pub s3_region: String,
    pub s3_path_style: bool,
    pub s3_list_attrs: bool,
    pub s3_direct_receive: bool,
    pub s3_access_key_id: String,
    pub s3_secret_access_key: Secret,
    pub s3_secret_access_key_file: PathBuf,
    pub ufs_timeout: Duration,
    pub ufs_retries: usize,
    pub etcd: Vec<String>,
    pub cluster_name: String,
    /// Static workers: (id, address).
    pub workers: Vec<(String, String)>,
    pub cluster_secret: Secret,
    pub cluster_secret_file: PathBuf,
    pub cluster_tls: bool,
    pub cluster_unix_socket: bool,
    pub listen: String,
    pub advertise: String,
    pub worker_id: String,
    pub member_ttl: Duration,
    pub worker_timeout: Duration,
    pub worker_retry_after: Duration,
    pub placement_group: u64,
    pub failover_candidates: usize,
    pub metrics_listen: Listen,
    pub web_listen: Listen,
    pub log: String,
    pub log_format: LogFormat,
    pub log_repeat_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        let mut c = Config {
            state_dir: PathBuf::new(),
            mountpoint: PathBuf::new(),
            mounts: Vec::new(),
            page_size: 0,
            memory_capacity: 0,
            disk_tiers_raw: String::new(),
            high_watermark: 0.0,
            low_watermark: 0.0,
            eviction_policy: String::new(),
            disk_direct_io: false,
            sync_policy: SyncPolicy::Always,
            sync_rules: Vec::new(),
            cache_ttl_rules: Vec::new(),
            write_type: WriteType::ReadOnly,
            write_rules: Vec::new(),
            write_memory: 0,
            write_file_memory: 0,
            max_file_size: 0,
            write_jobs: Vec::new(),
            cache_only_ttl: Duration::ZERO,
            cache_only_replicas: 0,
            upload_delay: Duration::ZERO,
            negative_ttl: Duration::ZERO,
            bulk_list_max: 0,
            ufs_list_page: 0,
            lookup_lists_parent: false,
            attr_ttl: Duration::ZERO,
            entry_ttl: Duration::ZERO,
            prefetch_max: 0,
            request_size: 0,
            fetch_concurrency: 0,
            buffer_memory: 0,
            fuse_threads: 0,
            fuse_max_read: 0,
            fuse_cold_direct_io: false,
            fuse_open_fill_max: 0,
            fuse_source_passthrough: false,
            fuse_xattrs: false,
            passthrough: PassthroughMode::Auto,
            allow_other: false,
            s3_endpoint: String::new(),
            s3_region: String::new(),
            s3_path_style: false,
            s3_list_attrs: false,
            s3_direct_receive: true,
            s3_access_key_id: String::new(),
            s3_secret_access_key: Secret::default(),
            s3_secret_access_key_file: PathBuf::new(),
            ufs_timeout: Duration::ZERO,
            ufs_retries: 0,
            etcd: Vec::new(),
            cluster_name: String::new(),
            workers: Vec::new(),
            cluster_secret: Secret::default(),
            cluster_secret_file: PathBuf::new(),
            cluster_tls: false,
            cluster_unix_socket: false,
            listen: String::new(),
            advertise: String::new(),
            worker_id: String::new(),
            member_ttl: Duration::ZERO,
            worker_timeout: Duration::ZERO,
            worker_retry_after: Duration::ZERO,
            placement_group: 0,
            failover_candidates: 0,
            metrics_listen: Listen::Off,
            web_listen: Listen::Off,
            log: String::new(),
            log_format: LogFormat::Text,
            log_repeat_interval: Duration::ZERO,
        };
        for opt in OPTIONS {
            // The defaults are literals in this file; a failure here is a bug caught by tests.
            c.set(opt.name, opt.default)
                .unwrap_or_else(|e| panic!("built-in default of {} is invalid: {e}", opt.name));
        }
        c
    }
}

fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::invalid(format!(
            "{key}: expected true or false, got {v:?}"
        ))),
    }
}

/// The longest duration any option takes: past it, deadlines and TTLs added to a clock
/// overflow (a signer's timestamp panicked at `ufs_timeout = 10000years`), and no setting
/// means that long.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

fn parse_duration(key: &str, v: &str) -> Result<Duration> {
    let d = humantime::parse_duration(v.trim()).map_err(|e| {
        Error::invalid(format!(
            "{key}: invalid duration {v:?} ({e}); e.g. 500ms, 30s, 1h"
        ))
    })?;
    if d > MAX_DURATION {
        return Err(Error::invalid(format!(
            "{key}: {v:?} is longer than the most any option takes (366 days)"
        )));
    }
    Ok(d)
}

fn parse_fraction(key: &str, v: &str) -> Result<f64> {
    match v.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(Error::invalid(format!(
            "{key}: expected a fraction between 0 and 1, got {v:?}"
        ))),
    }
}

fn parse_count(key: &str, v: &str, min: usize, max: usize) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(Error::invalid(format!(
            "{key}: expected an integer from {min} to {max}, got {v:?}"
        ))),
    }
}

/// Most requests to one under-store in flight at once (each may hold a part in memory).
pub const MAX_FETCH_CONCURRENCY: usize = 4096;

/// Most FUSE threads: the kernel keeps at most a few hundred requests in flight per mount
/// (`max_background` and the congestion threshold are far lower), so more threads only cost
/// memory and start-up time.
pub const MAX_FUSE_THREADS: usize = 1024;

/// Refuses a count of OS threads past `ceiling` or past what this system lets the process
/// start (RLIMIT_NPROC, kernel.threads-max), with a message saying which.
fn check_thread_count(key: &str, n: usize, ceiling: usize) -> Result<()> {
    if n > ceiling {
        return Err(Error::invalid(format!(
            "{key} = {n}: at most {ceiling} (more threads cannot be used)"
        )));
    }
    let mut limit = None;
    // SAFETY: getrlimit writes into the struct passed.
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut rl) } == 0
        && rl.rlim_cur != libc::RLIM_INFINITY
    {
        limit = Some((rl.rlim_cur, "the process limit (ulimit -u)"));
    }
    if let Some(max) = std::fs::read_to_string("/proc/sys/kernel/threads-max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    {
        if limit.is_none_or(|(l, _)| max < l) {
            limit = Some((max, "kernel.threads-max"));
        }
    }
    match limit {
        Some((l, what)) if n as u64 >= l => Err(Error::invalid(format!(
            "{key} = {n}: this system allows at most {l} threads ({what})"
        ))),
        _ => Ok(()),
    }
}

fn parse_size_opt(key: &str, v: &str) -> Result<u64> {
    parse_size(v).map_err(|e| e.context(key))
}

fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `HOST:PORT` (IPv4/IPv6 literal or a name) with a numeric port.
fn check_addr(key: &str, v: &str) -> Result<()> {
    match v.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(Error::invalid(format!(
            "{key}: expected HOST:PORT, e.g. 10.0.0.1:29998, got {v:?}"
        ))),
    }
}

/// Worker ids name etcd keys and files: keep them to a safe alphabet.
pub fn check_worker_id(id: &str) -> Result<()> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(Error::invalid(format!(
            "worker id {id:?}: expected 1-128 letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

/// Parses a mount table: `PATH=URI` entries, comma-separated (the `mounts` option's syntax,
/// also how clusters store their shared table).
pub fn parse_mount_table(text: &str) -> Result<Vec<MountSpec>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(parse_mount_spec)
        .collect()
}

/// Parses one `PATH=VALUE` entry (a mount, a sync rule): the normalised namespace path and the
/// value. `what` names the kind of entry in errors, `example` shows a good one.
pub fn parse_path_entry<'a>(text: &'a str, what: &str, example: &str) -> Result<(String, &'a str)> {
    let (path, value) = text
        .split_once('=')
        .ok_or_else(|| Error::invalid(format!("{what} {text:?}: expected {example}")))?;
    let path = normalize_ns_path(path.trim()).ok_or_else(|| {
        Error::invalid(format!(
            "{what} {text:?}: PATH must be absolute, without . or .. (e.g. {example})"
        ))
    })?;
    Ok((path, value))
}

/// Parses comma-separated `PATH=VALUE` entries (sync rules, write rules, jobs): each path
/// normalised, each value by `value`.
pub fn parse_path_rules<T>(
    text: &str,
    what: &str,
    example: &str,
    value: impl Fn(&str, &str) -> Result<T>,
) -> Result<Vec<T>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|entry| {
            let (path, v) = parse_path_entry(entry.trim(), what, example)?;
            value(&path, v).map_err(|e| e.context(format!("{what} {entry:?}")))
        })
        .collect()
}

/// Parses `PATH=URI`.
pub fn parse_mount_spec(text: &str) -> Result<MountSpec> {
    let (path, uri) = parse_path_entry(text, "mount", "/data=s3://bucket/prefix")?;
    if !uri.contains("://") {
        return Err(Error::invalid(format!(
            "mount {text:?}: URI must have a scheme, e.g. s3://bucket/prefix or file:///dir"
        )));
    }
    Ok(MountSpec {
        path,
        uri: uri.trim().to_string(),
    })
}

/// Whether namespace path `path` is `dir` or below it, on whole components (both normalised).
pub fn is_at_or_under(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || (path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/')
}

/// Normalises an absolute namespace path: `/a//b/` → `/a/b`, `/` stays `/`. Rejects relative
/// paths and `.`/`..` components. Nothing else is changed: a file name may end in a space or
/// a newline (configuration text is trimmed by its parser, not here).
pub fn normalize_ns_path(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut out = String::new();
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return None;
        }
        out.push('/');
        out.push_str(comp);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

impl Config {
    /// Sets one option from text, validating it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let v = value.trim();
        match key {
            "state_dir" => self.state_dir = PathBuf::from(v),
            "mountpoint" => self.mountpoint = PathBuf::from(v),
            "mounts" => self.mounts = parse_mount_table(v)?,
            "page_size" => {
                let n = parse_size_opt(key, v)?;
                if !(4096..=(64 << 20)).contains(&n) || !n.is_power_of_two() {
                    return Err(Error::invalid(format!(
                        "page_size: expected a power of two between 4KiB and 64MiB, got {v:?}"
                    )));
                }
                self.page_size = n;
            }
            "memory_capacity" => self.memory_capacity = parse_size_opt(key, v)?,
            "disk_tiers" => {
                self.disk_tiers_raw = v.to_string();
                self.disk_tiers()?;
            }
            "high_watermark" => self.high_watermark = parse_fraction(key, v)?,
            "low_watermark" => self.low_watermark = parse_fraction(key, v)?,
            "eviction_policy" => match v {
                "tinylfu" | "lru" => self.eviction_policy = v.to_string(),
                _ => {
                    return Err(Error::invalid(format!(
                        "eviction_policy: unknown policy {v:?} (known: tinylfu, lru)"
                    )))
                }
            },
            "sync_policy" => self.sync_policy = SyncPolicy::parse(v).map_err(|e| e.context(key))?,
            "sync_rules" => self.sync_rules = parse_sync_rules(v).map_err(|e| e.context(key))?,
            "cache_ttl_rules" => {
                self.cache_ttl_rules =
                    parse_path_rules(v, "cache TTL rule", "/data/tmp=1h", |prefix, d| {
                        Ok((prefix.to_string(), parse_duration(key, d)?))
                    })
                    .map_err(|e| e.context(key))?
            }
            "write_type" => self.write_type = WriteType::parse(v).map_err(|e| e.context(key))?,
            "write_rules" => self.write_rules = parse_write_rules(v).map_err(|e| e.context(key))?,
            "write_memory" => self.write_memory = parse_size_opt(key, v)?,
            "write_file_memory" => self.write_file_memory = parse_size_opt(key, v)?,
            "max_file_size" => self.max_file_size = parse_size_opt(key, v)?,
            "write_jobs" => self.write_jobs = parse_jobs(v).map_err(|e| e.context(key))?,
            "cache_only_ttl" => self.cache_only_ttl = parse_duration(key, v)?,
            "cache_only_replicas" => self.cache_only_replicas = parse_count(key, v, 0, 1024)?,
            "upload_delay" => self.upload_delay = parse_duration(key, v)?,
            "negative_ttl" => self.negative_ttl = parse_duration(key, v)?,
            "bulk_list_max" => self.bulk_list_max = parse_count(key, v, 0, 1 << 30)?,
            "ufs_list_page" => {
                let n = parse_count(key, v, 1, usize::MAX)?;
                if n > 1000 {
                    return Err(Error::invalid(format!(
                        "ufs_list_page: S3 returns at most 1000 keys per page, got {v:?}"
                    )));
                }
                self.ufs_list_page = n
            }
            "lookup_lists_parent" => self.lookup_lists_parent = parse_bool(key, v)?,
            "disk_direct_io" => self.disk_direct_io = parse_bool(key, v)?,
            "attr_ttl" => self.attr_ttl = parse_duration(key, v)?,
            "entry_ttl" => self.entry_ttl = parse_duration(key, v)?,
            "prefetch_max" => self.prefetch_max = parse_size_opt(key, v)?,
            "request_size" => {
                let n = parse_size_opt(key, v)?;
                if !(4096..=(1 << 30)).contains(&n) {
                    return Err(Error::invalid(format!(
                        "request_size: expected 4KiB..1GiB, got {v:?}"
                    )));
                }
                self.request_size = n;
            }
            "fetch_concurrency" => {
                self.fetch_concurrency = parse_count(key, v, 1, MAX_FETCH_CONCURRENCY)?
            }
            "buffer_memory" => {
                let n = parse_size_opt(key, v)?;
                if n < (1 << 20) {
                    return Err(Error::invalid(format!(
                        "buffer_memory: must be at least 1MiB, got {v:?}"
                    )));
                }
                self.buffer_memory = n;
            }
            "fuse_threads" => self.fuse_threads = parse_count(key, v, 1, usize::MAX)?,
            "fuse_max_read" => {
                let n = parse_size_opt(key, v)?;
                if !(4096..=(1 << 20)).contains(&n) {
                    return Err(Error::invalid(format!(
                        "fuse_max_read: expected 4KiB..1MiB, got {v:?}"
                    )));
                }
                self.fuse_max_read = n;
            }
            "fuse_cold_direct_io" => self.fuse_cold_direct_io = parse_bool(key, v)?,
            "fuse_open_fill_max" => self.fuse_open_fill_max = parse_size_opt(key, v)?,
            "fuse_source_passthrough" => self.fuse_source_passthrough = parse_bool(key, v)?,
            "fuse_xattrs" => self.fuse_xattrs = parse_bool(key, v)?,
            "passthrough" => {
                self.passthrough = match v {
                    "auto" => PassthroughMode::Auto,
                    "on" => PassthroughMode::On,
                    "off" => PassthroughMode::Off,
                    _ => {
                        return Err(Error::invalid(format!(
                            "passthrough: expected auto, on or off, got {v:?}"
                        )))
                    }
                }
            }
            "allow_other" => self.allow_other = parse_bool(key, v)?,
            "s3_endpoint" => {
                if !(v.is_empty() || v.starts_with("http://") || v.starts_with("https://")) {
                    return Err(Error::invalid(format!(
                        "s3_endpoint: expected an http:// or https:// URL, got {v:?}"
                    )));
                }
                self.s3_endpoint = v.to_string()
            }
            "s3_region" => self.s3_region = v.to_string(),
            "s3_path_style" => self.s3_path_style = parse_bool(key, v)?,
            "s3_list_attrs" => self.s3_list_attrs = parse_bool(key, v)?,
            "s3_direct_receive" => self.s3_direct_receive = parse_bool(key, v)?,
            "s3_access_key_id" => self.s3_access_key_id = v.to_string(),
            "s3_secret_access_key" => self.s3_secret_access_key = Secret::new(v),
            "s3_secret_access_key_file" => self.s3_secret_access_key_file = PathBuf::from(v),
            "cluster_secret" => self.cluster_secret = Secret::new(v),
            "cluster_secret_file" => self.cluster_secret_file = PathBuf::from(v),
            "cluster_tls" => self.cluster_tls = parse_bool(key, v)?,
            "cluster_unix_socket" => self.cluster_unix_socket = parse_bool(key, v)?,
            "ufs_timeout" => self.ufs_timeout = parse_duration(key, v)?,
            "ufs_retries" => self.ufs_retries = parse_count(key, v, 0, 100)?,
            "etcd" => {
                self.etcd = split_list(v);
                if let Some(bad) = self.etcd.iter().find(|e| !e.starts_with("http://")) {
                    return Err(Error::invalid(format!(
                        "etcd: endpoint {bad:?} must be an http:// URL, e.g. http://127.0.0.1:2379"
                    )));
                }
            }
            "cluster_name" => {
                if v.is_empty()
                    || !v
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                {
                    return Err(Error::invalid(format!(
                        "cluster_name: expected letters, digits, '-', '_' or '.', got {v:?}"
                    )));
                }
                self.cluster_name = v.to_string()
            }
            "workers" => {
                self.workers = split_list(v)
                    .iter()
                    .map(|w| {
                        let (id, addr) = w.split_once('=').ok_or_else(|| {
                            Error::invalid(format!(
                                "workers: entry {w:?} must be ID=HOST:PORT, e.g. w1=10.0.0.1:29998"
                            ))
                        })?;
                        check_worker_id(id)?;
                        check_addr(key, addr)?;
                        Ok((id.to_string(), addr.to_string()))
                    })
                    .collect::<Result<_>>()?;
            }
            "listen" => {
                check_addr(key, v)?;
                self.listen = v.to_string()
            }
            "advertise" => {
                if !v.is_empty() {
                    check_addr(key, v)?;
                }
                self.advertise = v.to_string()
            }
            "worker_id" => {
                if !v.is_empty() {
                    check_worker_id(v)?;
                }
                self.worker_id = v.to_string()
            }
            "member_ttl" => {
                let d = parse_duration(key, v)?;
                if d < Duration::from_secs(1) {
                    return Err(Error::invalid(format!(
                        "member_ttl: must be at least 1s (etcd leases count whole seconds), got {v:?}"
                    )));
                }
                self.member_ttl = d
            }
            "worker_timeout" => self.worker_timeout = parse_duration(key, v)?,
            "worker_retry_after" => self.worker_retry_after = parse_duration(key, v)?,
            "placement_group" => {
                let n = parse_size_opt(key, v)?;
                if !(4096..=(64 << 20)).contains(&n) {
                    return Err(Error::invalid(format!(
                        "placement_group: expected 4KiB..64MiB, got {v:?}"
                    )));
                }
                self.placement_group = n
            }
            "failover_candidates" => self.failover_candidates = parse_count(key, v, 1, 1024)?,
            "metrics_listen" => self.metrics_listen = Listen::parse(key, v)?,
            "web_listen" => self.web_listen = Listen::parse(key, v)?,
            "log" => self.log = v.to_string(),
            "log_format" => {
                self.log_format = match v.trim() {
                    "text" => LogFormat::Text,
                    "json" => LogFormat::Json,
                    _ => {
                        return Err(Error::invalid(format!(
                            "log_format: expected text or json, got {v:?}"
                        )))
                    }
                }
            }
            "log_repeat_interval" => self.log_repeat_interval = parse_duration(key, v)?,
            _ => return Err(Error::invalid(format!("unknown option {key:?}"))),
        }
        Ok(())
    }

    /// The disk tiers, with `auto` resolved against `state_dir`.
    pub fn disk_tiers(&self) -> Result<Vec<DiskTierSpec>> {
        let raw = self.disk_tiers_raw.trim();
        match raw {
            "none" | "" => return Ok(Vec::new()),
            "auto" => {
                return Ok(vec![DiskTierSpec {
                    dir: self.state_dir.join("cache"),
                    quota: 10 << 30,
                }])
            }
            _ => {}
        }
        raw.split(',')
            .map(|entry| {
                let (dir, quota) = entry.trim().rsplit_once(':').ok_or_else(|| {
                    Error::invalid(format!(
                        "disk_tiers: entry {entry:?} must be DIR:QUOTA, e.g. /nvme/silt:100GiB"
                    ))
                })?;
                if !Path::new(dir).is_absolute() {
                    return Err(Error::invalid(format!(
                        "disk_tiers: directory {dir:?} must be absolute"
                    )));
                }
                Ok(DiskTierSpec {
                    dir: PathBuf::from(dir),
                    quota: parse_size_opt("disk_tiers", quota)?,
                })
            })
            .collect()
    }

    /// Checks relations between options that `set` cannot check one at a time.
    pub fn validate(&self) -> Result<()> {
        if self.low_watermark > self.high_watermark {
            return Err(Error::invalid(format!(
                "low_watermark ({}) must not exceed high_watermark ({})",
                self.low_watermark, self.high_watermark
            )));
        }
        if self.prefetch_max < self.page_size {
            return Err(Error::invalid(
                "prefetch_max must be at least one page_size",
            ));
        }
        self.disk_tiers()?;
        check_thread_count("fuse_threads", self.fuse_threads, MAX_FUSE_THREADS)?;
        if !self.etcd.is_empty() && !self.workers.is_empty() {
            return Err(Error::invalid(
                "etcd and workers are two ways to name the cluster: give one of them",
            ));
        }
        Ok(())
    }

    /// Reads the secrets named by `*_file` options into their values; giving a secret both
    /// ways is refused (which one was meant is not clear). Returns warnings for the caller to
    /// show (a secret file other users can read).
    pub fn load_secret_files(&mut self) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        for (name, value, file) in [
            (
                "s3_secret_access_key",
                &mut self.s3_secret_access_key,
                &self.s3_secret_access_key_file,
            ),
            (
                "cluster_secret",
                &mut self.cluster_secret,
                &self.cluster_secret_file,
            ),
        ] {
            if file.as_os_str().is_empty() {
                continue;
            }
            if !value.is_empty() {
                return Err(Error::invalid(format!(
                    "{name} and {name}_file are both given: give one of them"
                )));
            }
            let (secret, shared) = read_secret_file(file)?;
            if shared {
                warnings.push(format!(
                    "{} ({name}_file) can be read by other users; chmod 600 it",
                    file.display()
                ));
            }
            *value = secret;
        }
        Ok(warnings)
    }

    /// Whether `silt up` mounts the namespace with FUSE (`mountpoint` is not `none`).
    pub fn mounts_fuse(&self) -> bool {
        self.mountpoint != Path::new("none")
    }

    /// Whether this process belongs to a cluster (etcd or a static worker list).
    pub fn is_cluster(&self) -> bool {
        !self.etcd.is_empty() || !self.workers.is_empty()
    }

    /// The address other processes reach this worker at: `advertise`, else `bound`, the
    /// address `listen` was bound to (its port resolved), unless that is every address.
    pub fn advertised_addr(&self, bound: std::net::SocketAddr) -> Result<String> {
        if !self.advertise.is_empty() {
            return Ok(self.advertise.clone());
        }
        if bound.ip().is_unspecified() {
            return Err(Error::invalid(format!(
                "listen is {} (every address): give --advertise HOST:PORT, the address other machines reach this worker at",
                self.listen
            )));
        }
        Ok(bound.to_string())
    }

    /// Applies a TOML config file of flat `key = value` pairs (arrays for lists).
    pub fn apply_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::from(e).context(format!("config file {}", path.display())))?;
        self.apply_toml(&text)
            .map_err(|e| e.context(format!("config file {}", path.display())))
    }

    pub fn apply_toml(&mut self, text: &str) -> Result<()> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            Error::invalid(format!("not valid TOML: {}", e.message()))
        })?;
        // `[mount."/path"]` sections: one mount each, its settings in the URI's query.
        let sections = match table.remove("mount") {
            Some(v) => Self::mount_sections(v)?,
            None => Vec::new(),
        };
        if !sections.is_empty() {
            let listed = match table.remove("mounts") {
                Some(toml::Value::Array(items)) => items
                    .into_iter()
                    .map(|v| match v {
                        toml::Value::String(s) => Ok(s),
                        other => Err(Error::invalid(format!(
                            "mounts: list items must be strings, got {other}"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?,
                Some(toml::Value::String(s)) => vec![s],
                Some(other) => {
                    return Err(Error::invalid(format!("mounts: unsupported value {other}")))
                }
                None => Vec::new(),
            };
            let all: Vec<String> = listed.into_iter().chain(sections).collect();
            self.set("mounts", &all.join(","))?;
        }
        for (key, value) in table {
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Array(items) => items
                    .into_iter()
                    .map(|v| match v {
                        toml::Value::String(s) => Ok(s),
                        other => Err(Error::invalid(format!(
                            "{key}: list items must be strings, got {other}"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?
                    .join(","),
                other => return Err(Error::invalid(format!("{key}: unsupported value {other}"))),
            };
            self.set(&key, &text)?;
        }
        Ok(())
    }

    /// `[mount."/lab"]` tables (`uri = "s3://b/p"` and that store's options, e.g. `endpoint`,
    /// `region`, `secret_access_key_file`) as `PATH=URI?key=value&...` mount entries: the same
    /// form as on the command line, so every front end reads one syntax. The store validates
    /// the keys when it opens.
    fn mount_sections(value: toml::Value) -> Result<Vec<String>> {
        let toml::Value::Table(mounts) = value else {
            return Err(Error::invalid(
                "mount: expected sections [mount.\"/PATH\"] with uri = \"...\" in each",
            ));
        };
        let mut out = Vec::new();
        for (path, section) in mounts {
            let what = format!("[mount.\"{path}\"]");
            let toml::Value::Table(mut section) = section else {
                return Err(Error::invalid(format!("{what}: expected a section")));
            };
            let uri = match section.remove("uri") {
                Some(toml::Value::String(u)) => u,
                Some(_) => return Err(Error::invalid(format!("{what}: uri must be a string"))),
                None => return Err(Error::invalid(format!("{what}: uri = \"...\" is missing"))),
            };
            if uri.contains(',') {
                return Err(Error::invalid(format!(
                    "{what}: uri must not contain ','; give options as keys of the section"
                )));
            }
            let mut query = Vec::new();
            for (key, v) in section {
                let v = match v {
                    toml::Value::String(s) => s,
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    other => {
                        return Err(Error::invalid(format!(
                            "{what}: {key}: expected a string, a number or true/false, got {other}"
                        )))
                    }
                };
                query.push(format!("{key}={}", crate::query::percent_encode(&v)));
            }
            let sep = if uri.contains('?') { '&' } else { '?' };
            let entry = if query.is_empty() {
                format!("{path}={uri}")
            } else {
                format!("{path}={uri}{sep}{}", query.join("&"))
            };
            // Checked here so that an error names the section.
            parse_mount_spec(&entry).map_err(|e| e.context(what.clone()))?;
            out.push(entry);
        }
        Ok(out)
    }

    /// Applies `SILT_<NAME>` environment variables.
    pub fn apply_env(&mut self) -> Result<()> {
        for opt in OPTIONS {
            if let Ok(v) = std::env::var(env_name(opt.name)) {
                self.set(opt.name, &v)
                    .map_err(|e| e.context(format!("environment {}", env_name(opt.name))))?;
            }
        }
        Ok(())
    }
}

/// `page_size` → `SILT_PAGE_SIZE`.
pub fn env_name(option: &str) -> String {
    format!("SILT_{}", option.to_ascii_uppercase())
}

/// `page_size` → `page-size`.
pub fn flag_name(option: &str) -> String {
    option.replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_validate() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.page_size, 1 << 20);
        assert_eq!(
            c.disk_tiers().unwrap()[0].dir,
            PathBuf::from("/var/lib/silt/cache")
        );
    }

    #[test]
    fn cache_ttl_rules_parse_and_refuse_bad_ones() {
        let mut c = Config::default();
        c.set("cache_ttl_rules", "/data/tmp=1h, /scratch=90s")
            .unwrap();
        assert_eq!(
            c.cache_ttl_rules,
            vec![
                ("/data/tmp".to_string(), Duration::from_secs(3600)),
                ("/scratch".to_string(), Duration::from_secs(90))
            ]
        );
        for bad in ["/data/tmp", "/data/tmp=soon", "data=1h"] {
            let e = c.set("cache_ttl_rules", bad).unwrap_err();
            assert!(e.to_string().contains("cache_ttl_rules"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_values_give_clear_errors() {
        let mut c = Config::default();
        let e = c.set("page_size", "3MiB").unwrap_err();
        assert!(e.to_string().contains("power of two"), "{e}");
        assert!(c
            .set("sync_policy", "soon")
            .unwrap_err()
            .to_string()
            .contains("sync_policy"));
        assert!(c
            .set("nope", "1")
            .unwrap_err()
            .to_string()
            .contains("unknown option"));
        assert!(c.set("mounts", "data=s3://b").is_err());
        let e = c.set("log_format", "xml").unwrap_err();
        assert!(e.to_string().contains("text or json"), "{e}");
        c.set("log_format", "json").unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        assert!(c.set("mounts", "/data=bucket").is_err());
        assert!(c.set("disk_tiers", "relative:1GiB").is_err());
        assert!(c.set("s3_endpoint", "localhost:9000").is_err());
        c.set("low_watermark", "0.99").unwrap();
        c.set("high_watermark", "0.5").unwrap();
        assert!(c.validate().is_err());
    }

    #[test]
    fn ops_listeners_resolve_by_role() {
        let mut c = Config::default();
        assert_eq!(c.metrics_listen, Listen::Auto);
        assert_eq!(
            c.metrics_listen.resolve(true, DEFAULT_METRICS_LISTEN),
            Some((DEFAULT_METRICS_LISTEN.to_string(), false))
        );
        assert_eq!(c.web_listen.resolve(false, DEFAULT_WEB_LISTEN), None);
        c.set("web_listen", "127.0.0.1:0").unwrap();
        assert_eq!(
            c.web_listen.resolve(false, DEFAULT_WEB_LISTEN),
            Some(("127.0.0.1:0".to_string(), true))
        );
        c.set("metrics_listen", "off").unwrap();
        assert_eq!(c.metrics_listen.resolve(true, DEFAULT_METRICS_LISTEN), None);
        let e = c.set("metrics_listen", "9464").unwrap_err().to_string();
        assert!(
            e.contains("metrics_listen") && e.contains("HOST:PORT"),
            "{e}"
        );
    }

    #[test]
    fn toml_lists_and_paths() {
        let mut c = Config::default();
        c.apply_toml("mounts = [\"/a=file:///x\", \"/b/c/=s3://bkt/p\"]\npage_size = \"4MiB\"\nfuse_threads = 4\n")
            .unwrap();
        assert_eq!(c.mounts.len(), 2);
        assert_eq!(c.mounts[1].path, "/b/c");
        assert_eq!(c.page_size, 4 << 20);
        assert_eq!(c.fuse_threads, 4);
        assert!(c.apply_toml("page_size = [1]").is_err());
        assert_eq!(normalize_ns_path("//a/./b"), None);
        // Names may end in white space: `/d/f ` is not `/d/f`.
        assert_eq!(normalize_ns_path("/d/f "), Some("/d/f ".into()));
        assert_eq!(normalize_ns_path("/d/g\n/"), Some("/d/g\n".into()));
        assert_eq!(normalize_ns_path("/"), Some("/".into()));
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_read_from_files() {
        let mut c = Config::default();
        c.set("cluster_secret", "cfg-secret-0123456789").unwrap();
        c.set("s3_secret_access_key", "s3-key-abcdef").unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("cfg-secret") && !shown.contains("s3-key"),
            "{shown}"
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k");
        std::fs::write(&file, "from-a-file-0123456789\n").unwrap();
        let mut c = Config::default();
        c.set("cluster_secret_file", file.to_str().unwrap())
            .unwrap();
        c.set("s3_secret_access_key_file", file.to_str().unwrap())
            .unwrap();
        let warnings = c.load_secret_files().unwrap();
        assert_eq!(c.cluster_secret.expose(), "from-a-file-0123456789");
        assert_eq!(c.s3_secret_access_key.expose(), "from-a-file-0123456789");
        // Written with the default umask: readable by others, which is worth a warning.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(warnings.len(), if mode & 0o077 != 0 { 2 } else { 0 });
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = Config::default();
        c.set("cluster_secret_file", file.to_str().unwrap())
            .unwrap();
        assert!(c.load_secret_files().unwrap().is_empty());

        // A value and a file for one secret: refused, without showing either.
        c.set("cluster_secret", "other-value-0123456789").unwrap();
        let e = c.load_secret_files().unwrap_err().to_string();
        assert!(
            e.contains("give one of them") && !e.contains("value"),
            "{e}"
        );
    }
}

#[cfg(test)]
mod doc_tests {
    /// docs/CONFIGURATION.md lists every option with its real default.
    #[test]
    fn configuration_doc_lists_every_option_and_default() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/CONFIGURATION.md"
        ))
        .expect("docs/CONFIGURATION.md");
        for o in super::OPTIONS {
            let default = if o.default.is_empty() {
                "(empty)".to_string()
            } else {
                format!("`{}`", o.default)
            };
            let row = format!("| `{}` | {} |", o.name, default);
            assert!(
                doc.contains(&row),
                "docs/CONFIGURATION.md lacks the row starting {row}"
            );
        }
    }

    #[test]
    fn mount_sections_become_mount_entries_with_their_options() {
        let mut cfg = super::Config::default();
        cfg.apply_toml(
            r#"
mounts = ["/local=file:///srv/data"]
[mount."/lab"]
uri = "s3://shared/ckpt"
endpoint = "http://10.0.0.5:9000"
access_key_id = "lab"
secret_access_key_file = "/etc/silt/lab secret"
[mount."/gcs"]
uri = "gs://bucket/prefix"
"#,
        )
        .unwrap();
        let got: Vec<(String, String)> = cfg
            .mounts
            .iter()
            .map(|m| (m.path.clone(), m.uri.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("/local".to_string(), "file:///srv/data".to_string()),
                ("/gcs".to_string(), "gs://bucket/prefix".to_string()),
                (
                    "/lab".to_string(),
                    "s3://shared/ckpt?access_key_id=lab&endpoint=http://10.0.0.5:9000&secret_access_key_file=/etc/silt/lab%20secret".to_string()
                ),
            ]
        );
        for bad in [
            "[mount.\"/x\"]\nendpoint = \"http://h\"\n",
            "[mount.\"relative\"]\nuri = \"s3://b\"\n",
            "[mount.\"/x\"]\nuri = \"s3://b\"\nregion = [1]\n",
            "mount = 3\n",
        ] {
            assert!(super::Config::default().apply_toml(bad).is_err(), "{bad}");
        }
    }
}
