//! Worker RPC: how clients read from (and preload into) a worker.
//!
//! Framing is `silt-proto`'s: one JSON request frame; a response of JSON and raw `Data` frames
//! closed by `End` or `Error`. A connection carries any number of requests, one at a time.
//! A request is one [`Request`] (a tagged enum: `op` names the variant), decoded once, whole,
//! version first; the worker dispatches on the variant and times it under the metric label
//! the variant names (`Request::metric`).
//! Before the first request, both ends prove membership of the cluster (`crate::auth`, once per
//! connection); a connection that does not is closed before anything is served.
//!
//! Requests name the object by its store URI, path and content fingerprint parts, never by
//! a worker-local handle, so any worker can serve any object of the cluster's mount table and
//! computes the same `ObjectId` (and finds the same cached pages) as every other process.
//! Ranges are bytes, not pages, so processes with different page sizes interoperate.
//!
//! Same host: over the worker's Unix socket a client may ask for a file descriptor instead of
//! bytes (`fd: true`). When every page of the range is in the worker's disk tier (the data
//! file holds each page at its own offset), the worker pins the object, answers `{"fd": true}` and passes the open data file (SCM_RIGHTS); the client reads its
//! range with `pread` and then sends `done`, and only then is the pin released, so eviction
//! can never punch a hole under a read in progress. Otherwise the worker sends bytes.
//! For FUSE passthrough (`lease_copy`) a client needs a file for the whole life of an open, so the
//! worker leases a private copy instead (see `lease_copy`).
//!
//! Replicated cache-only files (`crate::replica`): `rput` (the file's bytes follow the request
//! as `Data` frames closed by `End`; answered `{"stored": size}`), `rget` (bytes of a range of
//! one version, by path and tag), `rstat`, `rlist` (every file below a directory) and `rdel`.
//! They name files by namespace path; a worker keeps them in its own resident table.
//!
//! The worker's own under-stores (`store_*`, Unix socket only; see [`store`]): a same-host
//! client (a process attached to a `silt up`) makes every call of its stores through the
//! owner, so it needs no store endpoint or credentials of its own.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use silt_common::io::ReadAt;
use silt_common::{metrics, Error, ErrorKind, ObjectId, PageKey, Result};
use silt_proto::{
    decode_json, decode_request, read_frame, write_error, write_frame, write_json, ErrorBody,
    FrameKind, Versioned,
};
use silt_reader::{ObjectRef, PageReader};
use silt_resident::RemoteMeta;
use silt_ufs::{DynStore, EntryKind, Headers, ObjectMeta, SetAttrs, SpecialKind};

use crate::auth::{self, ClusterKey};
use crate::replica::ResidentTable;
pub use answer::Answer;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

pub mod answer;
pub mod store;

/// Largest range one request may ask for (placement groups are at most this large).
pub const MAX_RANGE: u64 = 64 << 20;

/// How long a worker keeps an object pinned for a client reading through a passed
/// descriptor before giving up on its `done`.
const DONE_TIMEOUT: Duration = Duration::from_secs(60);

/// One version of one object, as it travels between processes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireObject {
    /// Under-store URI (a mount of the cluster's mount table).
    pub store: String,
    pub path: String,
    pub size: u64,
    #[serde(default)]
    pub etag: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    /// Modification time in nanoseconds since the epoch.
    #[serde(default)]
    pub mtime_ns: Option<u64>,
}

impl WireObject {
    pub fn from_ref(obj: &ObjectRef) -> WireObject {
        let m = &obj.meta;
        WireObject {
            store: obj.store.uri().to_string(),
            path: m.path.clone(),
            size: m.size,
            etag: m.etag.clone(),
            version: m.version.clone(),
            mtime_ns: m
                .mtime
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .and_then(|d| u64::try_from(d.as_nanos()).ok()),
        }
    }

    /// The object as the worker holding `store` sees it; same `ObjectId` as the sender's.
    pub fn into_ref(self, store: DynStore) -> ObjectRef {
        let meta = ObjectMeta {
            path: self.path,
            kind: EntryKind::File,
            size: self.size,
            mtime: self
                .mtime_ns
                .map(|n| SystemTime::UNIX_EPOCH + Duration::from_nanos(n)),
            etag: self.etag,
            version: self.version,
            mode: None,
            posix: Default::default(),
        };
        ObjectRef::new(store, meta)
    }
}

/// The pattern of every `store_*` request.
macro_rules! store_request {
    () => {
        Request::StoreInfo { .. }
            | Request::StoreStat { .. }
            | Request::StoreList { .. }
            | Request::StoreListTree { .. }
            | Request::StoreHeaders { .. }
            | Request::StoreRead { .. }
            | Request::StoreWrite { .. }
            | Request::StoreDelete { .. }
            | Request::StoreCreateDir { .. }
            | Request::StoreRemoveDir { .. }
            | Request::StoreRename { .. }
            | Request::StoreCopy { .. }
            | Request::StoreSymlink { .. }
            | Request::StoreReadLink { .. }
            | Request::StoreSetAttrs { .. }
            | Request::StoreMknod { .. }
            | Request::StoreHardLink { .. }
    };
}

/// A request of the worker protocol, decoded once, whole, into what its operation needs. On
/// the wire: `{"v": 1, "op": "<name>", ...its fields}` (fields of other operations are
/// ignored, a missing one is refused). Answers are JSON (and `Data` frames) closed by `End`
/// or `Error`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// The worker's identity, cache and counters.
    Stats,
    /// Directory `path` of the namespace changed in the store (an attached client's change):
    /// the owner revalidates it before answering.
    Changed {
        path: String,
        /// Not a change in the store: the cached bytes of the files at or below `path` were
        /// freed (`silt fs free`); the owner drops its mount's kernel copy of them.
        #[serde(default)]
        freed: bool,
        /// The whole tree below `path` may have changed (a recursive `sync`): the owner
        /// revalidates it with one recursive listing (an older owner, which does not read
        /// this, revalidates `path` alone).
        #[serde(default)]
        recursive: bool,
    },
    /// For each range: how many of its pages the worker holds, how many bytes are pinned.
    Cached {
        #[serde(default)]
        ranges: Vec<PageRange>,
    },
    /// `silt fs pin`: this worker's part of the object, kept until unpinned, then loaded.
    Pin {
        object: WireObject,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: u64,
    },
    Unpin {
        object: WireObject,
    },
    /// Bytes of a range, or (`fd`, Unix socket) the data file they lie in.
    Read {
        object: WireObject,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: u64,
        #[serde(default)]
        fd: bool,
    },
    /// The object's cache file, pinned while the connection lives (Unix socket).
    Lease {
        object: WireObject,
    },
    /// A private copy of the object's cache file, for passthrough (Unix socket).
    /// `hold` from clients before the rename.
    #[serde(rename = "lease_copy", alias = "hold")]
    LeaseCopy {
        object: WireObject,
    },
    /// Cached whatever the admission policy says (`silt load`).
    Load {
        object: WireObject,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: u64,
    },
    /// Fetched now for a read coming soon, admitted as a read's pages are.
    Prefetch {
        object: WireObject,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: u64,
    },
    /// The version was replaced or deleted: its pages go.
    Forget {
        object: WireObject,
    },
    /// A replicated cache-only file: its bytes follow as `Data` frames closed by `End`.
    Rput {
        path: String,
        file: WireResident,
    },
    /// Bytes of a range of one version (`file.tag`) of a replicated file.
    Rget {
        path: String,
        file: WireResident,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: u64,
    },
    Rstat {
        path: String,
    },
    /// Every replicated file strictly below directory `path`.
    Rlist {
        path: String,
    },
    Rdel {
        path: String,
    },
    /// The `store_*` operations (Unix socket only, see [`store`]): a call of the worker's own
    /// under-store `store` (a URI of its mount table), so a same-host client needs no store
    /// credentials. `store_info`: the store's URI and capabilities.
    #[serde(rename = "store_info")]
    StoreInfo {
        store: String,
    },
    #[serde(rename = "store_stat")]
    StoreStat {
        store: String,
        path: String,
    },
    #[serde(rename = "store_list")]
    StoreList {
        store: String,
        path: String,
        #[serde(default)]
        recursive: bool,
        /// Answer in pages (one JSON frame of at most `LIST_PAGE` entries each, then the end):
        /// a listing past one frame's 64 MiB (some 200,000 entries) is not refused. An older
        /// worker, which does not read this, answers in one frame, which a reader of pages
        /// takes as the one page.
        #[serde(default)]
        paged: bool,
    },
    /// `list_tree`: every entry below `path`, or none if there are more than `max`.
    #[serde(rename = "store_list_tree")]
    StoreListTree {
        store: String,
        path: String,
        max: u64,
    },
    #[serde(rename = "store_headers")]
    StoreHeaders {
        store: String,
        path: String,
        expected: ObjectMeta,
    },
    /// Bytes `[offset, offset + len)` of the version `expected`, as `Data` frames.
    #[serde(rename = "store_read")]
    StoreRead {
        store: String,
        path: String,
        expected: ObjectMeta,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: u64,
    },
    /// A whole object of `size` bytes, which follow as `Data` frames closed by `End`, with
    /// the attributes `attrs` and, where given, the S3 `headers`.
    #[serde(rename = "store_write")]
    StoreWrite {
        store: String,
        path: String,
        size: u64,
        #[serde(default)]
        attrs: SetAttrs,
        #[serde(default)]
        headers: Option<Headers>,
    },
    #[serde(rename = "store_delete")]
    StoreDelete {
        store: String,
        path: String,
    },
    #[serde(rename = "store_create_dir")]
    StoreCreateDir {
        store: String,
        path: String,
    },
    #[serde(rename = "store_remove_dir")]
    StoreRemoveDir {
        store: String,
        path: String,
    },
    #[serde(rename = "store_rename")]
    StoreRename {
        store: String,
        from: String,
        to: String,
    },
    #[serde(rename = "store_copy")]
    StoreCopy {
        store: String,
        from: String,
        to: String,
    },
    #[serde(rename = "store_symlink")]
    StoreSymlink {
        store: String,
        path: String,
        target: String,
    },
    #[serde(rename = "store_read_link")]
    StoreReadLink {
        store: String,
        path: String,
    },
    #[serde(rename = "store_set_attrs")]
    StoreSetAttrs {
        store: String,
        path: String,
        attrs: SetAttrs,
    },
    #[serde(rename = "store_mknod")]
    StoreMknod {
        store: String,
        path: String,
        kind: SpecialKind,
        #[serde(default)]
        rdev: u32,
        #[serde(default)]
        attrs: SetAttrs,
    },
    #[serde(rename = "store_hard_link")]
    StoreHardLink {
        store: String,
        from: String,
        to: String,
    },
}

impl Request {
    pub fn stats() -> Request {
        Request::Stats
    }

