//! Sync policies against the in-memory store, one promise per test: what `never`,
//! `interval=D` and `always` answer and how many store requests they cost, negative entries,
//! bulk listing, content and metadata changes, failures that never leave holes, `sync` and
//! `invalidate`. Time is a manual clock: nothing sleeps and nothing asserts on durations.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use silt_client::{Change, ChangeKind, Client, ClientOptions, Clock, Entry, OpenFile};
use silt_common::sync::{SyncPolicy, SyncRules};
use silt_common::{metrics, ErrorKind, PageKey, Result};
use silt_ufs::{Capabilities, Fault, FaultOp, FaultStore, MemStore, ObjectMeta, UnderStore};

mod common;

const PS: u64 = 4096;
const SEC: Duration = Duration::from_secs(1);

/// Counts the client's listings by kind (`list` and `list_tree`, which the `FaultStore` below it
/// counts together as `FaultOp::List`), and can hold recursive listings at a gate until the
/// test lets them through. HEADs and reads are counted by the `FaultStore`.
struct Probe {
    inner: Arc<FaultStore>,
    lists: AtomicU64,
    trees: AtomicU64,
    /// `Some`: every `list_tree` announces itself on `entered` and waits for a permit.
    gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    entered: tokio::sync::Notify,
}

impl Probe {
    fn stats(&self) -> u64 {
        self.inner.calls(FaultOp::Stat)
    }
    fn reads(&self) -> u64 {
        self.inner.calls(FaultOp::Read)
    }
    fn lists(&self) -> u64 {
        self.lists.load(Ordering::SeqCst)
    }
    fn trees(&self) -> u64 {
        self.trees.load(Ordering::SeqCst)
    }
    /// Metadata requests of every kind (HEADs, listings, recursive listings).
    fn meta_requests(&self) -> u64 {
        self.stats() + self.lists() + self.trees()
    }
}

#[async_trait]
impl UnderStore for Probe {
    fn uri(&self) -> &str {
        self.inner.uri()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.inner.stat(path).await
    }
    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(dir, recursive).await
    }
    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        self.trees.fetch_add(1, Ordering::SeqCst);
        let gate = self.gate.lock().clone();
        if let Some(gate) = gate {
            self.entered.notify_one();
            gate.acquire().await.unwrap().forget();
        }
        self.inner.list_tree(dir, max).await
    }
    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        self.inner.read(path, range, expected).await
    }
    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        self.inner.write(path, data).await
    }
    async fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(path).await
    }
}

/// A client with the store mounted at `/d`: the client talks to `probe`, which wraps `faults`,
/// which wraps `mem` (where tests change objects out of band).
struct Env {
    client: Arc<Client>,
    mem: Arc<MemStore>,
    faults: Arc<FaultStore>,
    probe: Arc<Probe>,
    clock: Clock,
    /// Every change told to subscribers, in order.
    changes: Arc<Mutex<Vec<Change>>>,
}

fn env_with(mem: Arc<MemStore>, policy: SyncPolicy, tweak: impl FnOnce(&mut ClientOptions)) -> Env {
    let faults = Arc::new(FaultStore::new(mem.clone()));
    let probe = Arc::new(Probe {
        inner: faults.clone(),
        lists: AtomicU64::new(0),
        trees: AtomicU64::new(0),
        gate: Mutex::new(None),
        entered: tokio::sync::Notify::new(),
    });
    let clock = Clock::manual();
    let mut opts = ClientOptions {
        clock: clock.clone(),
        ..common::options(SyncRules::new(policy, Vec::new()))
    };
    tweak(&mut opts);
    let client = Arc::new(Client::new(
        common::at_d(probe.clone()),
        common::worker(PS, 16 << 20),
        opts,
        tokio::runtime::Handle::current(),
    ));
    let changes = Arc::new(Mutex::new(Vec::new()));
    let sink = changes.clone();
    client.subscribe(Arc::new(move |c: &[Change]| {
        sink.lock().extend_from_slice(c)
    }));
    Env {
        client,
        mem,
        faults,
        probe,
        clock,
        changes,
    }
}

fn env(policy: SyncPolicy) -> Env {
    env_with(sample(), policy, |_| {})
}

