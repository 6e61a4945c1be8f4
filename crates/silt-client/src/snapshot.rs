//! The metadata cache carried across a clean restart.
//!
//! Without it, a restarted worker has its pages but not the listings and stats that lead to
//! them: the first pass over a warm data set pays one store round trip per directory, which on
//! a remote store is most of the time of a warm read (measured in docs/benchmarks.md).
//!
//! Invariants:
//! - The snapshot is written after a clean unmount, and also periodically while the daemon
//!   runs (`clean: false`), so a crash restart need not begin empty. It is removed when read,
//!   so it is used by at most one start.
//! - A periodic snapshot may predate this client's last changes (a delete, a rename, a
//!   commit after the save): from it only paths this client cannot change are restored
//!   (the caller's `trusts` gets `clean` and refuses writable prefixes), so nothing it
//!   deleted or replaced comes back after a crash. Changes by others are bounded by the sync
//!   policy's trust, as for any cached entry.
//! - An entry keeps its age: it is trusted only for what is left of its sync policy's trust since the
//!   store answered, exactly as if the process had not restarted (wall clock; if the clock went
//!   backwards the whole snapshot is dropped).
//! - An entry is restored only under a mount that still maps its path to the same store URI
//!   and relative path (by the `UnderStore` invariant, an object's `meta.path` is that relative
//!   path). Each record (one stat, or one whole listing) is applied whole or skipped: a record
//!   that does not parse or match is skipped, and a read error stops the restore between records.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use silt_ufs::{EntryKind, ObjectMeta};

use crate::namespace::{Namespace, Resolved};
use crate::Entry;

const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    /// Wall-clock time of the save, in milliseconds since the epoch.
    saved_at_ms: u128,
    /// Saved at a clean stop (nothing changed after it) rather than periodically.
    #[serde(default = "clean_default")]
    clean: bool,
}

/// Snapshots written before periodic saves existed were all written at a clean stop.
fn clean_default() -> bool {
    true
}

#[derive(Serialize, Deserialize)]
struct SavedEntry {
    path: String,
    dir: bool,
    /// A symbolic link (absent in snapshots of earlier versions).
    #[serde(default)]
    link: bool,
    size: u64,
    mtime_ns: Option<u128>,
    mode: Option<u32>,
    /// Owner, group, atime and ctime (absent in snapshots of earlier versions).
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    atime_ns: Option<u128>,
    #[serde(default)]
    ctime_ns: Option<u128>,
    store: String,
    rel: String,
    etag: Option<String>,
    version: Option<String>,
}

#[derive(Serialize, Deserialize)]
enum Record {
    Stat {
        age_ms: u64,
        entry: SavedEntry,
    },
    List {
        age_ms: u64,
        dir: String,
        /// The directory's store and path in it: an empty listing has no entry to check.
        store: String,
        rel: String,
        entries: Vec<SavedEntry>,
    },
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn to_ns(t: SystemTime) -> Option<u128> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_nanos())
}

fn from_ns(ns: u128) -> Option<SystemTime> {
    let secs = u64::try_from(ns / 1_000_000_000).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

fn save_entry(e: &Entry) -> Option<SavedEntry> {
    // Special files and files with several names are asked of the store again after a
    // restart (few, and the latter are never trusted from the cache anyway).
    if e.kind.is_special() || e.posix.linked() {
        return None;
    }
    let obj = e.object.as_ref()?;
    Some(SavedEntry {
        path: e.path.clone(),
        dir: e.kind == EntryKind::Dir,
        link: e.kind == EntryKind::Symlink,
        size: obj.meta.size,
        mtime_ns: obj
            .meta
            .mtime
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos()),
        mode: obj.meta.mode,
        uid: obj.meta.posix.uid,
        gid: obj.meta.posix.gid,
        atime_ns: obj.meta.posix.atime.and_then(to_ns),
        ctime_ns: obj.meta.posix.ctime.and_then(to_ns),
        store: obj.store.uri().to_string(),
        rel: obj.meta.path.clone(),
        etag: obj.meta.etag.clone(),
        version: obj.meta.version.clone(),
    })
}

fn restore_entry(ns: &Namespace, s: SavedEntry) -> Option<Entry> {
    let Ok(Resolved::Store { mount, rel }) = ns.resolve(&s.path) else {
        return None;
    };
    if mount.store.uri() != s.store || rel != s.rel {
        return None;
    }
    let mtime = match s.mtime_ns {
        Some(ns) => Some(from_ns(ns)?),
        None => None,
    };
    let posix = silt_ufs::Posix {
        uid: s.uid,
        gid: s.gid,
        atime: s.atime_ns.and_then(from_ns),
        ctime: s.ctime_ns.and_then(from_ns),
        ..Default::default()
    };
    let meta = ObjectMeta {
        path: s.rel,
        kind: if s.dir {
            EntryKind::Dir
        } else if s.link {
            EntryKind::Symlink
        } else {
            EntryKind::File
        },
        size: s.size,
        mtime,
        etag: s.etag,
        version: s.version,
        mode: s.mode,
        posix,
    };
    Some(Entry::from_meta(s.path, &mount.store, meta))
}

