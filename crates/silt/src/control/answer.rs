//! What the control socket answers, one type per kind of answer: the daemon writes it
//! (`control::handle`) and the `silt` commands read it (the client side of `control`), so
//! both ends agree on every field by construction. The JSON is the one the socket always
//! answered (`silt report --json` prints it). Errors are `Error` frames, not answers.
//!
//! Answers that are another crate's type: `pin` and `free` answer
//! [`silt_client::CacheUsage`], `sync` and `invalidate` [`silt_client::SyncReport`],
//! `sync-policy` [`silt_client::PolicyInfo`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
pub use silt_client::LoadProgress;
use silt_client::{CacheUsage, FileState, PolicyInfo};

/// `stat` (and each entry of `ls`): one namespace entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub path: String,
    pub name: String,
    /// `dir`, `file`, `symlink` or `special`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Seconds since the epoch.
    pub mtime: Option<f64>,
    /// Permission bits in octal.
    pub mode: Option<String>,
    /// The under-store's URI (credentials redacted), inside a mount.
    pub store: Option<String>,
    pub etag: Option<String>,
    /// Files only.
    pub fingerprint: Option<String>,
    /// `stat` only: the path's sync policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<PolicyInfo>,
    /// `stat` only: how much of it is cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheUsage>,
}

impl Entry {
    pub fn new(e: &silt_client::Entry) -> Entry {
        let obj = e.object.as_ref();
        Entry {
            path: e.path.clone(),
            name: e.name().to_string(),
            kind: match e.kind {
                silt_ufs::EntryKind::Dir => "dir",
                silt_ufs::EntryKind::File => "file",
                silt_ufs::EntryKind::Symlink => "symlink",
                silt_ufs::EntryKind::Special(_) => "special",
            }
            .to_string(),
            size: e.size,
            mtime: e
                .mtime
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs_f64()),
            mode: e.mode.map(|m| format!("{:o}", m & 0o7777)),
            store: obj.map(|o| o.store.uri().to_string()),
            etag: obj.and_then(|o| o.meta.etag.clone()),
            fingerprint: obj
                .filter(|_| !e.is_dir())
                .map(|o| o.meta.content_fingerprint()),
            sync: None,
            cache: None,
        }
    }
}

/// `unpin`: how many files' pins were dropped.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Unpinned {
    pub unpinned: u64,
}

/// `persist` and `persist-state`: one per `back` file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PathState {
    pub path: String,
    #[serde(flatten)]
    pub state: FileState,
}

/// `memory`: the read cache's memory tier and written data, with their ceilings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Memory {
    pub cache: CacheMemory,
    pub peak_rss_bytes: Option<u64>,
    /// `None`: this Silt does not write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<WriteMemory>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheMemory {
    pub capacity: u64,
    pub used: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WriteMemory {
    pub ceiling: u64,
    pub used: u64,
    pub peak: u64,
    pub spilled: u64,
    pub buffers: u64,
    pub cache_only_files: u64,
    pub cache_only_bytes: u64,
    pub pending_upload_files: u64,
    pub pending_upload_bytes: u64,
    pub jobs: Vec<JobMemory>,
}

/// One write job (`--write-jobs`; prefix `""`: the default one).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobMemory {
    pub prefix: String,
    pub priority: u8,
    /// `u64::MAX`: no quota.
    pub memory_quota: u64,
    pub memory_used: u64,
    pub spilled: u64,
}

/// `load`: progress frames (at most ten a second), then one `done`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum LoadEvent {
    Progress(LoadProgress),
    Done(LoadDone),
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct LoadDone {
    pub files: u64,
    pub bytes_total: u64,
    pub bytes_loaded: u64,
    pub bytes_already_cached: u64,
    pub seconds: f64,
    pub throughput_bytes_per_sec: f64,
}

