//! Eviction policies: which page a full tier gives up first.
//!
//! A policy tracks compact page keys ([`PolicyKey`]) and hands out a [`Handle`] per tracked
//! key. The store keeps the handle next to its own per-page metadata, so the policy needs no
//! key → entry map of its own: that halves per-page memory compared with a policy that keys
//! everything by [`silt_common::PageKey`] (32 bytes with alignment).

use silt_common::{Error, Result};

/// Compact identity of a cached page inside one store: `(object slot << 32) | page index`.
pub type PolicyKey = u64;

/// A policy's name for one tracked key, returned by [`EvictionPolicy::on_insert`].
pub type Handle = u32;

/// Decides the eviction order of one tier. The store calls it under its index lock.
///
/// Contract (every implementation MUST keep it; the store relies on it for correctness):
///
/// - `on_insert(key)` is called once when a page enters the tier. It MUST return a handle
///   that is unique among the currently tracked keys, or `None` when the policy cannot track
///   more keys (the store then does not cache the page).
/// - `on_access(handle, key)` is called on every hit. It MUST treat the key as just used. The
///   store also calls it to step over a pinned victim, so it MUST make `victim` return a
///   different key next time when more than one key is tracked.
/// - `on_remove(handle, key)` is called when the page leaves the tier for any reason. After it
///   the policy MUST NOT return `key` from `victim` until it is inserted again.
/// - A call whose `handle` does not currently track `key` (stale or foreign) MUST be ignored
///   and MUST NOT disturb other entries.
/// - `victim()` MUST return only a key that was inserted and not removed since, with its
///   handle; it MUST NOT remove it (the caller removes the page, then calls `on_remove`). It
///   MUST return `None` exactly when no key is tracked.
/// - `for_each` MUST visit every tracked key exactly once, next victim first (used to write
///   the journal in eviction order so the order survives a restart).
/// - Pinned keys are the caller's business: the caller skips them, the policy never needs to
///   know about pins.
/// - Every operation except `for_each` SHOULD be O(1).
///
/// Admission: when a tier is full (above its high watermark), the store asks
/// `admits(incoming, victim)` with how often each of the two pages was read lately (a
/// [`FrequencySketch`] estimate, 0..=15) before evicting anything; `false` leaves the tier as
/// it is and the page uncached there. Only the last level of the hierarchy asks (the disk
/// tiers, or memory when there are none): the memory tier above disks stays a recency window,
/// so a page read ahead is still there when its reader comes.
pub trait EvictionPolicy: Send {
    /// The configuration name of the policy (`"lru"`).
    fn name(&self) -> &'static str;
    /// Whether a page read `incoming` times lately (the read that missed included) may take
    /// the place of the next victim, read `victim` times. Plain LRU: always.
    fn admits(&self, _incoming: u8, _victim: u8) -> bool {
        true
    }
    /// Whether `admits` ever refuses. Then a full tier evicts one page per admitted page
    /// (down to the high watermark) instead of down to the low watermark: a batch would
    /// make room that the next pages fill unasked, undoing the admission test.
    fn filters_admission(&self) -> bool {
        false
    }
    fn on_insert(&mut self, key: PolicyKey) -> Option<Handle>;
    fn on_access(&mut self, handle: Handle, key: PolicyKey);
    fn on_remove(&mut self, handle: Handle, key: PolicyKey);
    fn victim(&self) -> Option<(PolicyKey, Handle)>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn for_each(&self, f: &mut dyn FnMut(PolicyKey));
}

/// The policies `eviction_policy` may name.
pub const POLICIES: &[&str] = &["tinylfu", "lru"];

/// Builds the policy named in the configuration.
pub fn new_policy(name: &str) -> Result<Box<dyn EvictionPolicy>> {
    match name {
        "lru" => Ok(Box::new(LruPolicy::new())),
        "tinylfu" => Ok(Box::new(TinyLfuPolicy(LruPolicy::new()))),
        _ => Err(Error::invalid(format!(
            "eviction_policy: unknown policy {name:?} (known: {})",
            POLICIES.join(", ")
        ))),
    }
}

/// LRU order with frequency admission (TinyLFU's rule): a page replaces the next victim
/// only if it was read more often lately; a tie keeps what is cached.
///
/// What it promises (checked by the trace tests in `store/tests.rs`): a working set
/// larger than the tier, read over and over in any order, keeps a stable resident set, so
/// each pass hits in about `capacity / working set` of its reads (LRU: close to none when
/// the order changes every pass, none at all when it does not); a small set read often stays
/// resident under a scan many times the tier's size; a new working set replaces an old one
/// within a few passes (the sketch halves its counts every 10 × the pages tracked, in
/// reads). Until a tier is full everything is admitted.
pub struct TinyLfuPolicy(LruPolicy);

