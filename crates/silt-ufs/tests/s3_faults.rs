//! The S3 store against a real S3 server (versitygw) behind [`S3Proxy`]: how many requests of
//! each kind an operation costs (listing pages, HEADs, PUTs), and what the store makes of
//! faults injected into chosen requests (a failing listing page, 503 SlowDown, a HEAD that
//! never gets an answer).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use silt_common::ErrorKind;
use silt_testkit::{FaultAction, ProxyCounts, S3Op, S3Proxy, S3Server};
use silt_ufs::{EntryKind, Measured, S3Options, S3Store, UnderStore};

/// Objects written by [`setup`] (`f0` … `f9`, below `set/`), and the listing page size.
const OBJECTS: usize = 10;
const PAGE: usize = 2;
/// The safety net of a test that must not hang (never reached when the store is right).
const NO_HANG: Duration = Duration::from_secs(120);

struct Fixture {
    /// Declared first: dropped (and its connections closed) before the server is killed.
    proxy: S3Proxy,
    server: S3Server,
}

impl Fixture {
    fn start() -> Fixture {
        let server = S3Server::start();
        server.create_bucket("bkt");
        let upstream = SocketAddr::from(([127, 0, 0, 1], server.port()));
        let proxy = S3Proxy::start(upstream).expect("starting the S3 proxy");
        Fixture { proxy, server }
    }

    /// Options that reach the server through the proxy.
    fn opts(&self, retries: usize, timeout: Duration) -> S3Options {
        S3Options {
            endpoint: self.proxy.endpoint(),
            list_page: PAGE,
            retries,
            timeout,
            ..self.server.s3_options()
        }
    }

    /// `s3://bkt/data` through the proxy, as `open_store` gives it: measured, a stalled
    /// store failing fast.
    fn store(&self, retries: usize, timeout: Duration) -> Measured {
        let s3 = S3Store::new("bkt", "data", &self.opts(retries, timeout))
            .unwrap_or_else(|e| panic!("opening the store: {e}"));
        silt_ufs::measured(Arc::new(s3), "s3_faults", timeout)
    }
}

fn name(i: usize) -> String {
    format!("set/f{i}")
}

/// Writes `set/f0` … `set/f{n-1}` (`f3` is 3 MiB, the others a few bytes), then zeroes the
/// proxy's counters.
async fn setup(f: &Fixture, store: &dyn UnderStore, n: usize) {
    for i in 0..n {
        store
            .write(&name(i), content(i))
            .await
            .unwrap_or_else(|e| panic!("write {}: {e}", name(i)));
    }
    f.proxy.reset_counts();
}

fn content(i: usize) -> Bytes {
    if i == 3 {
        Bytes::from(
            (0..3 << 20)
                .map(|b: u32| (b % 251) as u8)
                .collect::<Vec<u8>>(),
        )
    } else {
        Bytes::from(format!("object {i}"))
    }
}

async fn list_names(store: &dyn UnderStore) -> silt_common::Result<Vec<String>> {
    let mut names: Vec<String> = store
        .list("", true)
        .await?
        .into_iter()
        .filter(|m| m.kind == EntryKind::File)
        .map(|m| m.path)
        .collect();
    names.sort();
    Ok(names)
}

fn all_names() -> Vec<String> {
    let mut v: Vec<String> = (0..OBJECTS).map(name).collect();
    v.sort();
    v
}