    pub fn load(obj: &ObjectRef, range: std::ops::Range<u64>) -> Request {
        Request::Load {
            object: WireObject::from_ref(obj),
            offset: range.start,
            len: range.end.saturating_sub(range.start),
        }
    }

    pub fn prefetch(obj: &ObjectRef, range: std::ops::Range<u64>) -> Request {
        Request::Prefetch {
            object: WireObject::from_ref(obj),
            offset: range.start,
            len: range.end.saturating_sub(range.start),
        }
    }

    pub fn pin(obj: &ObjectRef, range: std::ops::Range<u64>) -> Request {
        Request::Pin {
            object: WireObject::from_ref(obj),
            offset: range.start,
            len: range.end.saturating_sub(range.start),
        }
    }

    pub fn unpin(obj: &ObjectRef) -> Request {
        Request::Unpin {
            object: WireObject::from_ref(obj),
        }
    }

    pub fn forget(obj: &ObjectRef) -> Request {
        Request::Forget {
            object: WireObject::from_ref(obj),
        }
    }

    /// The request with the protocol version, as it is sent.
    fn envelope(&self) -> Versioned<'_, Request> {
        Versioned::new(self)
    }

    /// Its operation's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Stats => "stats",
            Request::Changed { .. } => "changed",
            Request::Cached { .. } => "cached",
            Request::Pin { .. } => "pin",
            Request::Unpin { .. } => "unpin",
            Request::Read { .. } => "read",
            Request::Lease { .. } => "lease",
            Request::LeaseCopy { .. } => "lease_copy",
            Request::Load { .. } => "load",
            Request::Prefetch { .. } => "prefetch",
            Request::Forget { .. } => "forget",
            Request::Rput { .. } => "rput",
            Request::Rget { .. } => "rget",
            Request::Rstat { .. } => "rstat",
            Request::Rlist { .. } => "rlist",
            Request::Rdel { .. } => "rdel",
            Request::StoreInfo { .. } => "store_info",
            Request::StoreStat { .. } => "store_stat",
            Request::StoreList { .. } => "store_list",
            Request::StoreListTree { .. } => "store_list_tree",
            Request::StoreHeaders { .. } => "store_headers",
            Request::StoreRead { .. } => "store_read",
            Request::StoreWrite { .. } => "store_write",
            Request::StoreDelete { .. } => "store_delete",
            Request::StoreCreateDir { .. } => "store_create_dir",
            Request::StoreRemoveDir { .. } => "store_remove_dir",
            Request::StoreRename { .. } => "store_rename",
            Request::StoreCopy { .. } => "store_copy",
            Request::StoreSymlink { .. } => "store_symlink",
            Request::StoreReadLink { .. } => "store_read_link",
            Request::StoreSetAttrs { .. } => "store_set_attrs",
            Request::StoreMknod { .. } => "store_mknod",
            Request::StoreHardLink { .. } => "store_hard_link",
        }
    }

    /// The `op` label of `silt_worker_rpc_seconds` it is timed under (`None`: not timed).
    pub fn metric(&self) -> Option<metrics::RpcOp> {
        use metrics::RpcOp;
        Some(match self {
            Request::Stats => RpcOp::Stats,
            Request::Changed { .. } => RpcOp::Changed,
            Request::Cached { .. } => RpcOp::Cached,
            Request::Pin { .. } => RpcOp::Pin,
            Request::Unpin { .. } => RpcOp::Unpin,
            Request::Read { .. } => RpcOp::Read,
            // It lasts as long as the client holds the file.
            Request::Lease { .. } => return None,
            Request::LeaseCopy { .. } => RpcOp::LeaseCopy,
            Request::Load { .. } => RpcOp::Load,
            Request::Prefetch { .. } => RpcOp::Prefetch,
            Request::Forget { .. } => RpcOp::Forget,
            Request::Rput { .. }
            | Request::Rget { .. }
            | Request::Rstat { .. }
            | Request::Rlist { .. }
            | Request::Rdel { .. } => RpcOp::Resident,
            store_request!() => RpcOp::Store,
        })
    }

    /// One of the `store_*` operations (a call of the worker's own under-store).
    pub fn is_store(&self) -> bool {
        matches!(self, store_request!())
    }

    /// Decodes one request frame (`silt_proto::decode_request`): its version first, then
    /// the operation and every field it needs.
    pub fn decode(kind: FrameKind, payload: &[u8]) -> Result<Request> {
        decode_request(kind, payload)
    }
}

/// Pages `first..=last` of an object (`cached` asks how many of them a worker holds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PageRange {
    /// The object's id in hex.
    pub object: String,
    pub first: u64,
    pub last: u64,
}

/// The most pages one `cached` request may ask about (each range counts its pages): the
/// answer is work on the worker, so a request cannot make it unbounded.
pub const CACHED_MAX_PAGES: u64 = 1 << 24;

/// A replicated cache-only file as it travels between processes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireResident {
    #[serde(default)]
    pub path: String,
    pub size: u64,
    pub tag: String,
    #[serde(default)]
    pub mtime_ns: Option<u64>,
    /// What is left of its life, in milliseconds (`None`: until removed).
    #[serde(default)]
    pub expires_in_ms: Option<u64>,
}

impl WireResident {
    pub fn from_meta(path: &str, m: &RemoteMeta) -> WireResident {
        WireResident {
            path: path.to_string(),
            size: m.size,
            tag: m.tag.clone(),
            mtime_ns: m
                .mtime
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .and_then(|d| u64::try_from(d.as_nanos()).ok()),
            expires_in_ms: m
                .expires_in
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    pub fn into_meta(self) -> (String, RemoteMeta) {
        let meta = RemoteMeta {
            size: self.size,
            tag: self.tag,
            mtime: self
                .mtime_ns
                .map(|n| SystemTime::UNIX_EPOCH + Duration::from_nanos(n)),
            expires_in: self.expires_in_ms.map(Duration::from_millis),
        };
        (self.path, meta)
    }
}

/// Finds the under-store a request names. Workers answer only for stores of the cluster's
/// mount table (they hold its credentials); anything else is `Unavailable`, and the client
/// reads from the store itself.
#[async_trait]
pub trait StoreResolver: Send + Sync {
    async fn store(&self, uri: &str) -> Result<DynStore>;

    /// The metadata of `path` of store `uri` as this process's own namespace has it
    /// (cached, asked again when its sync policy says so), for a same-host client's
    /// `store_stat`: so a client attached to this node sees what it sees, and a new process
    /// (a DataLoader worker) does not ask the store again for every file. `None`: nothing to
    /// say (no namespace, not an entry it knows, a file being written): the store is asked.
    async fn known_file(&self, _uri: &str, _path: &str) -> Option<ObjectMeta> {
        None
    }

    /// The entries of directory `dir` of store `uri` as this process's namespace has them
    /// listed, for a same-host client's `store_list` (not recursive), as `known_file`.
    async fn known_listing(&self, _uri: &str, _dir: &str) -> Option<Vec<ObjectMeta>> {
        None
    }
}

/// A fixed set of stores.
pub struct FixedStores(pub Vec<DynStore>);

#[async_trait]
impl StoreResolver for FixedStores {
    async fn store(&self, uri: &str) -> Result<DynStore> {
        self.0
            .iter()
            .find(|s| s.uri() == uri)
            .cloned()
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("{uri} is not in this worker's mount table"),
                )
            })
    }
}

/// What a worker serves.
pub struct Service {
    worker: Arc<PageReader>,
    stores: Arc<dyn StoreResolver>,
    /// Who this worker is, for `stats`.
    identity: answer::Identity,
    /// What this service served (also counted in the process-wide `RPC_*` metrics).
    reads_served: AtomicU64,
    bytes_served: AtomicU64,
    files_leased: AtomicU64,
    /// Replicated cache-only files kept here (`None`: the `r*` ops are refused).
    resident: Option<Arc<ResidentTable>>,
    /// Every connection proves it holds this before it is served.
    key: ClusterKey,
    /// `changed`: a same-host client changed this namespace path in the store (`None`: the
    /// op is refused; only a single node serving its own namespace takes it).
    on_changed: Option<ChangedHook>,
    /// The `store_*` calls (`with_store_calls`): off unless this node serves its own
    /// namespace to attached clients (a cluster worker's socket serves reads only).
    store_calls: bool,
}

/// Told the namespace directories another client changed (see `Service::with_changed`).
pub type ChangedHook =
    Arc<dyn Fn(String, Change) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// What an attached client tells its owner of a path (`changed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Something in directory `path` changed in the store: revalidate its listing.
    Within,
    /// Anything below `path` may have changed: revalidate the tree.
    Below,
    /// The cached bytes at or below `path` were freed (not a change in the store).
    Freed,
}

/// Adds `n` to one of a service's own counters and to its process-wide metric.
fn count(own: &AtomicU64, metric: &metrics::Counter, n: u64) {
    own.fetch_add(n, Ordering::Relaxed);
    metric.add(n);
}

/// The end of the byte range `[offset, offset + len)` of `obj` if a worker serves it at once:
/// not empty, at most [`MAX_RANGE`] bytes, inside the object. The object's size comes from the
/// client: this bounds the work one request can ask for.
fn checked_end(obj: &ObjectRef, offset: u64, len: u64) -> Result<u64> {
    let outside = || {
        Error::invalid(format!(
            "range {offset}+{len} is outside {} ({} bytes)",
            obj.meta.path,
            obj.size()
        ))
    };
    match range_end(offset, len)? {
        end if end <= obj.size() && len > 0 => Ok(end),
        _ => Err(outside()),
    }
}

/// The end of the range `offset + len` a peer asked for: at most [`MAX_RANGE`] bytes, not
/// past the largest offset.
fn range_end(offset: u64, len: u64) -> Result<u64> {
    if len > MAX_RANGE {
        return Err(Error::invalid(format!(
            "range of {len} bytes is larger than a worker serves at once ({MAX_RANGE})"
        )));
    }
    offset
        .checked_add(len)
        .ok_or_else(|| Error::invalid(format!("range {offset}+{len} overflows")))
}

impl Service {
    /// `identity`: who this worker is, for `stats`; `key`: the cluster's secret, which every
    /// connection must prove it holds.
    pub fn new(
        worker: Arc<PageReader>,
        stores: Arc<dyn StoreResolver>,
        identity: answer::Identity,
        key: ClusterKey,
    ) -> Service {
        Service {
            key,
            worker,
            stores,
            identity,
            reads_served: AtomicU64::new(0),
            bytes_served: AtomicU64::new(0),
            files_leased: AtomicU64::new(0),
            resident: None,
            on_changed: None,
            store_calls: false,
        }
    }

    /// Serves the `store_*` calls on the Unix socket: same-host clients attached to this
    /// node (which opens no store of its own) call its stores through it, write calls too.
    pub fn with_store_calls(mut self) -> Service {
        self.store_calls = true;
        self
    }

