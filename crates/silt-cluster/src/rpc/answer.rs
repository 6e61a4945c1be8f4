//! What a worker answers, one type per kind of answer: the worker writes it
//! (`rpc::serve_one`) and the client reads it (`WorkerClient`), so both ends agree on every
//! field by construction. On the wire each is the JSON frame that follows the request (before
//! any `Data` frames and the closing `End`); the field names are the protocol's since its
//! first version. Errors are not answers: they are `Error` frames (`silt_proto::ErrorBody`).
//!
//! Each type names the operations it answers ([`Answer::OPS`]); a client asking for an answer
//! of the wrong type for its request fails a debug assertion, on either end.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::WireResident;

/// The answer of one or more operations of [`super::Request`].
pub trait Answer: Serialize + DeserializeOwned {
    /// The operations (`Request::name`) answered with this type.
    const OPS: &'static [&'static str];

    /// Whether this type answers `op` (checked in debug builds where answers are written
    /// and read).
    fn answers(op: &str) -> bool {
        Self::OPS.contains(&op)
    }
}

macro_rules! answers {
    ($t:ty => $($op:literal),+) => {
        impl Answer for $t {
            const OPS: &'static [&'static str] = &[$($op),+];
        }
    };
}

/// Who a worker is: the `identity` of its `stats`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Identity {
    pub id: String,
    /// Where it is reached (TCP address, or its Unix socket's path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
}

impl Identity {
    pub fn new(id: impl Into<String>) -> Identity {
        Identity {
            id: id.into(),
            addr: None,
        }
    }

    pub fn at(mut self, addr: impl Into<String>) -> Identity {
        self.addr = Some(addr.into());
        self
    }
}

/// One tier of a worker's page cache, as `stats` reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TierStats {
    pub name: String,
    pub capacity: u64,
    pub used: u64,
    pub pages: u64,
}

/// `stats`: the worker's identity, cache and counters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    pub identity: Identity,
    pub page_size: u64,
    /// All tiers together.
    pub capacity: u64,
    pub used: u64,
    pub tiers: Vec<TierStats>,
    pub page_hits: u64,
    pub page_misses: u64,
    /// Hits of all page lookups (0 before the first).
    pub hit_ratio: f64,
    pub reads_served: u64,
    pub bytes_served: u64,
    /// Called `files_lent` by workers before the op was renamed `lease_copy`.
    #[serde(alias = "files_lent")]
    pub files_leased: u64,
    /// Bytes this worker's process read from under-stores.
    pub ufs_read_bytes: u64,
    pub cache_only_files: u64,
    pub cache_only_bytes: u64,
}
answers!(Stats => "stats");

/// `changed`: handled; the node's metadata has seen the change.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Changed {
    pub ok: bool,
}
answers!(Changed => "changed");

/// `cached`: one entry per range asked about, in its order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cached {
    /// How many of the range's pages the worker holds.
    pub pages: Vec<u64>,
    /// How many of the range's bytes are pinned there (`silt fs pin`).
    pub pinned: Vec<u64>,
}
answers!(Cached => "cached");

/// `load` and `pin`: the bytes of the range the worker now holds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Held {
    pub bytes: u64,
}
answers!(Held => "load", "pin");

/// `unpin`: how many pins of the object the worker dropped.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Unpinned {
    pub unpinned: u64,
}
answers!(Unpinned => "unpin");

/// `prefetch`: the pages the worker started fetching.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Prefetched {
    pub pages: u64,
}
answers!(Prefetched => "prefetch");

/// `forget`: the version's pages are gone.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Forgot {
    pub forgot: bool,
}
answers!(Forgot => "forget");

/// `read`, `lease` and `lease_copy`: whether a file descriptor follows (passed over the Unix
/// socket, `SCM_RIGHTS`). Without one, `read`'s bytes follow as `Data` frames; `lease` and
/// `lease_copy` have nothing to lease. With one, `read` and `lease` say which pages of the file the
/// client may read and their crc32c, which it checks every page against (`lease_copy` leases a
/// private copy, checked by the worker: no pages).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileHead {
    pub fd: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// The page of the object at the first of `crcs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crcs: Option<Vec<u32>>,
}
answers!(FileHead => "read", "lease", "lease_copy");

impl FileHead {
    /// No descriptor follows.
    pub fn none() -> FileHead {
        FileHead {
            fd: false,
            page_size: None,
            first: None,
            crcs: None,
        }
    }

    /// A private copy follows (`lease_copy`).
    pub fn copy() -> FileHead {
        FileHead {
            fd: true,
            ..FileHead::none()
        }
    }

    /// The data file follows; pages `first..first + crcs.len()` of it may be read.
    pub fn pages(page_size: u64, first: u64, crcs: Vec<u32>) -> FileHead {
        FileHead {
            fd: true,
            page_size: Some(page_size),
            first: Some(first),
            crcs: Some(crcs),
        }
    }
}

/// What a client sends after reading through a descriptor `read` passed: the worker unpins.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum AfterFd {
    Done,
}

/// `rput`: the file is kept, this many bytes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stored {
    pub stored: u64,
}
answers!(Stored => "rput");

/// `rget` and `store_read`: this many bytes follow as `Data` frames.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Sending {
    pub size: u64,
}
answers!(Sending => "rget", "store_read");

/// `rstat`: the replicated file, if the worker holds one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Found {
    pub file: Option<WireResident>,
}
answers!(Found => "rstat");

/// `rlist`: every replicated file below the directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Listed {
    pub files: Vec<WireResident>,
}
answers!(Listed => "rlist");

/// `rdel`: whether there was a file to drop.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Deleted {
    pub deleted: bool,
}
answers!(Deleted => "rdel");

/// `store_info`: the worker's under-store, as its clients see it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreInfo {
    pub uri: String,
    pub capabilities: silt_ufs::Capabilities,
}
answers!(StoreInfo => "store_info");

/// The metadata a store call answered with (of the entry it stats, makes or changes).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreMeta {
    pub meta: silt_ufs::ObjectMeta,
}
answers!(StoreMeta => "store_stat", "store_write", "store_create_dir", "store_rename",
    "store_copy", "store_symlink", "store_set_attrs", "store_mknod", "store_hard_link");

/// `store_list`: the entries listed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreEntries {
    pub entries: Vec<silt_ufs::ObjectMeta>,
}
answers!(StoreEntries => "store_list");

/// `store_list_tree`: the tree, or `None` when it has more entries than asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreTree {
    pub entries: Option<Vec<silt_ufs::ObjectMeta>>,
}
answers!(StoreTree => "store_list_tree");

/// `store_headers`: the S3 headers of the version asked about.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreHeaders {
    pub headers: silt_ufs::Headers,
}
answers!(StoreHeaders => "store_headers");

/// `store_read_link`: the link's target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreLink {
    pub target: String,
}
answers!(StoreLink => "store_read_link");

/// `store_delete` and `store_remove_dir`: done.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreDone {
    pub ok: bool,
}
answers!(StoreDone => "store_delete", "store_remove_dir");
