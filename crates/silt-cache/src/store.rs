//! The page store: one index lock over a memory tier and the disk tiers.
//!
//! Objects are interned into slots (`u32`), so a page is a `u64` key
//! `(slot << 32) | index` everywhere in the index: per cached disk page the store keeps a
//! 16-byte map entry (key + crc + policy handle) and the LRU policy a 16-byte node. Per
//! object there is one slot (48 bytes) and one `ObjectId → slot` entry.
//!
//! Locking: every index change happens under one `parking_lot::Mutex`. Bulk page I/O (the
//! `pread`/`pwrite` of page bytes and `complete_file`'s verification) runs outside it; small
//! metadata I/O (journal appends, hole punches, creating, opening and deleting data files)
//! runs inside, which keeps the index and the files in step. A page being written is indexed
//! as pending: counted against the quota, invisible to readers and to `complete_file`, not
//! evictable. Its bytes go through a handle opened with the reservation, so a write that
//! outlives its reservation (`remove_object` meanwhile) lands in the unlinked file, never in a
//! newer one at the same path. Hence: while the index holds a committed disk page, that
//! tier's data file holds exactly its bytes at its offset.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use silt_common::bufpool;
use silt_common::config::{Config, DiskTierSpec};
use silt_common::metrics;
use silt_common::{Error, ObjectId, PageKey, Result};
use tracing::{debug, info, warn};

use crate::disk::{self, DiskPage, DiskTier, RecoveredPage, PENDING};
use crate::policy::{
    new_policy, page_fingerprint, EvictionPolicy, FrequencySketch, Handle, PolicyKey,
};
use crate::{page_count, page_len};

/// Configuration of a [`PageStore`].
#[derive(Debug, Clone)]
pub struct PageStoreConfig {
    /// Page size in bytes (any value from 1 to `u32::MAX`; Silt uses powers of two).
    pub page_size: u64,
    /// Quota of the memory tier in bytes; 0 disables it.
    pub memory_capacity: u64,
    /// Disk tiers, fastest first.
    pub disk_tiers: Vec<DiskTierSpec>,
    /// Fraction of a quota above which eviction starts.
    pub high_watermark: f64,
    /// Fraction of a quota eviction brings usage down to.
    pub low_watermark: f64,
    /// `"tinylfu"` or `"lru"` (`policy::POLICIES`).
    pub eviction_policy: String,
    /// Whole pages in aligned buffers go to disk with `O_DIRECT` (`disk::write_page`).
    pub disk_direct_io: bool,
}

impl PageStoreConfig {
    /// A memory-only store with the configuration's default watermarks and eviction (tests
    /// and tools).
    pub fn in_memory(page_size: u64, memory_capacity: u64) -> Self {
        let defaults = Config::default();
        PageStoreConfig {
            page_size,
            memory_capacity,
            disk_tiers: Vec::new(),
            high_watermark: defaults.high_watermark,
            low_watermark: defaults.low_watermark,
            eviction_policy: defaults.eviction_policy,
            disk_direct_io: defaults.disk_direct_io,
        }
    }

    /// The page store part of Silt's configuration.
    pub fn from_config(c: &Config) -> Result<Self> {
        Ok(PageStoreConfig {
            page_size: c.page_size,
            memory_capacity: c.memory_capacity,
            disk_tiers: c.disk_tiers()?,
            high_watermark: c.high_watermark,
            low_watermark: c.low_watermark,
            eviction_policy: c.eviction_policy.clone(),
            disk_direct_io: c.disk_direct_io,
        })
    }
}

/// Where a page was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Memory,
    /// Disk tier by position in [`PageStoreConfig::disk_tiers`].
    Disk(usize),
}

/// One tier's usage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierStats {
    /// `"memory"`, `"disk0"`, `"disk1"`, ...
    pub name: String,
    /// `None` for the memory tier.
    pub dir: Option<PathBuf>,
    pub capacity: u64,
    /// Bytes of cached pages (including pages being written).
    pub used: u64,
    pub pages: u64,
}

/// Usage and counters of one store (the process-wide metrics are in `silt_common::metrics`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageStoreStats {
    /// Memory tier first, then the disk tiers in order.
    pub tiers: Vec<TierStats>,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub checksum_failures: u64,
    /// Pages a full tier did not take: its admission judged the victim worth more.
    pub admissions_refused: u64,
    /// Objects the user pinned (`silt fs pin`), and their bytes.
    pub pinned_objects: u64,
    pub pinned_bytes: u64,
}

const NO_TIER: u8 = u8::MAX;
/// Most pinned victims one eviction round steps over before giving up (bounds the work of
/// one put when the tier is full of pinned pages).
const MAX_PIN_SKIPS: usize = 4096;
/// Most prefetched pages waiting for their first read that the store protects (`State::unread`).
const MAX_UNREAD: usize = 1 << 16;

/// A page memory evicted, offered to the disk tiers (see `State::demoted`): admitted as a
/// put would be, or regardless if `unread` (prefetched and not read yet).
struct Demoted {
    id: ObjectId,
    size: u64,
    index: u32,
    data: Bytes,
    unread: bool,
}

/// Most pages memory eviction keeps aside for the disk tiers at once (see `State::demoted`).
const MAX_DEMOTED: usize = 64;

/// One cached object version. 48 bytes.
struct ObjectSlot {
    id: ObjectId,
    size: u64,
    /// Distinguishes this slot's life from earlier and later users of the same slot number.
    gen: u32,
    /// Bumped whenever a disk page of the object goes away.
    disk_epoch: u32,
    mem_pages: u32,
    /// Disk pages, pending ones included.
    disk_pages: u32,
    /// Disk pages being written (pending).
    pending: u32,
    /// The disk tier holding the object's data file, or `NO_TIER`.
    tier: u8,
    /// Every disk page present is known good: written by this process, recovered after a
    /// clean shutdown, or read back and checked by `complete_file`. Only pages recovered after
    /// a crash (possibly torn) start out unverified. Removing a page keeps the others good.
    /// Says nothing about pending pages: `complete_file` also needs `pending == 0`.
    verified: bool,
    /// The journal holds a seal for exactly the pages present (see `disk::RecordKind::Seal`):
    /// after a crash they are trusted without reading them back. Cleared, durably, before any
    /// page of the object is punched or its file removed.
    sealed: bool,
}

struct MemPage {
    data: Bytes,
    handle: Handle,
}

struct MemTier {
    capacity: u64,
    used: u64,
    pages: HashMap<PolicyKey, MemPage>,
    policy: Box<dyn EvictionPolicy>,
}

#[derive(Default)]
struct Counters {
    hits: u64,
    misses: u64,
    evictions: u64,
    checksum_failures: u64,
    /// Pages a full tier did not take (admission said the victim was worth more).
    refused: u64,
}

struct State {
    page_size: u64,
    high: f64,
    low: f64,
    objects: HashMap<ObjectId, u32>,
    slots: Vec<Option<ObjectSlot>>,
    free_slots: Vec<u32>,
    next_gen: u32,
    mem: MemTier,
    disks: Vec<DiskTier>,
    pins: HashMap<ObjectId, u32>,
    /// Objects being loaded on request (`silt load`): admitted without the frequency test.
    preferred: HashMap<ObjectId, u32>,
    /// Objects the user pinned (`silt fs pin`), with the byte ranges pinned (start → length;
    /// a cluster worker pins only the placement groups it owns): never evicted, always
    /// admitted; together at most the disk tiers' high watermarks.
    user_pins: HashMap<ObjectId, HashMap<u64, u64>>,
    /// Where `user_pins` is kept across restarts (beside the first disk tier), if anywhere.
    pins_file: Option<PathBuf>,
    /// How often each page was read lately, for admission to full tiers.
    sketch: FrequencySketch,
    /// Pages memory evicted that no disk tier holds (a full tier refused them when they
    /// came): offered to the disk tiers again after the put or get that evicted them, when
    /// hits in memory may since have made them worth a place there. At most
    /// `MAX_DEMOTED`; more are dropped as before.
    demoted: Vec<Demoted>,
    /// Pages fetched ahead of a read (`put_prefetched`) that no read has asked for yet. A
    /// full disk tier may refuse them (they were not read), so they live in memory; if memory
    /// evicts one before its read, it goes to disk regardless, since dropping it would only
    /// fetch it again moments later. At most `MAX_UNREAD`.
    unread: HashSet<(ObjectId, u32)>,
    counters: Counters,
    /// Complete objects waiting to be sealed (see `PageStore::seal_completed`).
    seal_queue: Vec<ObjectId>,
    /// Wakes the background sealer, if one runs.
    sealer: Option<mpsc::Sender<()>>,
    /// By slot: the data file's `fstat` when `complete_file` last read it back and found every
    /// page good. Only objects leased whole have one.
    stamps: HashMap<u32, FileStamp>,
    /// [`STAMP_SETTLE`]; tests shorten it.
    settle: std::time::Duration,
}