    /// Takes `changed` notes (a directory whose entries a same-host client changed in the
    /// store) and answers once `hook` has handled each, so this node's metadata cache (and
    /// its mount) see them when the client's call returns.
    pub fn with_changed(mut self, hook: ChangedHook) -> Service {
        self.on_changed = Some(hook);
        self
    }

    /// Keeps replicated cache-only files in `table`.
    pub fn with_resident(mut self, table: Arc<ResidentTable>) -> Service {
        self.resident = Some(table);
        self
    }

    fn resident_table(&self) -> Result<&Arc<ResidentTable>> {
        self.resident.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "this worker keeps no cache-only files",
            )
        })
    }

    async fn object(&self, wire: WireObject) -> Result<ObjectRef> {
        let store = self.stores.store(&wire.store).await?;
        Ok(wire.into_ref(store))
    }

    /// The bytes `[offset, offset+len)`, one piece per page (cached or fetched).
    async fn pages(&self, obj: &ObjectRef, offset: u64, len: u64) -> Result<Vec<Bytes>> {
        let end = checked_end(obj, offset, len)?;
        let ps = self.worker.page_size();
        let pages = self
            .worker
            .read_pages(obj, offset / ps..=(end - 1) / ps)
            .await?;
        let first = offset / ps;
        Ok(pages
            .into_iter()
            .enumerate()
            .map(|(i, (page, _))| silt_reader::page_slice(ps, first + i as u64, &page, offset, end))
            .collect())
    }

    /// How many pages of each range this worker holds in any tier (no fetch, no hit counted).
    fn cached(&self, ranges: &[PageRange]) -> Result<Vec<u64>> {
        let mut asked = 0u64;
        for r in ranges {
            if r.last < r.first {
                return Err(Error::invalid(format!(
                    "cached: range {}..={} ends before it starts",
                    r.first, r.last
                )));
            }
            asked = asked.saturating_add(r.last - r.first + 1);
        }
        if asked > CACHED_MAX_PAGES {
            return Err(Error::invalid(format!(
                "cached: {asked} pages asked about at once; at most {CACHED_MAX_PAGES}"
            )));
        }
        let store = self.worker.page_store();
        ranges
            .iter()
            .map(|r| {
                let object = ObjectId::from_hex(&r.object).ok_or_else(|| {
                    Error::invalid(format!("cached: {:?} is not an object id", r.object))
                })?;
                Ok((r.first..=r.last)
                    .filter(|&index| store.contains(&PageKey { object, index }))
                    .count() as u64)
            })
            .collect()
    }

    fn stats(&self) -> answer::Stats {
        let s = self.worker.stats();
        let tiers: Vec<answer::TierStats> = s
            .tiers
            .iter()
            .map(|t| answer::TierStats {
                name: t.name.clone(),
                capacity: t.capacity,
                used: t.used,
                pages: t.pages,
            })
            .collect();
        let lookups = s.hits + s.misses;
        let (cache_only_files, cache_only_bytes) =
            self.resident.as_ref().map_or((0, 0), |t| t.usage());
        answer::Stats {
            identity: self.identity.clone(),
            page_size: self.worker.page_size(),
            capacity: s.tiers.iter().map(|t| t.capacity).sum(),
            used: s.tiers.iter().map(|t| t.used).sum(),
            tiers,
            page_hits: s.hits,
            page_misses: s.misses,
            hit_ratio: if lookups > 0 {
                s.hits as f64 / lookups as f64
            } else {
                0.0
            },
            reads_served: self.reads_served.load(Ordering::Relaxed),
            bytes_served: self.bytes_served.load(Ordering::Relaxed),
            files_leased: self.files_leased.load(Ordering::Relaxed),
            ufs_read_bytes: metrics::UFS_READ_BYTES.get(),
            cache_only_files,
            cache_only_bytes,
        }
    }
}

pub async fn serve_tcp(listener: TcpListener, svc: Arc<Service>) {
    let accept = || async {
        let (s, peer) = listener.accept().await?;
        let _ = s.set_nodelay(true);
        Ok((Conn::Tcp(s), peer.to_string()))
    };
    accept_loop(accept, svc, "worker port").await
}

pub async fn serve_unix(listener: UnixListener, svc: Arc<Service>) {
    let accept = || async {
        let (s, _) = listener.accept().await?;
        // A Unix peer has no address; its process id says who it was.
        let peer = match s.peer_cred().ok().and_then(|c| c.pid()) {
            Some(pid) => format!("unix socket, pid {pid}"),
            None => "unix socket".to_string(),
        };
        Ok((Conn::Unix(s), peer))
    };
    accept_loop(accept, svc, "worker socket").await
}