#[tokio::test]
async fn requests_are_counted_by_operation() {
    let f = Fixture::start();
    let store = f.store(2, Duration::from_secs(10));
    setup(&f, &store, OBJECTS - 1).await;

    let last = name(OBJECTS - 1);
    store.write(&last, content(OBJECTS - 1)).await.unwrap();
    let meta = store.stat(&last).await.unwrap();
    assert_eq!(meta.size, content(OBJECTS - 1).len() as u64);
    assert_eq!(list_names(&store).await.unwrap(), all_names());
    let counts = f.proxy.counts();
    println!("write + stat + recursive list of {OBJECTS} objects, {PAGE} per page: {counts}");
    // S3 ListObjectsV2 says IsTruncated=false on the page with the last key, so 10 keys take
    // exactly 5 pages of 2 (no trailing empty page).
    assert_eq!(
        counts,
        ProxyCounts {
            list: (OBJECTS / PAGE) as u64,
            head: 1,
            put: 1,
            ..ProxyCounts::default()
        }
    );

    // Bodies pass through intact both ways: a 3 MiB object, whole and in part.
    f.proxy.reset_counts();
    let big = store.stat(&name(3)).await.unwrap();
    let bytes = store.read(&name(3), 0..big.size, &big).await.unwrap();
    assert!(bytes == content(3), "3 MiB read back unchanged");
    let part = store.read(&name(3), 1000..1010, &big).await.unwrap();
    assert_eq!(part, content(3).slice(1000..1010));
    let counts = f.proxy.counts();
    println!("stat + two ranged reads: {counts}");
    assert_eq!((counts.head, counts.get, counts.total()), (1, 2, 3));

    // A delayed request is still answered by the server.
    f.proxy.reset_counts();
    f.proxy.inject(
        S3Op::Get,
        0,
        1,
        FaultAction::Delay(Duration::from_millis(50)),
    );
    let part = store.read(&name(3), 5..9, &big).await.unwrap();
    assert_eq!(part, content(3).slice(5..9));
    assert_eq!(f.proxy.counts().get, 1);
}

#[tokio::test]
async fn a_listing_that_fails_on_page_three_fails_whole() {
    let f = Fixture::start();
    let retries = 1;
    let store = f.store(retries, Duration::from_secs(10));
    setup(&f, &store, OBJECTS).await;

    // Pages 1 and 2 pass; page 3 fails on the first try and on every retry.
    f.proxy
        .inject(S3Op::List, 2, retries + 1, FaultAction::internal_error());
    let e = tokio::time::timeout(NO_HANG, list_names(&store))
        .await
        .expect("the listing ends")
        .expect_err("a listing with a failing page must fail");
    let counts = f.proxy.counts();
    println!("list with page 3 failing: {e} ({counts})");
    assert!(e.kind().is_retryable(), "{:?}: {e}", e.kind());
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("list"), "{msg}");
    assert!(msg.contains("InternalError"), "{msg}");
    assert_eq!(
        counts.list,
        2 + (retries as u64 + 1),
        "two good pages, then the third page tried {} times",
        retries + 1
    );

    f.proxy.clear_faults();
    f.proxy.reset_counts();
    assert_eq!(list_names(&store).await.unwrap(), all_names());
    assert_eq!(f.proxy.counts().list, (OBJECTS / PAGE) as u64);
}

#[tokio::test]
async fn slow_down_on_head_is_retried() {
    let f = Fixture::start();
    let store = f.store(1, Duration::from_secs(10));
    setup(&f, &store, 1).await;

    f.proxy.inject(S3Op::Head, 0, 1, FaultAction::slow_down());
    let meta = store
        .stat(&name(0))
        .await
        .expect("stat retried past SlowDown");
    assert_eq!(meta.size, content(0).len() as u64);
    assert_eq!(f.proxy.counts().head, 2, "one refused, one retried");

    // Without retries the SlowDown reaches the caller, as a retryable kind.
    let store = f.store(0, Duration::from_secs(10));
    f.proxy.reset_counts();
    f.proxy.inject(S3Op::Head, 0, 1, FaultAction::slow_down());
    let e = store
        .stat(&name(0))
        .await
        .expect_err("SlowDown without retries");
    println!("stat answered 503 SlowDown, no retries: {e}");
    // A HEAD answer has no body, so the store never sees the `SlowDown` code: only the 503,
    // a server error (Unavailable) rather than RateLimited. Either way: retryable.
    assert!(
        matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::RateLimited),
        "{:?}: {e}",
        e.kind()
    );
    assert!(e.kind().is_retryable());
    let msg = e.to_string();
    assert!(msg.contains("stat") && msg.contains(&name(0)), "{msg}");
    assert!(msg.contains(&f.proxy.endpoint()), "{msg}");
    assert_eq!(f.proxy.counts().head, 1);
    // The fault is used up: the next stat reaches the server.
    store.stat(&name(0)).await.unwrap();
}