impl EvictionPolicy for TinyLfuPolicy {
    fn name(&self) -> &'static str {
        "tinylfu"
    }
    fn admits(&self, incoming: u8, victim: u8) -> bool {
        // `incoming` counts the read that missed; the victim's current-pass read may still
        // be to come. Comparing reads before this one keeps equals (a pass over a working
        // set, in any order) from displacing each other.
        incoming.saturating_sub(1) > victim
    }
    fn filters_admission(&self) -> bool {
        true
    }
    fn on_insert(&mut self, key: PolicyKey) -> Option<Handle> {
        self.0.on_insert(key)
    }
    fn on_access(&mut self, handle: Handle, key: PolicyKey) {
        self.0.on_access(handle, key)
    }
    fn on_remove(&mut self, handle: Handle, key: PolicyKey) {
        self.0.on_remove(handle, key)
    }
    fn victim(&self) -> Option<(PolicyKey, Handle)> {
        self.0.victim()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn for_each(&self, f: &mut dyn FnMut(PolicyKey)) {
        self.0.for_each(f)
    }
}

/// How often each page was read lately, approximately: a count-min sketch of four rows of
/// 4-bit counters (kept in bytes, saturating at 15) with conservative increments, halved
/// every `sample` increments so old popularity fades. Pages are named by a 64-bit
/// fingerprint of (object, page index), stable across slot reuse. Estimates never
/// undercount since the last halving; collisions can only overcount.
pub struct FrequencySketch {
    table: Vec<u8>,
    width_mask: u64,
    additions: u64,
    sample: u64,
}

const SKETCH_ROWS: usize = 4;
const SKETCH_MAX: u8 = 15;
const SKETCH_SEEDS: [u64; SKETCH_ROWS] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x27D4_EB2F_1656_67C5,
];

impl FrequencySketch {
    /// A sketch with room for about `pages` tracked pages (8 counters per page in each row,
    /// so the ~10 × `pages` distinct pages of one sample rarely share all four; at most 2^22
    /// per row: 16 MiB of counters). Counts are halved every 10 × the pages tracked (see
    /// [`FrequencySketch::ensure`]).
    pub fn new(pages: u64) -> FrequencySketch {
        let width = pages
            .saturating_mul(8)
            .clamp(256, 1 << 22)
            .next_power_of_two();
        FrequencySketch {
            table: vec![0; width as usize * SKETCH_ROWS],
            width_mask: width - 1,
            additions: 0,
            sample: 10 * 64,
        }
    }

    /// Follows the number of pages the tiers track: the halving period is 10 × that (a pass
    /// over the cache's contents must not halve the counts it builds), and a sketch too
    /// narrow for them is rebuilt wider (its counts start over; the store sizes it for pages of
    /// 1/16 of the page size, so this happens only for caches of still smaller files).
    pub fn ensure(&mut self, pages: u64) {
        if pages.saturating_mul(8) > self.width_mask + 1 && self.width_mask + 1 < 1 << 22 {
            *self = FrequencySketch::new(pages.next_power_of_two());
        }
        self.sample = 10 * pages.max(64);
    }

    fn slots(&self, fp: u64) -> [usize; SKETCH_ROWS] {
        let width = self.width_mask + 1;
        std::array::from_fn(|row| {
            let h = (fp ^ SKETCH_SEEDS[row]).wrapping_mul(SKETCH_SEEDS[(row + 1) % SKETCH_ROWS]);
            (row as u64 * width + ((h >> 32) & self.width_mask)) as usize
        })
    }

    /// The estimate for `fp`, 0..=15.
    pub fn estimate(&self, fp: u64) -> u8 {
        self.slots(fp)
            .iter()
            .map(|&i| self.table[i])
            .min()
            .unwrap_or(0)
    }