async fn accept_loop<F, Fut>(mut accept: F, svc: Arc<Service>, what: &'static str)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<(Conn, String)>>,
{
    loop {
        match accept().await {
            Ok((conn, peer)) => {
                let svc = svc.clone();
                tokio::spawn(async move {
                    if let Err(e) = handle(conn, &svc, &peer).await {
                        tracing::debug!("{what} connection ended: {e}");
                    }
                });
            }
            Err(e) => {
                // Out of fds and the like: back off instead of spinning.
                silt_common::warn_limited!(per: what, "accept failed", listener = what, error = %e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handle(mut s: Conn, svc: &Service, peer: &str) -> Result<()> {
    // Nothing is read as a request, let alone served, before the peer proved membership.
    let channel = match s {
        Conn::Unix(_) => auth::Channel::Unix,
        _ => auth::Channel::Tcp,
    };
    if auth::accept(&mut s, &svc.key, peer, channel).await? == auth::Accepted::StartTls {
        let Conn::Tcp(tcp) = s else {
            return Err(Error::internal(
                "TLS asked for on a connection that is not TCP",
            ));
        };
        let (tls, binding) = crate::tls::accept(tcp).await.inspect_err(|_| {
            metrics::RPC_AUTH_FAILURES.inc();
        })?;
        s = Conn::Tls(Box::new(tls.into()));
        auth::accept(&mut s, &svc.key, peer, auth::Channel::Tls(&binding)).await?;
    }
    while let Some((kind, payload)) = read_frame(&mut s).await? {
        let req = match Request::decode(kind, &payload) {
            Ok(r) => r,
            Err(e) => {
                write_error(&mut s, &e).await?;
                return s.flush().await.map_err(Error::from);
            }
        };
        let timed = req.metric().map(|op| (op, std::time::Instant::now()));
        let served = serve_one(&mut s, svc, req).await;
        if let Some((op, began)) = timed {
            op.histogram().since(began);
        }
        match served {
            Ok(()) => write_frame(&mut s, FrameKind::End, &[]).await?,
            // The request failed, the connection did not: answer and keep serving.
            Err(e) if !e.broken => write_error(&mut s, &e.error).await?,
            Err(e) => return Err(e.error),
        }
    }
    Ok(())
}

/// An error while serving, and whether it broke the connection.
struct ServeError {
    error: Error,
    broken: bool,
}

impl From<Error> for ServeError {
    fn from(error: Error) -> Self {
        ServeError {
            error,
            broken: false,
        }
    }
}

fn broken(error: Error) -> ServeError {
    ServeError {
        error,
        broken: true,
    }
}

/// Writes `a`, the answer to operation `op` (the type says which it answers: checked in debug
/// builds, as the client does when it reads one).
async fn reply<A: Answer, W: AsyncWrite + Unpin>(
    s: &mut W,
    op: &str,
    a: &A,
) -> std::result::Result<(), ServeError> {
    debug_assert!(
        A::answers(op),
        "{op} is not answered with {}",
        std::any::type_name::<A>()
    );
    write_json(s, a).await.map_err(broken)
}

async fn serve_one(
    s: &mut Conn,
    svc: &Service,
    req: Request,
) -> std::result::Result<(), ServeError> {
    let op = req.name();
    match req {
        Request::Rput { .. }
        | Request::Rget { .. }
        | Request::Rstat { .. }
        | Request::Rlist { .. }
        | Request::Rdel { .. } => serve_resident(s, svc.resident_table()?, req).await,
        store_request!() => match s {
            Conn::Unix(u) if svc.store_calls => {
                return store::serve(u, svc.stores.as_ref(), req).await
            }
            _ => {
                if matches!(req, Request::StoreWrite { .. }) {
                    // Past the write's bytes, so the connection stays usable.
                    store::skip_bytes(s).await?;
                }
                let why = match s {
                    Conn::Unix(_) => {
                        "served by a node to its attached clients only, not by this worker"
                    }
                    Conn::Tcp(_) | Conn::Tls(_) => "only offered over the worker's Unix socket",
                };
                Err(Error::new(ErrorKind::Unsupported, format!("{op} is {why}")).into())
            }
        },
        Request::Stats => reply(s, op, &svc.stats()).await,
        Request::Changed {
            path,
            freed,
            recursive,
        } => {
            let Some(hook) = &svc.on_changed else {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "changed: this worker keeps no namespace of its own",
                )
                .into());
            };
            let change = match (freed, recursive) {
                (true, _) => Change::Freed,
                (false, true) => Change::Below,
                (false, false) => Change::Within,
            };
            hook(path, change).await;
            reply(s, op, &answer::Changed { ok: true }).await
        }
        Request::Cached { ranges } => {
            let pages = svc.cached(&ranges)?;
            let store = svc.worker.page_store();
            let ps = store.page_size();
            // Parsed by `cached` already: every object id is valid.
            let pinned: Vec<u64> = ranges
                .iter()
                .map(|r| {
                    let bytes =
                        r.first.saturating_mul(ps)..r.last.saturating_add(1).saturating_mul(ps);
                    ObjectId::from_hex(&r.object).map_or(0, |id| store.pinned_bytes_in(id, bytes))
                })
                .collect();
            reply(s, op, &answer::Cached { pages, pinned }).await
        }
        Request::Pin {
            object,
            offset,
            len,
        } => {
            // `silt fs pin` in a cluster: this worker's part of the object, kept until unpinned
            // (refused, pinning nothing, past the disk tiers' high watermarks), then loaded.
            let obj = svc.object(object).await?;
            let end = checked_end(&obj, offset, len)?;
            svc.worker.page_store().pin_user(&[(obj.id, offset..end)])?;
            let pages = svc.pages(&obj, offset, len).await?;
            let bytes: u64 = pages.iter().map(|p| p.len() as u64).sum();
            reply(s, op, &answer::Held { bytes }).await
        }
        Request::Unpin { object } => {
            let obj = svc.object(object).await?;
            let n = svc.worker.page_store().unpin_user(&[obj.id]);
            reply(s, op, &answer::Unpinned { unpinned: n as u64 }).await
        }
        Request::Read {
            object,
            offset,
            len,
            fd,
        } => {
            let obj = svc.object(object).await?;
            if fd {
                if let Conn::Unix(u) = s {
                    if try_send_fd(u, svc, &obj, offset, len).await? {
                        count(&svc.reads_served, &metrics::RPC_READS_SERVED, 1);
                        return Ok(());
                    }
                }
            }
            let pages = svc.pages(&obj, offset, len).await?;
            reply(s, op, &answer::FileHead::none()).await?;
            for p in pages {
                count(
                    &svc.bytes_served,
                    &metrics::RPC_BYTES_SERVED,
                    p.len() as u64,
                );
                write_frame(s, FrameKind::Data, &p).await.map_err(broken)?;
            }
            count(&svc.reads_served, &metrics::RPC_READS_SERVED, 1);
            Ok(())
        }
        Request::Lease { object } => {
            let obj = svc.object(object).await?;
            match s {
                Conn::Unix(u) => lease(u, svc, &obj).await,
                Conn::Tcp(_) | Conn::Tls(_) => Err(Error::invalid(
                    "lease is only offered over the worker's Unix socket",
                )
                .into()),
            }
        }
        Request::LeaseCopy { object } => {
            let obj = svc.object(object).await?;
            match s {
                Conn::Unix(u) => lease_copy(u, svc, &obj).await,
                Conn::Tcp(_) | Conn::Tls(_) => Err(Error::new(
                    ErrorKind::Unsupported,
                    "lease_copy is only offered over the worker's Unix socket",
                )
                .into()),
            }
        }
        Request::Load {
            object,
            offset,
            len,
        } => {
            let obj = svc.object(object).await?;
            // Asked for: cached even where the cache is full of pages read as often.
            let _prefer = svc.worker.page_store().prefer(obj.id);
            let pages = svc.pages(&obj, offset, len).await?;
            let bytes: u64 = pages.iter().map(|p| p.len() as u64).sum();
            reply(s, op, &answer::Held { bytes }).await
        }
        Request::Prefetch {
            object,
            offset,
            len,
        } => {
            // Read soon by the asker: fetched now, admitted as any read would be and not
            // counted as one (the read itself will be). Answers at once.
            let obj = svc.object(object).await?;
            let end = checked_end(&obj, offset, len)?;
            let ps = svc.worker.page_size();
            let started = svc.worker.prefetch(&obj, offset / ps..=(end - 1) / ps);
            reply(s, op, &answer::Prefetched { pages: started }).await
        }
        Request::Forget { object } => {
            // A client saw this version replaced or deleted in the store: its pages can never
            // be asked for again.
            let obj = svc.object(object).await?;
            svc.worker.page_store().remove_object(obj.id);
            reply(s, op, &answer::Forgot { forgot: true }).await
        }
    }
    .map_err(|mut e| {
        if !e.broken {
            e.error = e.error.context(op);
        }
        e
    })
}

/// Bytes of a replicated file or of a store call travel in frames of this size.
const RESIDENT_CHUNK: usize = 1 << 20;

/// Sends the first `len` bytes of `src` as `Data` frames closed by `End` (a client's `rput`,
/// `store_write`). A failure to read `src` is the caller's (`CallError::Worker`: final).
async fn send_bytes<W: AsyncWrite + Unpin>(
    w: &mut W,
    src: &dyn ReadAt,
    len: u64,
) -> std::result::Result<(), CallError> {
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(RESIDENT_CHUNK as u64) as usize;
        let b = src.read_at(at, n).map_err(CallError::Worker)?;
        write_frame(w, FrameKind::Data, &b).await?;
        at += n as u64;
    }
    write_frame(w, FrameKind::End, &[]).await?;
    Ok(())
}

/// Reads the `size` bytes a worker announced (`Sending`) from `Data` frames to their `End`
/// (a client's `rget`, `store_read`): exactly `size`, else `Corrupted`; `what` names them.
async fn read_sent<R: AsyncRead + Unpin>(
    r: &mut R,
    size: u64,
    what: &str,
) -> std::result::Result<Bytes, CallError> {
    let mut out = BytesMut::with_capacity(size as usize);
    loop {
        match read_frame(r).await? {
            Some((FrameKind::Data, p)) if (out.len() + p.len()) as u64 <= size => {
                out.extend_from_slice(&p)
            }
            Some((FrameKind::End, _)) => break,
            Some((FrameKind::Error, p)) => return Err(worker_error(&p)),
            _ => {
                return Err(
                    Error::new(ErrorKind::Corrupted, format!("worker sent garbled {what}")).into(),
                )
            }
        }
    }
    if out.len() as u64 != size {
        return Err(Error::new(
            ErrorKind::Corrupted,
            format!(
                "worker sent {} bytes of {what}, announced {size}",
                out.len()
            ),
        )
        .into());
    }
    Ok(out.freeze())
}

/// Reads the `size` bytes of a client's `rput` or `store_write` from `Data` frames to their
/// `End` whatever happens (so the connection stays usable), giving each piece to `keep` at its
/// offset; more or fewer than `size`, or `keep`'s first failure, is the call's error.
async fn receive_bytes<S: AsyncRead + Unpin>(
    s: &mut S,
    path: &str,
    size: u64,
    mut keep: impl FnMut(u64, &[u8]) -> Result<()>,
) -> std::result::Result<(), ServeError> {
    let (mut at, mut failed) = (0u64, None);
    loop {
        match read_frame(s).await.map_err(broken)? {
            Some((FrameKind::Data, p)) => {
                if failed.is_none() {
                    if at + p.len() as u64 > size {
                        failed = Some(Error::invalid(format!(
                            "{path}: more bytes than the {size} announced"
                        )));
                    } else if let Err(e) = keep(at, &p) {
                        failed = Some(e.context(path));
                    }
                }
                at += p.len() as u64;
            }
            Some((FrameKind::End, _)) => break,
            _ => {
                return Err(broken(Error::invalid(format!(
                    "{path}: the bytes ended early"
                ))))
            }
        }
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    if at != size {
        return Err(Error::invalid(format!("{path}: {at} bytes arrived, {size} announced")).into());
    }
    Ok(())
}

/// The `r*` ops: replicated cache-only files (see the module docs).
async fn serve_resident(
    s: &mut Conn,
    t: &ResidentTable,
    req: Request,
) -> std::result::Result<(), ServeError> {
    let op = req.name();
    match req {
        Request::Rput { path, file } => {
            let size = file.size;
            let buf = t.buffer(&path);
            receive_bytes(s, &path, size, |at, p| buf.write_at(at, p)).await?;
            buf.set_len(size)?;
            t.insert(path, file, buf);
            reply(s, op, &answer::Stored { stored: size }).await
        }
        Request::Rget {
            path,
            file: want,
            offset,
            len,
        } => {
            let f = t.get(&path, &want.tag)?;
            let end = Some(range_end(offset, len)?)
                .filter(|&e| e <= f.meta.size)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "range {offset}+{len} is outside {path} ({} bytes)",
                        f.meta.size
                    ))
                })?;
            reply(s, op, &answer::Sending { size: len }).await?;
            let mut at = offset;
            while at < end {
                let n = (end - at).min(RESIDENT_CHUNK as u64) as usize;
                let b = f.data.read(at, n).map_err(broken)?;
                count(&t.bytes_served, &metrics::RPC_BYTES_SERVED, n as u64);
                write_frame(s, FrameKind::Data, &b).await.map_err(broken)?;
                at += n as u64;
            }
            Ok(())
        }
        Request::Rstat { path } => {
            let file = t.stat(&path);
            reply(s, op, &answer::Found { file }).await
        }
        Request::Rlist { path } => {
            let files = t.list(&path);
            reply(s, op, &answer::Listed { files }).await
        }
        Request::Rdel { path } => {
            let deleted = t.delete(&path);
            reply(s, op, &answer::Deleted { deleted }).await
        }
        other => {
            Err(Error::internal(format!("{} is not a resident-file request", other.name())).into())
        }
    }
}

/// Lends a same-host client a **private copy** of the object's disk-tier file for FUSE
/// passthrough, if the whole object is there: an unnamed file (`O_TMPFILE`) in the tier's
/// directory, filled while the object is pinned (`copy_file_range`, or a reflink where the file
/// system shares blocks). The copy belongs to the client alone, so nothing the worker does later
/// — evicting, punching holes, restarting — can change bytes under the client's readers; it is
/// freed when the client's last handle closes. Otherwise answers `{"fd": false}`.
async fn lease_copy(
    u: &mut UnixStream,
    svc: &Service,
    obj: &ObjectRef,
) -> std::result::Result<(), ServeError> {
    let store = svc.worker.page_store().clone();
    let (id, size) = (obj.id, obj.size());
    let copy = tokio::task::spawn_blocking(move || {
        let _pin = store.pin(id);
        let whole = store.complete_file(id, size)?;
        let copy = private_copy(&whole, size).ok()?;
        // The source verified, but it could have been altered since: lease only good bytes.
        store.copy_verified(&whole, &copy).then_some(copy)
    })
    .await
    .map_err(|e| Error::internal(format!("copying a cache file: {e}")))?;
    let Some(copy) = copy else {
        return reply(u, "lease_copy", &answer::FileHead::none()).await;
    };
    reply(u, "lease_copy", &answer::FileHead::copy()).await?;
    send_fd(u, copy.as_raw_fd()).await.map_err(broken)?;
    count(&svc.files_leased, &metrics::RPC_FILES_LEASED, 1);
    Ok(())
}

/// Lends a same-host client the object's own disk-tier file for as long as the connection
/// stays open, if the whole object is there: `{"fd": true, "page_size", "first": 0, "crcs"}`
/// and the descriptor, then the object stays pinned (not evicted) until the client closes the
/// connection or sends anything. The client checks every page it reads against `crcs`, so a
/// file changed under it anyway (this worker restarted) gives an error, never wrong bytes.
/// Otherwise answers `{"fd": false}`. No copy, unlike `lease_copy`: for readers that can check.
async fn lease(
    u: &mut UnixStream,
    svc: &Service,
    obj: &ObjectRef,
) -> std::result::Result<(), ServeError> {
    let store = svc.worker.page_store().clone();
    let pin = store.pin(obj.id);
    let pages = obj.size().div_ceil(svc.worker.page_size());
    let found = (pages > 0)
        .then(|| store.disk_range(obj.id, obj.size(), 0, pages - 1))
        .flatten()
        .and_then(|(path, crcs)| Some((std::fs::File::open(path).ok()?, crcs)));
    let Some((file, crcs)) = found else {
        return reply(u, "lease", &answer::FileHead::none()).await;
    };
    let head = answer::FileHead::pages(svc.worker.page_size(), 0, crcs);
    reply(u, "lease", &head).await?;
    send_fd(u, file.as_raw_fd()).await.map_err(broken)?;
    count(&svc.files_leased, &metrics::RPC_FILES_LEASED, 1);
    // Held until the client is done with it: no time bound, the connection is the lease.
    let _ = read_frame(u).await;
    drop(pin);
    Err(broken(Error::new(ErrorKind::Unavailable, "lease ended")))
}

