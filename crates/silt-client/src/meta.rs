//! Metadata cache: stat results, directory listings and "no such file" answers, each with the
//! instant the store gave it. Whether a record is still trusted is the caller's question (the
//! path's sync policy); the cache only stores, compares and reports what changed.
//!
//! Invariants:
//! - One lock covers every map, so a reader never sees a listing and a stat that disagree
//!   about a path learned in one update.
//! - A listing is replaced whole or not at all: a failed or partial store answer never reaches
//!   the cache (callers insert only complete results), so no directory shows up half-listed.
//! - A newer answer about one path (a HEAD) is written into the parent's cached listing too,
//!   so `stat` and `readdir` agree; the listing keeps its own age.
//! - Every update returns what changed compared with what was cached, entry by entry.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use silt_reader::ObjectRef;

use crate::namespace::parent_and_name;
use crate::Entry;
use silt_common::config::is_at_or_under;

/// What happened to a path between two answers of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    /// Type, size or content fingerprint (ETag, version id, or mtime without either): the
    /// bytes may differ; every cached page of the old version is dropped.
    Content,
    /// Only attributes outside the content fingerprint (mode, mtime next to an ETag): cached
    /// pages stay valid.
    Metadata,
    /// Dropped by `silt fs invalidate` (nothing is known about the store's state).
    Invalidated,
    /// The sync policy of this prefix changed: caches holding answers under it (the kernel's)
    /// must forget them so the new policy applies at once.
    Policy,
    /// The cached bytes were dropped on request (`silt fs free`); the store and the metadata
    /// are unchanged, so caches of the bytes (the kernel's page cache) must drop them too, and
    /// the next read is a cold one.
    Freed,
}

#[derive(Debug, Clone)]
pub struct Change {
    pub path: String,
    pub kind: ChangeKind,
    /// The version whose cached pages must go (content changes, removals, invalidations).
    pub old_object: Option<Arc<ObjectRef>>,
}

/// How two answers about one path differ, if they do.
pub fn diff(old: &Entry, new: &Entry) -> Option<ChangeKind> {
    if old.kind != new.kind {
        return Some(ChangeKind::Content);
    }
    match (&old.object, &new.object) {
        (Some(a), Some(b)) if Arc::ptr_eq(a, b) => None,
        (Some(a), Some(b)) => {
            // An object's id is a hash of its store, path and content fingerprint.
            if !new.is_dir() && a.id != b.id {
                Some(ChangeKind::Content)
            } else if a.meta.metadata_fingerprint() != b.meta.metadata_fingerprint()
                // A new name (hard link) or a device's number: attributes the kernel shows.
                || (a.meta.posix.nlink, a.meta.posix.rdev) != (b.meta.posix.nlink, b.meta.posix.rdev)
            {
                Some(ChangeKind::Metadata)
            } else {
                None
            }
        }
        // Synthetic directories come from the mount table and never change here.
        _ => None,
    }
}

fn file_object(e: &Entry) -> Option<Arc<ObjectRef>> {
    (!e.is_dir()).then(|| e.object.clone()).flatten()
}

fn change(path: &str, kind: ChangeKind, old: Option<&Entry>) -> Change {
    let old_object = match kind {
        ChangeKind::Metadata | ChangeKind::Added | ChangeKind::Policy => None,
        _ => old.and_then(file_object),
    };
    Change {
        path: path.to_string(),
        kind,
        old_object,
    }
}

/// What the cache knows about a path, judged by the caller's trust.
pub enum Lookup {
    Found(Entry),
    /// A trusted listing of the parent without it, or a trusted "no such file".
    Missing,
    /// Nothing trusted; `stale` is the last answer, if any, to fall back on when the store
    /// cannot be reached.
    Unknown {
        stale: Option<Entry>,
    },
}

#[derive(Default)]
struct Inner {
    stats: HashMap<String, (Instant, Entry)>,
    lists: HashMap<String, Listing>,
    negative: HashMap<String, Instant>,
    /// Listings kept only to compare the next answer with (`invalidate` of one of their
    /// entries): never trusted, whatever their age.
    distrusted: HashSet<String>,
}

