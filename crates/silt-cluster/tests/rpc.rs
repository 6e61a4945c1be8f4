//! Worker RPC against an in-process worker over a MemStore: bytes, the error split between the
//! worker's answers and link failures, and hostile requests.

use std::sync::Arc;

use silt_cache::{PageStore, PageStoreConfig};
use silt_cluster::rpc::{self, CallError, Endpoint, FixedStores, Service, WorkerClient};
use silt_common::ErrorKind;
use silt_ufs::{DynStore, MemStore};
use silt_worker::{ObjectRef, Worker, WorkerOptions};

const PS: u64 = 64 << 10;

async fn worker(store: DynStore) -> (Endpoint, tempfile::TempDir) {
    let pages = Arc::new(
        PageStore::open(PageStoreConfig {
            page_size: PS,
            memory_capacity: 64 * PS,
            disk_tiers: Vec::new(),
            high_watermark: 1.0,
            low_watermark: 1.0,
            eviction_policy: "lru".into(),
        })
        .unwrap(),
    );
    let opts = WorkerOptions {
        fetch_concurrency: 4,
        buffer_memory: 16 << 20,
        request_size: 4 * PS,
    };
    let w = Arc::new(Worker::new(pages, &opts, tokio::runtime::Handle::current()));
    let svc = Arc::new(Service {
        worker: w,
        stores: Arc::new(FixedStores(vec![store])),
        identity: serde_json::json!({"id": "t"}),
    });
    let dir = tempfile::tempdir().unwrap();
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
    let c = WorkerClient::new(ep);
    let obj = ObjectRef::new(store.clone(), meta.clone());

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
    // Still serving.
    let v = c.call("stats", None, 0..0).await.unwrap();
    assert!(v["reads_served"].as_u64().unwrap() >= 3);
    assert!(store.stat("x").await.is_ok());
}

#[tokio::test]
async fn a_dead_endpoint_is_a_link_failure() {
    let dir = tempfile::tempdir().unwrap();
    let c = WorkerClient::new(Endpoint::Unix(dir.path().join("nobody.sock")));
    let store: DynStore = Arc::new(MemStore::new("mem://x"));
    let meta = MemStore::new("mem://x").put("a", vec![0u8; 10]).unwrap();
    match c.read(&ObjectRef::new(store, meta), 0..10).await {
        Err(CallError::Link(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable),
        other => panic!("expected a link failure, got {other:?}"),
    }
}