/// `dir/a`, `dir/b` and `top`.
fn sample() -> Arc<MemStore> {
    let mem = Arc::new(MemStore::new("mem://sync"));
    mem.put("dir/a", "a-one").unwrap();
    mem.put("dir/b", "b-one").unwrap();
    mem.put("top", "top").unwrap();
    mem
}

fn interval(secs: u64) -> SyncPolicy {
    SyncPolicy::Interval(Duration::from_secs(secs))
}

/// Bytes that differ at every offset between two `seed`s.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn names(list: &[Entry]) -> Vec<String> {
    list.iter().map(|e| e.name().to_string()).collect()
}

impl Env {
    async fn names(&self, dir: &str) -> Vec<String> {
        names(&self.client.list(dir).await.unwrap())
    }

    async fn read_all(&self, path: &str) -> Vec<u8> {
        let f = self.client.open(path).await.unwrap();
        self.read_file(&f).await.unwrap()
    }

    async fn read_file(&self, f: &OpenFile) -> Result<Vec<u8>> {
        Ok(self.client.read(f, 0, f.size() + 1).await?.to_vec())
    }

    /// Whether every page of the version `e` names is cached (`false` if none is).
    fn pages_cached(&self, e: &Entry) -> (bool, bool) {
        let obj = e.object.as_ref().unwrap();
        let n = e.size.div_ceil(PS);
        let has = |i| {
            self.client
                .page_reader()
                .page_store()
                .contains(&PageKey::new(obj.id, i))
        };
        ((0..n).all(has), (0..n).any(has))
    }

    fn changes(&self) -> Vec<(String, ChangeKind, bool)> {
        self.changes
            .lock()
            .drain(..)
            .map(|c| (c.path, c.kind, c.old_object.is_some()))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_keeps_every_answer_until_sync() {
    let e = env(SyncPolicy::Never);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 5);
    assert_eq!(e.read_all("/d/dir/a").await, b"a-one");
    assert_eq!(
        e.probe.meta_requests(),
        1,
        "one recursive listing of /d/dir"
    );
    // /d/dir's own stat comes from /d's listing (one more sweep, before anything changes).
    assert!(e.client.stat("/d/dir").await.unwrap().is_dir());
    let learned = e.probe.meta_requests();
    assert_eq!(learned, 2);

    e.mem.put("dir/a", "a-two, longer").unwrap();
    e.mem.remove("dir/b");
    e.mem.put("dir/c", "c").unwrap();
    e.clock.advance(Duration::from_secs(86_400 * 365));
    for _ in 0..3 {
        assert_eq!(e.names("/d/dir").await, ["a", "b"]);
        assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 5);
        assert!(e.client.stat("/d/dir/b").await.is_ok());
        let missing = e.client.stat("/d/dir/c").await.unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        assert_eq!(e.client.walk_files("/d/dir").await.unwrap().len(), 2);
    }
    assert_eq!(
        e.probe.meta_requests(),
        learned,
        "no store request on repeat"
    );
    assert!(e.changes().is_empty());

