//! Worker RPC against an in-process worker over a MemStore: bytes, the error split between the
//! worker's answers and link failures, and hostile requests.

use std::sync::Arc;

use silt_cache::{PageStore, PageStoreConfig};
use silt_cluster::rpc::{self, CallError, Endpoint, FixedStores, Request, Service, WorkerClient};
use silt_common::ErrorKind;
use silt_reader::{ObjectRef, PageReader, PageReaderOptions};
use silt_ufs::{DynStore, MemStore};

/// The cluster secret every test worker and client share.
fn key() -> silt_cluster::ClusterKey {
    silt_cluster::ClusterKey::new(&silt_common::secret::Secret::new(
        "test-cluster-secret-0123456789",
    ))
    .unwrap()
}

const PS: u64 = 64 << 10;

async fn worker(store: DynStore) -> (Endpoint, tempfile::TempDir) {
    worker_with(store, false).await
}

/// A worker serving `store` on a Unix socket in a temporary dir (with a disk tier there if
/// `disk`).
async fn worker_with(store: DynStore, disk: bool) -> (Endpoint, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let disk_tiers = if disk {
        vec![silt_common::config::DiskTierSpec {
            dir: dir.path().join("cache"),
            quota: 256 * PS,
        }]
    } else {
        Vec::new()
    };
    let pages = Arc::new(
        PageStore::open(PageStoreConfig {
            disk_tiers,
            high_watermark: 1.0,
            low_watermark: 1.0,
            ..PageStoreConfig::in_memory(PS, 64 * PS)
        })
        .unwrap(),
    );
    let opts = PageReaderOptions {
        fetch_concurrency: 4,
        buffer_memory: 16 << 20,
        request_size: 4 * PS,
    };
    let w = Arc::new(PageReader::new(
        pages,
        &opts,
        tokio::runtime::Handle::current(),
    ));
    let svc = Arc::new(Service::new(
        w,
        Arc::new(FixedStores(vec![store])),
        rpc::answer::Identity::new("t"),
        key(),
    ));
    let path = dir.path().join("w.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(rpc::serve_unix(l, svc));
    (Endpoint::Unix(path), dir)
}

#[tokio::test]
async fn reads_answers_and_hostile_ranges() {
    let mem = Arc::new(MemStore::new("mem://rpc"));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let meta = mem.put("x", data.clone()).unwrap();
    let store: DynStore = mem.clone();
    let (ep, _dir) = worker(store.clone()).await;
    let c = WorkerClient::new(ep, key());
    let obj = ObjectRef::new(store.clone(), meta.clone());
    let reads_served = || async {
        let v = c.call(Request::Stats).await.unwrap();
        v["reads_served"].as_u64().unwrap()
    };
    let before = reads_served().await;

    // Bytes of any range, exactly.
    let got = c.read(&obj, 1000..250_000).await.unwrap();
    assert_eq!(&got[..], &data[1000..250_000]);

    // A changed object is the worker's answer, not a link failure.
    mem.put("x", vec![1u8; 300_000]).unwrap();
    let fresh = ObjectRef::new(store.clone(), meta.clone());
    match c.read(&fresh, 200_000..299_000).await {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::ContentChanged),
        other => panic!("expected the worker's ContentChanged, got {other:?}"),
    }

    // A client claiming an enormous object and range: refused, and the worker lives on.
    let mut huge = meta.clone();
    huge.size = 1 << 60;
    let huge = ObjectRef::new(store.clone(), huge);
    match c.read(&huge, 0..(1 << 50)).await {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A store the worker does not serve: its answer, Unavailable (the client reads itself).
    let other: DynStore = Arc::new(MemStore::new("mem://elsewhere"));
    let stray = ObjectRef::new(other, meta.clone());
    match c.read(&stray, 0..10).await {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Still serving; of this worker's reads only the one answered with bytes counts.
    assert_eq!(reads_served().await - before, 1);
}

#[tokio::test]
async fn a_dead_endpoint_is_a_link_failure() {
    let dir = tempfile::tempdir().unwrap();
    let c = WorkerClient::new(Endpoint::Unix(dir.path().join("nobody.sock")), key());
    let store: DynStore = Arc::new(MemStore::new("mem://x"));
    let meta = MemStore::new("mem://x").put("a", vec![0u8; 10]).unwrap();
    match c.read(&ObjectRef::new(store, meta), 0..10).await {
        Err(CallError::Link(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable),
        other => panic!("expected a link failure, got {other:?}"),
    }
}

/// A worker with a disk tier (behind its Unix socket) and a client of it, over a store
/// holding one file of five pages and a bit: (its bytes, the object, client, state dir, the
/// store).
async fn disk_worker_with_a_file() -> (
    Vec<u8>,
    ObjectRef,
    WorkerClient,
    tempfile::TempDir,
    Arc<MemStore>,
) {
    let mem = Arc::new(MemStore::new("mem://fd"));
    let data: Vec<u8> = (0..5 * PS as u32 + 77).map(|i| (i % 241) as u8).collect();
    let meta = mem.put("f", data.clone()).unwrap();
    let store: DynStore = mem.clone();
    let (ep, dir) = worker_with(store.clone(), true).await;
    let obj = ObjectRef::new(store, meta);
    (data, obj, WorkerClient::new(ep, key()), dir, mem)
}

/// Flips the byte at `offset` of the (only) data file in the worker's disk tier.
fn flip_cached_byte(state: &std::path::Path, offset: u64) {
    let file = silt_testkit::files_below(&state.join("cache"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .expect("the worker's data file");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[offset as usize] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
}

/// Reads through a passed descriptor check every page's crc32c, like local disk reads.
#[tokio::test]
async fn passed_descriptors_are_read_and_checked() {
    let (data, obj, c, dir, _) = disk_worker_with_a_file().await;
    let fd_reads = || silt_common::metrics::REMOTE_FD_READS.get();
    // First read fetches (bytes); then the pages are on the worker's disk: descriptors.
    let size = data.len() as u64;
    assert_eq!(&c.read(&obj, 0..size).await.unwrap()[..], &data[..]);
    let before = fd_reads();
    let got = c.read(&obj, PS + 5..3 * PS + 9).await.unwrap();
    assert_eq!(&got[..], &data[(PS + 5) as usize..(3 * PS + 9) as usize]);
    assert_eq!(
        fd_reads(),
        before + 1,
        "the second read did not use a descriptor"
    );
    // Both reads were served, one with bytes and one with a descriptor.
    let stats = c.call(Request::Stats).await.unwrap();
    assert_eq!(stats["reads_served"], 2, "{stats}");
    // Flip a byte of page 2 in the worker's cache file: the next read through it is refused.
    flip_cached_byte(dir.path(), 2 * PS + 3);
    match c.read(&obj, PS..3 * PS).await {
        Err(CallError::Link(e)) => assert_eq!(e.kind(), ErrorKind::Corrupted, "{e}"),
        other => panic!("expected a checksum failure, got {other:?}"),
    }
}

/// `read_into` fills the caller's buffer: from the worker's bytes when it has to fetch, from
/// the passed descriptor (in place for whole pages, through pages for any other range) once
/// cached, every page checked; a flipped byte is refused, never written into the buffer's
/// answer.
#[tokio::test]
async fn reads_into_a_buffer_fill_it_and_check_every_page() {
    let (data, obj, c, dir, _) = disk_worker_with_a_file().await;
    // This worker's own counts (the process-wide metric moves with the other tests too): a
    // read served through a descriptor sends no bytes.
    let served = || async {
        let stats = c.call(Request::Stats).await.unwrap();
        (
            stats["reads_served"].as_u64().unwrap(),
            stats["bytes_served"].as_u64().unwrap(),
        )
    };
    let read = |offset: u64, len: usize| {
        let (c, obj) = (&c, &obj);
        async move {
            let mut buf = vec![0u8; len];
            c.read_into(obj, offset, &mut buf).await.map(|_| buf)
        }
    };
    let size = data.len();
    assert_eq!(
        read(0, size).await.unwrap(),
        data,
        "cold: the worker's bytes"
    );
    for (offset, len) in [
        (0, size),
        (PS + 5, 2 * PS as usize),
        (4 * PS, PS as usize + 77),
    ] {
        let (reads, bytes) = served().await;
        let got = read(offset, len).await.unwrap();
        assert_eq!(
            got,
            &data[offset as usize..offset as usize + len],
            "{offset}+{len}"
        );
        assert_eq!(
            served().await,
            (reads + 1, bytes),
            "{offset}+{len}: not through a descriptor"
        );
    }
    // A buffer longer than the object: the worker's pages do not cover it.
    assert!(read(0, size + 1).await.is_err(), "a read past the end");
    flip_cached_byte(dir.path(), 2 * PS + 3);
    for (offset, len) in [(0, size), (PS, 2 * PS as usize)] {
        match read(offset, len).await {
            Err(CallError::Link(e)) => assert_eq!(e.kind(), ErrorKind::Corrupted, "{e}"),
            other => panic!("{offset}+{len}: expected a checksum failure, got {other:?}"),
        }
    }
}

/// A lease leases the worker's own cache file of a whole object (no copy) while it lives;
/// every read through it checks the pages it touches, so a flipped byte is an error.
#[tokio::test]
async fn a_lease_reads_the_workers_file_and_checks_every_page() {
    let (data, obj, c, dir, mem) = disk_worker_with_a_file().await;
    let size = data.len() as u64;
    assert!(c.lease(&obj).await.unwrap().is_none(), "nothing cached yet");
    c.read(&obj, 0..size).await.unwrap();
    let lease = c
        .lease(&obj)
        .await
        .unwrap()
        .expect("a lease of the cached file");
    let read = |offset: u64, len: usize| {
        let mut buf = vec![0u8; len];
        lease.read_into(offset, &mut buf).map(|_| buf)
    };
    // Whole pages, unaligned ranges, the short last page, nothing.
    for (offset, len) in [
        (0, PS as usize),
        (PS + 5, 2 * PS as usize),
        (4 * PS, PS as usize + 77),
        (size - 1, 1),
        (3, 0),
    ] {
        let got = read(offset, len).unwrap();
        assert_eq!(
            got,
            &data[offset as usize..offset as usize + len],
            "{offset}+{len}"
        );
    }
    assert!(read(size - 1, 2).is_err(), "a read past the end");
    // Flip a byte of page 2 in the worker's cache file: reads touching it fail, others not.
    flip_cached_byte(dir.path(), 2 * PS + 3);
    let err = read(PS + 1, PS as usize).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupted, "{err}");
    assert_eq!(read(0, PS as usize).unwrap(), &data[..PS as usize]);
    // Loads of twice the disk tier (admitted whatever their counts) evict everything else:
    // the leased object stays whole while the lease lives.
    for i in 0..8 {
        let meta = mem
            .put(&format!("o{i}"), vec![i as u8; (64 * PS) as usize])
            .unwrap();
        let other = ObjectRef::new(mem.clone(), meta);
        c.call(Request::load(&other, 0..64 * PS)).await.unwrap();
    }
    let ask = silt_cluster::rpc::PageRange {
        object: obj.id.to_hex(),
        first: 0,
        last: 5,
    };
    assert_eq!(
        c.cached(vec![ask]).await.unwrap(),
        vec![6],
        "the leased object was evicted"
    );
    assert_eq!(read(0, PS as usize).unwrap(), &data[..PS as usize]);
    // Dropping the lease ends its connection; the worker goes on serving.
    drop(lease);
    let stats = c.call(Request::Stats).await.unwrap();
    assert_eq!(stats["files_leased"], 1, "{stats}");
}

/// `prefetch` answers at once and starts fetching what the worker lacks; a read right after
/// joins those fetches instead of fetching again; a range past the end is refused.
#[tokio::test]
async fn prefetch_starts_fetches_that_a_read_then_joins() {
    let mem = Arc::new(MemStore::new("mem://prefetch"));
    let data = vec![3u8; (5 * PS) as usize];
    let a = mem.put("a", data.clone()).unwrap();
    let b = mem.put("b", data.clone()).unwrap();
    let store: DynStore = mem.clone();
    let (ep, _dir) = worker(store.clone()).await;
    let c = WorkerClient::new(ep, key());
    let (a, b) = (ObjectRef::new(store.clone(), a), ObjectRef::new(store, b));
    // The cost of reading b cold, for comparison.
    let before = mem.requests();
    assert_eq!(
        c.read(&b, 0..5 * PS).await.unwrap().len(),
        (5 * PS) as usize
    );
    let cold = mem.requests() - before;
    let before = mem.requests();
    let v = c.call(Request::prefetch(&a, 0..5 * PS)).await.unwrap();
    assert_eq!(v["pages"], 5, "{v}");
    assert_eq!(&c.read(&a, 0..5 * PS).await.unwrap()[..], &data[..]);
    assert_eq!(mem.requests() - before, cold, "the read fetched again");
    let ask = silt_cluster::rpc::PageRange {
        object: a.id.to_hex(),
        first: 0,
        last: 4,
    };
    assert_eq!(c.cached(vec![ask]).await.unwrap(), vec![5]);
    // Prefetching what is cached starts nothing.
    let v = c.call(Request::prefetch(&a, 0..5 * PS)).await.unwrap();
    assert_eq!(v["pages"], 0, "{v}");
    match c.call(Request::prefetch(&a, 4 * PS..6 * PS)).await {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
        other => panic!("a prefetch past the end: {other:?}"),
    }
}

/// `cached` counts the pages a worker holds without fetching any; hostile asks are refused;
/// `changed` is refused by a worker with no namespace of its own.
#[tokio::test]
async fn cached_counts_held_pages_and_refuses_hostile_asks() {
    use silt_cluster::rpc::{PageRange, CACHED_MAX_PAGES};
    let mem = Arc::new(MemStore::new("mem://cached"));
    let meta = mem.put("x", vec![7u8; (5 * PS) as usize]).unwrap();
    let store: DynStore = mem.clone();
    let (ep, _dir) = worker(store.clone()).await;
    let c = WorkerClient::new(ep, key());
    let obj = ObjectRef::new(store.clone(), meta.clone());
    let ask = |first, last| PageRange {
        object: obj.id.to_hex(),
        first,
        last,
    };
    assert_eq!(c.cached(vec![ask(0, 4)]).await.unwrap(), vec![0]);
    // Pages 1..=2 read through the worker: now held. Asking fetched nothing.
    c.read(&obj, PS..3 * PS).await.unwrap();
    let fetched_before = mem.requests();
    assert_eq!(
        c.cached(vec![ask(0, 4), ask(1, 1), ask(3, 4)])
            .await
            .unwrap(),
        vec![2, 1, 0]
    );
    assert_eq!(mem.requests(), fetched_before);
    for bad in [
        vec![ask(3, 1)],
        vec![PageRange {
            object: "zz".into(),
            first: 0,
            last: 0,
        }],
        vec![ask(0, CACHED_MAX_PAGES)],
    ] {
        match c.cached(bad).await {
            Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    match c.changed("/data", silt_cluster::rpc::Change::Within).await {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A cluster worker's socket (no `with_store_calls`) serves reads only: a member on the same
/// host cannot write, delete or even stat through the worker's store credentials; a refused
/// write's bytes are skipped, so the connection serves on.
#[tokio::test]
async fn a_worker_without_store_calls_refuses_them_on_its_unix_socket() {
    let mem = Arc::new(MemStore::new("mem://rpc"));
    mem.put("x", b"kept".to_vec()).unwrap();
    let store: DynStore = mem.clone();
    let (ep, _dir) = worker(store.clone()).await;
    let c = WorkerClient::new(ep, key());
    for req in [
        Request::StoreStat {
            store: "mem://rpc".into(),
            path: "x".into(),
        },
        Request::StoreDelete {
            store: "mem://rpc".into(),
            path: "x".into(),
        },
    ] {
        match c.call(req.clone()).await {
            Err(CallError::Worker(e)) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                assert!(e.to_string().contains("attached clients only"), "{e}");
            }
            other => panic!("{} on a worker's socket: {other:?}", req.name()),
        }
    }
    struct Src;
    impl silt_common::io::ReadAt for Src {
        fn read_at(&self, _: u64, len: usize) -> silt_common::Result<bytes::Bytes> {
            Ok(bytes::Bytes::from(vec![b'z'; len]))
        }
    }
    match c
        .store_write("mem://rpc", "x", &Src, 3 << 20, &Default::default(), None)
        .await
    {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}"),
        other => panic!("store_write on a worker's socket: {other:?}"),
    }
    assert_eq!(mem.get("x").unwrap(), b"kept".to_vec());
    assert!(c.call(Request::Stats).await.is_ok());
}