    /// Counts one read of `fp`.
    pub fn record(&mut self, fp: u64) {
        let slots = self.slots(fp);
        let min = slots.iter().map(|&i| self.table[i]).min().unwrap_or(0);
        if min < SKETCH_MAX {
            for i in slots {
                if self.table[i] == min {
                    self.table[i] += 1;
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.sample {
            for c in &mut self.table {
                *c >>= 1;
            }
            self.additions /= 2;
        }
    }
}

/// A page's fingerprint for the sketch: (object id, page index) mixed (splitmix64).
pub fn page_fingerprint(object: u128, index: u64) -> u64 {
    let mut x = (object as u64)
        ^ ((object >> 64) as u64).rotate_left(29)
        ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

const NIL: u32 = u32::MAX;
/// `prev` of a node on the free list; never a valid index because handles stay below it.
const FREE: u32 = u32::MAX - 1;

/// 16 bytes per tracked key.
#[derive(Clone, Copy)]
struct Node {
    key: PolicyKey,
    prev: u32,
    next: u32,
}

/// Least-recently-used order as an intrusive doubly linked list over a slab: the handle is
/// the node's slot, so every operation is O(1) with no hashing.
pub struct LruPolicy {
    nodes: Vec<Node>,
    /// Head of the free list (chained through `next`).
    free: u32,
    /// Least recently used (next victim).
    head: u32,
    /// Most recently used.
    tail: u32,
    len: usize,
}

impl Default for LruPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl LruPolicy {
    pub fn new() -> Self {
        LruPolicy {
            nodes: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    fn tracks(&self, handle: Handle, key: PolicyKey) -> bool {
        self.nodes
            .get(handle as usize)
            .is_some_and(|n| n.prev != FREE && n.key == key)
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn push_back(&mut self, i: u32) {
        let tail = self.tail;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = tail;
            n.next = NIL;
        }
        if tail == NIL {
            self.head = i;
        } else {
            self.nodes[tail as usize].next = i;
        }
        self.tail = i;
    }
}

impl EvictionPolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_insert(&mut self, key: PolicyKey) -> Option<Handle> {
        let i = if self.free != NIL {
            let i = self.free;
            self.free = self.nodes[i as usize].next;
            self.nodes[i as usize].key = key;
            i
        } else {
            let i = u32::try_from(self.nodes.len()).ok().filter(|&i| i < FREE)?;
            self.nodes.push(Node {
                key,
                prev: NIL,
                next: NIL,
            });
            i
        };
        self.push_back(i);
        self.len += 1;
        Some(i)
    }

    fn on_access(&mut self, handle: Handle, key: PolicyKey) {
        if self.tracks(handle, key) && self.tail != handle {
            self.unlink(handle);
            self.push_back(handle);
        }
    }

    fn on_remove(&mut self, handle: Handle, key: PolicyKey) {
        if !self.tracks(handle, key) {
            return;
        }
        self.unlink(handle);
        let free = self.free;
        let n = &mut self.nodes[handle as usize];
        n.prev = FREE;
        n.next = free;
        self.free = handle;
        self.len -= 1;
    }

    fn victim(&self) -> Option<(PolicyKey, Handle)> {
        (self.head != NIL).then(|| (self.nodes[self.head as usize].key, self.head))
    }

    fn len(&self) -> usize {
        self.len
    }

    fn for_each(&self, f: &mut dyn FnMut(PolicyKey)) {
        let mut i = self.head;
        while i != NIL {
            let n = &self.nodes[i as usize];
            f(n.key);
            i = n.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(p: &dyn EvictionPolicy) -> Vec<PolicyKey> {
        let mut v = Vec::new();
        p.for_each(&mut |k| v.push(k));
        v
    }

    #[test]
    fn lru_evicts_least_recently_used_first() {
        let mut p = LruPolicy::new();
        let h: Vec<_> = (0..4).map(|k| p.on_insert(k).unwrap()).collect();
        assert_eq!(p.victim(), Some((0, h[0])));
        p.on_access(h[0], 0);
        p.on_access(h[2], 2);
        assert_eq!(order(&p), vec![1, 3, 0, 2]);
        assert_eq!(p.victim().map(|v| v.0), Some(1));
        p.on_remove(h[1], 1);
        assert_eq!(p.victim().map(|v| v.0), Some(3));
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn lru_ignores_stale_handles_and_reuses_slots() {
        let mut p = LruPolicy::new();
        let a = p.on_insert(10).unwrap();
        let b = p.on_insert(11).unwrap();
        p.on_remove(a, 10);
        // Stale: removed already, or wrong key for a live handle.
        p.on_remove(a, 10);
        p.on_access(a, 10);
        p.on_remove(b, 99);
        p.on_access(12345, 11);
        assert_eq!(order(&p), vec![11]);
        let c = p.on_insert(12).unwrap();
        assert_eq!(c, a, "freed slot is reused");
        p.on_remove(a, 10); // old key, same handle: ignored
        assert_eq!(order(&p), vec![11, 12]);
        p.on_remove(b, 11);
        p.on_remove(c, 12);
        assert!(p.is_empty());
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn lru_single_entry_access_and_victim() {
        let mut p = LruPolicy::new();
        let h = p.on_insert(7).unwrap();
        p.on_access(h, 7);
        assert_eq!(p.victim(), Some((7, h)));
        p.on_remove(h, 7);
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn new_policy_knows_its_names() {
        for name in POLICIES {
            assert_eq!(new_policy(name).unwrap().name(), *name);
        }
        let e = new_policy("lfu").err().unwrap();
        assert_eq!(e.kind(), silt_common::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_sketch_counts_saturates_and_fades() {
        let mut s = FrequencySketch::new(1000);
        s.ensure(1000);
        let fps: Vec<u64> = (0..500).map(|i| page_fingerprint(7, i)).collect();
        for (i, &fp) in fps.iter().enumerate() {
            for _ in 0..(i % 5) {
                s.record(fp);
            }
        }
        // Never under the true count (only collisions could add).
        for (i, &fp) in fps.iter().enumerate() {
            assert!(s.estimate(fp) >= (i % 5) as u8, "page {i}");
        }
        let hot = page_fingerprint(8, 0);
        for _ in 0..100 {
            s.record(hot);
        }
        assert_eq!(s.estimate(hot), SKETCH_MAX);
        // 10 × 1000 more reads of other pages: the hot page's count has been halved.
        for i in 0..10_000 {
            s.record(page_fingerprint(9, i));
        }
        assert!(s.estimate(hot) <= SKETCH_MAX / 2, "{}", s.estimate(hot));
    }

    #[test]
    fn node_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 16);
    }
}
