//! Worker RPC against an in-process worker over a MemStore: bytes, the error split between the
//! worker's answers and link failures, and hostile requests.

use std::sync::Arc;

use silt_cache::{PageStore, PageStoreConfig};
use silt_cluster::rpc::{self, CallError, Endpoint, FixedStores, Service, WorkerClient};
use silt_common::ErrorKind;
use silt_ufs::{DynStore, MemStore};
use silt_worker::{ObjectRef, Worker, WorkerOptions};

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
    let opts = WorkerOptions {
        fetch_concurrency: 4,
        buffer_memory: 16 << 20,
        request_size: 4 * PS,
    };
    let w = Arc::new(Worker::new(pages, &opts, tokio::runtime::Handle::current()));
    let svc = Arc::new(Service::new(
        w,
        Arc::new(FixedStores(vec![store])),
        serde_json::json!({"id": "t"}),
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
        let v = c.call("stats", None, 0..0).await.unwrap();
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

/// Reads through a passed descriptor check every page's crc32c, like local disk reads.
#[tokio::test]
async fn passed_descriptors_are_read_and_checked() {
    let mem = Arc::new(MemStore::new("mem://fd"));
    let data: Vec<u8> = (0..5 * PS as u32 + 77).map(|i| (i % 241) as u8).collect();
    let meta = mem.put("f", data.clone()).unwrap();
    let store: DynStore = mem;
    let (ep, dir) = worker_with(store.clone(), true).await;
    let c = WorkerClient::new(ep, key());
    let obj = ObjectRef::new(store, meta);
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
    let stats = c.call("stats", None, 0..0).await.unwrap();
    assert_eq!(stats["reads_served"], 2, "{stats}");
    // Flip a byte of page 2 in the worker's cache file: the next read through it is refused.
    let file = silt_testkit::files_below(&dir.path().join("cache"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .expect("the worker's data file");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[(2 * PS + 3) as usize] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    match c.read(&obj, PS..3 * PS).await {
        Err(CallError::Link(e)) => assert_eq!(e.kind(), ErrorKind::Corrupted, "{e}"),
        other => panic!("expected a checksum failure, got {other:?}"),
    }
}