/// An unnamed copy of the first `size` bytes of the object's file, in the same directory.
fn private_copy(whole: &silt_cache::CompleteFile, size: u64) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = whole.path.parent().unwrap_or(std::path::Path::new("."));
    let mut src = &whole.file;
    let mut dst = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o400)
        .open(dir)?;
    let copied = std::io::copy(&mut std::io::Read::take(&mut src, size), &mut dst)?;
    if copied != size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "cache file shorter than its object",
        ));
    }
    Ok(dst)
}

/// Passes the object's disk-tier file if every page of `[offset, offset + len)` is there
/// (`true`); `false`: not possible, send bytes instead. The pin is held until the client says
/// it has read.
async fn try_send_fd(
    u: &mut UnixStream,
    svc: &Service,
    obj: &ObjectRef,
    offset: u64,
    len: u64,
) -> std::result::Result<bool, ServeError> {
    let Ok(end) = checked_end(obj, offset, len) else {
        return Ok(false); // the bytes path answers with the error
    };
    let ps = svc.worker.page_size();
    let store = svc.worker.page_store();
    let _pin = store.pin(obj.id);
    let first = offset / ps;
    let Some((path, crcs)) = store.disk_range(obj.id, obj.size(), first, (end - 1) / ps) else {
        return Ok(false);
    };
    let Ok(file) = std::fs::File::open(&path) else {
        return Ok(false);
    };
    // The client reads whole pages and checks each against its crc, as a local disk read does.
    reply(u, "read", &answer::FileHead::pages(ps, first, crcs)).await?;
    send_fd(u, file.as_raw_fd()).await.map_err(broken)?;
    // Wait for `done` (or the client going away) before the pin drops.
    let done = tokio::time::timeout(DONE_TIMEOUT, read_frame(u))
        .await
        .unwrap_or_else(|_| Err(Error::new(ErrorKind::Timeout, "client never said done")));
    match done {
        Ok(Some((FrameKind::Json, _))) => Ok(true),
        Ok(_) => Err(broken(Error::invalid(
            "expected `done` after a passed file descriptor",
        ))),
        Err(e) => Err(broken(e)),
    }
}

async fn send_fd(u: &UnixStream, fd: RawFd) -> Result<()> {
    socket_io(u, Interest::WRITABLE, || sendmsg_fd(u.as_raw_fd(), fd)).await
}

async fn recv_fd(u: &UnixStream) -> Result<OwnedFd> {
    socket_io(u, Interest::READABLE, || recvmsg_fd(u.as_raw_fd())).await
}

/// Runs a non-blocking socket call `op` once the socket is ready for `interest`, again after
/// every spurious wake-up.
async fn socket_io<T>(
    u: &UnixStream,
    interest: Interest,
    mut op: impl FnMut() -> std::io::Result<T>,
) -> Result<T> {
    loop {
        u.ready(interest).await?;
        match u.try_io(interest, &mut op) {
            Ok(v) => return Ok(v),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends one byte with `fd` attached (SCM_RIGHTS).
fn sendmsg_fd(sock: RawFd, fd: RawFd) -> std::io::Result<()> {
    silt_common::sys::send_with_fd(sock, &[0], fd)
}

/// Receives the byte `sendmsg_fd` sent and the fd attached to it.
fn recvmsg_fd(sock: RawFd) -> std::io::Result<OwnedFd> {
    match silt_common::sys::recv_with_fd(sock, 1)? {
        (_, Some(fd)) => Ok(fd),
        (b, None) if b.is_empty() => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "socket closed before the file descriptor arrived",
        )),
        (_, None) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "expected one file descriptor (SCM_RIGHTS)",
        )),
    }
}

// ---- connections ------------------------------------------------------------------------

/// A connection to a worker (or from a client): TCP, TCP in TLS, or the worker's Unix socket.
pub enum Conn {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
    Unix(UnixStream),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => {
                // TLS keeps written bytes that the socket could not take at once until a later
                // write or a flush; nothing in this request–response protocol flushes, so a
                // side about to wait for its peer sends what it still holds first (else the
                // end of a response can sit here while both sides wait).
                let mut s = std::pin::Pin::new(s.as_mut());
                std::task::ready!(s.as_mut().poll_flush(cx))?;
                s.poll_read(cx, buf)
            }
            Conn::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Where a client reaches one worker.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Tcp(String),
    /// Same host: the worker's Unix socket (file descriptors are passed over it).
    Unix(PathBuf),
}

/// A client of one worker, with a pool of idle connections. Every call is bounded by the
/// caller's timeout; a connection that saw an error is dropped, never reused.
pub struct WorkerClient {
    endpoint: Endpoint,
    idle: parking_lot::Mutex<Vec<Conn>>,
    /// Proves this client's membership on every new connection (pooled ones are proven).
    key: ClusterKey,
}

/// Idle connections kept per worker; more concurrent calls open more and close the extra.
const MAX_IDLE: usize = 64;

