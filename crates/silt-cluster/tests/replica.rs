//! Replicated cache-only files: the worker RPC ops (`rput`, `rget`, `rstat`, `rlist`,
//! `rdel`) against in-process workers, and `Replicas` (N copies, failover when one dies).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use silt_cache::{Arena, ArenaConfig, PageStore, PageStoreConfig};
use silt_cluster::rpc::{self, CallError, Endpoint, FixedStores, Request, Service, WorkerClient};
use silt_cluster::{Member, Replicas, ResidentTable, Router, RouterOptions, StaticMembership};
use silt_common::config::DiskTierSpec;
use silt_common::ErrorKind;
use silt_reader::{PageReader, PageReaderOptions};
use silt_resident::{RemoteMeta, ResidentRemote};
use silt_ufs::MemStore;

/// The cluster secret every test worker and client share.
fn key() -> silt_cluster::ClusterKey {
    silt_cluster::ClusterKey::new(&silt_common::secret::Secret::new(
        "test-cluster-secret-0123456789",
    ))
    .unwrap()
}

const PS: u64 = 64 << 10;

/// A worker with a resident table on its own runtime (shut down = the worker dies: its
/// listener and every connection close), reached over TCP.
struct TestWorker {
    rt: Option<tokio::runtime::Runtime>,
    addr: String,
    _dir: tempfile::TempDir,
}

impl TestWorker {
    fn start(memory: u64) -> TestWorker {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let spill = dir.path().join("spill");
        let addr = rt.block_on(async move {
            let pages = Arc::new(PageStore::open(PageStoreConfig::in_memory(PS, 16 * PS)).unwrap());
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
                memory_ceiling: memory,
                file_memory: memory,
                spill: vec![DiskTierSpec {
                    dir: spill,
                    quota: 256 << 20,
                }],
                jobs: Vec::new(),
            })
            .unwrap();
            let svc = Arc::new(
                Service::new(
                    w,
                    Arc::new(FixedStores(vec![Arc::new(MemStore::new("mem://r"))])),
                    rpc::answer::Identity::new("t"),
                    key(),
                )
                .with_resident(Arc::new(ResidentTable::new(arena))),
            );
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            tokio::spawn(rpc::serve_tcp(l, svc));
            addr
        });
        TestWorker {
            rt: Some(rt),
            addr,
            _dir: dir,
        }
    }

    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn meta(size: u64, tag: &str) -> RemoteMeta {
    RemoteMeta {
        size,
        tag: tag.to_string(),
        mtime: Some(SystemTime::now()),
        expires_in: Some(Duration::from_secs(3600)),
    }
}

fn data(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 31 + seed as u64) as u8)
        .collect()
}

fn client_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn resident_ops_on_one_worker() {
    // 1 MiB of memory: the 3 MiB file spills to disk on the worker.
    let w = TestWorker::start(1 << 20);
    let rt = client_rt();
    rt.block_on(async {
        let c = WorkerClient::new(Endpoint::Tcp(w.addr.clone()), key());
        let bytes = data(1, 3 << 20 | 12345);
        let m = meta(bytes.len() as u64, "silt-1");
        let src = bytes::Bytes::from(bytes.clone());
        c.resident_put("/data/a/f", &m, &BytesSrc(src))
            .await
            .unwrap();
        c.resident_put(
            "/data/a/b/g",
            &meta(0, "silt-2"),
            &BytesSrc(bytes::Bytes::new()),
        )
        .await
        .unwrap();

        // Ranges of the version asked for, exactly.
        let got = c
            .resident_get("/data/a/f", "silt-1", 1000..(2 << 20) + 7)
            .await
            .unwrap();
        assert_eq!(&got[..], &bytes[1000..(2 << 20) + 7]);
        // Another version: ContentChanged; no file: NotFound; both answers of a live worker.
        match c.resident_get("/data/a/f", "silt-0", 0..10).await {
            Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::ContentChanged),
            other => panic!("expected ContentChanged, got {other:?}"),
        }
        match c.resident_get("/data/zz", "silt-1", 0..10).await {
            Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::NotFound),
            other => panic!("expected NotFound, got {other:?}"),
        }
        // Outside the file: refused, and the connection goes on serving.
        match c.resident_get("/data/a/f", "silt-1", 0..(4 << 20)).await {
            Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::InvalidInput),
            other => panic!("expected a refusal, got {other:?}"),
        }

        let st = c.resident_stat("/data/a/f").await.unwrap().unwrap();
        assert_eq!((st.size, st.tag.as_str()), (m.size, "silt-1"));
        assert!(st.expires_in.unwrap() <= Duration::from_secs(3600));
        assert!(c.resident_stat("/data/a").await.unwrap().is_none());

        let mut list: Vec<String> = c
            .resident_list("/data/a")
            .await
            .unwrap()
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        list.sort();
        assert_eq!(list, vec!["/data/a/b/g", "/data/a/f"]);
        assert!(c.resident_list("/data/ab").await.unwrap().is_empty());

        let stats = c.call(Request::Stats).await.unwrap();
        assert_eq!(stats["cache_only_files"], 2, "{stats}");

        assert!(c.resident_delete("/data/a/f").await.unwrap());
        assert!(!c.resident_delete("/data/a/f").await.unwrap());
        assert!(c.resident_stat("/data/a/f").await.unwrap().is_none());
        // An announced size that the bytes do not match is refused.
        match c
            .resident_put(
                "/data/x",
                &meta(10, "silt-3"),
                &Short(bytes::Bytes::from_static(b"abc")),
            )
            .await
        {
            Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(c.resident_stat("/data/x").await.unwrap().is_none());
    });
}

