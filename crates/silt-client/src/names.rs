//! Locks by name, and the conditions a commit can be given.
//!
//! Every commit, unlink and rename through the client holds the lock of each name it changes
//! while it changes it in the store, so a conditional commit (S3's `If-Match`,
//! `If-None-Match: *`: [`Precondition`]) is decided with no other change of that name through
//! this client in between. The locks are a fixed set of stripes: two names may share one,
//! which only makes them wait for each other. Order: a session's order lock is taken before
//! a name's, never after, and two names are locked in stripe order, so no two holders wait
//! for each other.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard};

use crate::Entry;

const STRIPES: usize = 64;

pub(crate) struct NameLocks {
    stripes: Vec<Mutex<()>>,
}

impl NameLocks {
    pub(crate) fn new() -> Self {
        NameLocks {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn stripe(&self, name: &str) -> usize {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        (h.finish() % self.stripes.len() as u64) as usize
    }

    /// Holds `name` until the guard is dropped.
    pub(crate) async fn lock(&self, name: &str) -> MutexGuard<'_, ()> {
        self.stripes[self.stripe(name)].lock().await
    }

    /// Holds both names (one lock where they share a stripe), taken in stripe order.
    pub(crate) async fn lock_two(&self, a: &str, b: &str) -> Vec<MutexGuard<'_, ()>> {
        let (x, y) = (self.stripe(a), self.stripe(b));
        let mut order = vec![x.min(y)];
        if x != y {
            order.push(x.max(y));
        }
        let mut held = Vec::with_capacity(2);
        for i in order {
            held.push(self.stripes[i].lock().await);
        }
        held
    }
}

/// What must hold of the stored file for a commit to happen (`Client::set_precondition`).
#[derive(Clone)]
pub enum Precondition {
    /// No file there (`If-None-Match: *`).
    Absent,
    /// A file there of which this says yes (`If-Match`: its ETag is one of those given).
    Matches(Arc<dyn Fn(&Entry) -> bool + Send + Sync>),
}

impl std::fmt::Debug for Precondition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precondition::Absent => "Absent",
            Precondition::Matches(_) => "Matches(..)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two names sharing a stripe are one lock (taking it twice would wait for ever), and
    /// locks of two names are always taken in one order.
    #[tokio::test]
    async fn two_names_are_locked_once_each_stripe_in_order() {
        let l = NameLocks::new();
        let a = "/data/a";
        let same = (0..10_000)
            .map(|i| format!("/data/x{i}"))
            .find(|n| l.stripe(n) == l.stripe(a))
            .expect("a name sharing a's stripe");
        assert_eq!(l.lock_two(a, &same).await.len(), 1);
        let other = (0..10_000)
            .map(|i| format!("/data/y{i}"))
            .find(|n| l.stripe(n) != l.stripe(a))
            .expect("a name on another stripe");
        let held = l.lock_two(&other, a).await;
        assert_eq!(held.len(), 2);
        // Held: a third taker of either name waits.
        assert!(l.stripes[l.stripe(a)].try_lock().is_err());
        assert!(l.stripes[l.stripe(&other)].try_lock().is_err());
        drop(held);
        assert!(l.stripes[l.stripe(a)].try_lock().is_ok());
    }
}