impl WorkerClient {
    pub fn new(endpoint: Endpoint, key: ClusterKey) -> WorkerClient {
        WorkerClient {
            key,
            endpoint,
            idle: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Whether the worker is reached over its Unix socket (on this host: it passes its cache
    /// files as descriptors).
    pub fn same_host(&self) -> bool {
        matches!(self.endpoint, Endpoint::Unix(_))
    }

    /// An idle connection (`true`: it was pooled, so it may be stale) or a new one.
    async fn conn(&self) -> Result<(Conn, bool)> {
        if let Some(c) = self.idle.lock().pop() {
            return Ok((c, true));
        }
        Ok((self.connect().await?, false))
    }

    async fn connect(&self) -> Result<Conn> {
        let unavailable = |what: &str, e: std::io::Error| {
            Error::new(
                ErrorKind::Unavailable,
                format!("connecting to worker {what}: {e}"),
            )
        };
        // Once per connection: pooled connections carry any number of requests after it.
        match &self.endpoint {
            Endpoint::Tcp(addr) => {
                let mut s = TcpStream::connect(addr)
                    .await
                    .map_err(|e| unavailable(addr, e))?;
                let _ = s.set_nodelay(true);
                if !self.key.tls() {
                    auth::connect(&mut s, &self.key, &[]).await?;
                    return Ok(Conn::Tcp(s));
                }
                auth::request_tls(&mut s).await?;
                let (tls, binding) = crate::tls::connect(s)
                    .await
                    .map_err(|e| e.context(format!("worker {addr}")))?;
                let mut c = Conn::Tls(Box::new(tls.into()));
                auth::connect(&mut c, &self.key, &binding).await?;
                Ok(c)
            }
            Endpoint::Unix(path) => {
                let mut s = UnixStream::connect(path)
                    .await
                    .map_err(|e| unavailable(&path.display().to_string(), e))?;
                auth::connect(&mut s, &self.key, &[]).await?;
                Ok(Conn::Unix(s))
            }
        }
    }

    fn put_back(&self, c: Conn) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(c);
        }
    }

    /// Drops every idle connection (after the worker failed: they may be half-dead).
    pub fn reset(&self) {
        self.idle.lock().clear();
    }

    /// Runs `call` on a connection; if a *pooled* connection fails on the link (the worker
    /// restarted since, say), tries once more on a new one before reporting the worker.
    async fn with_conn<T, F, Fut>(&self, call: F) -> std::result::Result<T, CallError>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, CallError>>,
    {
        let (c, pooled) = self.conn().await?;
        match call(c).await {
            Err(CallError::Link(_)) if pooled => {
                self.reset();
                call(self.connect().await?).await
            }
            r => r,
        }
    }

    /// Bytes `range` of `obj`, exactly `range.end - range.start` of them.
    pub async fn read(
        &self,
        obj: &ObjectRef,
        range: std::ops::Range<u64>,
    ) -> std::result::Result<Bytes, CallError> {
        self.with_conn(|c| self.read_on(c, obj, range.clone()))
            .await
    }

    async fn read_on(
        &self,
        mut c: Conn,
        obj: &ObjectRef,
        range: std::ops::Range<u64>,
    ) -> std::result::Result<Bytes, CallError> {
        let len = range.end.saturating_sub(range.start);
        let (head, fd) = ask_read(&mut c, obj, range.start, len).await?;
        let bytes = if let Some(fd) = fd {
            let bytes = pread_checked(fd, &head, obj.size(), range.start, len).await;
            done_with_fd(&mut c, bytes).await?
        } else {
            let mut out = BytesMut::with_capacity(len as usize);
            c = self
                .data_frames(c, |p| {
                    if out.len() + p.len() > len as usize {
                        return Err(too_many_bytes());
                    }
                    out.extend_from_slice(p);
                    Ok(())
                })
                .await?;
            out.freeze()
        };
        self.put_back(c);
        Ok(finish(bytes, len)?)
    }

    /// Bytes `offset..offset + buf.len()` of `obj` written into `buf` (a caller's own buffer:
    /// the SDK's `bytes` objects), with no copy of its own where the worker passes its cache
    /// file: the pages are read into `buf` and checked there. A pooled connection that fails
    /// on the link is retried once on a new one, as `read` is.
    pub async fn read_into(
        &self,
        obj: &ObjectRef,
        offset: u64,
        buf: &mut [u8],
    ) -> std::result::Result<(), CallError> {
        let (c, pooled) = self.conn().await?;
        match self.read_into_on(c, obj, offset, &mut *buf).await {
            Err(CallError::Link(_)) if pooled => {
                self.reset();
                self.read_into_on(self.connect().await?, obj, offset, buf)
                    .await
            }
            r => r,
        }
    }

    async fn read_into_on(
        &self,
        mut c: Conn,
        obj: &ObjectRef,
        offset: u64,
        buf: &mut [u8],
    ) -> std::result::Result<(), CallError> {
        let len = buf.len() as u64;
        let (head, fd) = ask_read(&mut c, obj, offset, len).await?;
        if let Some(fd) = fd {
            let read = pread_into_checked(fd, &head, obj.size(), offset, buf).await;
            done_with_fd(&mut c, read).await?;
        } else {
            let mut at = 0;
            c = self
                .data_frames(c, |p| {
                    let dst = buf.get_mut(at..at + p.len()).ok_or_else(too_many_bytes)?;
                    dst.copy_from_slice(p);
                    at += p.len();
                    Ok(())
                })
                .await?;
            if at != buf.len() {
                return Err(Error::new(
                    ErrorKind::Corrupted,
                    format!("worker sent {at} bytes, expected {len}"),
                )
                .into());
            }
        }
        self.put_back(c);
        metrics::REMOTE_READ_BYTES.add(len);
        Ok(())
    }

    /// The data frames of a read's answer, each given to `sink`, up to its end; the connection
    /// back for the pool. A worker's error frame ends it (the connection pooled: the answer
    /// was whole).
    async fn data_frames(
        &self,
        mut c: Conn,
        mut sink: impl FnMut(&[u8]) -> std::result::Result<(), CallError>,
    ) -> std::result::Result<Conn, CallError> {
        loop {
            match read_frame(&mut c).await? {
                Some((FrameKind::Data, p)) => sink(&p)?,
                Some((FrameKind::End, _)) => return Ok(c),
                Some((FrameKind::Error, p)) => {
                    self.put_back(c);
                    return Err(worker_error(&p));
                }
                Some((FrameKind::Json, _)) | None => {
                    return Err(
                        Error::new(ErrorKind::Unavailable, "worker response ended early").into(),
                    )
                }
            }
        }
    }

    /// A private copy of the object's cache file from a same-host worker (see `lease_copy` on the
    /// server), for passthrough: `None` if the worker does not hold the whole object on disk.
    pub async fn lease_copy(
        &self,
        obj: &ObjectRef,
    ) -> std::result::Result<Option<silt_reader::LeasedCopy>, CallError> {
        if !matches!(self.endpoint, Endpoint::Unix(_)) {
            return Ok(None);
        }
        self.with_conn(|mut c| async move {
            let req = Request::LeaseCopy {
                object: WireObject::from_ref(obj),
            };
            write_json(&mut c, &req.envelope()).await?;
            let head: answer::FileHead = expect_answer(&mut c, "lease_copy").await?;
            let file = passed_fd(&c, &head).await?.map(std::fs::File::from);
            expect_end(&mut c).await?;
            self.put_back(c);
            // The copy is the client's own: nothing to keep alive beside the file.
            Ok(file.map(|file| silt_reader::LeasedCopy {
                file,
                guard: Box::new(()),
            }))
        })
        .await
    }

    /// The object's own cache file on a same-host worker, pinned there while the returned
    /// [`Lease`] lives (see `lease` on the server): `None` if the worker does not hold the
    /// whole object on disk or is not reached over its Unix socket.
    pub async fn lease(&self, obj: &ObjectRef) -> std::result::Result<Option<Lease>, CallError> {
        if !matches!(self.endpoint, Endpoint::Unix(_)) {
            return Ok(None);
        }
        // A connection of its own: it stays open as long as the lease.
        let mut c = self.connect().await?;
        let req = Request::Lease {
            object: WireObject::from_ref(obj),
        };
        write_json(&mut c, &req.envelope()).await?;
        let head: answer::FileHead = expect_answer(&mut c, "lease").await?;
        let Some(fd) = passed_fd(&c, &head).await? else {
            expect_end(&mut c).await?;
            self.put_back(c);
            return Ok(None);
        };
        let (page_size, first, crcs) = passed_pages(&head)?;
        let pages = obj.size().div_ceil(page_size);
        if first != 0 || crcs.len() as u64 != pages {
            return Err(
                Error::new(ErrorKind::Corrupted, "lease: pages do not cover the file").into(),
            );
        }
        Ok(Some(Lease {
            file: std::fs::File::from(fd),
            size: obj.size(),
            page_size,
            crcs,
            _conn: c,
        }))
    }

    /// The answer to `req`, a request answered with one JSON frame (not `read`, `lease`,
    /// `lease_copy`, `rput` or `rget`), as the type that answers it.
    pub async fn ask<A: Answer>(&self, req: &Request) -> std::result::Result<A, CallError> {
        self.with_conn(|mut c| async move {
            write_json(&mut c, &req.envelope()).await?;
            let a = expect_answer(&mut c, req.name()).await?;
            expect_end(&mut c).await?;
            self.put_back(c);
            Ok(a)
        })
        .await
    }

    /// The answers to `req`, a request answered with any number of JSON frames before its
    /// end (a paged `store_list`), as the type that answers each.
    pub async fn ask_pages<A: Answer>(
        &self,
        req: &Request,
    ) -> std::result::Result<Vec<A>, CallError> {
        self.with_conn(|mut c| async move {
            write_json(&mut c, &req.envelope()).await?;
            let mut pages = Vec::new();
            loop {
                match read_frame(&mut c).await? {
                    Some((FrameKind::Json, p)) => pages.push(answer_json(&p)?),
                    Some((FrameKind::End, _)) => break,
                    Some((FrameKind::Error, p)) => {
                        self.put_back(c);
                        return Err(worker_error(&p));
                    }
                    _ => {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            "worker response ended early",
                        )
                        .into())
                    }
                }
            }
            self.put_back(c);
            Ok(pages)
        })
        .await
    }

    /// The worker's identity, cache and counters.
    pub async fn stats(&self) -> std::result::Result<answer::Stats, CallError> {
        self.ask(&Request::Stats).await
    }

    /// Keeps the `meta.size` bytes of `data` on this worker as the replicated cache-only file
    /// `path`. A failure to read `data` here is returned as the worker's answer (final).
    pub async fn resident_put(
        &self,
        path: &str,
        meta: &RemoteMeta,
        data: &dyn ReadAt,
    ) -> std::result::Result<(), CallError> {
        let req = Request::Rput {
            path: path.to_string(),
            file: WireResident::from_meta(path, meta),
        };
        self.with_conn(|mut c| {
            let req = &req;
            async move {
                write_json(&mut c, &req.envelope()).await?;
                send_bytes(&mut c, data, meta.size).await?;
                let answer::Stored { stored } = expect_answer(&mut c, "rput").await?;
                expect_end(&mut c).await?;
                self.put_back(c);
                if stored != meta.size {
                    return Err(CallError::Link(Error::new(
                        ErrorKind::Corrupted,
                        format!("worker stored {stored} bytes of {path}, {} sent", meta.size),
                    )));
                }
                Ok(())
            }
        })
        .await
    }

    /// Bytes `range` (at most [`MAX_RANGE`]) of version `tag` of the replicated file `path`.
    pub async fn resident_get(
        &self,
        path: &str,
        tag: &str,
        range: std::ops::Range<u64>,
    ) -> std::result::Result<Bytes, CallError> {
        let want = WireResident {
            path: path.to_string(),
            size: 0,
            tag: tag.to_string(),
            mtime_ns: None,
            expires_in_ms: None,
        };
        let req = Request::Rget {
            path: path.to_string(),
            file: want,
            offset: range.start,
            len: range.end.saturating_sub(range.start),
        };
        let len = range.end.saturating_sub(range.start);
        self.ask_bytes(&req, len, true, "a replicated file").await
    }

    /// The bytes `req` is answered with (`Sending { size }`, then `Data` frames): `size`
    /// must be `asked` (`exact`) or at most that.
    pub(crate) async fn ask_bytes(
        &self,
        req: &Request,
        asked: u64,
        exact: bool,
        what: &str,
    ) -> std::result::Result<Bytes, CallError> {
        self.with_conn(|mut c| async move {
            write_json(&mut c, &req.envelope()).await?;
            let answer::Sending { size } = expect_answer(&mut c, req.name()).await?;
            if size > asked || (exact && size != asked) {
                return Err(Error::new(
                    ErrorKind::Corrupted,
                    format!("worker announced {size} bytes, {asked} asked for"),
                )
                .into());
            }
            let out = read_sent(&mut c, size, what).await?;
            self.put_back(c);
            Ok(out)
        })
        .await
    }

    /// The replicated file at `path`, if this worker holds one.
    pub async fn resident_stat(
        &self,
        path: &str,
    ) -> std::result::Result<Option<RemoteMeta>, CallError> {
        let answer::Found { file } = self
            .ask(&Request::Rstat {
                path: path.to_string(),
            })
            .await?;
        Ok(file.map(|w| w.into_meta().1))
    }

    /// Every replicated file this worker holds strictly below directory `dir`.
    pub async fn resident_list(
        &self,
        dir: &str,
    ) -> std::result::Result<Vec<(String, RemoteMeta)>, CallError> {
        let answer::Listed { files } = self
            .ask(&Request::Rlist {
                path: dir.to_string(),
            })
            .await?;
        Ok(files.into_iter().map(WireResident::into_meta).collect())
    }

    /// How many pages of each of `ranges` this worker holds (one answer per range).
    pub async fn cached(&self, ranges: Vec<PageRange>) -> std::result::Result<Vec<u64>, CallError> {
        Ok(self
            .cache_state(ranges)
            .await?
            .into_iter()
            .map(|(pages, _)| pages)
            .collect())
    }

    /// For each range: how many of its pages the worker holds, and how many of its bytes the
    /// user pinned there (`silt fs pin`).
    pub async fn cache_state(
        &self,
        ranges: Vec<PageRange>,
    ) -> std::result::Result<Vec<(u64, u64)>, CallError> {
        let n = ranges.len();
        let req = Request::Cached { ranges };
        let answer::Cached { pages, pinned } = self.ask(&req).await?;
        if pages.len() != n || pinned.len() != n {
            return Err(CallError::Link(Error::new(
                ErrorKind::Corrupted,
                format!(
                    "worker answered {} page counts and {} pinned byte counts for {n} ranges",
                    pages.len(),
                    pinned.len()
                ),
            )));
        }
        Ok(pages.into_iter().zip(pinned).collect())
    }

    /// Tells the worker that directory `path` of the namespace changed in the store.
    pub async fn changed(&self, path: &str, change: Change) -> std::result::Result<(), CallError> {
        let req = Request::Changed {
            path: path.to_string(),
            freed: change == Change::Freed,
            recursive: change == Change::Below,
        };
        self.ask::<answer::Changed>(&req).await.map(drop)
    }

    /// Drops the replicated file at `path` here; whether there was one.
    pub async fn resident_delete(&self, path: &str) -> std::result::Result<bool, CallError> {
        let answer::Deleted { deleted } = self
            .ask(&Request::Rdel {
                path: path.to_string(),
            })
            .await?;
        Ok(deleted)
    }

    /// The answer to a request answered with one JSON frame, as raw JSON: for tests and
    /// tools that look at the wire itself (the cluster's own calls read typed answers, see
    /// [`WorkerClient::ask`]).
    pub async fn call(&self, req: Request) -> std::result::Result<Value, CallError> {
        let req = &req;
        self.with_conn(|mut c| async move {
            write_json(&mut c, &req.envelope()).await?;
            let v = expect_json(&mut c).await?;
            expect_end(&mut c).await?;
            self.put_back(c);
            Ok(v)
        })
        .await
    }
}

/// Why a call to a worker failed: the worker answered with an error (it is alive; the error
/// may be about the object or its store), or talking to it failed (refused, broken, garbled,
/// timed out). Only the second says anything about the worker's health.
#[derive(Debug)]
pub enum CallError {
    Worker(Error),
    Link(Error),
}