/// A directory's complete listing, when it was fetched, and a digest of what a directory
/// reader sees of it (names and kinds), kept with it so a consumer (the FUSE kernel cache) can
/// tell at no cost whether the listing it was given is still the current one.
struct Listing {
    at: Instant,
    entries: Arc<Vec<Entry>>,
    digest: u64,
}

impl Listing {
    fn new(at: Instant, entries: Arc<Vec<Entry>>) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        entries.len().hash(&mut h);
        for e in entries.iter() {
            e.name().hash(&mut h);
            e.is_dir().hash(&mut h);
        }
        Listing {
            at,
            digest: h.finish(),
            entries,
        }
    }
}

fn find<'a>(list: &'a [Entry], name: &str) -> std::result::Result<&'a Entry, usize> {
    list.binary_search_by(|e| e.name().cmp(name))
        .map(|i| &list[i])
}

impl Inner {
    /// `entries`, a listing of `dir` asked for at `at`, corrected by answers about its children
    /// learned after `at` (a file written or removed through Silt while the listing was in
    /// flight): those are newer, and the listing must not undo them.
    /// `entries` (a listing) with what a HEAD of the same object version told about its
    /// attributes. Some stores list no attributes (S3 without `s3_list_attrs`: no user
    /// metadata, so no mode, owner or link type), while a HEAD of the same version (same
    /// ETag or version id: same object, same metadata) had them; the listing does not make
    /// them unknown again, and a link stays a link.
    fn with_known_attributes(&self, entries: Arc<Vec<Entry>>) -> Arc<Vec<Entry>> {
        let known = |e: &Entry| -> Option<Entry> {
            // Cheap tests first: a listing with attributes needs no lookup.
            if e.mode.is_some() || e.posix != Default::default() {
                return None;
            }
            // Only where a listing cannot say: elsewhere a listed `None` is the answer (the
            // object's attributes may have changed without a new version: chmod on S3
            // keeps the ETag).
            if !e.object.as_ref()?.store.capabilities().list_without_attrs {
                return None;
            }
            let old = self.current(&e.path)?;
            if e.is_dir() {
                // A directory's attributes live on its marker, which a listing does not
                // HEAD; a directory has no version to tell a change by, so what a stat or a
                // change here learned stays until the directory is asked about again.
                let old_has = old.mode.is_some() || old.posix != Default::default();
                return (old.is_dir() && old_has).then_some(old);
            }
            let old_has =
                old.mode.is_some() || old.posix != Default::default() || old.kind != e.kind;
            let (a, b) = (old.object.as_ref()?, e.object.as_ref()?);
            let same_version = a.meta.etag.is_some() || a.meta.version.is_some();
            (old_has && same_version && a.id == b.id).then_some(old)
        };
        let updates: Vec<(usize, Entry)> = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| known(e).map(|k| (i, k)))
            .collect();
        if updates.is_empty() {
            return entries;
        }
        let mut entries = entries;
        let v = Arc::make_mut(&mut entries);
        for (i, k) in updates {
            v[i] = k;
        }
        entries
    }

    fn with_newer_answers(
        &self,
        at: Instant,
        dir: &str,
        entries: Arc<Vec<Entry>>,
    ) -> Arc<Vec<Entry>> {
        let child = |p: &str| parent_and_name(p).is_some_and(|(d, _)| d == dir);
        let newer: Vec<&Entry> = self
            .stats
            .iter()
            .filter(|(p, (known, _))| *known > at && child(p))
            .map(|(_, (_, e))| e)
            .collect();
        let gone: Vec<&str> = self
            .negative
            .iter()
            .filter(|(p, known)| **known > at && child(p))
            .filter_map(|(p, _)| parent_and_name(p).map(|(_, n)| n))
            .collect();
        if newer.is_empty() && gone.is_empty() {
            return entries;
        }
        let mut entries = entries;
        let v = Arc::make_mut(&mut entries);
        for e in newer {
            match v.binary_search_by(|x| x.name().cmp(e.name())) {
                Ok(i) => v[i] = e.clone(),
                Err(i) => v.insert(i, e.clone()),
            }
        }
        for n in gone {
            if let Ok(i) = v.binary_search_by(|x| x.name().cmp(n)) {
                v.remove(i);
            }
        }
        entries
    }

    /// Whether the cache holds an answer about `path` itself asked for after `at`.
    fn newer_than(&self, path: &str, at: Instant) -> bool {
        self.stats.get(path).is_some_and(|(known, _)| *known > at)
            || self.negative.get(path).is_some_and(|known| *known > at)
    }

    /// The newest answer about `path`, trusted or not.
    fn current(&self, path: &str) -> Option<Entry> {
        let from_stat = self.stats.get(path);
        let from_list = parent_and_name(path).and_then(|(dir, name)| {
            let l = self.lists.get(dir)?;
            find(&l.entries, name).ok().map(|e| (l.at, e.clone()))
        });
        match (from_stat, from_list) {
            (Some((a, e)), Some((b, _))) if *a >= b => Some(e.clone()),
            (_, Some((_, e))) => Some(e),
            (Some((_, e)), None) => Some(e.clone()),
            (None, None) => None,
        }
    }

    /// Whether `path`'s parent has a cached listing (of any age).
    fn parent_listed(&self, path: &str) -> bool {
        parent_and_name(path).is_some_and(|(dir, _)| self.lists.contains_key(dir))
    }

    /// Writes `entry` (or its absence) into the parent's cached listing, keeping its age.
    fn patch_parent(&mut self, path: &str, entry: Option<&Entry>) {
        let Some((dir, name)) = parent_and_name(path) else {
            return;
        };
        let Some(listing) = self.lists.get_mut(dir) else {
            return;
        };
        let list = &listing.entries;
        let pos = list.binary_search_by(|x| x.name().cmp(name));
        let same_name_and_kind = match (pos, entry) {
            // The same answer again (every HEAD under `always`): nothing to copy.
            (Ok(i), Some(e)) if diff(&list[i], e).is_none() => return,
            (Err(_), None) => return,
            (Ok(i), Some(e)) => list[i].kind == e.kind,
            _ => false,
        };
        let mut v = list.as_ref().clone();
        match (pos, entry) {
            (Ok(i), Some(e)) => v[i] = e.clone(),
            (Ok(i), None) => {
                v.remove(i);
            }
            (Err(i), Some(e)) => v.insert(i, e.clone()),
            (Err(_), None) => {}
        }
        if same_name_and_kind {
            // What a directory reader sees is unchanged: so is the digest.
            listing.entries = Arc::new(v);
        } else {
            *listing = Listing::new(listing.at, Arc::new(v));
        }
    }

    /// Drops `dir`'s subtree (see `drop_below`) and reports each entry in it as `kind`.
    fn forget_below(&mut self, dir: &str, kind: ChangeKind, changes: &mut Vec<Change>) {
        for e in self.drop_below(dir) {
            changes.push(change(&e.path, kind, Some(&e)));
        }
    }

    /// Drops every record of `dir`'s subtree (not `dir`'s own stat). Returns the files dropped.
    fn drop_below(&mut self, dir: &str) -> Vec<Entry> {
        let mut gone = Vec::new();
        let below = |p: &str| p != dir && is_at_or_under(p, dir);
        self.stats.retain(|p, (_, e)| {
            let keep = !below(p);
            if !keep {
                gone.push(e.clone());
            }
            keep
        });
        self.lists.retain(|d, l| {
            if !is_at_or_under(d, dir) {
                return true;
            }
            gone.extend(l.entries.iter().cloned());
            false
        });
        self.negative.retain(|p, _| !below(p));
        gone
    }
}

