//! Metadata cache: stat results and directory listings, trusted for `metadata_ttl`.
//!
//! A fresh listing of a directory also answers stat and lookup of its children (including
//! "no such child"), so walking a tree costs one listing per directory and no per-file HEAD.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::Entry;

type Listings = HashMap<String, (Instant, Arc<Vec<Entry>>)>;

pub struct MetaCache {
    ttl: Duration,
    stats: Mutex<HashMap<String, (Instant, Entry)>>,
    lists: Mutex<Listings>,
}

/// What the cache knows about a path.
pub enum Cached {
    Found(Entry),
    /// The parent's fresh listing has no such child.
    Missing,
    Unknown,
}

impl MetaCache {
    pub fn new(ttl: Duration) -> Self {
        MetaCache {
            ttl,
            stats: Mutex::new(HashMap::new()),
            lists: Mutex::new(HashMap::new()),
        }
    }

    fn fresh(&self, at: Instant) -> bool {
        at.elapsed() < self.ttl
    }

    pub fn stat(&self, path: &str, parent: Option<(&str, &str)>) -> Cached {
        if let Some((at, e)) = self.stats.lock().get(path) {
            if self.fresh(*at) {
                return Cached::Found(e.clone());
            }
        }
        if let Some((dir, name)) = parent {
            if let Some((at, list)) = self.lists.lock().get(dir) {
                if self.fresh(*at) {
                    return match list.binary_search_by(|e| e.name().cmp(name)) {
                        Ok(i) => Cached::Found(list[i].clone()),
                        Err(_) => Cached::Missing,
                    };
                }
            }
        }
        Cached::Unknown
    }

    pub fn put_stat(&self, entry: Entry) {
        self.stats
            .lock()
            .insert(entry.path.clone(), (Instant::now(), entry));
    }

    pub fn list(&self, dir: &str) -> Option<Arc<Vec<Entry>>> {
        match self.lists.lock().get(dir) {
            Some((at, l)) if self.fresh(*at) => Some(l.clone()),
            _ => None,
        }
    }

    /// Every entry still fresh, with the instant it was fetched (for the snapshot).
    pub fn contents(&self) -> crate::snapshot::Contents {
        let stats = self
            .stats
            .lock()
            .values()
            .filter(|(at, _)| self.fresh(*at))
            .map(|(at, e)| (*at, e.clone()))
            .collect();
        let lists = self
            .lists
            .lock()
            .iter()
            .filter(|(_, (at, _))| self.fresh(*at))
            .map(|(d, (at, l))| (*at, d.clone(), l.clone()))
            .collect();
        (stats, lists)
    }

    /// Caches a stat fetched at `at` (restored from a snapshot).
    pub fn put_stat_at(&self, at: Instant, entry: Entry) {
        self.stats.lock().insert(entry.path.clone(), (at, entry));
    }

    /// Caches a listing fetched at `at` (restored from a snapshot); sorts it by name.
    pub fn put_list_at(&self, at: Instant, dir: String, mut entries: Vec<Entry>) {
        entries.sort_by(|a, b| a.name().cmp(b.name()));
        self.lists.lock().insert(dir, (at, Arc::new(entries)));
    }

    /// Caches a listing; `entries` must be sorted by name.
    pub fn put_list(&self, dir: &str, entries: Arc<Vec<Entry>>) {
        let now = Instant::now();
        {
            // Children's stats are answered by the listing itself; drop stale per-path copies so
            // they cannot outlive it with older content.
            let mut stats = self.stats.lock();
            for e in entries.iter() {
                stats.remove(&e.path);
            }
        }
        self.lists.lock().insert(dir.to_string(), (now, entries));
    }
}