impl CallError {
    pub fn into_error(self) -> Error {
        match self {
            CallError::Worker(e) | CallError::Link(e) => e,
        }
    }
}

impl From<Error> for CallError {
    /// Local failures are link failures: never mistaken for an answer about the object.
    fn from(e: Error) -> Self {
        CallError::Link(e)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Worker(e) => write!(f, "worker answered: {e}"),
            CallError::Link(e) => write!(f, "{e}"),
        }
    }
}

fn worker_error(payload: &[u8]) -> CallError {
    match decode_json::<ErrorBody>(payload) {
        Ok(body) => CallError::Worker(body.into_error()),
        Err(e) => CallError::Link(Error::new(
            ErrorKind::Corrupted,
            format!("unreadable error from worker: {e}"),
        )),
    }
}

fn finish(bytes: Bytes, len: u64) -> Result<Bytes> {
    if bytes.len() as u64 != len {
        return Err(Error::new(
            ErrorKind::Corrupted,
            format!("worker sent {} bytes, expected {len}", bytes.len()),
        ));
    }
    metrics::REMOTE_READ_BYTES.add(len);
    Ok(bytes)
}

/// The descriptor the worker passes after answering `head` with `fd: true`; `None` when it
/// answered `fd: false` (bytes, or no file, follow).
async fn passed_fd(
    c: &Conn,
    head: &answer::FileHead,
) -> std::result::Result<Option<OwnedFd>, CallError> {
    if !head.fd {
        return Ok(None);
    }
    let Conn::Unix(u) = c else {
        return Err(Error::new(
            ErrorKind::Corrupted,
            "worker offered a file descriptor over TCP",
        )
        .into());
    };
    Ok(Some(recv_fd(u).await?))
}

/// The answer to `op`, as the type that answers it.
async fn expect_answer<A: Answer>(c: &mut Conn, op: &str) -> std::result::Result<A, CallError> {
    debug_assert!(
        A::answers(op),
        "{op} is not answered with {}",
        std::any::type_name::<A>()
    );
    expect_json(c).await
}

async fn expect_json<T: serde::de::DeserializeOwned>(
    c: &mut Conn,
) -> std::result::Result<T, CallError> {
    match read_frame(c).await? {
        Some((FrameKind::Json, p)) => Ok(answer_json(&p)?),
        Some((FrameKind::Error, p)) => Err(worker_error(&p)),
        _ => Err(Error::new(
            ErrorKind::Unavailable,
            "worker closed the connection or answered out of order",
        )
        .into()),
    }
}

/// A worker's JSON answer frame, decoded.
fn answer_json<T: serde::de::DeserializeOwned>(p: &[u8]) -> Result<T> {
    decode_json(p)
        .map_err(|e| Error::new(ErrorKind::Corrupted, format!("garbled worker answer: {e}")))
}

async fn expect_end(c: &mut Conn) -> std::result::Result<(), CallError> {
    match read_frame(c).await? {
        Some((FrameKind::End, _)) => Ok(()),
        Some((FrameKind::Error, p)) => Err(worker_error(&p)),
        _ => Err(Error::new(
            ErrorKind::Unavailable,
            "worker response did not end where expected",
        )
        .into()),
    }
}

/// Reads the whole pages covering `[offset, offset + len)` from a passed descriptor, checks
/// each against the crc32c the worker sent (`head`: `page_size`, `first`, `crcs`), and returns
/// the requested bytes. A mismatch is a link failure: the caller asks elsewhere.
fn bad_fd(what: &str) -> Error {
    Error::new(ErrorKind::Corrupted, format!("passed descriptor: {what}"))
}

/// The page size, first page and page crcs a worker sent with a descriptor.
fn passed_pages(head: &answer::FileHead) -> Result<(u64, u64, Vec<u32>)> {
    let bad = bad_fd;
    let ps = head
        .page_size
        .filter(|p| *p > 0)
        .ok_or_else(|| bad("no page size"))?;
    let first = head.first.ok_or_else(|| bad("no first page"))?;
    let crcs = head.crcs.clone().ok_or_else(|| bad("no checksums"))?;
    Ok((ps, first, crcs))
}

/// `silt_reader::check_pages`, its failure said to be the passed descriptor's.
fn check_pages(buf: &[u8], ps: u64, crcs: &[u32]) -> Result<()> {
    silt_reader::check_pages(buf, ps, crcs).map_err(|_| bad_fd("page checksum mismatch"))
}

/// A same-host worker's cache file of one whole object, pinned there until this is dropped
/// (which closes the connection that holds the pin). Reads check every page they touch.
pub struct Lease {
    file: std::fs::File,
    size: u64,
    page_size: u64,
    crcs: Vec<u32>,
    _conn: Conn,
}

impl silt_reader::LocalRead for Lease {
    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        Lease::read_into(self, offset, buf)
    }

    fn map_source(&self) -> Option<silt_reader::MapSource<'_>> {
        Some(silt_reader::MapSource {
            file: &self.file,
            size: self.size,
            pages: Some((self.page_size, &self.crcs)),
        })
    }
}

impl Lease {
    /// Fills `buf` with the bytes at `offset` (the range must lie inside the object). Blocks.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let ps = self.page_size;
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| Error::invalid("read past the end of a leased file"))?;
        if buf.is_empty() {
            return Ok(());
        }
        let first = offset / ps;
        let last = (end - 1) / ps;
        let crcs = &self.crcs[first as usize..=last as usize];
        if offset.is_multiple_of(ps) && (end.is_multiple_of(ps) || end == self.size) {
            // Whole pages: straight into the caller's buffer, checked in place.
            self.file.read_exact_at(buf, offset)?;
            return check_pages(buf, ps, crcs);
        }
        let start = first * ps;
        let stop = ((last + 1) * ps).min(self.size);
        let mut pages = vec![0u8; (stop - start) as usize];
        self.file.read_exact_at(&mut pages, start)?;
        check_pages(&pages, ps, crcs)?;
        let from = (offset - start) as usize;
        buf.copy_from_slice(&pages[from..from + buf.len()]);
        Ok(())
    }
}

/// Reads of a passed file up to this size (a small file's pages) are made on the calling task,
/// larger ones on a blocking thread: a read from a cold disk tier blocks a runtime thread for
/// at most this much.
const INLINE_PREAD: usize = 256 << 10;

async fn pread_checked(
    fd: OwnedFd,
    head: &answer::FileHead,
    size: u64,
    offset: u64,
    len: u64,
) -> Result<Bytes> {
    let bad = bad_fd;
    let (ps, first, crcs) = passed_pages(head)?;
    let start = first
        .checked_mul(ps)
        .ok_or_else(|| bad("page out of range"))?;
    let stop = start
        .checked_add(crcs.len() as u64 * ps)
        .ok_or_else(|| bad("page out of range"))?
        .min(size);
    if start > offset || stop < offset + len || stop - start > MAX_RANGE + ps {
        return Err(bad("pages do not cover the range"));
    }
    let file = std::fs::File::from(fd);
    let want = (stop - start) as usize;
    let buf = if want <= INLINE_PREAD {
        // A page-cache copy of this size costs less than handing it to a blocking thread (and
        // a loader process starting dozens of them for a batch of small files).
        silt_common::sys::read_exact_at_fresh(&file, want, start)?
    } else {
        tokio::task::spawn_blocking(move || {
            silt_common::sys::read_exact_at_fresh(&file, want, start)
        })
        .await
        .map_err(|e| Error::internal(format!("reading a passed file: {e}")))??
    };
    check_pages(&buf, ps, &crcs)?;
    let from = (offset - start) as usize;
    Ok(Bytes::from(buf).slice(from..from + len as usize))
}

/// Sends `read` of `len` bytes at `offset` (asking for the cache file itself over a Unix
/// socket) and takes the worker's answer: its head, and the descriptor it passed, if any.
async fn ask_read(
    c: &mut Conn,
    obj: &ObjectRef,
    offset: u64,
    len: u64,
) -> std::result::Result<(answer::FileHead, Option<OwnedFd>), CallError> {
    let fd = matches!(c, Conn::Unix(_));
    let req = Request::Read {
        object: WireObject::from_ref(obj),
        offset,
        len,
        fd,
    };
    write_json(c, &req.envelope()).await?;
    let head: answer::FileHead = expect_answer(c, "read").await?;
    let fd = passed_fd(c, &head).await?;
    Ok((head, fd))
}

/// Tells the worker a passed descriptor was read (it unpins the object then), whatever the
/// read gave; then `read`'s failure, or the end of the worker's answer and `read`'s value.
async fn done_with_fd<T>(c: &mut Conn, read: Result<T>) -> std::result::Result<T, CallError> {
    write_json(c, &answer::AfterFd::Done).await?;
    let v = read?;
    expect_end(c).await?;
    metrics::REMOTE_FD_READS.inc();
    Ok(v)
}

fn too_many_bytes() -> CallError {
    Error::new(
        ErrorKind::Corrupted,
        "worker sent more bytes than asked for",
    )
    .into()
}