#[tokio::test]
async fn a_hanging_head_times_out() {
    let f = Fixture::start();
    let store = f.store(0, Duration::from_millis(500));
    setup(&f, &store, 1).await;

    f.proxy.inject(S3Op::Head, 0, usize::MAX, FaultAction::Hang);
    let e = tokio::time::timeout(NO_HANG, store.stat(&name(0)))
        .await
        .expect("stat must give up on a server that never answers")
        .expect_err("a HEAD without an answer");
    println!("stat of a HEAD that never gets an answer: {e}");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.kind().is_retryable());
    assert_eq!(f.proxy.counts().head, 1);

    // Clearing the fault closes the hanging connection; the store works again (after the
    // stall's quiet period, requests failing at once meanwhile).
    f.proxy.clear_faults();
    until_it_answers(&store).await;
}

/// Polls `stat` until the store answers (bounded by [`NO_HANG`]); while it is known stalled
/// each try fails at once without a request.
async fn until_it_answers(store: &dyn UnderStore) {
    let deadline = tokio::time::Instant::now() + NO_HANG;
    loop {
        match store.stat(&name(0)).await {
            Ok(_) => return,
            Err(e) if e.kind() == ErrorKind::Timeout => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never answered: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Cold reads (`read_pieces`, what a cache fetch asks for) are received straight into page
/// buffers; an answer that path does not handle goes through the HTTP client, which retries a
/// 500 and says `ContentChanged` for a replaced object; a GET that hangs costs one deadline
/// and is not asked again. The only test here that calls `read_pieces`, so the receive
/// counters move for it alone.
#[tokio::test]
async fn cold_reads_are_received_straight_and_the_rest_goes_through_the_client() {
    use silt_common::metrics::{UFS_RECEIVES_DECLINED, UFS_RECEIVES_DIRECT};
    let counters = || (UFS_RECEIVES_DIRECT.get(), UFS_RECEIVES_DECLINED.get());
    let f = Fixture::start();
    let store = f.store(1, Duration::from_secs(2));
    setup(&f, &store, 4).await;
    let big = store.stat(&name(3)).await.unwrap();
    let read = |range: std::ops::Range<u64>, meta: silt_ufs::ObjectMeta| {
        let store = &store;
        async move {
            let path = meta.path.clone();
            tokio::time::timeout(NO_HANG, store.read_pieces(&path, range, &meta, 1 << 20))
                .await
                .expect("a read must end")
        }
    };

    let before = counters();
    let got = read(1..big.size, big.clone()).await.unwrap();
    assert!(got.concat() == content(3)[1..]);
    assert!(got[..2]
        .iter()
        .all(|p| p.len() == 1 << 20 && silt_common::bufpool::is_aligned(p)));
    let after = counters();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 0),
        "received straight"
    );
    assert_eq!(f.proxy.counts().get, 1);

    f.proxy.reset_counts();
    f.proxy
        .inject(S3Op::Get, 0, 1, FaultAction::internal_error());
    let got = read(5..9, big.clone()).await.unwrap();
    assert_eq!(got.concat(), content(3)[5..9]);
    let now = counters();
    assert_eq!(
        (now.0 - after.0, now.1 - after.1),
        (0, 1),
        "the 500 declined"
    );
    assert_eq!(f.proxy.counts().get, 2, "asked again through the client");

    store
        .write(&name(3), Bytes::from_static(b"replaced"))
        .await
        .unwrap();
    let e = read(0..10, big.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}");
    let new = store.stat(&name(3)).await.unwrap();

    f.proxy.reset_counts();
    f.proxy.inject(S3Op::Get, 0, 1, FaultAction::Hang);
    let e = read(0..8, new.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(f.proxy.counts().get, 1, "a hung GET asked again");
    f.proxy.clear_faults();
    until_it_answers(&store).await;
    assert_eq!(read(0..8, new.clone()).await.unwrap().concat(), b"replaced");

    let off = S3Store::new(
        "bkt",
        "data",
        &S3Options {
            direct_receive: false,
            ..f.opts(1, Duration::from_secs(2))
        },
    )
    .unwrap();
    let before = counters();
    let got = off
        .read_pieces(&name(3), 0..8, &new, 1 << 20)
        .await
        .unwrap();
    assert_eq!(got.concat(), b"replaced");
    assert_eq!(
        counters(),
        before,
        "s3_direct_receive = false still received straight"
    );
}

/// A store that stops answering costs one deadline, not one per try: once a read ran out of
/// its deadline, the next reads (the kernel retries a failed read at once) and other requests
/// fail at once without reaching the server, until a probe finds it answering again.
#[tokio::test]
async fn a_frozen_store_fails_fast_until_it_answers() {
    let f = Fixture::start();
    let store = f.store(0, Duration::from_secs(2));
    setup(&f, &store, 1).await;
    let meta = store.stat(&name(0)).await.unwrap();
    f.proxy.reset_counts();

    f.proxy.inject(S3Op::Get, 0, usize::MAX, FaultAction::Hang);
    let e = tokio::time::timeout(NO_HANG, store.read(&name(0), 0..4, &meta))
        .await
        .expect("a read must give up")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(f.proxy.counts().get, 1);
    for _ in 0..3 {
        let e = store.read(&name(0), 0..4, &meta).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("failing at once"), "{e}");
    }
    let e = store.stat(&name(0)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(
        f.proxy.counts(),
        ProxyCounts {
            get: 1,
            ..ProxyCounts::default()
        },
        "tries during the stall reach the server"
    );

    f.proxy.clear_faults();
    until_it_answers(&store).await;
    assert_eq!(
        &store.read(&name(0), 0..4, &meta).await.unwrap()[..],
        b"obje"
    );
}

/// One request that hangs while others are answered is that request's problem: it times out,
/// and the store is not treated as stalled.
#[tokio::test]
async fn one_hanging_request_does_not_stall_the_store() {
    let f = Fixture::start();
    let store = std::sync::Arc::new(f.store(0, Duration::from_secs(2)));
    setup(&f, &*store, 1).await;
    let meta = store.stat(&name(0)).await.unwrap();
    f.proxy.reset_counts();

    f.proxy.inject(S3Op::Get, 0, 1, FaultAction::Hang);
    let hung = {
        let (store, meta) = (store.clone(), meta.clone());
        tokio::spawn(async move { store.read(&name(0), 0..4, &meta).await })
    };
    // Once the GET hangs at the proxy, another request is answered.
    let deadline = tokio::time::Instant::now() + NO_HANG;
    while f.proxy.counts().get == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the read never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.stat(&name(0)).await.unwrap();
    let e = hung.await.unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(
        &store.read(&name(0), 0..4, &meta).await.unwrap()[..],
        b"obje"
    );
}

/// A recursive listing of a tree with a few subdirectories is split: one delimited request
/// finds them, then each subtree is listed on its own (side by side). It returns what one
/// sweep returns (plus each subdirectory as a directory entry), costs one request per subtree
/// that fits a page, respects the entry budget, and fails whole when one share fails.
#[tokio::test]
async fn a_tree_listing_is_split_by_subdirectory() {
    let f = Fixture::start();
    let retries = 1;
    let opts = S3Options {
        list_page: 10,
        ..f.opts(retries, Duration::from_secs(10))
    };
    let store = S3Store::new("bkt", "tree", &opts).unwrap();
    let keys = [
        "r0", "r1", "a/1", "a/2", "a/3", "b/x/1", "b/x/2", "b/y", "c/z", "c/w",
    ];
    for k in keys {
        store.write(k, Bytes::from(k.to_string())).await.unwrap();
    }
    let split_files = |v: &[silt_ufs::ObjectMeta]| -> Vec<String> {
        let mut f: Vec<String> = v
            .iter()
            .filter(|m| m.kind == EntryKind::File)
            .map(|m| m.path.clone())
            .collect();
        f.sort();
        f
    };
    let dirs = |v: &[silt_ufs::ObjectMeta]| -> std::collections::BTreeSet<String> {
        v.iter()
            .filter(|m| m.kind == EntryKind::Dir)
            .map(|m| m.path.clone())
            .collect()
    };

    // An empty directory (versitygw shows it as a `e/` marker) is a subdirectory too.
    std::fs::create_dir_all(f.server.root().join("bkt/tree/e")).unwrap();
    f.proxy.reset_counts();
    let sweep = store.list("", true).await.unwrap();
    assert_eq!(
        f.proxy.counts().list,
        1,
        "one sweep of 10 keys, 10 per page"
    );

    f.proxy.reset_counts();
    let tree = store
        .list_tree("", 100)
        .await
        .unwrap()
        .expect("within budget");
    let c = f.proxy.counts();
    println!("split listing of 3 subtrees: {c}");
    assert_eq!((c.list, c.total()), (5, 5), "1 delimited + 4 subtrees: {c}");
    assert_eq!(split_files(&tree), split_files(&sweep));
    let (sweep_dirs, tree_dirs) = (dirs(&sweep), dirs(&tree));
    assert!(
        sweep_dirs.is_subset(&tree_dirs),
        "{sweep_dirs:?} ⊄ {tree_dirs:?}"
    );
    assert_eq!(
        tree_dirs,
        ["a", "b", "c", "e"].map(String::from).into_iter().collect()
    );

    // Without subdirectories the delimited page is the whole listing: one request. With one,
    // the page's files and that subtree: two.
    f.proxy.reset_counts();
    let a = store.list_tree("a", 100).await.unwrap().unwrap();
    assert_eq!(split_files(&a), ["a/1", "a/2", "a/3"]);
    assert_eq!(f.proxy.counts().list, 1);
    f.proxy.reset_counts();
    let b = store.list_tree("b", 100).await.unwrap().unwrap();
    assert_eq!(split_files(&b), ["b/x/1", "b/x/2", "b/y"]);
    assert_eq!(f.proxy.counts().list, 2);

    // The budget counts every share: 10 files are more than 8.
    assert!(store.list_tree("", 8).await.unwrap().is_none());

    // After the delimited request and one subtree, every listing request fails (the shares
    // run side by side, so which subtree fails is not fixed): the whole listing fails.
    f.proxy
        .inject(S3Op::List, 2, usize::MAX, FaultAction::internal_error());
    let e = tokio::time::timeout(NO_HANG, store.list_tree("", 100))
        .await
        .expect("the listing ends")
        .expect_err("a listing with a failing share must fail");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    f.proxy.clear_faults();

    // A first page that is full (more entries at the top than a page holds) is not split.
    let small = S3Store::new(
        "bkt",
        "tree",
        &S3Options {
            list_page: 4,
            ..opts.clone()
        },
    )
    .unwrap();
    f.proxy.reset_counts();
    let tree = small.list_tree("", 100).await.unwrap().unwrap();
    assert_eq!(split_files(&tree), split_files(&sweep));
    assert_eq!(
        f.proxy.counts().list,
        1 + 3,
        "the delimited page, then one sweep of 10 keys in pages of 4"
    );
}