/// `report`: the daemon's state and counters (`silt report`, `--json` prints it whole).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub role: String,
    pub mountpoint: String,
    pub state_dir: String,
    pub mounts: Vec<MountReport>,
    pub page_size: u64,
    pub tiers: Vec<TierReport>,
    pub page_hits: u64,
    pub page_misses: u64,
    pub evictions: u64,
    pub admissions_refused: u64,
    pub pinned: PinnedReport,
    pub hit_ratio: f64,
    pub bytes_by_source: BytesBySource,
    pub metadata: MetadataReport,
    pub passthrough: PassthroughReport,
    pub opens: OpensReport,
    pub peak_rss_bytes: Option<u64>,
    pub memory: Memory,
    /// Every counter of `silt_common::metrics` by name.
    pub metrics: BTreeMap<String, u64>,
    /// In a cluster: its members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MountReport {
    pub path: String,
    /// Credentials redacted.
    pub uri: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TierReport {
    pub name: String,
    /// `None`: the memory tier.
    pub dir: Option<String>,
    pub capacity: u64,
    pub used: u64,
    pub pages: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct PinnedReport {
    pub objects: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct BytesBySource {
    pub memory: u64,
    pub disk: u64,
    pub under_store: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MetadataReport {
    /// Cached stats, listings and negative entries.
    pub stats: u64,
    pub listings: u64,
    pub negative: u64,
    pub default_policy: String,
    pub rules: Vec<RuleReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuleReport {
    pub prefix: String,
    pub policy: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PassthroughReport {
    pub configured: String,
    pub kernel_supported: bool,
    pub enabled: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpensReport {
    pub passthrough: u64,
    pub daemon: u64,
    /// The last opens, oldest first.
    pub recent: Vec<OpenReport>,
}

/// How one open was served.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpenReport {
    pub path: String,
    pub mode: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterReport {
    pub membership: String,
    pub workers: Vec<WorkerReport>,
}

/// One member of the view: its `stats` if it answered (`live`), else why not.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkerReport {
    pub id: String,
    pub addr: String,
    pub live: bool,
    /// Its cache's (live), or what it registered with (down).
    pub capacity: u64,
    /// Down: what asking it gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Live: what it answered.
    #[serde(flatten)]
    pub stats: Option<WorkerCounters>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct WorkerCounters {
    pub used: u64,
    pub hit_ratio: f64,
    pub page_hits: u64,
    pub page_misses: u64,
    pub reads_served: u64,
    pub bytes_served: u64,
    pub files_leased: u64,
    pub ufs_read_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The flattened answers read back what was written, and keep the socket's old JSON.
    #[test]
    fn flattened_answers_cross_the_socket() {
        let failed = PathState {
            path: "/w/a".into(),
            state: FileState::Failed {
                reason: "denied".into(),
                attempts: 3,
            },
        };
        let v = serde_json::to_value(&failed).unwrap();
        assert_eq!(
            v,
            json!({"path": "/w/a", "state": "failed", "reason": "denied", "attempts": 3})
        );
        assert_eq!(serde_json::from_value::<PathState>(v).unwrap(), failed);

        let down = WorkerReport {
            id: "w1".into(),
            addr: "h:1".into(),
            live: false,
            capacity: 5,
            error: Some("refused".into()),
            stats: None,
        };
        let v = serde_json::to_value(&down).unwrap();
        assert_eq!(
            v,
            json!({"id": "w1", "addr": "h:1", "live": false, "capacity": 5, "error": "refused"})
        );
        assert_eq!(serde_json::from_value::<WorkerReport>(v).unwrap(), down);
        let live = WorkerReport {
            live: true,
            error: None,
            stats: Some(WorkerCounters {
                used: 1,
                hit_ratio: 0.5,
                page_hits: 2,
                page_misses: 2,
                reads_served: 3,
                bytes_served: 4,
                files_leased: 0,
                ufs_read_bytes: 6,
            }),
            ..down
        };
        let v = serde_json::to_value(&live).unwrap();
        assert_eq!(v["ufs_read_bytes"], 6);
        assert_eq!(serde_json::from_value::<WorkerReport>(v).unwrap(), live);

        let ev = LoadEvent::Progress(LoadProgress {
            files_total: 1,
            bytes_total: 2,
            pages_done: 0,
            pages_total: 1,
            bytes_done: 0,
            bytes_cached: 0,
        });
        let v = serde_json::to_value(&ev).unwrap();
        assert_eq!(v["progress"]["bytes_total"], 2);
        assert_eq!(serde_json::from_value::<LoadEvent>(v).unwrap(), ev);
    }
}
