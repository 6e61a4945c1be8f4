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
pub trait EvictionPolicy: Send {
    /// The configuration name of the policy (`"lru"`).
    fn name(&self) -> &'static str;
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

/// Builds the policy named in the configuration.
pub fn new_policy(name: &str) -> Result<Box<dyn EvictionPolicy>> {
    match name {
        "lru" => Ok(Box::new(LruPolicy::new())),
        _ => Err(Error::invalid(format!(
            "eviction_policy: unknown policy {name:?} (known: lru)"
        ))),
    }
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
    fn new_policy_knows_lru_only() {
        assert_eq!(new_policy("lru").unwrap().name(), "lru");
        let e = new_policy("lfu").err().unwrap();
        assert_eq!(e.kind(), silt_common::ErrorKind::InvalidInput);
    }

    #[test]
    fn node_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 16);
    }
}