/// Two replicas over three workers: each file on exactly two; one of them killed, every file
/// still reads, stats and lists; writes go on (the dead worker's turn passes to the next).
#[test]
fn two_replicas_survive_a_dead_worker() {
    let mut workers: Vec<TestWorker> = (0..3).map(|_| TestWorker::start(8 << 20)).collect();
    let rt = client_rt();
    let members: Vec<Member> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| Member::new(format!("w{i}"), w.addr.clone()))
        .collect();
    let router = Arc::new(Router::new(
        Arc::new(StaticMembership::new(members)),
        RouterOptions {
            timeout: Duration::from_secs(5),
            retry_after: Duration::from_secs(60),
            group_size: 1 << 20,
            candidates: 2,
            host_id: "test".into(),
            unix_socket: true,
            key: key(),
        },
    ));
    let reps = Replicas::new(router, 2);
    let files: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| (format!("/data/d/f{i}"), data(i as u8, 1000 + i * 70_001)))
        .collect();
    let clients: Vec<WorkerClient> = workers
        .iter()
        .map(|w| WorkerClient::new(Endpoint::Tcp(w.addr.clone()), key()))
        .collect();
    let holders = rt.block_on(async {
        for (i, (p, b)) in files.iter().enumerate() {
            let src = BytesSrc(bytes::Bytes::from(b.clone()));
            reps.put(p, &meta(b.len() as u64, &format!("silt-{i}")), &src)
                .await
                .unwrap();
        }
        let mut holders = vec![0usize; 3];
        for (p, _) in &files {
            let mut n = 0;
            for (k, c) in clients.iter().enumerate() {
                if c.resident_stat(p).await.unwrap().is_some() {
                    holders[k] += 1;
                    n += 1;
                }
            }
            assert_eq!(n, 2, "{p} is not on exactly two workers");
        }
        holders
    });
    // Kill the worker holding the most replicas.
    let victim = (0..3).max_by_key(|&k| holders[k]).unwrap();
    assert!(holders[victim] > 0);
    workers[victim].kill();
    rt.block_on(async {
        for (i, (p, b)) in files.iter().enumerate() {
            let tag = format!("silt-{i}");
            let st = reps.stat(p).await.unwrap().expect("a replica answers");
            assert_eq!((st.size, st.tag.as_str()), (b.len() as u64, tag.as_str()));
            let got = reps.read(p, &tag, 0..b.len() as u64).await.unwrap();
            assert!(got[..] == b[..], "{p}: bytes differ after the kill");
        }
        let list = reps.list("/data").await.unwrap();
        assert_eq!(list.len(), files.len(), "{list:?}");
        // Writes go on with one worker dead: the next in rank takes its turn.
        let b = data(99, 5000);
        reps.put(
            "/data/d/new",
            &meta(5000, "silt-99"),
            &BytesSrc(b.clone().into()),
        )
        .await
        .unwrap();
        assert_eq!(
            &reps.read("/data/d/new", "silt-99", 0..5000).await.unwrap()[..],
            &b[..]
        );
        // Deletion reaches every live holder.
        reps.delete("/data/d/f0").await.unwrap();
        assert!(reps.stat("/data/d/f0").await.unwrap().is_none());
        match reps.read("/data/d/f0", "silt-0", 0..10).await {
            Err(e) => assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}"),
            Ok(_) => panic!("a deleted file still reads"),
        }
    });
    // Two dead of three: fewer than two workers can acknowledge, so the put fails.
    let second = (0..3).find(|&k| k != victim).unwrap();
    workers[second].kill();
    rt.block_on(async {
        let e = reps
            .put(
                "/data/d/late",
                &meta(3, "silt-100"),
                &BytesSrc(bytes::Bytes::from_static(b"abc")),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    });
}

struct BytesSrc(bytes::Bytes);

impl silt_common::io::ReadAt for BytesSrc {
    fn read_at(&self, offset: u64, len: usize) -> silt_common::Result<bytes::Bytes> {
        Ok(self.0.slice(offset as usize..offset as usize + len))
    }
}

/// A source shorter than the size announced: reads past its end give what there is.
struct Short(bytes::Bytes);

impl silt_common::io::ReadAt for Short {
    fn read_at(&self, offset: u64, len: usize) -> silt_common::Result<bytes::Bytes> {
        let end = (offset as usize + len).min(self.0.len());
        Ok(self.0.slice((offset as usize).min(end)..end))
    }
}