/// What the cache holds, for saving: (stats, listings), each with the instant it was fetched.
pub(crate) type Contents = (
    Vec<(Instant, Entry)>,
    Vec<(Instant, String, Arc<Vec<Entry>>)>,
);

/// Writes the snapshot atomically (temporary file, then rename). Returns records written.
pub(crate) fn save(
    path: &Path,
    ns: &Namespace,
    contents: Contents,
    clean: bool,
) -> std::io::Result<usize> {
    let now = Instant::now();
    let header = Header {
        format: FORMAT,
        clean,
        saved_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
    };
    let tmp = path.with_extension("tmp");
    let mut out = BufWriter::new(silt_common::private::create(&tmp)?);
    serde_json::to_writer(&mut out, &header)?;
    out.write_all(b"\n")?;
    let mut n = 0;
    let (stats, lists) = contents;
    for (at, e) in stats {
        if let Some(entry) = save_entry(&e) {
            let rec = Record::Stat {
                age_ms: ms(now.duration_since(at)),
                entry,
            };
            serde_json::to_writer(&mut out, &rec)?;
            out.write_all(b"\n")?;
            n += 1;
        }
    }
    for (at, dir, entries) in lists {
        // Listings of synthetic directories come from the mount table, not the store.
        let Ok(Resolved::Store { mount, rel }) = ns.resolve(&dir) else {
            continue;
        };
        let store = mount.store.uri().to_string();
        // A listing with a synthetic child (a mount point below a store directory) is cheap to
        // rebuild and cannot be restored faithfully from store metadata: skip it.
        let saved: Option<Vec<SavedEntry>> = entries.iter().map(save_entry).collect();
        if let Some(entries) = saved {
            let age_ms = ms(now.duration_since(at));
            let rec = Record::List {
                age_ms,
                dir,
                store,
                rel,
                entries,
            };
            serde_json::to_writer(&mut out, &rec)?;
            out.write_all(b"\n")?;
            n += 1;
        }
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(n)
}

/// Reads and removes the snapshot; `put_stat` / `put_list` receive every record whose age
/// `trusts(path, age, clean)` accepts (`clean`: saved at a clean stop), with the instant it was fetched. Returns records restored; a missing file restores nothing.
pub(crate) fn restore(
    path: &Path,
    ns: &Namespace,
    trusts: impl Fn(&str, Duration, bool) -> bool,
    mut put_stat: impl FnMut(Instant, Entry),
    mut put_list: impl FnMut(Instant, String, Vec<Entry>),
) -> std::io::Result<usize> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    // Used once: a crash after this start must not bring these entries back.
    std::fs::remove_file(path)?;
    let mut lines = BufReader::new(file).lines();
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let header: Header = match lines.next() {
        Some(line) => serde_json::from_str(&line?).map_err(|_| bad("bad snapshot header"))?,
        None => return Ok(0),
    };
    if header.format != FORMAT {
        return Err(bad("unknown snapshot format"));
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let Some(since_save) = now_ms.checked_sub(header.saved_at_ms) else {
        return Err(bad("the clock went backwards since the snapshot was saved"));
    };
    let since_save = Duration::from_millis(u64::try_from(since_save).unwrap_or(u64::MAX));
    let now = Instant::now();
    let fetched = |path: &str, age_ms: u64| {
        let age = since_save.saturating_add(Duration::from_millis(age_ms));
        if !trusts(path, age, header.clean) {
            return None;
        }
        now.checked_sub(age)
    };
    let mut n = 0;
    for line in lines {
        let Ok(rec) = serde_json::from_str::<Record>(&line?) else {
            continue;
        };
        match rec {
            Record::Stat { age_ms, entry } => {
                let at = fetched(&entry.path, age_ms);
                if let (Some(at), Some(e)) = (at, restore_entry(ns, entry)) {
                    put_stat(at, e);
                    n += 1;
                }
            }
            Record::List {
                age_ms,
                dir,
                store,
                rel,
                entries,
            } => {
                let Some(at) = fetched(&dir, age_ms) else {
                    continue;
                };
                match ns.resolve(&dir) {
                    Ok(Resolved::Store {
                        mount,
                        rel: now_rel,
                    }) if mount.store.uri() == store && now_rel == rel => {}
                    _ => continue,
                }
                let restored: Option<Vec<Entry>> =
                    entries.into_iter().map(|s| restore_entry(ns, s)).collect();
                if let Some(list) = restored {
                    put_list(at, dir, list);
                    n += 1;
                }
            }
        }
    }
    Ok(n)
}