/// What `fstat` says of a data file, and which life and page set of the slot it describes.
/// Any write to the file moves its ctime (no unprivileged user can set a ctime), a replaced
/// file has another inode, and a page the store removed or rewrote bumps the slot's epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    gen: u32,
    epoch: u32,
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// A file whose ctime is younger than this when it is stamped could still change within the
/// same timestamp tick unseen (kernel timestamps are coarse: a jiffy, or a second on some
/// file systems), so its stamp is not trusted: it is read back again at its next lease.
const STAMP_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

impl FileStamp {
    fn of(meta: &std::fs::Metadata, gen: u32, epoch: u32) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            gen,
            epoch,
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether a change after `taken` (when the `fstat` began) must give another ctime.
    fn settled(&self, taken: std::time::SystemTime, settle: std::time::Duration) -> bool {
        let Ok(now) = taken.duration_since(std::time::UNIX_EPOCH) else {
            return false;
        };
        let (secs, nanos) = self.ctime;
        let ctime = u64::try_from(secs).map(|s| std::time::Duration::new(s, 0));
        let ctime =
            ctime.map(|c| c + std::time::Duration::from_nanos(nanos.clamp(0, 999_999_999) as u64));
        ctime.is_ok_and(|c| c + settle < now)
    }
}

/// A whole object's disk-tier file, open, its pages verified (see
/// [`PageStore::complete_file`]).
#[derive(Debug)]
pub struct CompleteFile {
    pub file: File,
    pub path: PathBuf,
    object: ObjectId,
    object_size: u64,
    /// The file's `fstat` from before its bytes were verified (or found unchanged).
    seen: FileStamp,
    /// Whether `seen` may be trusted to show any later change (see [`STAMP_SETTLE`]).
    settled: bool,
}

struct Shared {
    state: Mutex<State>,
    page_size: u64,
    has_disks: bool,
    /// Per disk tier: `PageStoreConfig::disk_direct_io`, cleared once the tier's file system
    /// refuses `O_DIRECT` (`disk::write_page`).
    direct_io: Vec<AtomicBool>,
    /// Page writes to one data file take turns here (striped by slot): the kernel serialises
    /// them on the file's inode lock anyway, but by spinning while the owner copies, which cost
    /// concurrent fetches of one file 5 % of the daemon's CPU on a cold scan (issue 18); a
    /// waiter here sleeps.
    write_turns: [Mutex<()>; WRITE_STRIPES],
}

/// Lets the page-size buffer pool keep one memory eviction's buffers idle: a full memory tier
/// evicts from the high watermark to a page below the low one at once, and the fetches that
/// follow take those buffers instead of mapping fresh ones. Idle plus cached bytes stay under
/// the high watermark of the largest capacity set (the pool's bound never shrinks: it is
/// shared by every store of the process).
fn keep_eviction_batch(page_size: u64, capacity: u64, high: f64, low: f64) {
    if let Some(pool) = page_pool(page_size) {
        let batch = capacity as f64 * (high - low);
        pool.keep_idle_bytes((batch as usize).saturating_add(pool.size()));
    }
}

/// The process-wide pool of `page_size` buffers the fetches fill, if pages are pooled.
fn page_pool(page_size: u64) -> Option<Arc<bufpool::BufferPool>> {
    usize::try_from(page_size)
        .ok()
        .and_then(bufpool::BufferPool::for_size)
}

/// Stripes of `Shared::write_turns`.
const WRITE_STRIPES: usize = 64;

/// The worker's page store. `Send + Sync`; share it behind an `Arc`.
pub struct PageStore {
    shared: Arc<Shared>,
}

/// Keeps an object's disk pages from being evicted while it lives (see [`PageStore::pin`]),
/// or its pages admitted to full tiers ([`PageStore::prefer`]).
pub struct PinGuard {
    shared: Arc<Shared>,
    object: ObjectId,
    set: fn(&mut State) -> &mut HashMap<ObjectId, u32>,
}

impl PinGuard {
    fn take(
        shared: &Arc<Shared>,
        object: ObjectId,
        set: fn(&mut State) -> &mut HashMap<ObjectId, u32>,
    ) -> PinGuard {
        *set(&mut shared.state.lock()).entry(object).or_insert(0) += 1;
        PinGuard {
            shared: shared.clone(),
            object,
            set,
        }
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock();
        let set = (self.set)(&mut st);
        if let Some(n) = set.get_mut(&self.object) {
            *n -= 1;
            if *n == 0 {
                set.remove(&self.object);
            }
        }
    }
}

impl std::fmt::Debug for PinGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinGuard")
            .field("object", &self.object)
            .finish()
    }
}

fn pkey(slot: u32, index: u32) -> PolicyKey {
    (u64::from(slot) << 32) | u64::from(index)
}

fn key_slot(key: PolicyKey) -> u32 {
    (key >> 32) as u32
}

fn key_index(key: PolicyKey) -> u32 {
    key as u32
}

fn mark(quota: u64, fraction: f64) -> u64 {
    (quota as f64 * fraction) as u64
}