    let report = e.client.sync("/d/dir", false).await.unwrap();
    assert_eq!(
        (report.added, report.removed, report.content_changed),
        (1, 1, 1)
    );
    assert_eq!(e.names("/d/dir").await, ["a", "c"]);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 13);
    assert_eq!(
        e.client.stat("/d/dir/b").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(e.read_all("/d/dir/a").await, b"a-two, longer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_revalidates_on_the_first_access_after_the_interval() {
    let e = env(interval(10));
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    assert_eq!(e.probe.meta_requests(), 1);
    e.mem.put("dir/c", "c").unwrap();
    e.mem.put("dir/a", "a-two, longer").unwrap();

    // Younger than the interval: the cached answer, no request.
    e.clock.advance(9 * SEC);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 5);
    assert_eq!(
        e.client.stat("/d/dir/c").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(e.probe.meta_requests(), 1);
    let info = e.client.policy_info("/d/dir/a").unwrap();
    assert_eq!(info.policy, "interval=10s");
    assert_eq!(info.checked_secs_ago, Some(9.0));

    // As old as the interval: revalidated by the next access, with one request.
    e.clock.advance(SEC);
    assert_eq!(e.names("/d/dir").await, ["a", "b", "c"]);
    assert_eq!(e.probe.meta_requests(), 2);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 13);
    assert_eq!(e.client.stat("/d/dir/c").await.unwrap().size, 1);
    assert_eq!(
        e.probe.meta_requests(),
        2,
        "stats answered by the new listing"
    );

    // A stat alone is revalidated the same way.
    e.mem.put("dir/a", "a3").unwrap();
    e.clock.advance(9 * SEC);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 13);
    assert_eq!(e.probe.meta_requests(), 2);
    e.clock.advance(SEC);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 2);
    assert_eq!(e.probe.meta_requests(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_asks_the_store_on_every_stat_list_and_open() {
    let e = env(SyncPolicy::Always);
    for i in 1..=3 {
        assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 5);
        assert_eq!(e.probe.stats(), i, "one HEAD per stat");
    }
    for i in 1..=3 {
        assert_eq!(e.names("/d/dir").await, ["a", "b"]);
        assert_eq!(e.probe.lists(), i, "one listing per list");
    }
    assert_eq!(e.probe.trees(), 0, "no bulk listing under always");
    let stats = e.probe.stats();
    let f = e.client.open("/d/dir/a").await.unwrap();
    assert_eq!(e.probe.stats(), stats + 1, "open asks too");

    e.mem.put("dir/a", "a-two, longer").unwrap();
    e.mem.put("dir/c", "c").unwrap();
    e.mem.remove("dir/b");
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 13);
    assert_eq!(e.names("/d/dir").await, ["a", "c"]);
    assert_eq!(e.read_all("/d/dir/a").await, b"a-two, longer");
    for _ in 0..2 {
        let err = e.client.stat("/d/dir/b").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }
    e.mem.put("dir/b", "back").unwrap();
    assert_eq!(e.client.stat("/d/dir/b").await.unwrap().size, 4);
    // The handle opened before the overwrite: none of its version's pages was ever cached
    // (nothing read it) and the store holds another version now, so it can only fail.
    let err = e.read_file(&f).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ContentChanged, "{err}");
    assert_eq!(e.probe.trees(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_path_is_remembered_for_the_negative_ttl() {
    for policy in [SyncPolicy::Never, interval(60)] {
        let e = env_with(sample(), policy, |o| {
            o.negative_ttl = 5 * SEC;
            o.lookup_lists_parent = false;
        });
        for _ in 0..2 {
            let err = e.client.stat("/d/dir/new").await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NotFound, "{policy}");
        }
        assert_eq!(e.probe.stats(), 1, "{policy}: the second answer is cached");
        e.mem.put("dir/new", "new").unwrap();
        e.clock.advance(4 * SEC);
        assert!(e.client.stat("/d/dir/new").await.is_err(), "{policy}");
        assert_eq!(e.probe.stats(), 1, "{policy}");
        e.clock.advance(SEC);
        assert_eq!(e.client.stat("/d/dir/new").await.unwrap().size, 3);
        assert_eq!(e.probe.stats(), 2, "{policy}");
        assert_eq!(e.probe.lists() + e.probe.trees(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_path_is_trusted_no_longer_than_its_policy() {
    let e = env_with(sample(), interval(2), |o| {
        o.negative_ttl = 5 * SEC;
        o.lookup_lists_parent = false;
    });
    assert!(e.client.stat("/d/dir/new").await.is_err());
    e.mem.put("dir/new", "new").unwrap();
    e.clock.advance(SEC);
    assert!(e.client.stat("/d/dir/new").await.is_err());
    assert_eq!(e.probe.stats(), 1);
    e.clock.advance(SEC);
    assert_eq!(e.client.stat("/d/dir/new").await.unwrap().size, 3);
    assert_eq!(e.probe.stats(), 2);

    // Under `always` a "no such file" is not remembered at all.
    let e = env_with(sample(), SyncPolicy::Always, |o| {
        o.negative_ttl = 5 * SEC;
    });
    for i in 1..=2 {
        assert!(e.client.stat("/d/dir/new").await.is_err());
        assert_eq!(e.probe.stats(), i);
    }
    e.mem.put("dir/new", "new").unwrap();
    assert_eq!(e.client.stat("/d/dir/new").await.unwrap().size, 3);
}

/// `t/` with nested directories, 7 files, 6 directories.
fn tree() -> Arc<MemStore> {
    let mem = Arc::new(MemStore::new("mem://tree"));
    for (p, n) in [
        ("t/a/x/f1", 1),
        ("t/a/f2", 2),
        ("t/b/f3", 3),
        ("t/b/y/z/f4", 4),
        ("t/b/y/f5", 5),
        ("t/c", 6),
        ("t/e/f6", 7),
    ] {
        mem.put(p, vec![n as u8; n]).unwrap();
    }
    mem
}

const TREE_DIRS: [&str; 7] = [
    "/d/t",
    "/d/t/a",
    "/d/t/a/x",
    "/d/t/b",
    "/d/t/b/y",
    "/d/t/b/y/z",
    "/d/t/e",
];
const TREE_FILES: [&str; 7] = [
    "/d/t/a/x/f1",
    "/d/t/a/f2",
    "/d/t/b/f3",
    "/d/t/b/y/z/f4",
    "/d/t/b/y/f5",
    "/d/t/c",
    "/d/t/e/f6",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_listing_loads_the_whole_tree_with_one_recursive_listing() {
    let e = env_with(tree(), SyncPolicy::Never, |o| o.bulk_list_max = 100);
    assert_eq!(e.names("/d").await, ["t"]);
    assert_eq!(e.probe.trees(), 1);
    assert_eq!(e.faults.calls(FaultOp::List), 1);
    assert_eq!(e.probe.meta_requests(), 1);

    assert_eq!(e.names("/d/t").await, ["a", "b", "c", "e"]);
    assert_eq!(e.names("/d/t/b/y").await, ["f5", "z"]);
    for d in TREE_DIRS {
        e.client.list(d).await.unwrap();
        assert!(e.client.stat(d).await.unwrap().is_dir(), "{d}");
    }
    for (i, f) in TREE_FILES.iter().enumerate() {
        assert_eq!(e.client.stat(f).await.unwrap().size, i as u64 + 1, "{f}");
    }
    let walked = e.client.walk_files("/d/t").await.unwrap();
    assert_eq!(walked.len(), TREE_FILES.len());
    assert_eq!(
        e.probe.meta_requests(),
        1,
        "everything below /d answered by the one recursive listing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_walkers_share_one_recursive_listing() {
    let e = env_with(tree(), interval(60), |o| o.bulk_list_max = 100);
    let walkers: Vec<_> = (0..8)
        .map(|_| {
            let c = e.client.clone();
            tokio::spawn(async move { c.walk_files("/d/t").await })
        })
        .collect();
    for w in walkers {
        let files = w.await.unwrap().unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        let mut want = TREE_FILES.to_vec();
        want.sort();
        assert_eq!(paths, want);
    }
    assert_eq!(e.faults.calls(FaultOp::List), 1, "one sweep for 8 walkers");
    assert_eq!(e.probe.trees(), 1);
    assert_eq!(e.probe.stats(), 0);
}

/// Awaits a spawned task; the timeout only guards against a hang.
async fn join<T>(what: &str, task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(60 * SEC, task)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within a minute"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn walkers_arriving_during_a_sweep_wait_for_it() {
    let e = env_with(tree(), interval(60), |o| o.bulk_list_max = 100);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *e.probe.gate.lock() = Some(gate.clone());
    let c = e.client.clone();
    let first = tokio::spawn(async move { c.list("/d").await });
    // The sweep of /d has started (and is held): walkers of any directory below it wait.
    e.probe.entered.notified().await;
    let walkers: Vec<_> = TREE_DIRS
        .iter()
        .cycle()
        .take(8)
        .enumerate()
        .map(|(i, d)| {
            let c = e.client.clone();
            let d = d.to_string();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    c.walk_files(&d).await.map(|f| f.len())
                } else {
                    c.list(&d).await.map(|l| l.len())
                }
            })
        })
        .collect();
    // A chance for the walkers to run up to their wait (not a barrier: one that arrives after
    // the sweep is answered from it, and every assertion below holds either way).
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    // While the sweep is held nothing else has reached the store and nobody has an answer: a
    // walker that did not wait would have listed (and finished) or swept again (and be held).
    assert_eq!(e.probe.trees(), 1, "one recursive listing, held");
    assert_eq!(e.probe.meta_requests(), 1, "nothing else asked the store");
    assert!(!first.is_finished());
    for (i, w) in walkers.iter().enumerate() {
        assert!(
            !w.is_finished(),
            "walker {i} answered while the sweep was held"
        );
    }
    // Every permit: a second recursive listing would pass too (and fail the counts below)
    // rather than hang the test.
    gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS);
    assert_eq!(names(&join("the sweep", first).await.unwrap()), ["t"]);
    for (i, w) in walkers.into_iter().enumerate() {
        assert!(join(&format!("walker {i}"), w).await.unwrap() > 0);
    }
    assert_eq!(e.faults.calls(FaultOp::List), 1, "one sweep in all");
    assert_eq!(e.probe.meta_requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_bigger_than_bulk_list_max_is_listed_per_directory() {
    let mem = Arc::new(MemStore::new("mem://big"));
    for d in ["a", "b"] {
        for i in 0..3 {
            mem.put(&format!("big/{d}/{i}"), "x").unwrap();
        }
    }
    let e = env_with(mem, interval(10), |o| o.bulk_list_max = 3);
    assert_eq!(e.names("/d/big").await, ["a", "b"]);
    assert_eq!(
        (e.probe.trees(), e.probe.lists()),
        (1, 1),
        "tried, fell back"
    );
    // A directory below whose own tree is small enough is loaded in one sweep.
    assert_eq!(e.names("/d/big/a").await, ["0", "1", "2"]);
    assert_eq!((e.probe.trees(), e.probe.lists()), (2, 1));
    assert_eq!(e.client.stat("/d/big/a/1").await.unwrap().size, 1);
    assert_eq!(e.probe.meta_requests(), 3);

    // The fallback is remembered: the next revalidation lists the one directory only.
    e.clock.advance(10 * SEC);
    e.mem.put("big/c", "y").unwrap();
    assert_eq!(e.names("/d/big").await, ["a", "b", "c"]);
    assert_eq!((e.probe.trees(), e.probe.lists()), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_change_is_reported_and_drops_the_old_pages() {
    let mem = sample();
    mem.put("dir/f", pattern(1, 6000)).unwrap();
    let e = env_with(mem, interval(10), |_| {});
    let old = e.client.stat("/d/dir/f").await.unwrap();
    let f_old = e.client.open("/d/dir/f").await.unwrap();
    assert_eq!(e.read_file(&f_old).await.unwrap(), pattern(1, 6000));
    assert_eq!(e.pages_cached(&old), (true, true));

    e.mem.put("dir/f", pattern(2, 5000)).unwrap();
    e.clock.advance(10 * SEC);
    let new = e.client.stat("/d/dir/f").await.unwrap();
    assert_eq!(new.size, 5000);
    assert_eq!(
        e.changes(),
        [("/d/dir/f".to_string(), ChangeKind::Content, true)]
    );
    assert_eq!(e.read_all("/d/dir/f").await, pattern(2, 5000));
    // The handle opened before keeps the version it opened, whole from its cached pages
    // (POSIX: an open file's bytes), and those pages go when it closes.
    assert_eq!(e.pages_cached(&old), (true, true), "kept while open");
    assert_eq!(e.read_file(&f_old).await.unwrap(), pattern(1, 6000));
    drop(f_old);
    assert_eq!(e.pages_cached(&old), (false, false), "old pages dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_file_never_mixes_versions() {
    let mem = sample();
    mem.put("dir/f", pattern(1, 3 * PS as usize)).unwrap();
    let e = env_with(mem, SyncPolicy::Never, |_| {});
    let f = e.client.open("/d/dir/f").await.unwrap();
    // Page 1 cached (a read that does not start at 0 prefetches nothing), 0 and 2 not.
    let mid = e.client.read(&f, PS, PS).await.unwrap();
    assert_eq!(
        mid,
        pattern(1, 3 * PS as usize)[PS as usize..2 * PS as usize]
    );
    e.mem.put("dir/f", pattern(2, 3 * PS as usize)).unwrap();
    // Page 0 of the old version must come from the store, which has another version now: the
    // whole read fails rather than serve page 1 from the cache next to new bytes.
    for _ in 0..2 {
        let err = e.read_file(&f).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ContentChanged, "{err}");
    }
    // Once the change is noticed, the old handle still reads what it has cached of its own
    // version (page 1), and still fails where it would need the store.
    let report = e.client.sync("/d/dir/f", false).await.unwrap();
    assert_eq!((report.content_changed, report.objects_dropped), (1, 1));
    assert_eq!(e.client.read(&f, PS, PS).await.unwrap(), mid);
    let err = e.read_file(&f).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ContentChanged);
    assert_eq!(e.read_all("/d/dir/f").await, pattern(2, 3 * PS as usize));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_only_change_keeps_the_cached_pages() {
    let mem = sample();
    mem.put("dir/f", pattern(1, 6000)).unwrap();
    let e = env_with(mem, interval(10), |_| {});
    let old = e.client.stat("/d/dir/f").await.unwrap();
    assert_eq!(old.mode, None);
    let f_old = e.client.open("/d/dir/f").await.unwrap();
    assert_eq!(e.read_file(&f_old).await.unwrap(), pattern(1, 6000));

    e.mem.set_mode("dir/f", Some(0o640)).unwrap();
    e.clock.advance(9 * SEC);
    assert_eq!(e.client.stat("/d/dir/f").await.unwrap().mode, None);
    e.clock.advance(SEC);
    let new = e.client.stat("/d/dir/f").await.unwrap();
    assert_eq!(new.mode, Some(0o640));
    assert_eq!(
        e.changes(),
        [("/d/dir/f".to_string(), ChangeKind::Metadata, false)]
    );
    assert_eq!(
        new.object.as_ref().unwrap().id,
        old.object.as_ref().unwrap().id,
        "same version"
    );
    assert_eq!(e.pages_cached(&old), (true, true), "pages kept");
    let reads = e.probe.reads();
    assert_eq!(e.read_file(&f_old).await.unwrap(), pattern(1, 6000));
    assert_eq!(e.read_all("/d/dir/f").await, pattern(1, 6000));
    assert_eq!(e.probe.reads(), reads, "served from cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_revalidation_serves_the_whole_previous_listing() {
    let e = env(interval(10));
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    e.mem.remove("dir/b");
    e.mem.put("dir/c", "c").unwrap();
    e.clock.advance(10 * SEC);

    e.faults
        .inject(Fault::fail_next(FaultOp::List, 2, ErrorKind::Unavailable));
    let stale = metrics::META_STALE_SERVED.get();
    assert_eq!(e.names("/d/dir").await, ["a", "b"], "the old view, whole");
    assert!(metrics::META_STALE_SERVED.get() > stale);
    // A lookup in it is answered from the old view too, not "missing".
    assert_eq!(e.client.stat("/d/dir/b").await.unwrap().size, 5);
    assert_eq!(e.faults.calls(FaultOp::List), 3);
    assert!(e.changes().is_empty());

    // The store is back: the next access revalidates.
    assert_eq!(e.names("/d/dir").await, ["a", "c"]);
    let mut seen = e.changes();
    seen.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        seen,
        [
            ("/d/dir/b".to_string(), ChangeKind::Removed, true),
            ("/d/dir/c".to_string(), ChangeKind::Added, false)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_is_an_error_and_keeps_the_cached_view() {
    let e = env(SyncPolicy::Never);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    e.mem.remove("dir/b");
    e.mem.put("dir/a", "a-two, longer").unwrap();

    for recursive in [true, false] {
        e.faults
            .inject(Fault::fail_next(FaultOp::List, 1, ErrorKind::Unavailable));
        let err = e.client.sync("/d/dir", recursive).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        let msg = err.to_string();
        assert!(msg.contains("/d/dir") && msg.contains("injected"), "{msg}");
    }
    e.faults
        .inject(Fault::fail_next(FaultOp::Stat, 1, ErrorKind::Timeout));
    assert_eq!(
        e.client.sync("/d/dir", true).await.unwrap_err().kind(),
        ErrorKind::Timeout
    );
    let requests = e.probe.meta_requests();
    assert_eq!(e.names("/d/dir").await, ["a", "b"], "unchanged, whole");
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 5);
    assert_eq!(e.probe.meta_requests(), requests, "still trusted (never)");
    assert!(e.changes().is_empty());

    e.client.sync("/d/dir", true).await.unwrap();
    assert_eq!(e.names("/d/dir").await, ["a"]);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_always_a_failure_is_an_error_not_stale_data() {
    let e = env(SyncPolicy::Always);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    assert_eq!(e.client.stat("/d/dir/a").await.unwrap().size, 5);
    e.faults
        .inject(Fault::fail_next(FaultOp::List, 1, ErrorKind::Unavailable));
    let err = e.client.list("/d/dir").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    e.faults
        .inject(Fault::fail_next(FaultOp::Stat, 2, ErrorKind::Unavailable));
    let err = e.client.stat("/d/dir/a").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let err = e.client.open("/d/dir/a").await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_drops_metadata_and_pages_at_and_below_the_path() {
    let mem = sample();
    mem.put("dir/sub/f", pattern(1, 5000)).unwrap();
    let e = env_with(mem, SyncPolicy::Never, |_| {});
    let f = e.client.stat("/d/dir/sub/f").await.unwrap();
    assert_eq!(e.read_all("/d/dir/sub/f").await, pattern(1, 5000));
    let top = e.client.stat("/d/top").await.unwrap();
    assert_eq!(e.read_all("/d/top").await, b"top");
    assert_eq!(e.pages_cached(&f), (true, true));

    e.mem.put("dir/sub/f", pattern(2, 100)).unwrap();
    e.mem.put("dir/c", "c").unwrap();
    let requests = e.probe.meta_requests();
    let report = e.client.invalidate("/d/dir").await.unwrap();
    assert!(
        report.invalidated >= 1 && report.objects_dropped >= 1,
        "{report:?}"
    );
    assert!(e
        .changes()
        .contains(&("/d/dir/sub/f".to_string(), ChangeKind::Invalidated, true)));
    assert_eq!(e.pages_cached(&f), (false, false));
    assert_eq!(e.pages_cached(&top), (true, true), "outside the path: kept");

    assert_eq!(e.names("/d/dir").await, ["a", "b", "c", "sub"]);
    assert!(e.probe.meta_requests() > requests, "asked again");
    assert_eq!(e.read_all("/d/dir/sub/f").await, pattern(2, 100));

    // A single file: its own pages go, its neighbours' stay.
    let a = e.client.stat("/d/dir/a").await.unwrap();
    assert_eq!(e.read_all("/d/dir/a").await, b"a-one");
    e.client.invalidate("/d/top").await.unwrap();
    assert_eq!(e.pages_cached(&top), (false, false));
    assert_eq!(e.pages_cached(&a), (true, true));
}

// Regressions found by the model test (each failed before its fix).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_keeps_a_learned_listing_when_its_parent_is_first_listed() {
    let e = env(SyncPolicy::Never);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    e.mem.remove("dir/b");
    e.mem.put("dir/c", "c").unwrap();
    // /d/dir's own stat is not known yet: answered by listing /d, which sweeps the tree.
    assert!(e.client.stat("/d/dir").await.unwrap().is_dir());
    assert_eq!(
        e.names("/d/dir").await,
        ["a", "b"],
        "learned, kept until sync"
    );
    assert!(e.changes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_of_a_directory_forgets_a_file_gone_from_it() {
    let e = env_with(sample(), SyncPolicy::Never, |o| {
        o.lookup_lists_parent = false
    });
    let b = e.client.stat("/d/dir/b").await.unwrap(); // a HEAD: a stat record
    assert_eq!(e.read_all("/d/dir/b").await, b"b-one");
    e.mem.remove("dir/b");
    let report = e.client.sync("/d/dir", true).await.unwrap();
    assert_eq!(e.names("/d/dir").await, ["a"]);
    let err = e.client.stat("/d/dir/b").await.err().map(|e| e.kind());
    assert_eq!(err, Some(ErrorKind::NotFound), "the listing says gone");
    assert_eq!(report.removed, 1, "{report:?}");
    assert_eq!(e.pages_cached(&b), (false, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_of_a_vanished_directory_drops_its_listing() {
    let e = env(SyncPolicy::Never);
    let a = e.client.stat("/d/dir/a").await.unwrap(); // lists /d/dir only
    assert_eq!(e.read_all("/d/dir/a").await, b"a-one");
    e.mem.remove("dir/a");
    e.mem.remove("dir/b");
    for recursive in [false, true] {
        e.client.sync("/d/dir", recursive).await.unwrap();
        let listed = e.client.list("/d/dir").await.map(|l| names(&l));
        assert_eq!(listed.map_err(|e| e.kind()), Err(ErrorKind::NotFound));
        let err = e.client.stat("/d/dir/a").await.err().map(|e| e.kind());
        assert_eq!(err, Some(ErrorKind::NotFound));
    }
    assert_eq!(e.pages_cached(&a), (false, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_subdirectory_reports_its_files_and_drops_their_pages() {
    let mem = sample();
    mem.put("dir/sub/f", pattern(1, 5000)).unwrap();
    let e = env_with(mem, SyncPolicy::Never, |_| {});
    assert_eq!(e.names("/d/dir/sub").await, ["f"]);
    let f = e.client.stat("/d/dir/sub/f").await.unwrap();
    assert_eq!(e.read_all("/d/dir/sub/f").await, pattern(1, 5000));
    e.mem.remove("dir/sub/f");
    let report = e.client.sync("/d/dir", true).await.unwrap();
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    assert!(
        e.changes()
            .contains(&("/d/dir/sub/f".to_string(), ChangeKind::Removed, true)),
        "{report:?}"
    );
    assert_eq!(e.pages_cached(&f), (false, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_keeps_track_of_the_siblings_of_the_path() {
    let e = env(SyncPolicy::Never);
    let b = e.client.stat("/d/dir/b").await.unwrap();
    assert_eq!(e.read_all("/d/dir/b").await, b"b-one");
    e.mem.put("dir/b", "b-two").unwrap();
    e.client.invalidate("/d/dir/a").await.unwrap();
    assert_eq!(e.client.stat("/d/dir/b").await.unwrap().size, 5);
    assert_eq!(e.read_all("/d/dir/b").await, b"b-two");
    assert!(
        e.changes()
            .contains(&("/d/dir/b".to_string(), ChangeKind::Content, true)),
        "the new version was noticed without a change"
    );
    assert_eq!(e.pages_cached(&b), (false, false));
}

/// What the FUSE kernel caches are told: a TTL that ends when Silt's own trust ends, and a
/// listing digest that changes exactly when a directory's names or kinds do and is absent
/// while the listing is not trusted (so the kernel's readdir cache is dropped then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_ttls_and_listing_digests_follow_the_policy() {
    let hour = 3600 * SEC;
    let e = env(interval(10));
    assert_eq!(
        e.client.kernel_ttl("/d/dir/a", hour, false),
        10 * SEC,
        "the interval caps it"
    );
    assert_eq!(e.client.listing_digest("/d/dir"), None);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    let first = e
        .client
        .listing_digest("/d/dir")
        .expect("a trusted listing");
    e.clock.advance(4 * SEC);
    assert_eq!(e.client.kernel_ttl("/d/dir/a", hour, false), 6 * SEC);
    assert_eq!(e.client.kernel_ttl("/d/dir/a", 2 * SEC, false), 2 * SEC);
    assert_eq!(e.client.kernel_ttl("/d/dir", hour, true), 6 * SEC);

    // A content change with the same names keeps the digest; a new name changes it.
    e.mem.put("dir/a", "a-two").unwrap();
    e.clock.advance(6 * SEC);
    assert_eq!(e.client.listing_digest("/d/dir"), None, "expired");
    assert_eq!(e.client.kernel_ttl("/d/dir/a", hour, false), Duration::ZERO);
    assert_eq!(e.names("/d/dir").await, ["a", "b"]);
    assert_eq!(e.client.listing_digest("/d/dir"), Some(first));
    e.mem.put("dir/c", "c").unwrap();
    e.clock.advance(10 * SEC);
    assert_eq!(e.names("/d/dir").await, ["a", "b", "c"]);
    let second = e.client.listing_digest("/d/dir").unwrap();
    assert_ne!(second, first);
    // A name learned by a lookup is patched into the listing, and into its digest.
    e.mem.put("dir/d", "d").unwrap();
    e.client.invalidate("/d/dir/d").await.unwrap();
    assert_eq!(e.client.stat("/d/dir/d").await.unwrap().size, 1);
    assert_ne!(e.client.listing_digest("/d/dir"), Some(second));

    let never = env(SyncPolicy::Never);
    assert_eq!(never.names("/d/dir").await, ["a", "b"]);
    never.clock.advance(1000 * hour);
    assert_eq!(never.client.kernel_ttl("/d/dir", hour, true), hour);
    assert!(never.client.listing_digest("/d/dir").is_some());

    let always = env(SyncPolicy::Always);
    assert_eq!(always.names("/d/dir").await, ["a", "b"]);
    assert_eq!(
        always.client.kernel_ttl("/d/dir/a", hour, false),
        Duration::ZERO
    );
    assert_eq!(always.client.listing_digest("/d/dir"), None);
}
