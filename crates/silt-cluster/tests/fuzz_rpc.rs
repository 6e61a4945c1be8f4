//! A worker's RPC server fed arbitrary bytes and damaged requests over its socket: every
//! connection ends with answers or an error, the server never panics or hangs, and it keeps
//! serving. Arbitrary bytes go both to the handshake (no key) and, after a good handshake, to
//! the request decoders; damaged requests are sent after a good handshake.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use silt_cache::{Arena, ArenaConfig, PageStore, PageStoreConfig};
use silt_cluster::auth::{self, ClusterKey};
use silt_cluster::replica::ResidentTable;
use silt_cluster::rpc::{self, Endpoint, FixedStores, Request, Service, WorkerClient};
use silt_common::config::DiskTierSpec;
use silt_common::secret::Secret;
use silt_reader::{PageReader, PageReaderOptions};
use silt_ufs::MemStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PS: u64 = 64 << 10;

/// Panics anywhere in this test binary (a panicking connection task is otherwise silent).
static PANICS: AtomicUsize = AtomicUsize::new(0);

struct Fixture {
    rt: tokio::runtime::Runtime,
    key: ClusterKey,
    sock: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// One worker for every case: a memory page store, a MemStore with object `x`, and the
/// table of replicated cache-only files.
fn fixture() -> Fixture {
    {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                PANICS.fetch_add(1, Ordering::Relaxed);
                hook(info)
            }));
        });
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sock = dir.path().join("w.sock");
        let spill = dir.path().join("spill");
        let s = sock.clone();
        let key =
            ClusterKey::new(&Secret::new("fuzz-cluster-secret-0123456789".to_string())).unwrap();
        let k = key.clone();
        rt.block_on(async move {
            let mem = Arc::new(MemStore::new("mem://f"));
            mem.put("x", (0..300_000u32).map(|i| i as u8).collect::<Vec<u8>>())
                .unwrap();
            let pages = Arc::new(PageStore::open(PageStoreConfig::in_memory(PS, 64 * PS)).unwrap());
            let opts = PageReaderOptions {
                fetch_concurrency: 2,
                buffer_memory: 4 << 20,
                request_size: 4 * PS,
            };
            let w = Arc::new(PageReader::new(
                pages,
                &opts,
                tokio::runtime::Handle::current(),
            ));
            let arena = Arena::open(ArenaConfig {
                chunk_size: PS,
                memory_ceiling: 8 << 20,
                file_memory: 8 << 20,
                spill: vec![DiskTierSpec {
                    dir: spill,
                    quota: 64 << 20,
                }],
                jobs: Vec::new(),
            })
            .unwrap();
            let svc = Arc::new(
                Service::new(
                    w,
                    Arc::new(FixedStores(vec![mem])),
                    rpc::answer::Identity::new("fuzz"),
                    k,
                )
                .with_resident(Arc::new(ResidentTable::new(arena))),
            );
            let l = tokio::net::UnixListener::bind(&s).unwrap();
            tokio::spawn(rpc::serve_unix(l, svc));
        });
        Fixture {
            rt,
            key,
            sock,
            _dir: dir,
        }
    }
}

/// Sends `bytes` (after the handshake if `member`), closes the sending side and reads until the server closes. A server that
/// neither answers nor closes within a minute is a hang.
fn exchange(f: &Fixture, bytes: &[u8], member: bool) -> Vec<u8> {
    f.rt.block_on(async {
        let mut c = tokio::net::UnixStream::connect(&f.sock).await.unwrap();
        if member {
            auth::connect(&mut c, &f.key, &[]).await.unwrap();
        }
        // The server may refuse and close before reading everything: not an error here.
        let _ = c.write_all(bytes).await;
        let _ = c.shutdown().await;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut out))
            .await
            .expect("the worker neither answered nor closed: a hang")
            .ok();
        out
    })
}

/// The worker still answers a normal request.
fn still_serving(f: &Fixture) {
    f.rt.block_on(async {
        let c = WorkerClient::new(Endpoint::Unix(f.sock.clone()), f.key.clone());
        let v = c.call(Request::Stats).await.unwrap();
        assert!(v.is_object(), "{v}");
    });
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut b = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    b.push(kind);
    b.extend_from_slice(payload);
    b
}