/// Keys of slot `s` in `map`, probing indices or scanning, whichever is cheaper.
fn slot_keys<V>(map: &HashMap<PolicyKey, V>, s: u32, pages: u64) -> Vec<PolicyKey> {
    if pages <= map.len() as u64 {
        (0..pages)
            .filter_map(|i| u32::try_from(i).ok())
            .map(|i| pkey(s, i))
            .filter(|k| map.contains_key(k))
            .collect()
    } else {
        map.keys().copied().filter(|&k| key_slot(k) == s).collect()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// Made room: journaled, counted as an eviction.
    Evict,
    /// Failed verification or could not be tracked: journaled, not counted as an eviction.
    Drop,
    /// A pending write that failed: never journaled, so no removal record either.
    Abort,
}

/// A disk read planned under the lock and performed outside it.
struct DiskRead {
    tier: usize,
    slot: u32,
    gen: u32,
    key: PolicyKey,
    crc: u32,
    object: ObjectId,
    object_size: u64,
    index: u32,
    path: PathBuf,
    offset: u64,
    len: usize,
}

/// A disk page reserved (pending) under the lock, written outside it.
struct Reservation {
    tier: usize,
    slot: u32,
    gen: u32,
    index: u32,
    path: PathBuf,
    /// The data file as it was at reservation time (see the module docs).
    file: Arc<File>,
    offset: u64,
}

enum Lookup {
    Memory(Bytes),
    Disk(DiskRead),
    Miss,
}

impl State {
    fn slot(&self, s: u32) -> Option<&ObjectSlot> {
        self.slots.get(s as usize).and_then(Option::as_ref)
    }

    fn slot_mut(&mut self, s: u32) -> Option<&mut ObjectSlot> {
        self.slots.get_mut(s as usize).and_then(Option::as_mut)
    }

    fn lookup(&self, id: ObjectId) -> Option<u32> {
        self.objects.get(&id).copied()
    }

    /// The slot number, slot and disk tier (index) of `object` if its disk pages are in a disk
    /// tier and it is cached at size `object_size`.
    fn on_disk(&self, object: ObjectId, object_size: u64) -> Option<(u32, &ObjectSlot, usize)> {
        let s = self.lookup(object)?;
        let slot = self.slot(s)?;
        if slot.size != object_size || slot.tier == NO_TIER {
            return None;
        }
        Some((s, slot, usize::from(slot.tier)))
    }

    /// The crc32c of each page `pages` of slot `s` in disk tier `t`; `None` if one is not there
    /// or still pending (its bytes may still be a hole).
    fn committed_crcs(&self, t: usize, s: u32, pages: std::ops::Range<u64>) -> Option<Vec<u32>> {
        let tier = &self.disks[t];
        let mut crcs = Vec::with_capacity(usize::try_from(pages.end - pages.start).ok()?);
        for i in pages {
            let p = tier.pages.get(&pkey(s, u32::try_from(i).ok()?))?;
            if p.handle == PENDING {
                return None;
            }
            crcs.push(p.crc);
        }
        Some(crcs)
    }

    /// Queues slot `s` for sealing if all its pages are on disk, committed and known good.
    fn maybe_queue_seal(&mut self, s: u32) {
        let page_size = self.page_size;
        let Some(slot) = self.slot(s) else {
            return;
        };
        let complete = slot.tier != NO_TIER
            && slot.pending == 0
            && u64::from(slot.disk_pages) == page_count(slot.size, page_size);
        // Without a sealer (it could not start) nothing would drain the queue.
        let sealing = self.sealer.is_some() || cfg!(test);
        if sealing && complete && slot.verified && !slot.sealed && slot.size >= SEAL_MIN_BYTES {
            let id = slot.id;
            let wake = self.seal_queue.is_empty();
            self.seal_queue.push(id);
            // The sealer drains the whole queue per wake-up.
            if let (true, Some(tx)) = (wake, &self.sealer) {
                let _ = tx.send(());
            }
        }
    }

    /// Clears the seal of slot `s` (its removal record is in tier `t`'s journal already)
    /// before its data file is changed. Punching (`punch`) needs the record durable first;
    /// `false` if that failed (the caller then leaves the bytes alone). Unlinking does not:
    /// a missing file drops its pages, and a new file for the object syncs the journal first
    /// (`DiskTier::create_data_file`).
    fn unseal(&mut self, t: usize, s: u32, punch: bool) -> bool {
        match self.slot_mut(s) {
            Some(slot) if slot.sealed => {
                slot.sealed = false;
                let id = slot.id;
                if punch {
                    self.disks[t].unseal_durably()
                } else {
                    self.disks[t].unsealed_lazily(id);
                    true
                }
            }
            _ => true,
        }
    }

    fn ensure_slot(&mut self, id: ObjectId, size: u64) -> Option<u32> {
        if let Some(s) = self.lookup(id) {
            return Some(s);
        }
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1);
        let slot = ObjectSlot {
            id,
            size,
            gen,
            disk_epoch: 0,
            mem_pages: 0,
            disk_pages: 0,
            pending: 0,
            tier: NO_TIER,
            verified: true,
            sealed: false,
        };
        let s = match self.free_slots.pop() {
            Some(s) => {
                *self.slots.get_mut(s as usize)? = Some(slot);
                s
            }
            None => {
                let s = u32::try_from(self.slots.len()).ok()?;
                self.slots.push(Some(slot));
                s
            }
        };
        self.objects.insert(id, s);
        Some(s)
    }

    fn release_if_empty(&mut self, s: u32) {
        let Some(slot) = self.slot(s) else {
            return;
        };
        if slot.mem_pages == 0 && slot.disk_pages == 0 {
            let id = slot.id;
            self.objects.remove(&id);
            if let Some(entry) = self.slots.get_mut(s as usize) {
                *entry = None;
            }
            self.free_slots.push(s);
            self.stamps.remove(&s);
        }
    }

    fn count_eviction(&mut self) {
        self.counters.evictions += 1;
        metrics::PAGES_EVICTED.inc();
    }

    fn count_hit(&mut self) {
        self.counters.hits += 1;
        metrics::PAGE_HITS.inc();
    }

    /// Bytes the user pinned, all objects and ranges together.
    fn pinned_bytes(&self) -> u64 {
        self.user_pins.values().flat_map(HashMap::values).sum()
    }

    /// Writes the user's pins to `pins_file` (whole, then renamed over the old one, so a
    /// crash leaves the old or the new list). A failure is logged: the pins hold until the
    /// daemon stops.
    fn save_pins(&self) {
        let Some(path) = &self.pins_file else {
            return;
        };
        let mut text = String::from(PINS_HEADER);
        for (id, parts) in &self.user_pins {
            for (start, len) in parts {
                text.push_str(&format!("{} {start} {len}\n", id.to_hex()));
            }
        }
        let tmp = path.with_extension("tmp");
        let written = (|| {
            let mut f = silt_common::private::create(&tmp)?;
            std::io::Write::write_all(&mut f, text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            warn!(path = %path.display(), error = %e, "cannot save the pins; they hold until the daemon stops");
        }
    }

    // ---- memory tier ----

    /// Counts one read of page `index` of `object` in the frequency sketch (sized for the
    /// pages the tiers track now).
    fn record_read(&mut self, object: ObjectId, index: u64) {
        self.size_sketch();
        self.count_read(object, index);
    }

    /// Sizes the sketch for the pages the tiers track now.
    fn size_sketch(&mut self) {
        let tracked =
            self.mem.pages.len() + self.disks.iter().map(|d| d.pages.len()).sum::<usize>();
        self.sketch.ensure(tracked as u64);
    }

    /// `record_read` with the sketch already sized.
    fn count_read(&mut self, object: ObjectId, index: u64) {
        self.sketch.record(page_fingerprint(object.0, index));
        if !self.unread.is_empty() {
            if let Ok(index) = u32::try_from(index) {
                self.unread.remove(&(object, index));
            }
        }
    }

    /// Counts a read of every page of `object` (slot `s`, whole in disk tier `t`) served
    /// from its data file outside the store (passthrough, a leased file): for admission and
    /// recency as if each page were read with `get`, or a file read only that way would look
    /// cold next to the ones read through the store and be displaced by them.
    fn file_read(&mut self, t: usize, s: u32, object: ObjectId, pages: u64) {
        self.size_sketch();
        for index in 0..pages {
            self.count_read(object, index);
            let key = pkey(s, index as u32);
            if let Some(p) = self.disks[t].pages.get(&key) {
                let handle = p.handle;
                self.disks[t].policy.on_access(handle, key);
            }
        }
    }

    /// Removes a memory page without releasing its slot.
    fn mem_remove(&mut self, key: PolicyKey) -> bool {
        let Some(p) = self.mem.pages.remove(&key) else {
            return false;
        };
        self.mem.policy.on_remove(p.handle, key);
        self.mem.used -= p.data.len() as u64;
        if let Some(slot) = self.slot_mut(key_slot(key)) {
            slot.mem_pages -= 1;
        }
        true
    }

    fn mem_make_room(&mut self, len: u64) -> bool {
        let cap = self.mem.capacity;
        if len > cap {
            return false;
        }
        if self.mem.used + len > mark(cap, self.high) {
            let to = if self.mem.policy.filters_admission() && self.disks.is_empty() {
                self.high
            } else {
                self.low
            };
            self.mem_evict_to(mark(cap, to).saturating_sub(len));
        }
        self.mem.used + len <= cap
    }

    /// Evicts memory pages until at most `target` bytes are used.
    fn mem_evict_to(&mut self, target: u64) {
        while self.mem.used > target {
            let Some((key, handle)) = self.mem.policy.victim() else {
                break;
            };
            self.maybe_demote(key);
            if self.mem_remove(key) {
                self.count_eviction();
                self.release_if_empty(key_slot(key));
            } else {
                // Not ours (cannot happen with a correct policy): forget it so we progress.
                self.mem.policy.on_remove(handle, key);
            }
        }
    }

    /// Keeps memory page `key` aside for the disk tiers if none of them holds it.
    fn maybe_demote(&mut self, key: PolicyKey) {
        if self.disks.is_empty() || self.demoted.len() >= MAX_DEMOTED {
            return;
        }
        let Some(slot) = self.slot(key_slot(key)) else {
            return;
        };
        let on_disk =
            slot.tier != NO_TIER && self.disks[usize::from(slot.tier)].pages.contains_key(&key);
        if on_disk {
            return;
        }
        let (id, size, index) = (slot.id, slot.size, key_index(key));
        let unread = self.unread.remove(&(id, index));
        if let Some(p) = self.mem.pages.get(&key) {
            self.demoted.push(Demoted {
                id,
                size,
                index,
                data: p.data.clone(),
                unread,
            });
        }
    }

    fn mem_put(&mut self, id: ObjectId, size: u64, index: u32, data: &Bytes) {
        if self.mem.capacity == 0 {
            return;
        }
        if let Some(s) = self.lookup(id) {
            let key = pkey(s, index);
            if let Some(p) = self.mem.pages.get(&key) {
                let h = p.handle;
                self.mem.policy.on_access(h, key);
                return;
            }
        }
        let len = data.len() as u64;
        if self.disks.is_empty()
            && self.mem.used + len > mark(self.mem.capacity, self.high)
            && !self.admits(None, id, index)
        {
            return;
        }
        if !self.mem_make_room(len) {
            return;
        }
        // Eviction may have released the object's slot; this re-creates it if so.
        let Some(s) = self.ensure_slot(id, size) else {
            return;
        };
        let key = pkey(s, index);
        let Some(handle) = self.mem.policy.on_insert(key) else {
            self.release_if_empty(s);
            return;
        };
        self.mem.pages.insert(
            key,
            MemPage {
                data: data.clone(),
                handle,
            },
        );
        self.mem.used += len;
        if let Some(slot) = self.slot_mut(s) {
            slot.mem_pages += 1;
        }
    }

    /// Whether page `index` of `id` may replace the next victim of the memory tier (`None`)
    /// or disk tier `t` (asked only when the tier is full): per its policy, from how often
    /// each was read lately. Refusals are counted.
    fn admits(&mut self, tier: Option<usize>, id: ObjectId, index: u32) -> bool {
        if self.preferred.contains_key(&id) || self.user_pins.contains_key(&id) {
            return true;
        }
        let policy = match tier {
            None => &self.mem.policy,
            Some(t) => &self.disks[t].policy,
        };
        let Some((victim, _)) = policy.victim() else {
            return true;
        };
        let Some(victim_id) = self.slot(key_slot(victim)).map(|s| s.id) else {
            return true;
        };
        let incoming = self
            .sketch
            .estimate(page_fingerprint(id.0, u64::from(index)));
        let held = self
            .sketch
            .estimate(page_fingerprint(victim_id.0, u64::from(key_index(victim))));
        let admitted = policy.admits(incoming, held);
        if !admitted {
            self.counters.refused += 1;
        }
        admitted
    }

    // ---- disk tiers ----

    fn is_pinned(&self, key: PolicyKey) -> bool {
        (!self.pins.is_empty() || !self.user_pins.is_empty())
            && self.slot(key_slot(key)).is_some_and(|s| {
                self.pins.contains_key(&s.id) || self.user_pins.contains_key(&s.id)
            })
    }

    /// Evicts per the watermarks so that `len` more bytes fit; whether they fit the quota.
    fn disk_make_room(&mut self, t: usize, len: u64) -> bool {
        self.disks[t].refresh_quota(false);
        let quota = self.disks[t].quota;
        if len > quota {
            return false;
        }
        if self.disks[t].used + len > mark(quota, self.high) {
            let to = if self.disks[t].policy.filters_admission() {
                self.high
            } else {
                self.low
            };
            self.disk_evict_to(t, mark(quota, to).saturating_sub(len));
        }
        self.disks[t].used + len <= quota
    }

    /// Evicts tier `t`'s pages (pinned ones stepped over) until it uses at most `target`.
    fn disk_evict_to(&mut self, t: usize, target: u64) {
        let mut skips = 0;
        while self.disks[t].used > target {
            let Some((key, handle)) = self.disks[t].policy.victim() else {
                break;
            };
            if self.is_pinned(key) {
                if skips >= MAX_PIN_SKIPS || skips >= self.disks[t].policy.len() {
                    break;
                }
                skips += 1;
                // Step over it: a pinned page is in use anyway.
                self.disks[t].policy.on_access(handle, key);
                continue;
            }
            if !self.disk_remove(t, key, Removal::Evict) {
                self.disks[t].policy.on_remove(handle, key);
            }
        }
    }

    /// Removes one disk page (committed or pending), releasing the slot if it empties.
    fn disk_remove(&mut self, t: usize, key: PolicyKey, why: Removal) -> bool {
        let Some(page) = self.disks[t].pages.remove(&key) else {
            return false;
        };
        if page.handle != PENDING {
            self.disks[t].policy.on_remove(page.handle, key);
        }
        let (s, index, page_size) = (key_slot(key), key_index(key), self.page_size);
        let Some(slot) = self.slot_mut(s) else {
            warn!(key, "disk page without an object slot");
            return true;
        };
        let (id, size) = (slot.id, slot.size);
        slot.disk_pages = slot.disk_pages.saturating_sub(1);
        if page.handle == PENDING {
            slot.pending = slot.pending.saturating_sub(1);
        }
        slot.disk_epoch = slot.disk_epoch.wrapping_add(1);
        let now_empty = slot.disk_pages == 0;
        if now_empty {
            slot.tier = NO_TIER;
            // No disk page left to doubt.
            slot.verified = true;
        }
        let len = page_len(u64::from(index), size, page_size).unwrap_or(0);
        let tier = &mut self.disks[t];
        tier.used = tier.used.saturating_sub(len);
        if why != Removal::Abort {
            tier.journal_remove_page(id, index, size);
        }
        // Unlinking is always safe (a missing file drops its pages at the next open);
        // punching a sealed file is not until the seal is undone durably.
        let may_punch = self.unseal(t, s, !now_empty);
        let tier = &mut self.disks[t];
        if now_empty {
            tier.remove_data_file(id);
        } else if may_punch {
            tier.punch(id, index, len);
        }
        if why == Removal::Evict {
            self.count_eviction();
        }
        self.release_if_empty(s);
        self.maybe_compact(t);
        true
    }

    fn maybe_compact(&mut self, t: usize) {
        if !self.disks[t].wants_compaction() {
            return;
        }
        let (slots, disks) = (&self.slots, &mut self.disks);
        let resolve = |key: PolicyKey| {
            slots
                .get(key_slot(key) as usize)
                .and_then(Option::as_ref)
                .map(|s| (s.id, s.size, key_index(key)))
        };
        if let Err(e) = disks[t].compact(&resolve) {
            warn!(tier = %disks[t].name, error = %e, "cannot compact the cache journal");
        }
        // The rewritten journal has no seals (nor, if it failed, a trustworthy tail): seal
        // the tier's complete objects again.
        let sealed: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&s| {
                self.slot(s)
                    .is_some_and(|x| x.sealed && usize::from(x.tier) == t)
            })
            .collect();
        for s in sealed {
            if let Some(slot) = self.slot_mut(s) {
                slot.sealed = false;
            }
            self.maybe_queue_seal(s);
        }
    }

    /// A tier for an object with no disk pages yet: the first with room below its high
    /// watermark, else the first that can make room by evicting.
    fn choose_tier(&mut self, id: ObjectId, index: u32, len: u64, force: bool) -> Option<usize> {
        for d in &mut self.disks {
            d.refresh_quota(false);
        }
        let high = self.high;
        let free = self
            .disks
            .iter()
            .position(|d| len <= d.quota && d.used + len <= mark(d.quota, high));
        if free.is_some() {
            return free;
        }
        (0..self.disks.len())
            .find(|&t| self.disk_admits(t, id, index, len, force) && self.disk_make_room(t, len))
    }

    /// Whether tier `t` takes `len` more bytes of page `index` of `id`: at once below its
    /// high watermark or when `force`d, else as its admission decides.
    fn disk_admits(&mut self, t: usize, id: ObjectId, index: u32, len: u64, force: bool) -> bool {
        let d = &self.disks[t];
        force || d.used + len <= mark(d.quota, self.high) || self.admits(Some(t), id, index)
    }

    /// Reserves a disk page for page `index` of `id` (admitted regardless if `force`).
    fn disk_reserve(
        &mut self,
        id: ObjectId,
        size: u64,
        index: u32,
        crc: u32,
        force: bool,
    ) -> Option<Reservation> {
        if self.disks.is_empty() {
            return None;
        }
        let len = page_len(u64::from(index), size, self.page_size)?;
        let current = self
            .lookup(id)
            .and_then(|s| self.slot(s).map(|slot| (s, slot.tier)));
        let t = match current {
            Some((s, tier)) if tier != NO_TIER => {
                let t = usize::from(tier);
                if self.disks[t].pages.contains_key(&pkey(s, index))
                    || !self.disk_admits(t, id, index, len, force)
                    || !self.disk_make_room(t, len)
                {
                    return None;
                }
                t
            }
            _ => self.choose_tier(id, index, len, force)?,
        };
        // Eviction may have released the slot or emptied the object's tier.
        let s = self.ensure_slot(id, size)?;
        let tier = self.slot(s)?.tier;
        let key = pkey(s, index);
        // The handle is taken here, under the lock: it is the file the index describes.
        let file = if tier == NO_TIER {
            match self.disks[t].create_data_file(id, size) {
                Ok(f) => f,
                Err(e) => {
                    silt_common::warn_limited!(
                        per: t,
                        "cannot create a cache data file",
                        tier = %self.disks[t].name,
                        object = %id,
                        error = %e
                    );
                    self.release_if_empty(s);
                    return None;
                }
            }
        } else if usize::from(tier) != t || self.disks[t].pages.contains_key(&key) {
            return None;
        } else {
            match self.disks[t].data_file(id) {
                Ok(f) => f,
                Err(e) => {
                    silt_common::warn_limited!(
                        per: t,
                        "cannot open a cache data file",
                        tier = %self.disks[t].name,
                        object = %id,
                        error = %e
                    );
                    return None;
                }
            }
        };
        let slot = self.slot_mut(s)?;
        slot.tier = t as u8;
        slot.disk_pages += 1;
        slot.pending += 1;
        let gen = slot.gen;
        let disk = &mut self.disks[t];
        disk.pages.insert(
            key,
            DiskPage {
                crc,
                handle: PENDING,
            },
        );
        disk.used += len;
        Some(Reservation {
            tier: t,
            slot: s,
            gen,
            index,
            path: disk.data_path(id),
            file,
            offset: u64::from(index) * self.page_size,
        })
    }

    /// The pending page of `r` if the reservation is still current.
    fn reserved(&self, r: &Reservation) -> Option<(PolicyKey, DiskPage, ObjectId, u64)> {
        let slot = self.slot(r.slot).filter(|s| s.gen == r.gen)?;
        let key = pkey(r.slot, r.index);
        let page = *self.disks[r.tier].pages.get(&key)?;
        (page.handle == PENDING).then_some((key, page, slot.id, slot.size))
    }

    fn disk_commit(&mut self, r: &Reservation) {
        // Gone: removed (remove_object) while we wrote; nothing to commit.
        let Some((key, page, id, size)) = self.reserved(r) else {
            return;
        };
        let t = r.tier;
        if let Err(e) = self.disks[t].journal_put(id, r.index, page.crc, size) {
            silt_common::warn_limited!(
                per: t,
                "cannot append to the cache journal; page not cached",
                tier = %self.disks[t].name,
                error = %e
            );
            self.disk_remove(t, key, Removal::Abort);
            return;
        }
        match self.disks[t].policy.on_insert(key) {
            Some(h) => {
                if let Some(p) = self.disks[t].pages.get_mut(&key) {
                    p.handle = h;
                }
                if let Some(slot) = self.slot_mut(r.slot) {
                    slot.pending = slot.pending.saturating_sub(1);
                }
                self.maybe_queue_seal(r.slot);
            }
            None => {
                self.disk_remove(t, key, Removal::Drop);
            }
        }
        self.maybe_compact(t);
    }

    fn disk_abort(&mut self, r: &Reservation) {
        if let Some((key, ..)) = self.reserved(r) {
            self.disk_remove(r.tier, key, Removal::Abort);
        }
    }

    fn lookup_for_get(&mut self, key: &PageKey) -> Lookup {
        let (Ok(index), Some(s)) = (u32::try_from(key.index), self.lookup(key.object)) else {
            return Lookup::Miss;
        };
        let k = pkey(s, index);
        if let Some(p) = self.mem.pages.get(&k) {
            let (data, h) = (p.data.clone(), p.handle);
            self.mem.policy.on_access(h, k);
            self.count_hit();
            return Lookup::Memory(data);
        }
        let Some(slot) = self.slot(s) else {
            return Lookup::Miss;
        };
        if slot.tier == NO_TIER {
            return Lookup::Miss;
        }
        let (t, gen, size) = (usize::from(slot.tier), slot.gen, slot.size);
        let Some(page) = self.disks[t].pages.get(&k).copied() else {
            return Lookup::Miss;
        };
        let Some(len) = page_len(u64::from(index), size, self.page_size) else {
            return Lookup::Miss;
        };
        if page.handle == PENDING {
            return Lookup::Miss;
        }
        self.disks[t].policy.on_access(page.handle, k);
        Lookup::Disk(DiskRead {
            tier: t,
            slot: s,
            gen,
            key: k,
            crc: page.crc,
            object: key.object,
            object_size: size,
            index,
            path: self.disks[t].data_path(key.object),
            offset: u64::from(index) * self.page_size,
            len: len as usize,
        })
    }

    /// Called when a read outside the lock did not verify. Re-reads under the lock, where
    /// nothing can punch or rewrite the page, so a second mismatch is real corruption: the
    /// page is dropped and counted. `None` also when the page went away meanwhile.
    fn recheck(&mut self, r: &DiskRead) -> Option<Bytes> {
        let current = self.slot(r.slot).is_some_and(|s| s.gen == r.gen)
            && self.disks[r.tier]
                .pages
                .get(&r.key)
                .is_some_and(|p| p.handle != PENDING && p.crc == r.crc);
        if !current {
            return None;
        }
        let reason = match disk::read_page(&r.path, r.offset, r.len, self.page_size) {
            Ok(d) if crc32c::crc32c(&d) == r.crc => return Some(d),
            Ok(_) => "checksum mismatch".to_string(),
            Err(e) => e.to_string(),
        };
        silt_common::warn_limited!(
            per: r.tier,
            "cached page failed verification; dropping it",
            tier = %self.disks[r.tier].name,
            object = %r.object,
            index = r.index,
            %reason
        );
        self.counters.checksum_failures += 1;
        metrics::CHECKSUM_FAILURES.inc();
        self.disk_remove(r.tier, r.key, Removal::Drop);
        None
    }

    fn remove_object(&mut self, object: ObjectId) {
        // A page set aside for the disk tiers must not bring the version back.
        self.demoted.retain(|d| d.id != object);
        self.unread.retain(|(id, _)| *id != object);
        let Some(s) = self.lookup(object) else {
            return;
        };
        let Some(slot) = self.slot(s) else {
            return;
        };
        let (size, tier, page_size) = (slot.size, slot.tier, self.page_size);
        let pages = page_count(size, page_size);
        if tier != NO_TIER {
            let t = usize::from(tier);
            let d = &mut self.disks[t];
            for key in slot_keys(&d.pages, s, pages) {
                if let Some(p) = d.pages.remove(&key) {
                    if p.handle != PENDING {
                        d.policy.on_remove(p.handle, key);
                    }
                    let len = page_len(u64::from(key_index(key)), size, page_size).unwrap_or(0);
                    d.used = d.used.saturating_sub(len);
                }
            }
            d.journal_remove_object(object, size);
            self.unseal(t, s, false);
            let d = &mut self.disks[t];
            // Unlink, don't punch: a passthrough reader holding the file keeps whole bytes.
            d.remove_data_file(object);
            if let Some(slot) = self.slot_mut(s) {
                slot.disk_pages = 0;
                slot.pending = 0;
                slot.tier = NO_TIER;
                slot.verified = true;
                slot.sealed = false;
                slot.disk_epoch = slot.disk_epoch.wrapping_add(1);
            }
            self.maybe_compact(t);
        }
        for key in slot_keys(&self.mem.pages, s, pages) {
            self.mem_remove(key);
        }
        self.release_if_empty(s);
    }

    /// `clean`: the tier was shut down cleanly, so its pages need no read-back before
    /// passthrough (see `ObjectSlot::verified`).
    fn adopt_recovered(&mut self, t: usize, pages: Vec<RecoveredPage>, clean: bool) {
        let mut conflicts: HashMap<ObjectId, u64> = HashMap::new();
        for p in pages {
            if let Some(slot) = self.lookup(p.object).and_then(|s| self.slot(s)) {
                if slot.size != p.object_size
                    || (slot.tier != NO_TIER && usize::from(slot.tier) != t)
                {
                    // Already cached in an earlier tier: one data file per object.
                    conflicts.insert(p.object, p.object_size);
                    continue;
                }
            }
            let Some(len) = page_len(u64::from(p.index), p.object_size, self.page_size) else {
                continue;
            };
            let Some(s) = self.ensure_slot(p.object, p.object_size) else {
                continue;
            };
            let key = pkey(s, p.index);
            let d = &mut self.disks[t];
            if d.pages.contains_key(&key) {
                continue;
            }
            let Some(handle) = d.policy.on_insert(key) else {
                self.release_if_empty(s);
                continue;
            };
            d.pages.insert(key, DiskPage { crc: p.crc, handle });
            d.used += len;
            if let Some(slot) = self.slot_mut(s) {
                slot.disk_pages += 1;
                slot.tier = t as u8;
                slot.verified &= clean || p.sealed;
                slot.sealed = p.sealed;
            }
        }
        for (object, size) in conflicts {
            debug!(object = %object, tier = t, "dropping a second copy of a cached object");
            self.disks[t].journal_remove_object(object, size);
            // Its seal in this tier's journal is undone by the record (the file is unlinked).
            self.disks[t].unsealed_lazily(object);
            self.disks[t].remove_data_file(object);
        }
        // A seal covers the whole object; one whose pages were not all adopted is not sealed
        // here (its next put or removal is journaled after the seal, undoing it).
        let page_size = self.page_size;
        for slot in self.slots.iter_mut().flatten() {
            if slot.sealed && u64::from(slot.disk_pages) != page_count(slot.size, page_size) {
                slot.sealed = false;
            }
        }
    }

    /// Journals the seals of tier `t`'s recovered sealed objects again (the tier's open
    /// rewrote its journal without them), then drops a `no-seals` marker: every seal the
    /// journal holds from now on is current. No fdatasync: the bytes were synced when first
    /// sealed, or by the clean shutdown.
    fn reseal_recovered(&mut self, t: usize) {
        let page_size = self.page_size;
        for s in 0..self.slots.len() as u32 {
            let Some(slot) = self.slot(s) else { continue };
            if !slot.sealed || usize::from(slot.tier) != t {
                continue;
            }
            let (id, size) = (slot.id, slot.size);
            let crcs = self.committed_crcs(t, s, 0..page_count(size, page_size));
            let ok = crcs.is_some_and(|c| self.disks[t].journal_seal(id, size, &c).is_ok());
            if let (false, Some(slot)) = (ok, self.slot_mut(s)) {
                slot.sealed = false;
            }
        }
        if let Err(e) = self.disks[t].clear_no_seals() {
            warn!(tier = %self.disks[t].name, error = %e, "cannot remove the no-seals marker");
        }
    }

    fn tier_stats(&self) -> Vec<TierStats> {
        let mut v = vec![TierStats {
            name: "memory".to_string(),
            dir: None,
            capacity: self.mem.capacity,
            used: self.mem.used,
            pages: self.mem.pages.len() as u64,
        }];
        v.extend(self.disks.iter().map(|d| TierStats {
            name: d.name.clone(),
            dir: Some(d.dir.clone()),
            capacity: d.quota,
            used: d.used,
            pages: d.pages.len() as u64,
        }));
        v
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // Cheap once per shutdown, and keeps a clean restart from losing recent records.
        for (t, d) in self.disks.iter().enumerate() {
            // Pages recovered after a crash and never read back stay suspect: without the
            // marker, the next run verifies them before passthrough.
            let suspect = self
                .slots
                .iter()
                .flatten()
                .any(|s| usize::from(s.tier) == t && !s.verified);
            if suspect {
                continue;
            }
            if let Err(e) = d.mark_clean() {
                warn!(tier = %d.name, error = %e, "could not record a clean shutdown; pages will be re-verified");
            }
        }
    }
}

/// Objects smaller than this are not sealed: an fdatasync each (B2 caches 20,000 files) costs
/// more than reading one back after a crash of the machine. Unit tests seal everything.
const SEAL_MIN_BYTES: u64 = if cfg!(test) { 1 } else { 4 << 20 };

/// Seals the queued objects; `false` once the store is gone. The store is only held (and
/// locked) around the bookkeeping, never across the fdatasync, so dropping it is not delayed.
fn seal_queued(weak: &Weak<Shared>) -> bool {
    loop {
        let job = {
            let Some(shared) = weak.upgrade() else {
                return false;
            };
            let mut st = shared.state.lock();
            let Some(id) = st.seal_queue.pop() else {
                return true;
            };
            let page_size = st.page_size;
            let Some(s) = st.lookup(id) else { continue };
            let Some(slot) = st.slot(s) else { continue };
            let pages = page_count(slot.size, page_size);
            if slot.sealed
                || !slot.verified
                || slot.tier == NO_TIER
                || slot.pending != 0
                || u64::from(slot.disk_pages) != pages
            {
                continue;
            }
            let t = usize::from(slot.tier);
            (
                id,
                s,
                slot.gen,
                slot.disk_epoch,
                t,
                st.disks[t].data_path(id),
            )
        };
        let (id, s, gen, epoch, t, path) = job;
        // Every page was written (committed) before the object was queued.
        if let Err(e) = File::open(&path).and_then(|f| f.sync_data()) {
            debug!(object = %id, error = %e, "cannot sync a cache data file; not sealed");
            continue;
        }
        let Some(shared) = weak.upgrade() else {
            return false;
        };
        let mut st = shared.state.lock();
        let page_size = st.page_size;
        let Some(slot) = st.slot(s) else { continue };
        let pages = page_count(slot.size, page_size);
        // Changed meanwhile (a page removed, the slot reused): the sync proves nothing.
        if slot.gen != gen
            || slot.disk_epoch != epoch
            || slot.sealed
            || usize::from(slot.tier) != t
            || slot.pending != 0
            || u64::from(slot.disk_pages) != pages
        {
            continue;
        }
        let size = slot.size;
        let Some(crcs) = st.committed_crcs(t, s, 0..pages) else {
            continue;
        };
        match st.disks[t].journal_seal(id, size, &crcs) {
            Ok(()) => {
                if let Some(slot) = st.slot_mut(s) {
                    slot.sealed = true;
                }
            }
            Err(e) => {
                silt_common::warn_limited!(
                    per: t,
                    "cannot append a seal to the cache journal",
                    tier = %st.disks[t].name,
                    error = %e
                )
            }
        }
    }
}

fn validate(cfg: &PageStoreConfig) -> Result<()> {
    if cfg.page_size == 0 || cfg.page_size > u64::from(u32::MAX) {
        return Err(Error::invalid(format!(
            "page_size must be between 1 byte and 4GiB, got {}",
            cfg.page_size
        )));
    }
    let unit = 0.0..=1.0;
    if !unit.contains(&cfg.low_watermark)
        || !unit.contains(&cfg.high_watermark)
        || cfg.low_watermark > cfg.high_watermark
    {
        return Err(Error::invalid(format!(
            "watermarks must satisfy 0 <= low ({}) <= high ({}) <= 1",
            cfg.low_watermark, cfg.high_watermark
        )));
    }
    if cfg.disk_tiers.len() >= usize::from(NO_TIER) {
        return Err(Error::invalid("too many disk tiers"));
    }
    let mut dirs = HashSet::new();
    for t in &cfg.disk_tiers {
        if !dirs.insert(&t.dir) {
            return Err(Error::invalid(format!(
                "disk tier {} is listed twice",
                t.dir.display()
            )));
        }
    }
    Ok(())
}

/// The user's pins beside the first disk tier: a header line, then `OBJECT_ID_HEX START LEN`
/// for each pinned byte range.
const PINS_FILE: &str = "pins";
const PINS_HEADER: &str = "silt-pins 2\n";

/// The pins `path` holds; none if it is missing, and the readable ones (with a warning) if it
/// is damaged: a pin is a wish to keep bytes cached, never needed for correct reads.
fn load_pins(path: &std::path::Path) -> HashMap<ObjectId, HashMap<u64, u64>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot read the pins; starting without them");
            return HashMap::new();
        }
    };
    let mut lines = text.lines();
    if lines.next() != Some(PINS_HEADER.trim_end()) {
        warn!(path = %path.display(), "not a pins file; starting without pins");
        return HashMap::new();
    }
    let mut pins: HashMap<ObjectId, HashMap<u64, u64>> = HashMap::new();
    for line in lines {
        let mut fields = line.split(' ');
        let parsed = (|| {
            let id = ObjectId::from_hex(fields.next()?)?;
            let start = fields.next()?.parse::<u64>().ok()?;
            let len = fields.next()?.parse::<u64>().ok()?;
            fields.next().is_none().then_some((id, start, len))
        })();
        match parsed {
            Some((id, start, len)) => {
                pins.entry(id).or_default().insert(start, len);
            }
            None => warn!(path = %path.display(), line, "pins: line ignored"),
        }
    }
    pins
}