pub struct MetaCache {
    inner: Mutex<Inner>,
    /// Bumped by every update (not by lookups), so a periodic snapshot is skipped when
    /// nothing changed since the last one.
    generation: std::sync::atomic::AtomicU64,
}

impl MetaCache {
    pub fn new() -> Self {
        MetaCache {
            inner: Mutex::new(Inner::default()),
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn write(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.lock()
    }

    /// How many updates the cache has had (see `generation`).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Looks `path` up. `trust(at, is_dir)` says whether a record from `at` about a directory
    /// (or not) is trusted, `trust_negative` the same for a "no such file" answer.
    pub fn stat(
        &self,
        path: &str,
        trust: impl Fn(Instant, bool) -> bool,
        trust_negative: impl Fn(Instant) -> bool,
    ) -> Lookup {
        let inner = self.inner.lock();
        if let Some((at, e)) = inner.stats.get(path) {
            if trust(*at, e.is_dir()) {
                return Lookup::Found(e.clone());
            }
        }
        if let Some(at) = inner.negative.get(path) {
            if trust_negative(*at) {
                return Lookup::Missing;
            }
        }
        if let Some((dir, name)) = parent_and_name(path) {
            if let Some(l) = inner
                .lists
                .get(dir)
                .filter(|_| !inner.distrusted.contains(dir))
            {
                match find(&l.entries, name) {
                    Ok(e) if trust(l.at, e.is_dir()) => return Lookup::Found(e.clone()),
                    Err(_) if trust(l.at, false) => return Lookup::Missing,
                    _ => {}
                }
            }
        }
        Lookup::Unknown {
            stale: inner.current(path),
        }
    }

    /// The cached listing of `dir` and whether `trust` accepts its age.
    pub fn list(
        &self,
        dir: &str,
        trust: impl Fn(Instant) -> bool,
    ) -> Option<(Arc<Vec<Entry>>, bool)> {
        let inner = self.inner.lock();
        let distrusted = inner.distrusted.contains(dir);
        inner
            .lists
            .get(dir)
            .map(|l| (l.entries.clone(), !distrusted && trust(l.at)))
    }

    /// The digest of `dir`'s cached listing (see `Listing`), if `trust` accepts its age.
    pub fn list_digest(&self, dir: &str, trust: impl Fn(Instant) -> bool) -> Option<u64> {
        let inner = self.inner.lock();
        if inner.distrusted.contains(dir) {
            return None;
        }
        inner
            .lists
            .get(dir)
            .filter(|l| trust(l.at))
            .map(|l| l.digest)
    }

    /// Records a HEAD answer asked for at `at`. An answer older than what is cached about the
    /// path is dropped (a slow request must not undo a newer one); so are the other updates.
    pub fn put_stat(&self, at: Instant, entry: Entry) -> Vec<Change> {
        let mut inner = self.write();
        let path = entry.path.clone();
        if inner.newer_than(&path, at) {
            return Vec::new();
        }
        let mut changes = Vec::new();
        match inner.current(&path) {
            Some(old) => {
                if let Some(kind) = diff(&old, &entry) {
                    changes.push(change(&path, kind, Some(&old)));
                    if kind == ChangeKind::Content && old.is_dir() {
                        inner.forget_below(&path, ChangeKind::Removed, &mut changes);
                    }
                }
            }
            // Known absent: a "no such file" answer, or a cached listing of its parent
            // without it (the listing gains it below, and whoever showed that listing, the
            // kernel's cache of a mount's directory, must read it again).
            None if inner.negative.contains_key(&path) || inner.parent_listed(&path) => {
                changes.push(change(&path, ChangeKind::Added, None))
            }
            None => {}
        }
        inner.negative.remove(&path);
        inner.patch_parent(&path, Some(&entry));
        inner.stats.insert(path, (at, entry));
        changes
    }

    /// Records a "no such file" answer for `path`.
    pub fn put_missing(&self, at: Instant, path: &str) -> Vec<Change> {
        let mut inner = self.write();
        if inner.newer_than(path, at) {
            return Vec::new();
        }
        let mut changes = Vec::new();
        if let Some(old) = inner.current(path) {
            changes.push(change(path, ChangeKind::Removed, Some(&old)));
        }
        // Whatever it was, nothing is below it now (also a listing learned without its parent's).
        inner.forget_below(path, ChangeKind::Removed, &mut changes);
        inner.stats.remove(path);
        inner.patch_parent(path, None);
        inner.negative.insert(path.to_string(), at);
        changes
    }

    /// Records a complete listing of `dir` (`entries` sorted by name).
    pub fn put_list(&self, at: Instant, dir: &str, entries: Arc<Vec<Entry>>) -> Vec<Change> {
        let mut inner = self.write();
        let mut changes = Vec::new();
        Self::put_list_locked(&mut inner, at, dir, entries, &mut changes);
        changes
    }

    fn put_list_locked(
        inner: &mut Inner,
        at: Instant,
        dir: &str,
        entries: Arc<Vec<Entry>>,
        changes: &mut Vec<Change>,
    ) {
        if inner.lists.get(dir).is_some_and(|l| l.at > at) {
            return;
        }
        let entries = inner.with_newer_answers(at, dir, entries);
        let entries = inner.with_known_attributes(entries);
        let old_list = inner.lists.get(dir).map(|l| l.entries.clone());
        let mut seen: HashSet<&str> = HashSet::with_capacity(entries.len());
        for e in entries.iter() {
            seen.insert(e.name());
            // Compare with the newest answer (a HEAD may be newer than the old listing).
            let old = inner.current(&e.path);
            match old {
                Some(old) => {
                    if let Some(kind) = diff(&old, e) {
                        changes.push(change(&e.path, kind, Some(&old)));
                        if kind == ChangeKind::Content && old.is_dir() {
                            inner.forget_below(&e.path, ChangeKind::Removed, changes);
                        }
                    }
                }
                None if old_list.is_some() || inner.negative.contains_key(&e.path) => {
                    changes.push(change(&e.path, ChangeKind::Added, None))
                }
                None => {}
            }
            // An answer newer than this listing (merged into it above) stays, so a second
            // listing older than it cannot undo it either.
            if inner
                .stats
                .get(&e.path)
                .is_none_or(|(known, _)| *known <= at)
            {
                inner.stats.remove(&e.path);
            }
            inner.negative.remove(&e.path);
        }
        // Answers about children from HEADs that the listing does not have: gone too.
        // (Names of the old listing are handled with it, below.)
        let unlisted: Vec<String> = inner
            .stats
            .keys()
            .filter(|p| {
                parent_and_name(p).is_some_and(|(d, n)| {
                    d == dir
                        && !seen.contains(n)
                        && old_list.as_ref().is_none_or(|l| find(l, n).is_err())
                })
            })
            .cloned()
            .collect();
        for p in unlisted {
            if let Some((_, old)) = inner.stats.remove(&p) {
                changes.push(change(&p, ChangeKind::Removed, Some(&old)));
                if old.is_dir() {
                    inner.forget_below(&p, ChangeKind::Removed, changes);
                }
            }
        }
        inner.distrusted.remove(dir);
        if let Some(old_list) = old_list {
            for old in old_list.iter().filter(|o| !seen.contains(o.name())) {
                changes.push(change(&old.path, ChangeKind::Removed, Some(old)));
                inner.stats.remove(&old.path);
                if old.is_dir() {
                    inner.forget_below(&old.path, ChangeKind::Removed, changes);
                }
            }
        }
        inner
            .lists
            .insert(dir.to_string(), Listing::new(at, entries));
    }

    /// Records a whole tree from one recursive listing of `root`: every directory's complete
    /// listing. Cached listings below `root` that the tree does not have are gone from the
    /// store, and are dropped. Applied under one lock: readers see the old tree or the new.
    /// `keep(dir, at)`: a listing already cached that the caller still trusts stays as it is
    /// (a sweep fills what is missing or expired; it does not undo answers a `never` path has
    /// learned). `sync` keeps nothing.
    pub fn put_tree(
        &self,
        at: Instant,
        root: &str,
        tree: Vec<(String, Arc<Vec<Entry>>)>,
        keep: impl Fn(&str, Instant) -> bool,
    ) -> Vec<Change> {
        let mut inner = self.write();
        let mut changes = Vec::new();
        let kept: HashSet<String> = tree
            .iter()
            .filter(|(d, _)| {
                !inner.distrusted.contains(d) && inner.lists.get(d).is_some_and(|l| keep(d, l.at))
            })
            .map(|(d, _)| d.clone())
            .collect();
        let tree: Vec<_> = tree
            .into_iter()
            .filter(|(d, _)| !kept.contains(d))
            .collect();
        let dirs: HashSet<&str> = tree
            .iter()
            .map(|(d, _)| d.as_str())
            .chain(kept.iter().map(String::as_str))
            .collect();
        let vanished: Vec<String> = inner
            .lists
            .keys()
            .filter(|d| is_at_or_under(d, root) && !dirs.contains(d.as_str()))
            .cloned()
            .collect();
        // Parents first, so a vanished subtree is reported through its parent's listing.
        let mut tree = tree;
        tree.sort_by(|a, b| a.0.cmp(&b.0));
        for (dir, entries) in tree {
            Self::put_list_locked(&mut inner, at, &dir, entries, &mut changes);
        }
        for d in vanished {
            // Not reported through a parent's listing (none was cached): report it here.
            if let Some(l) = inner.lists.remove(&d) {
                for e in l.entries.iter() {
                    changes.push(change(&e.path, ChangeKind::Removed, Some(e)));
                    inner.stats.remove(&e.path);
                }
            }
        }
        changes
    }

    /// Drops everything known about `path` and below, and `path` from its parent's listing,
    /// which is then no longer trusted. Returns what was dropped, for data and kernel
    /// invalidation.
    pub fn invalidate(&self, path: &str) -> Vec<Change> {
        let mut inner = self.write();
        let mut changes = Vec::new();
        if let Some(e) = inner.current(path) {
            changes.push(change(path, ChangeKind::Invalidated, Some(&e)));
        }
        inner.forget_below(path, ChangeKind::Invalidated, &mut changes);
        inner.stats.remove(path);
        inner.negative.remove(path);
        inner.lists.remove(path);
        inner.distrusted.remove(path);
        // The parent's listing loses `path` and is asked again on the next access, but is kept
        // to compare with, so a change to a sibling is still noticed (and its pages dropped).
        inner.patch_parent(path, None);
        if let Some((dir, _)) = parent_and_name(path) {
            if inner.lists.contains_key(dir) {
                inner.distrusted.insert(dir.to_string());
            }
        }
        changes
    }

    /// Every record `keep(path, at)` accepts, with the instant it was fetched (for the snapshot).
    pub fn contents(&self, keep: impl Fn(&str, Instant) -> bool) -> crate::snapshot::Contents {
        let inner = self.inner.lock();
        let stats = inner
            .stats
            .iter()
            .filter(|(p, (at, _))| keep(p, *at))
            .map(|(_, (at, e))| (*at, e.clone()))
            .collect();
        let lists = inner
            .lists
            .iter()
            .filter(|(d, l)| keep(d, l.at))
            .map(|(d, l)| (l.at, d.clone(), l.entries.clone()))
            .collect();
        (stats, lists)
    }

    /// Caches a stat fetched at `at` (restored from a snapshot).
    pub fn put_stat_at(&self, at: Instant, entry: Entry) {
        self.write().stats.insert(entry.path.clone(), (at, entry));
    }

    /// Caches a listing fetched at `at` (restored from a snapshot); sorts it by name.
    pub fn put_list_at(&self, at: Instant, dir: String, mut entries: Vec<Entry>) {
        entries.sort_by(|a, b| a.name().cmp(b.name()));
        self.write()
            .lists
            .insert(dir, Listing::new(at, Arc::new(entries)));
    }

    /// Numbers of cached stats, listings and negative entries.
    pub fn sizes(&self) -> (usize, usize, usize) {
        let i = self.inner.lock();
        (i.stats.len(), i.lists.len(), i.negative.len())
    }

    /// When `path` (or its parent's listing, for a child) was last answered by the store.
    pub fn checked_at(&self, path: &str) -> Option<Instant> {
        Self::checked_at_locked(&self.inner.lock(), path)
    }

    fn checked_at_locked(inner: &Inner, path: &str) -> Option<Instant> {
        let own = inner.stats.get(path).map(|(at, _)| *at);
        let listed = parent_and_name(path).and_then(|(d, _)| inner.lists.get(d).map(|l| l.at));
        own.max(listed)
    }

    /// The oldest answer a view of `path` rests on: `checked_at`, and with `with_listing` also
    /// its own listing (a directory's contents).
    pub fn answered_at(&self, path: &str, with_listing: bool) -> Option<Instant> {
        let inner = self.inner.lock();
        let own = Self::checked_at_locked(&inner, path);
        let listed = with_listing
            .then(|| inner.lists.get(path).map(|l| l.at))
            .flatten();
        match (own, listed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Age of an instant under `now` (zero for instants in the future).
pub fn age(now: Instant, at: Instant) -> Duration {
    now.saturating_duration_since(at)
}

/// A directory tree assembled from one recursive listing: every directory below (and
/// including) `root`, with its complete, sorted listing. Directories appear as entries of the
/// listing (explicit) or only through the paths below them (object stores have key prefixes,
/// not directories); `dir_entry` makes the entry of an implied one.
pub fn build_tree(
    root: &str,
    entries: Vec<Entry>,
    dir_entry: impl Fn(&str) -> Entry,
) -> Vec<(String, Arc<Vec<Entry>>)> {
    let inside = |p: &str| p != root && is_at_or_under(p, root);
    let (dirs, files): (Vec<Entry>, Vec<Entry>) = entries
        .into_iter()
        .filter(|e| inside(&e.path))
        .partition(|e| e.is_dir());
    let mut explicit: HashMap<String, Entry> =
        dirs.into_iter().map(|d| (d.path.clone(), d)).collect();
    let mut lists: HashMap<String, Vec<Entry>> = HashMap::new();
    lists.insert(root.to_string(), Vec::new());
    // Adds directory `d` and its missing ancestors, each to its parent's listing.
    fn add_dir(
        d: &str,
        lists: &mut HashMap<String, Vec<Entry>>,
        explicit: &mut HashMap<String, Entry>,
        dir_entry: &dyn Fn(&str) -> Entry,
    ) {
        let mut missing = Vec::new();
        let mut p = d;
        while !lists.contains_key(p) {
            missing.push(p.to_string());
            match parent_and_name(p) {
                Some((parent, _)) => p = parent,
                None => break,
            }
        }
        for d in missing.into_iter().rev() {
            let e = explicit.remove(&d).unwrap_or_else(|| dir_entry(&d));
            if let Some((parent, _)) = parent_and_name(&d) {
                lists.entry(parent.to_string()).or_default().push(e);
            }
            lists.insert(d, Vec::new());
        }
    }
    for f in files {
        if let Some((parent, _)) = parent_and_name(&f.path) {
            let parent = parent.to_string();
            add_dir(&parent, &mut lists, &mut explicit, &dir_entry);
            lists.entry(parent).or_default().push(f);
        }
    }
    let empty: Vec<String> = explicit.keys().cloned().collect();
    for d in empty {
        add_dir(&d, &mut lists, &mut explicit, &dir_entry);
    }
    lists
        .into_iter()
        .map(|(d, mut l)| {
            l.sort_by(|a, b| a.name().cmp(b.name()));
            l.dedup_by(|a, b| a.name() == b.name());
            (d, Arc::new(l))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_ufs::EntryKind;

    fn e(path: &str, dir: bool) -> Entry {
        Entry {
            path: path.to_string(),
            kind: if dir { EntryKind::Dir } else { EntryKind::File },
            size: 0,
            mtime: None,
            mode: if dir { Some(0o755) } else { None },
            posix: Default::default(),
            object: None,
        }
    }

    #[test]
    fn a_listing_without_attributes_keeps_what_a_head_of_the_same_version_said() {
        let bare = silt_ufs::Capabilities {
            list_without_attrs: true,
            ..silt_ufs::UnderStore::capabilities(&silt_ufs::MemStore::new("mem://x"))
        };
        let store: silt_ufs::DynStore =
            Arc::new(silt_ufs::MemStore::new("mem://attrs").with_capabilities(bare));
        let meta = |kind, etag: &str, mode: Option<u32>, uid: Option<u32>| silt_ufs::ObjectMeta {
            path: "d/l".into(),
            kind,
            size: 4,
            mtime: None,
            etag: Some(etag.into()),
            version: None,
            mode,
            posix: silt_ufs::Posix {
                uid,
                ..Default::default()
            },
        };
        let entry = |m| Entry::from_meta("/m/d/l".into(), &store, m);
        let headed = entry(meta(EntryKind::Symlink, "e1", Some(0o777), Some(1000)));
        let listed = entry(meta(EntryKind::File, "e1", None, None));
        let c = MetaCache::new();
        let t0 = Instant::now();
        c.put_stat(t0, headed.clone());
        // The same version listed bare: no change, and a lookup through the listing still
        // shows the link with its owner.
        let changes = c.put_list(t0 + Duration::from_secs(1), "/m/d", Arc::new(vec![listed]));
        assert!(changes.is_empty(), "{changes:?}");
        match c.stat("/m/d/l", |_, _| true, |_| true) {
            Lookup::Found(e) => {
                assert_eq!(
                    (e.kind, e.mode, e.posix.uid),
                    (EntryKind::Symlink, Some(0o777), Some(1000))
                )
            }
            _ => panic!("not found"),
        }
        // Another version listed: what the HEAD said no longer holds.
        let other = entry(meta(EntryKind::File, "e2", None, None));
        let changes = c.put_list(t0 + Duration::from_secs(2), "/m/d", Arc::new(vec![other]));
        assert_eq!(changes.len(), 1);
        match c.stat("/m/d/l", |_, _| true, |_| true) {
            Lookup::Found(e) => assert_eq!((e.kind, e.mode), (EntryKind::File, None)),
            _ => panic!("not found"),
        }
    }

    /// Where listings carry attributes, a listed `None` is the store's answer: a mode removed
    /// without a new version (same ETag) is not brought back from an older HEAD (found by the
    /// model test).
    #[test]
    fn a_listing_with_attributes_is_the_answer_for_the_same_version() {
        let store: silt_ufs::DynStore = Arc::new(silt_ufs::MemStore::new("mem://attrs"));
        let meta = |mode: Option<u32>| silt_ufs::ObjectMeta {
            path: "d/f".into(),
            kind: EntryKind::File,
            size: 0,
            mtime: None,
            etag: Some("e1".into()),
            version: None,
            mode,
            posix: Default::default(),
        };
        let entry = |m| Entry::from_meta("/m/d/f".into(), &store, m);
        let c = MetaCache::new();
        let t0 = Instant::now();
        c.put_stat(t0, entry(meta(Some(0o600))));
        let changes = c.put_list(
            t0 + Duration::from_secs(1),
            "/m/d",
            Arc::new(vec![entry(meta(None))]),
        );
        assert_eq!(changes.len(), 1, "{changes:?}");
        match c.stat("/m/d/f", |_, _| true, |_| true) {
            Lookup::Found(e) => assert_eq!(e.mode, None),
            _ => panic!("not found"),
        }
    }

    #[test]
    fn tree_has_every_directory_once_with_explicit_entries_preferred() {
        let entries = vec![
            e("/r/a/b/f1", false),
            e("/r/a", true),
            e("/r/a/f2", false),
            e("/r/empty", true),
            e("/outside/x", false),
        ];
        let tree: HashMap<String, Arc<Vec<Entry>>> = build_tree("/r", entries, |d| e(d, true))
            .into_iter()
            .collect();
        let names =
            |d: &str| -> Vec<String> { tree[d].iter().map(|x| x.name().to_string()).collect() };
        assert_eq!(names("/r"), vec!["a", "empty"]);
        assert_eq!(names("/r/a"), vec!["b", "f2"]);
        assert_eq!(names("/r/a/b"), vec!["f1"]);
        assert!(names("/r/empty").is_empty());
        assert_eq!(tree.len(), 4);
    }
}