/// Requests as clients send them, each a list of frames.
fn requests() -> Vec<Vec<u8>> {
    let obj = serde_json::json!({"store": "mem://f", "path": "x", "size": 300_000});
    let file = serde_json::json!({"path": "/c/f", "size": 5, "tag": "t1"});
    let json = |v: serde_json::Value| frame(1, &serde_json::to_vec(&v).unwrap());
    vec![
        json(serde_json::json!({"v": 1, "op": "stats"})),
        json(serde_json::json!({"v": 1, "op": "read", "object": obj, "offset": 10, "len": 70_000})),
        json(
            serde_json::json!({"v": 1, "op": "read", "object": obj, "offset": 0, "len": 100, "fd": true}),
        ),
        json(serde_json::json!({"v": 1, "op": "lease_copy", "object": obj})),
        json(serde_json::json!({"v": 1, "op": "load", "object": obj})),
        json(serde_json::json!({"v": 1, "op": "forget", "object": obj})),
        json(serde_json::json!({"v": 1, "op": "prefetch", "object": obj, "offset": 0, "len": 100})),
        json(serde_json::json!({"v": 1, "op": "pin", "object": obj, "offset": 0, "len": 100})),
        json(serde_json::json!({"v": 1, "op": "unpin", "object": obj})),
        [
            json(serde_json::json!({"v": 1, "op": "rput", "path": "/c/f", "file": file})),
            frame(2, b"hello"),
            frame(3, b""),
        ]
        .concat(),
        json(
            serde_json::json!({"v": 1, "op": "rget", "path": "/c/f", "file": file, "offset": 0, "len": 5}),
        ),
        json(serde_json::json!({"v": 1, "op": "rstat", "path": "/c/f"})),
        json(serde_json::json!({"v": 1, "op": "rlist", "path": "/c"})),
        json(serde_json::json!({"v": 1, "op": "rdel", "path": "/c/f"})),
    ]
}

fn config() -> Config {
    Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    }
}

/// One worker for all cases (proptest's runner inside the test, so the worker and its files
/// go away with the test).
#[test]
fn worker_refuses_arbitrary_and_damaged_requests() {
    let f = fixture();
    let arbitrary = proptest::collection::vec(any::<u8>(), 0..512);
    TestRunner::new(config())
        .run(&(arbitrary, any::<bool>()), |(b, member)| {
            exchange(&f, &b, member);
            prop_assert_eq!(PANICS.load(Ordering::Relaxed), 0);
            Ok(())
        })
        .unwrap();

    // Real requests, several per connection, with flipped bytes, a cut, or a rewritten
    // length field.
    let all = requests();
    let damaged = (
        proptest::collection::vec(any::<prop::sample::Index>(), 1..4),
        proptest::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 0..3),
        proptest::option::of(any::<prop::sample::Index>()),
        proptest::option::of((any::<prop::sample::Index>(), any::<u32>())),
    );
    TestRunner::new(config())
        .run(&damaged, |(picks, flips, cut, new_len)| {
            let mut s: Vec<u8> = picks
                .iter()
                .flat_map(|i| all[i.index(all.len())].clone())
                .collect();
            if let Some((at, l)) = new_len {
                // The first frame's length field, or four bytes anywhere.
                let i = if at.index(2) == 0 {
                    0
                } else {
                    at.index(s.len() - 3)
                };
                s[i..i + 4].copy_from_slice(&l.to_be_bytes());
            }
            for (at, x) in flips {
                let i = at.index(s.len());
                s[i] ^= x;
            }
            if let Some(at) = cut {
                s.truncate(at.index(s.len() + 1));
            }
            exchange(&f, &s, true);
            prop_assert_eq!(PANICS.load(Ordering::Relaxed), 0);
            Ok(())
        })
        .unwrap();

    // Still well: every undamaged request is answered.
    for r in &all {
        let out = exchange(&f, r, true);
        assert!(
            out.len() >= 5,
            "no answer to {:?}",
            String::from_utf8_lossy(r)
        );
    }
    still_serving(&f);
    assert_eq!(PANICS.load(Ordering::Relaxed), 0);
}