/// `pread_checked` into the caller's `buf` (the bytes `[offset, offset + buf.len())`): read in
/// place when the passed pages are exactly that range (a whole file, or whole pages), else
/// through `pread_checked`'s buffer.
async fn pread_into_checked(
    fd: OwnedFd,
    head: &answer::FileHead,
    size: u64,
    offset: u64,
    buf: &mut [u8],
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let len = buf.len() as u64;
    let (ps, first, crcs) = passed_pages(head)?;
    let start = first.checked_mul(ps);
    let stop = start
        .and_then(|s| s.checked_add(crcs.len() as u64 * ps))
        .map(|s| s.min(size));
    if start != Some(offset) || stop != offset.checked_add(len) || len > MAX_RANGE + ps {
        let bytes = pread_checked(fd, head, size, offset, len).await?;
        buf.copy_from_slice(&bytes);
        return Ok(());
    }
    let file = std::fs::File::from(fd);
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if buf.len() <= INLINE_PREAD || !multi_thread {
        file.read_exact_at(buf, offset)?;
    } else {
        // The buffer is borrowed, so not handed to a blocking thread: this runtime thread
        // becomes one for the read (its other tasks move on meanwhile).
        tokio::task::block_in_place(|| file.read_exact_at(buf, offset))?;
    }
    check_pages(buf, ps, &crcs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use silt_proto::PROTOCOL_VERSION;

    fn frame(v: &Value) -> Vec<u8> {
        serde_json::to_vec(v).unwrap()
    }

    /// Every request decodes to itself from what the client sends; the wire keeps the names
    /// and fields the protocol had (`{"v": 1, "op": "read", "object": ..., "offset": ...}`).
    #[test]
    fn every_request_crosses_the_wire_whole() {
        let object = WireObject {
            store: "s3://b/p".into(),
            path: "x".into(),
            size: 10,
            etag: Some("e".into()),
            version: None,
            mtime_ns: Some(5),
        };
        let file = WireResident {
            path: "/c/f".into(),
            size: 4,
            tag: "silt-1".into(),
            mtime_ns: None,
            expires_in_ms: Some(9),
        };
        let mut all = vec![
            Request::Stats,
            Request::Changed {
                path: "/d".into(),
                freed: false,
                recursive: true,
            },
            Request::Cached {
                ranges: vec![PageRange {
                    object: "ab".into(),
                    first: 0,
                    last: 3,
                }],
            },
            Request::Pin {
                object: object.clone(),
                offset: 1,
                len: 2,
            },
            Request::Unpin {
                object: object.clone(),
            },
            Request::Read {
                object: object.clone(),
                offset: 3,
                len: 4,
                fd: true,
            },
            Request::Lease {
                object: object.clone(),
            },
            Request::LeaseCopy {
                object: object.clone(),
            },
            Request::Load {
                object: object.clone(),
                offset: 0,
                len: 10,
            },
            Request::Prefetch {
                object: object.clone(),
                offset: 0,
                len: 1,
            },
            Request::Forget {
                object: object.clone(),
            },
            Request::Rput {
                path: "/c/f".into(),
                file: file.clone(),
            },
            Request::Rget {
                path: "/c/f".into(),
                file,
                offset: 1,
                len: 2,
            },
            Request::Rstat {
                path: "/c/f".into(),
            },
            Request::Rlist { path: "/c".into() },
            Request::Rdel {
                path: "/c/f".into(),
            },
        ];
        all.extend(store_requests());
        for req in all {
            let wire = serde_json::to_value(req.envelope()).unwrap();
            assert_eq!(wire["v"], PROTOCOL_VERSION, "{wire}");
            assert_eq!(wire["op"], req.name(), "{wire}");
            let back = Request::decode(FrameKind::Json, &frame(&wire)).unwrap();
            assert_eq!(back, req);
        }
        let read = serde_json::to_value(
            Request::Read {
                object,
                offset: 3,
                len: 4,
                fd: false,
            }
            .envelope(),
        )
        .unwrap();
        for key in ["object", "offset", "len", "fd"] {
            assert!(read.get(key).is_some(), "{key} missing from {read}");
        }
    }

    /// One of each `store_*` request, with every field set.
    fn store_requests() -> Vec<Request> {
        let store = || "s3://b/p".to_string();
        let path = || "d/f".to_string();
        let mut expected = ObjectMeta::empty_file("d/f");
        expected.size = 9;
        expected.etag = Some("e".into());
        expected.mtime = Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(1_500_000_123));
        expected.posix.uid = Some(7);
        let attrs = SetAttrs {
            mode: Some(0o640),
            uid: Some(1),
            gid: None,
            atime: None,
            mtime: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(3)),
        };
        let headers = Headers {
            content_type: Some("text/plain".into()),
            ..Headers::default()
        };
        vec![
            Request::StoreInfo { store: store() },
            Request::StoreStat {
                store: store(),
                path: path(),
            },
            Request::StoreList {
                store: store(),
                path: path(),
                recursive: true,
                paged: true,
            },
            Request::StoreListTree {
                store: store(),
                path: path(),
                max: 5,
            },
            Request::StoreHeaders {
                store: store(),
                path: path(),
                expected: expected.clone(),
            },
            Request::StoreRead {
                store: store(),
                path: path(),
                expected,
                offset: 1,
                len: 2,
            },
            Request::StoreWrite {
                store: store(),
                path: path(),
                size: 3,
                attrs,
                headers: Some(headers),
            },
            Request::StoreDelete {
                store: store(),
                path: path(),
            },
            Request::StoreCreateDir {
                store: store(),
                path: path(),
            },
            Request::StoreRemoveDir {
                store: store(),
                path: path(),
            },
            Request::StoreRename {
                store: store(),
                from: path(),
                to: "g".into(),
            },
            Request::StoreCopy {
                store: store(),
                from: path(),
                to: "g".into(),
            },
            Request::StoreSymlink {
                store: store(),
                path: path(),
                target: "../t".into(),
            },
            Request::StoreReadLink {
                store: store(),
                path: path(),
            },
            Request::StoreSetAttrs {
                store: store(),
                path: path(),
                attrs,
            },
            Request::StoreMknod {
                store: store(),
                path: path(),
                kind: SpecialKind::CharDevice,
                rdev: 259,
                attrs,
            },
            Request::StoreHardLink {
                store: store(),
                from: path(),
                to: "g".into(),
            },
        ]
    }

    /// Every `store_*` request is one, timed as `store`, and answered by a type naming it.
    #[test]
    fn store_requests_are_named_timed_and_answered() {
        use answer::*;
        for req in store_requests() {
            let op = req.name();
            assert!(req.is_store() && op.starts_with("store_"), "{op}");
            assert_eq!(req.metric(), Some(metrics::RpcOp::Store), "{op}");
            let answered = [
                StoreInfo::answers(op),
                StoreMeta::answers(op),
                StoreEntries::answers(op),
                StoreTree::answers(op),
                StoreHeaders::answers(op),
                StoreLink::answers(op),
                StoreDone::answers(op),
                Sending::answers(op),
            ];
            assert_eq!(answered.iter().filter(|a| **a).count(), 1, "{op}");
        }
        assert!(!Request::Stats.is_store());
    }

    /// Answers keep the JSON the protocol always had, so older peers read them (and the
    /// raw-protocol tests still match them), and each names the operations it answers.
    #[test]
    fn answers_keep_their_wire_form() {
        use answer::*;
        let wire = |v: serde_json::Result<Value>| v.unwrap();
        assert_eq!(
            wire(serde_json::to_value(FileHead::none())),
            json!({"fd": false})
        );
        assert_eq!(
            wire(serde_json::to_value(FileHead::copy())),
            json!({"fd": true})
        );
        assert_eq!(
            wire(serde_json::to_value(FileHead::pages(4096, 2, vec![7, 8]))),
            json!({"fd": true, "page_size": 4096, "first": 2, "crcs": [7, 8]})
        );
        assert_eq!(
            wire(serde_json::to_value(AfterFd::Done)),
            json!({"op": "done"})
        );
        assert_eq!(
            wire(serde_json::to_value(Found { file: None })),
            json!({"file": null})
        );
        assert_eq!(
            wire(serde_json::to_value(Cached {
                pages: vec![1],
                pinned: vec![0]
            })),
            json!({"pages": [1], "pinned": [0]})
        );
        for (v, want) in [
            (
                serde_json::to_value(Changed { ok: true }),
                json!({"ok": true}),
            ),
            (serde_json::to_value(Held { bytes: 3 }), json!({"bytes": 3})),
            (
                serde_json::to_value(Unpinned { unpinned: 1 }),
                json!({"unpinned": 1}),
            ),
            (
                serde_json::to_value(Prefetched { pages: 5 }),
                json!({"pages": 5}),
            ),
            (
                serde_json::to_value(Forgot { forgot: true }),
                json!({"forgot": true}),
            ),
            (
                serde_json::to_value(Stored { stored: 9 }),
                json!({"stored": 9}),
            ),
            (
                serde_json::to_value(Sending { size: 9 }),
                json!({"size": 9}),
            ),
            (
                serde_json::to_value(Deleted { deleted: false }),
                json!({"deleted": false}),
            ),
        ] {
            assert_eq!(wire(v), want);
        }
        // What an older worker sent decodes: the identity with its address, no `crcs` on
        // `hold`'s head.
        let id: Identity = serde_json::from_value(json!({"id": "w0", "addr": "h:1"})).unwrap();
        assert_eq!(id, Identity::new("w0").at("h:1"));
        let head: FileHead = serde_json::from_value(json!({"fd": true})).unwrap();
        assert_eq!(head, FileHead::copy());
        // An older worker's stats (its leased files were `files_lent`) and an older client's
        // `hold` (now `lease_copy`) still decode.
        let old_stats = json!({
            "identity": {"id": "w0"}, "page_size": 4096, "capacity": 8, "used": 0,
            "tiers": [], "page_hits": 0, "page_misses": 0, "hit_ratio": 0.0,
            "reads_served": 0, "bytes_served": 0, "files_lent": 3, "ufs_read_bytes": 0,
            "cache_only_files": 0, "cache_only_bytes": 0
        });
        let stats: Stats = serde_json::from_value(old_stats).unwrap();
        assert_eq!(stats.files_leased, 3);
        let obj = json!({"store": "mem://", "path": "a", "size": 1, "etag": "e"});
        let hold = json!({"v": 1, "op": "hold", "object": obj});
        let req = Request::decode(FrameKind::Json, &serde_json::to_vec(&hold).unwrap()).unwrap();
        assert_eq!(req.name(), "lease_copy");
        assert!(Held::answers("load") && Held::answers("pin") && !Held::answers("read"));
        assert!(FileHead::answers("read") && FileHead::answers("lease"));
    }

    /// What the decoder refuses, and how: another version before anything else, an unknown
    /// operation by its name, a missing field by its name, a frame that is not JSON.
    #[test]
    fn bad_requests_are_refused_by_name() {
        let kind = |v: Value| {
            Request::decode(FrameKind::Json, &frame(&v))
                .map(|r| r.name())
                .map_err(|e| (e.kind(), e.to_string()))
        };
        let (k, m) = kind(json!({"v": 2, "op": "nonsense"})).unwrap_err();
        assert_eq!(k, ErrorKind::Unsupported, "{m}");
        assert!(m.contains("protocol version 2"), "{m}");
        let (k, m) = kind(json!({"op": "stats"})).unwrap_err();
        assert_eq!(k, ErrorKind::InvalidInput, "{m}");
        let (k, m) = kind(json!({"v": 1, "op": "ping"})).unwrap_err();
        assert_eq!(k, ErrorKind::InvalidInput, "{m}");
        assert!(
            m.contains("\"ping\"") && m.contains("unknown variant"),
            "{m}"
        );
        let (k, m) = kind(json!({"v": 1, "op": "read", "offset": 0})).unwrap_err();
        assert_eq!(k, ErrorKind::InvalidInput, "{m}");
        assert!(m.contains("object"), "{m}");
        let (k, m) = kind(json!({"v": 1, "op": "rget", "path": "/a"})).unwrap_err();
        assert_eq!(k, ErrorKind::InvalidInput, "{m}");
        assert!(m.contains("file"), "{m}");
        let (k, _) = kind(json!({"v": 1})).unwrap_err();
        assert_eq!(k, ErrorKind::InvalidInput);
        // Fields of other operations are ignored (older clients sent them all).
        assert_eq!(
            kind(json!({"v": 1, "op": "stats", "offset": 0, "len": 0, "fd": false})),
            Ok("stats")
        );
        let e = Request::decode(FrameKind::Data, b"{}").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let e = Request::decode(FrameKind::Json, b"{not json").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}