impl PageStore {
    /// Opens the store: creates the tier directories and recovers what the disk tiers hold.
    pub fn open(cfg: PageStoreConfig) -> Result<PageStore> {
        validate(&cfg)?;
        keep_eviction_batch(
            cfg.page_size,
            cfg.memory_capacity,
            cfg.high_watermark,
            cfg.low_watermark,
        );
        let mut st = State {
            page_size: cfg.page_size,
            high: cfg.high_watermark,
            low: cfg.low_watermark,
            objects: HashMap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            next_gen: 0,
            mem: MemTier {
                capacity: cfg.memory_capacity,
                used: 0,
                pages: HashMap::new(),
                policy: new_policy(&cfg.eviction_policy)?,
            },
            disks: Vec::with_capacity(cfg.disk_tiers.len()),
            pins: HashMap::new(),
            preferred: HashMap::new(),
            user_pins: cfg
                .disk_tiers
                .first()
                .map(|d| load_pins(&d.dir.join(PINS_FILE)))
                .unwrap_or_default(),
            pins_file: cfg.disk_tiers.first().map(|d| d.dir.join(PINS_FILE)),
            demoted: Vec::new(),
            unread: HashSet::new(),
            // Sized for pages of 1/16 of the page size (64 KiB of 1 MiB) on average: small
            // files make many short pages.
            sketch: FrequencySketch::new(
                (cfg.memory_capacity + cfg.disk_tiers.iter().map(|d| d.quota).sum::<u64>())
                    / (cfg.page_size / 16).max(256),
            ),
            counters: Counters::default(),
            seal_queue: Vec::new(),
            sealer: None,
            stamps: HashMap::new(),
            settle: STAMP_SETTLE,
        };
        for (t, spec) in cfg.disk_tiers.iter().enumerate() {
            let (tier, recovered, clean) = DiskTier::open(
                format!("disk{t}"),
                &spec.dir,
                spec.quota,
                cfg.page_size,
                new_policy(&cfg.eviction_policy)?,
            )?;
            st.disks.push(tier);
            st.adopt_recovered(t, recovered, clean);
            st.reseal_recovered(t);
            // A quota lowered since the last run: evict down to the low watermark now.
            st.disk_make_room(t, 0);
        }
        let has_disks = !st.disks.is_empty();
        if has_disks {
            // Fetches checksum each page as they fill it, for the disk tier's crc.
            if let Some(pool) = page_pool(cfg.page_size) {
                pool.want_checksums();
            }
        }
        // Unit tests seal explicitly (`seal_completed`) so their crash cases are deterministic.
        let (tx, rx) = mpsc::channel();
        if has_disks && !cfg!(test) {
            st.sealer = Some(tx);
        }
        let shared = Arc::new(Shared {
            has_disks,
            direct_io: (0..st.disks.len())
                .map(|_| AtomicBool::new(cfg.disk_direct_io))
                .collect(),
            state: Mutex::new(st),
            page_size: cfg.page_size,
            write_turns: std::array::from_fn(|_| Mutex::new(())),
        });
        if shared.state.lock().sealer.is_some() {
            let weak = Arc::downgrade(&shared);
            let spawned = std::thread::Builder::new()
                .name("silt-cache-seal".into())
                .spawn(move || {
                    // Ends when the store is dropped (the sender goes with it).
                    while rx.recv().is_ok() {
                        if !seal_queued(&weak) {
                            break;
                        }
                    }
                });
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start the cache sealer; a crash restart will verify cached files");
                shared.state.lock().sealer = None;
            }
        }
        Ok(PageStore { shared })
    }

    /// Seals, on the calling thread, every complete object queued for it: fdatasync of its
    /// data file, then a seal record in the journal. A background thread does this in
    /// running stores; tests call it to seal at a known point.
    pub fn seal_completed(&self) {
        seal_queued(&Arc::downgrade(&self.shared));
    }

    pub fn page_size(&self) -> u64 {
        self.shared.page_size
    }

    /// The page's bytes, from memory or else from disk (checksum verified; a page that fails
    /// is dropped, counted, and reported as a miss so the caller refetches). Disk hits are
    /// promoted into the memory tier.
    pub fn get(&self, key: &PageKey) -> Option<(Bytes, Source)> {
        self.get_counted(key, true)
    }

    /// [`PageStore::get`] for a caller that has just missed the page with `get` and looks
    /// once more before fetching it (another reader may have cached it meanwhile): not
    /// another read for admission, nor another miss. Counting it would make every miss weigh
    /// twice a hit in the frequency sketch, so each epoch's misses would displace the pages
    /// that hit.
    pub fn get_again(&self, key: &PageKey) -> Option<(Bytes, Source)> {
        self.get_counted(key, false)
    }

    fn get_counted(&self, key: &PageKey, count: bool) -> Option<(Bytes, Source)> {
        let read = {
            let mut st = self.shared.state.lock();
            if count {
                st.record_read(key.object, key.index);
            }
            match st.lookup_for_get(key) {
                Lookup::Memory(data) => return Some((data, Source::Memory)),
                Lookup::Miss => {
                    if count {
                        st.counters.misses += 1;
                    }
                    return None;
                }
                Lookup::Disk(r) => r,
            }
        };
        let verified = match disk::read_page(&read.path, read.offset, read.len, self.page_size()) {
            Ok(d) if crc32c::crc32c(&d) == read.crc => Some(d),
            _ => None,
        };
        let mut st = self.shared.state.lock();
        let data = match verified.or_else(|| st.recheck(&read)) {
            Some(d) => d,
            None => {
                st.counters.misses += 1;
                return None;
            }
        };
        st.count_hit();
        st.mem_put(read.object, read.object_size, read.index, &data);
        drop(st);
        self.write_demoted();
        Some((data, Source::Disk(read.tier)))
    }

    /// Whether the page is cached in any tier (not verified; counts nothing).
    pub fn contains(&self, key: &PageKey) -> bool {
        let st = self.shared.state.lock();
        let (Ok(index), Some(s)) = (u32::try_from(key.index), st.lookup(key.object)) else {
            return false;
        };
        let k = pkey(s, index);
        if st.mem.pages.contains_key(&k) {
            return true;
        }
        st.slot(s)
            .filter(|slot| slot.tier != NO_TIER)
            .and_then(|slot| st.disks[usize::from(slot.tier)].pages.get(&k))
            .is_some_and(|p| p.handle != PENDING)
    }

    /// Caches a page: in the memory tier and in a disk tier with room (the object's tier if
    /// it has pages on disk already), evicting per the watermarks. A page that fits no tier
    /// is not cached; a failing disk write is logged and the page stays uncached there.
    /// Errors only for a page that does not belong to an object of `object_size` bytes.
    pub fn put(&self, key: PageKey, data: Bytes, object_size: u64) -> Result<()> {
        self.put_page(key, data, object_size, false)
    }

    /// [`PageStore::put`] of a page fetched ahead of a read that has not asked for it yet
    /// (read-ahead, a prefetch): admitted as any put, but until that read comes, memory does
    /// not drop it: evicted from memory, it goes to a disk tier regardless of its admission
    /// (see `State::unread`).
    pub fn put_prefetched(&self, key: PageKey, data: Bytes, object_size: u64) -> Result<()> {
        self.put_page(key, data, object_size, true)
    }

    fn put_page(
        &self,
        key: PageKey,
        data: Bytes,
        object_size: u64,
        prefetched: bool,
    ) -> Result<()> {
        let ps = self.page_size();
        let Some(len) = page_len(key.index, object_size, ps) else {
            return Err(Error::invalid(format!(
                "page {} is beyond the end of object {} ({object_size} bytes)",
                key.index, key.object
            )));
        };
        if data.len() as u64 != len {
            return Err(Error::invalid(format!(
                "page {} of object {} must be {len} bytes, got {}",
                key.index,
                key.object,
                data.len()
            )));
        }
        let Ok(index) = u32::try_from(key.index) else {
            // More pages than the index can address: simply not cached.
            return Ok(());
        };
        // Checksummed before taking the lock: only disk tiers need it. A fetched page's was
        // taken when it was filled (`bufpool::known_crc`).
        let crc = self.shared.has_disks.then(|| page_crc(&data));
        let reservation = {
            let mut st = self.shared.state.lock();
            if let Some(slot) = st.lookup(key.object).and_then(|s| st.slot(s)) {
                if slot.size != object_size {
                    return Err(Error::invalid(format!(
                        "object {} is cached with size {}, not {object_size}",
                        key.object, slot.size
                    )));
                }
            }
            st.mem_put(key.object, object_size, index, &data);
            if prefetched && st.unread.len() < MAX_UNREAD {
                st.unread.insert((key.object, index));
            }
            crc.and_then(|crc| st.disk_reserve(key.object, object_size, index, crc, false))
        };
        if let Some(r) = reservation {
            self.write_reserved(&r, &data);
        }
        self.write_demoted();
        Ok(())
    }

    /// Writes a reserved disk page and commits it (or gives the reservation up).
    fn write_reserved(&self, r: &Reservation, data: &[u8]) {
        let written = {
            let _turn = self.shared.write_turns[r.slot as usize % WRITE_STRIPES].lock();
            disk::write_page(&r.file, r.offset, data, &self.shared.direct_io[r.tier])
        };
        let mut st = self.shared.state.lock();
        match written {
            Ok(()) => st.disk_commit(r),
            Err(e) => {
                silt_common::warn_limited!(
                    per: r.tier,
                    "cannot write a cache page",
                    path = %r.path.display(),
                    error = %e
                );
                st.disk_abort(r);
            }
        }
    }

    /// Offers the disk tiers the pages memory evicted that no disk tier held (see
    /// `State::demoted`); each is admitted or not as any put is.
    fn write_demoted(&self) {
        if !self.shared.has_disks {
            return;
        }
        let pages = std::mem::take(&mut self.shared.state.lock().demoted);
        for d in pages {
            let crc = page_crc(&d.data);
            let reservation = self
                .shared
                .state
                .lock()
                .disk_reserve(d.id, d.size, d.index, crc, d.unread);
            if let Some(r) = reservation {
                self.write_reserved(&r, &d.data);
            }
        }
    }

    /// `Some(file)` iff every page of the object is in one disk tier's data file and every
    /// byte of it is verified: `file` is open on a regular local file whose bytes
    /// `[0, object_size)` are exactly the object (for FUSE passthrough, or a worker's lease).
    ///
    /// The file is read back and each page checked against its crc32c unless its `fstat`
    /// (inode, size, mtime, ctime) is what it was at the last such check in this process, made long enough
    /// after its last change that a later one would move its ctime: a file altered on disk
    /// (by anyone but the store) is read back again, and a page that fails is dropped, so the
    /// object is not complete until refetched. The unchanged case costs one `open` + `fstat`.
    ///
    /// The caller reads the file outside the store, so a complete file counts as a read of
    /// each of its pages (for admission and recency).
    ///
    /// Pin the object ([`PageStore::pin`]) before calling this and keep the guard while the
    /// file is in use, or eviction may punch holes into it.
    pub fn complete_file(&self, object: ObjectId, object_size: u64) -> Option<CompleteFile> {
        let ps = self.page_size();
        let pages = page_count(object_size, ps);
        let (t, s, gen, epoch, path, stamp, settle) = {
            let mut st = self.shared.state.lock();
            let (s, slot, t) = st.on_disk(object, object_size)?;
            // A pending page is not on disk yet (its bytes may still be a hole).
            if slot.pending != 0 || u64::from(slot.disk_pages) != pages {
                return None;
            }
            let stamp = st.stamps.get(&s).copied();
            let path = st.disks[t].data_path(object);
            let (gen, epoch) = (slot.gen, slot.disk_epoch);
            st.file_read(t, s, object, pages);
            (t, s, gen, epoch, path, stamp, st.settle)
        };
        let taken = std::time::SystemTime::now();
        let file = File::open(&path).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() != object_size {
            return None;
        }
        let seen = FileStamp::of(&meta, gen, epoch);
        let done = CompleteFile {
            file,
            path,
            object,
            object_size,
            seen,
            settled: seen.settled(taken, settle),
        };
        if stamp == Some(seen) {
            return Some(done);
        }
        // No stamp (the first lease since this process started, whatever the journal says of
        // the pages: a change made while Silt was stopped leaves no trace a restart can see)
        // or a changed one: every page is read back first.
        let crcs = self.shared.state.lock().committed_crcs(t, s, 0..pages)?;
        let mut buf = vec![0u8; usize::try_from(ps).ok()?];
        for (i, &crc) in crcs.iter().enumerate() {
            let index = u32::try_from(i).ok()?;
            let offset = u64::from(index) * ps;
            let len = usize::try_from(page_len(u64::from(index), object_size, ps)?).ok()?;
            let page = &mut buf[..len];
            if done.file.read_exact_at(page, offset).is_ok() && crc32c::crc32c(page) == crc {
                continue;
            }
            let r = DiskRead {
                tier: t,
                slot: s,
                gen,
                key: pkey(s, index),
                crc,
                object,
                object_size,
                index,
                path: done.path.clone(),
                offset,
                len,
            };
            // Not a race with a page being rewritten (the file is whole and pinned): the
            // bytes on disk are not what was written.
            self.shared.state.lock().recheck(&r)?;
        }
        let mut st = self.shared.state.lock();
        let slot = st.slot_mut(s)?;
        if slot.gen != gen || slot.disk_epoch != epoch {
            return None;
        }
        slot.verified = true;
        if done.settled {
            st.stamps.insert(s, seen);
        } else {
            st.stamps.remove(&s);
        }
        st.maybe_queue_seal(s);
        Some(done)
    }

    /// Whether `copy` (a private copy of `cf.file` made after `complete_file` returned it)
    /// holds the object's verified bytes: yes if the source has not changed since it was
    /// verified (its `fstat` is the same and was settled), else `copy` is read back and checked
    /// page by page.
    pub fn copy_verified(&self, cf: &CompleteFile, copy: &File) -> bool {
        let unchanged = cf.settled
            && cf
                .file
                .metadata()
                .ok()
                .is_some_and(|m| FileStamp::of(&m, cf.seen.gen, cf.seen.epoch) == cf.seen);
        if unchanged {
            return true;
        }
        let ps = self.page_size();
        let pages = page_count(cf.object_size, ps);
        let crcs = {
            let st = self.shared.state.lock();
            let Some((s, slot, t)) = st.on_disk(cf.object, cf.object_size) else {
                return false;
            };
            if slot.gen != cf.seen.gen || slot.disk_epoch != cf.seen.epoch {
                return false;
            }
            match st.committed_crcs(t, s, 0..pages) {
                Some(c) => c,
                None => return false,
            }
        };
        let Ok(cap) = usize::try_from(ps) else {
            return false;
        };
        let mut buf = vec![0u8; cap];
        crcs.iter().enumerate().all(|(i, &crc)| {
            let offset = i as u64 * ps;
            let len = page_len(i as u64, cf.object_size, ps)
                .and_then(|l| usize::try_from(l).ok())
                .unwrap_or(0);
            let page = &mut buf[..len.min(cap)];
            copy.read_exact_at(page, offset).is_ok() && crc32c::crc32c(page) == crc
        })
    }

    /// `Some((path, crcs))` iff pages `first..=last` of the object are all in one disk tier's
    /// data file and known good (written by this process or recovered after a clean shutdown):
    /// the object's bytes of those pages are at their own offsets in `path`, so a reader may
    /// `pread` them there (a same-host client, through a passed descriptor) and check each
    /// page against its crc32c in `crcs`, as `get` does. Pages recovered after a crash are not
    /// offered (`get` verifies them instead). Pin the object first.
    pub fn disk_range(
        &self,
        object: ObjectId,
        object_size: u64,
        first: u64,
        last: u64,
    ) -> Option<(PathBuf, Vec<u32>)> {
        let st = self.shared.state.lock();
        let (s, slot, t) = st.on_disk(object, object_size)?;
        if !slot.verified || first > last {
            return None;
        }
        let crcs = st.committed_crcs(t, s, first..last.checked_add(1)?)?;
        Some((st.disks[t].data_path(object), crcs))
    }

    /// Written data needs `bytes` on the file system holding `path` and found it full
    /// (`ENOSPC`): cached pages give way. Every disk tier on that file system evicts that
    /// much (pinned pages stay), and its quota follows the free space left, so it does not
    /// fill the room again. Whether anything was evicted.
    pub fn reclaim_near(&self, path: &Path, bytes: u64) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(dev) = std::fs::metadata(path).map(|m| m.dev()) else {
            return false;
        };
        let mut st = self.shared.state.lock();
        let mut evicted = false;
        for t in 0..st.disks.len() {
            if std::fs::metadata(&st.disks[t].dir).map(|m| m.dev()).ok() != Some(dev) {
                continue;
            }
            let before = st.disks[t].used;
            st.disk_evict_to(t, before.saturating_sub(bytes));
            evicted |= st.disks[t].used < before;
            st.disks[t].refresh_quota(true);
            let quota = st.disks[t].quota;
            if st.disks[t].used > quota {
                st.disk_evict_to(t, quota);
            }
        }
        if evicted {
            info!(path = %path.display(), bytes, "cached pages evicted to make room for written data");
        }
        evicted
    }

    /// While the returned guard (or any other for the object) lives, no disk page of the
    /// object is evicted. Explicit removal (`remove_object`, a failed checksum) still works.
    pub fn pin(&self, object: ObjectId) -> PinGuard {
        PinGuard::take(&self.shared, object, |st| &mut st.pins)
    }

    /// Pins the byte ranges `(id, range)` of objects until [`PageStore::unpin_user`]: their
    /// disk pages are never evicted and always admitted. Refused, pinning nothing, when the
    /// pinned total would pass the disk tiers' high watermarks (or there is no disk tier):
    /// then eviction could not keep its quotas. A range already pinned is not counted twice;
    /// a cluster worker pins each placement group of an object it owns as its own range.
    pub fn pin_user(&self, parts: &[(ObjectId, std::ops::Range<u64>)]) -> Result<()> {
        let mut st = self.shared.state.lock();
        let room: u64 = st.disks.iter().map(|d| mark(d.quota, st.high)).sum();
        let mut new: HashMap<(ObjectId, u64), u64> = HashMap::new();
        for (id, r) in parts {
            if !st
                .user_pins
                .get(id)
                .is_some_and(|p| p.contains_key(&r.start))
            {
                new.insert((*id, r.start), r.end.saturating_sub(r.start));
            }
        }
        let adding: u64 = new.values().sum();
        let pinned = st.pinned_bytes();
        if pinned + adding > room {
            return Err(Error::invalid(format!(
                "pinning {adding} more bytes would pin {} in all, more than the disk tiers \
                 can hold ({room} bytes up to their high watermarks); unpin something or \
                 pin less",
                pinned + adding
            )));
        }
        for ((id, start), len) in new {
            st.user_pins.entry(id).or_default().insert(start, len);
        }
        st.save_pins();
        Ok(())
    }

    /// Unpins the objects; how many were pinned.
    pub fn unpin_user(&self, objects: &[ObjectId]) -> usize {
        let mut st = self.shared.state.lock();
        let n = objects
            .iter()
            .filter(|id| st.user_pins.remove(id).is_some())
            .count();
        if n > 0 {
            st.save_pins();
        }
        n
    }

    /// Whether the user pinned the object (any range of it).
    pub fn is_user_pinned(&self, object: ObjectId) -> bool {
        self.shared.state.lock().user_pins.contains_key(&object)
    }

    /// How many bytes of `range` of the object the user pinned here.
    pub fn pinned_bytes_in(&self, object: ObjectId, range: std::ops::Range<u64>) -> u64 {
        let st = self.shared.state.lock();
        st.user_pins.get(&object).map_or(0, |parts| {
            parts
                .iter()
                .map(|(&start, &len)| {
                    let end = start.saturating_add(len).min(range.end);
                    end.saturating_sub(start.max(range.start))
                })
                .sum()
        })
    }

    /// While the returned guard lives, pages of the object are cached even in a full tier
    /// whose policy would refuse them (an explicit load: the user asked for these bytes).
    pub fn prefer(&self, object: ObjectId) -> PinGuard {
        PinGuard::take(&self.shared, object, |st| &mut st.preferred)
    }

    /// Sets the memory tier's quota; lowering it evicts down to it (and to the low watermark)
    /// before returning, giving the memory back to the host.
    pub fn set_memory_capacity(&self, bytes: u64) {
        let mut st = self.shared.state.lock();
        st.mem.capacity = bytes;
        keep_eviction_batch(st.page_size, bytes, st.high, st.low);
        if st.mem.used > mark(bytes, st.high) {
            let low = mark(bytes, st.low);
            st.mem_evict_to(low);
        }
    }

    /// Drops every page of the object from every tier and deletes its data file.
    pub fn remove_object(&self, object: ObjectId) {
        let mut st = self.shared.state.lock();
        // A version gone from the cache keeps no pin (it could never be read again).
        if st.user_pins.remove(&object).is_some() {
            st.save_pins();
        }
        st.remove_object(object);
    }

    /// Whether some disk tier can take `bytes` more and stay below its low watermark (so no
    /// eviction is near, and a full tier, which hovers above it, takes nothing), at most half
    /// filled by them. False without disk tiers.
    pub fn disk_takes_unevicted(&self, bytes: u64) -> bool {
        let st = self.shared.state.lock();
        st.disks
            .iter()
            .any(|d| bytes <= d.quota / 2 && d.used.saturating_add(bytes) <= mark(d.quota, st.low))
    }

    pub fn stats(&self) -> PageStoreStats {
        let st = self.shared.state.lock();
        PageStoreStats {
            tiers: st.tier_stats(),
            hits: st.counters.hits,
            misses: st.counters.misses,
            evictions: st.counters.evictions,
            checksum_failures: st.counters.checksum_failures,
            admissions_refused: st.counters.refused,
            pinned_objects: st.user_pins.len() as u64,
            pinned_bytes: st.pinned_bytes(),
        }
    }
}

impl std::fmt::Debug for PageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageStore")
            .field("page_size", &self.page_size())
            .finish_non_exhaustive()
    }
}

/// A page's crc32c: the one taken when its buffer was filled, if it was (a fetched page),
/// else computed now.
fn page_crc(data: &[u8]) -> u32 {
    bufpool::known_crc(data).unwrap_or_else(|| crc32c::crc32c(data))
}

#[cfg(test)]
mod tests;
