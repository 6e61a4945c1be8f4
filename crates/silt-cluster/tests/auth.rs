//! Cluster membership on the worker port: the raw-protocol attack of issue 15 as a test. A
//! peer speaking the frame format without the handshake, with a wrong secret, or replaying a
//! recorded handshake gets nothing from a worker (a real `Service` on a real TCP socket and on
//! its Unix socket) for any request kind; a member with the secret gets everything; a client
//! never sends a request to a worker that cannot prove it holds the secret.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use silt_cache::{Arena, ArenaConfig, PageStore, PageStoreConfig};
use silt_cluster::rpc::{self, CallError, Endpoint, FixedStores, Request, Service, WorkerClient};
use silt_cluster::{ClusterKey, ResidentTable};
use silt_common::config::DiskTierSpec;
use silt_common::secret::Secret;
use silt_common::ErrorKind;
use silt_proto::{read_frame, write_frame, write_json, FrameKind};
use silt_reader::{ObjectRef, PageReader, PageReaderOptions};
use silt_resident::RemoteMeta;
use silt_ufs::{DynStore, MemStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

const PS: u64 = 64 << 10;
const SECRET: &str = "the-cluster-secret-of-this-test";

fn key(s: &str) -> ClusterKey {
    ClusterKey::new(&Secret::new(s)).unwrap()
}

struct BytesSrc(bytes::Bytes);

impl silt_common::io::ReadAt for BytesSrc {
    fn read_at(&self, offset: u64, len: usize) -> silt_common::Result<bytes::Bytes> {
        Ok(self.0.slice(offset as usize..offset as usize + len))
    }
}

/// A worker (disk tier, resident table) serving on TCP and on a Unix socket, with one cached
/// object and one cache-only file worth stealing.
struct Fx {
    tcp: String,
    uds: std::path::PathBuf,
    store: DynStore,
    obj: ObjectRef,
    data: Vec<u8>,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fx {
    fixture_with(key(SECRET)).await
}

/// [`fixture`] with a worker of key `worker` (e.g. one with `cluster_tls`).
async fn fixture_with(worker: ClusterKey) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemStore::new("mem://auth"));
    let data: Vec<u8> = (0..3 * PS as u32 + 11).map(|i| (i % 239) as u8).collect();
    let meta = mem.put("obj", data.clone()).unwrap();
    let store: DynStore = mem;
    let pages = Arc::new(
        PageStore::open(PageStoreConfig {
            disk_tiers: vec![DiskTierSpec {
                dir: dir.path().join("cache"),
                quota: 256 * PS,
            }],
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
    let arena = Arena::open(ArenaConfig {
        chunk_size: PS,
        memory_ceiling: 16 << 20,
        file_memory: 16 << 20,
        spill: vec![DiskTierSpec {
            dir: dir.path().join("spill"),
            quota: 64 << 20,
        }],
        jobs: Vec::new(),
    })
    .unwrap();
    let svc = Arc::new(
        Service::new(
            w,
            Arc::new(FixedStores(vec![store.clone()])),
            rpc::answer::Identity::new("t"),
            worker.clone(),
        )
        .with_resident(Arc::new(ResidentTable::new(arena)))
        .with_store_calls(),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = l.local_addr().unwrap().to_string();
    tokio::spawn(rpc::serve_tcp(l, svc.clone()));
    let uds = dir.path().join("w.sock");
    tokio::spawn(rpc::serve_unix(UnixListener::bind(&uds).unwrap(), svc));
    let obj = ObjectRef::new(store.clone(), meta);
    let fx = Fx {
        tcp,
        uds,
        store,
        obj,
        data,
        _dir: dir,
    };
    // A member caches the object (on disk: `hold` and descriptor reads have something to
    // give) and keeps a cache-only file there.
    let member = WorkerClient::new(Endpoint::Tcp(fx.tcp.clone()), worker);
    let size = fx.data.len() as u64;
    assert_eq!(
        &member.read(&fx.obj, 0..size).await.unwrap()[..],
        &fx.data[..]
    );
    member
        .resident_put(
            "/data/private",
            &resident_meta(5, "v1"),
            &BytesSrc("hello".into()),
        )
        .await
        .unwrap();
    fx
}

fn resident_meta(size: u64, tag: &str) -> RemoteMeta {
    RemoteMeta {
        size,
        tag: tag.into(),
        mtime: Some(SystemTime::now()),
        expires_in: Some(Duration::from_secs(3600)),
    }
}

/// What the worker holds and has done, as a member sees it (over the Unix socket, which every
/// worker serves without TLS).
async fn state(fx: &Fx) -> Value {
    let m = WorkerClient::new(Endpoint::Unix(fx.uds.clone()), key(SECRET));
    let s = m.call(Request::Stats).await.unwrap();
    let files = m.resident_list("/").await.unwrap();
    let mut stored: Vec<String> = fx
        .store
        .list("", true)
        .await
        .unwrap()
        .iter()
        .map(|e| format!("{}:{}", e.path, e.size))
        .collect();
    stored.sort();
    json!({
        "store": stored,
        "reads_served": s["reads_served"], "bytes_served": s["bytes_served"],
        "files_leased": s["files_leased"], "used": s["used"], "page_misses": s["page_misses"],
        "cache_only_files": s["cache_only_files"],
        "resident": files.iter().map(|(p, m)| format!("{p}:{}:{}", m.tag, m.size)).collect::<Vec<_>>(),
    })
}

/// Every request kind the service knows (and one it does not), as raw frames: the JSON request
/// and, for `rput`, the bytes that follow it.
fn requests(fx: &Fx) -> Vec<(&'static str, Value, Option<Vec<u8>>)> {
    let object = json!({"store": fx.store.uri(), "path": fx.obj.meta.path, "size": fx.obj.size(),
        "etag": fx.obj.meta.etag, "version": fx.obj.meta.version});
    let whole = fx.obj.size();
    let req = |op: &str| json!({"v": 1, "op": op, "object": object, "offset": 0, "len": whole});
    let res = |op: &str, file: Value| json!({"v": 1, "op": op, "path": "/data/private", "file": file, "offset": 0, "len": 5});
    let uri = fx.store.uri().to_string();
    let st = |op: &str, mut args: Value| {
        args["v"] = json!(1);
        args["op"] = json!(op);
        args["store"] = json!(uri);
        args
    };
    let expected = serde_json::to_value(&fx.obj.meta).unwrap();
    vec![
        ("stats", json!({"v": 1, "op": "stats"}), None),
        (
            "changed",
            json!({"v": 1, "op": "changed", "path": "/data", "freed": true}),
            None,
        ),
        (
            "cached",
            json!({"v": 1, "op": "cached", "ranges": [{"object": "00", "first": 0, "last": 0}]}),
            None,
        ),
        (
            "lease",
            json!({"v": 1, "op": "lease", "object": object}),
            None,
        ),
        ("read", req("read"), None),
        (
            "read fd",
            {
                let mut r = req("read");
                r["fd"] = json!(true);
                r
            },
            None,
        ),
        (
            "lease_copy",
            json!({"v": 1, "op": "lease_copy", "object": object, "fd": true}),
            None,
        ),
        ("load", req("load"), None),
        ("prefetch", req("prefetch"), None),
        ("pin", req("pin"), None),
        ("unpin", req("unpin"), None),
        ("forget", req("forget"), None),
        ("rget", res("rget", json!({"size": 0, "tag": "v1"})), None),
        ("rstat", res("rstat", Value::Null), None),
        ("rlist", json!({"v": 1, "op": "rlist", "path": "/"}), None),
        ("rdel", res("rdel", Value::Null), None),
        (
            "rput",
            json!({"v": 1, "op": "rput", "path": "/data/private",
                "file": {"path": "/data/private", "size": 4, "tag": "evil"}}),
            Some(b"evil".to_vec()),
        ),
        ("store_info", st("store_info", json!({})), None),
        ("store_stat", st("store_stat", json!({"path": "obj"})), None),
        (
            "store_list",
            st("store_list", json!({"path": "", "recursive": true})),
            None,
        ),
        (
            "store_list_tree",
            st("store_list_tree", json!({"path": "", "max": 10})),
            None,
        ),
        (
            "store_headers",
            st(
                "store_headers",
                json!({"path": "obj", "expected": expected}),
            ),
            None,
        ),
        (
            "store_read",
            st(
                "store_read",
                json!({"path": "obj", "expected": expected, "offset": 0, "len": 5}),
            ),
            None,
        ),
        (
            "store_write",
            st("store_write", json!({"path": "evil", "size": 4})),
            Some(b"evil".to_vec()),
        ),
        (
            "store_delete",
            st("store_delete", json!({"path": "obj"})),
            None,
        ),
        (
            "store_create_dir",
            st("store_create_dir", json!({"path": "evil"})),
            None,
        ),
        (
            "store_remove_dir",
            st("store_remove_dir", json!({"path": "evil"})),
            None,
        ),
        (
            "store_rename",
            st("store_rename", json!({"from": "obj", "to": "evil"})),
            None,
        ),
        (
            "store_copy",
            st("store_copy", json!({"from": "obj", "to": "evil"})),
            None,
        ),
        (
            "store_symlink",
            st("store_symlink", json!({"path": "evil", "target": "obj"})),
            None,
        ),
        (
            "store_read_link",
            st("store_read_link", json!({"path": "obj"})),
            None,
        ),
        (
            "store_set_attrs",
            st(
                "store_set_attrs",
                json!({"path": "obj", "attrs": {"mode": 511}}),
            ),
            None,
        ),
        (
            "store_mknod",
            st("store_mknod", json!({"path": "evil", "kind": "fifo"})),
            None,
        ),
        (
            "store_hard_link",
            st("store_hard_link", json!({"from": "obj", "to": "evil"})),
            None,
        ),
        ("unknown op", json!({"v": 1, "op": "ping"}), None),
    ]
}

/// Sends `prefix` (raw bytes), then `req` and `data` on `s` as a client that skips the
/// handshake would, and returns every frame the worker sent until it closed the connection.
async fn attempt<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    prefix: &[u8],
    req: &Value,
    data: Option<&[u8]>,
) -> Vec<(FrameKind, bytes::Bytes)> {
    // Writes may fail once the worker has closed; what it sent is what counts.
    let _ = s.write_all(prefix).await;
    let _ = write_json(&mut s, req).await;
    if let Some(d) = data {
        let _ = write_frame(&mut s, FrameKind::Data, d).await;
        let _ = write_frame(&mut s, FrameKind::End, &[]).await;
    }
    let mut got = Vec::new();
    let all = async {
        while let Ok(Some(f)) = read_frame(&mut s).await {
            got.push(f);
        }
    };
    // Only a guard against a hang: the worker must close, whenever it does.
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the worker kept an unauthenticated connection open");
    got
}

/// The worker sent its challenge and a refusal, and nothing else: no bytes, no answer.
fn assert_refused(what: &str, frames: &[(FrameKind, bytes::Bytes)]) {
    let mut refused = false;
    for (i, (kind, p)) in frames.iter().enumerate() {
        match kind {
            FrameKind::Json if i == 0 => {
                let v: Value = serde_json::from_slice(p).unwrap();
                assert!(
                    v.get("auth").is_some(),
                    "{what}: first frame is not a challenge: {v}"
                );
                assert_eq!(
                    v.as_object().unwrap().len(),
                    2,
                    "{what}: challenge carries more: {v}"
                );
            }
            FrameKind::Error => {
                let v: Value = serde_json::from_slice(p).unwrap();
                assert_eq!(
                    v["kind"],
                    ErrorKind::PermissionDenied.as_str(),
                    "{what}: {v}"
                );
                assert!(
                    !v["message"].as_str().unwrap().contains(SECRET),
                    "{what}: {v}"
                );
                refused = true;
            }
            other => panic!("{what}: the worker answered an unauthenticated peer: {other:?} {p:?}"),
        }
    }
    assert!(refused, "{what}: closed without saying why: {frames:?}");
}

/// Every request kind the protocol has, as `Request::name` says it.
const REQUEST_KINDS: &[&str] = &[
    "stats",
    "changed",
    "cached",
    "pin",
    "unpin",
    "read",
    "lease",
    "lease_copy",
    "load",
    "prefetch",
    "forget",
    "rput",
    "rget",
    "rstat",
    "rlist",
    "rdel",
    "store_info",
    "store_stat",
    "store_list",
    "store_list_tree",
    "store_headers",
    "store_read",
    "store_write",
    "store_delete",
    "store_create_dir",
    "store_remove_dir",
    "store_rename",
    "store_copy",
    "store_symlink",
    "store_read_link",
    "store_set_attrs",
    "store_mknod",
    "store_hard_link",
];

/// The raw list below is what the handshake tests send: each entry must decode as the kind
/// it names today (a renamed op left under an old name would be refused before decoding, and
/// pass unseen), and together they must name every kind.
#[tokio::test]
async fn the_raw_requests_are_every_kind_as_it_decodes() {
    let fx = fixture().await;
    let mut named = std::collections::BTreeSet::new();
    for (what, req, _) in requests(&fx) {
        if what == "unknown op" {
            continue;
        }
        let bytes = serde_json::to_vec(&req).unwrap();
        let decoded = Request::decode(FrameKind::Json, &bytes)
            .unwrap_or_else(|e| panic!("{what} does not decode: {e}"));
        assert_eq!(json!(decoded.name()), req["op"], "{what}");
        named.insert(decoded.name());
    }
    let every: std::collections::BTreeSet<&str> = REQUEST_KINDS.iter().copied().collect();
    assert_eq!(named, every, "request kinds missing from the raw list");
}

#[tokio::test]
async fn without_the_handshake_every_request_kind_is_refused() {
    let fx = fixture().await;
    let before = state(&fx).await;
    let failures = silt_common::metrics::RPC_AUTH_FAILURES.get();
    let mut n = 0;
    for (what, req, data) in requests(&fx) {
        let tcp = TcpStream::connect(&fx.tcp).await.unwrap();
        assert_refused(
            &format!("tcp {what}"),
            &attempt(tcp, &[], &req, data.as_deref()).await,
        );
        let uds = UnixStream::connect(&fx.uds).await.unwrap();
        assert_refused(
            &format!("unix {what}"),
            &attempt(uds, &[], &req, data.as_deref()).await,
        );
        // A forged answer to the challenge, then the request: refused just the same.
        let forged = json!({"v": 1, "op": "auth", "nonce": "A".repeat(43) + "=",
            "mac": "B".repeat(43) + "="});
        let mut pre = Vec::new();
        write_json(&mut pre, &forged).await.unwrap();
        let tcp = TcpStream::connect(&fx.tcp).await.unwrap();
        assert_refused(
            &format!("forged {what}"),
            &attempt(tcp, &pre, &req, data.as_deref()).await,
        );
        n += 3;
    }
    // Nothing was read, fetched, leased, written or deleted.
    assert_eq!(state(&fx).await, before);
    assert!(silt_common::metrics::RPC_AUTH_FAILURES.get() >= failures + n);
}

#[tokio::test]
async fn a_wrong_secret_gets_nothing_and_the_right_one_everything() {
    let fx = fixture().await;
    let before = state(&fx).await;
    let size = fx.obj.size();
    for ep in [
        Endpoint::Tcp(fx.tcp.clone()),
        Endpoint::Unix(fx.uds.clone()),
    ] {
        let c = WorkerClient::new(ep.clone(), key("another-cluster-secret-entirely"));
        let refused = |what: &str, r: Result<(), CallError>| match r {
            Err(CallError::Link(e)) => {
                assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{what}: {e}")
            }
            other => panic!("{what} with a wrong secret ({ep:?}): {other:?}"),
        };
        refused("read", c.read(&fx.obj, 0..size).await.map(drop));
        if matches!(ep, Endpoint::Unix(_)) {
            refused("lease_copy", c.lease_copy(&fx.obj).await.map(drop));
        }
        for req in [
            Request::Stats,
            Request::load(&fx.obj, 0..size),
            Request::forget(&fx.obj),
        ] {
            let op = req.name();
            refused(op, c.call(req).await.map(drop));
        }
        refused(
            "rget",
            c.resident_get("/data/private", "v1", 0..5).await.map(drop),
        );
        refused("rstat", c.resident_stat("/data/private").await.map(drop));
        let uri = fx.store.uri().to_string();
        refused(
            "store_stat",
            c.call(Request::StoreStat {
                store: uri.clone(),
                path: "obj".into(),
            })
            .await
            .map(drop),
        );
        refused(
            "store_write",
            c.store_write(
                &uri,
                "evil",
                &BytesSrc("evil".into()),
                4,
                &Default::default(),
                None,
            )
            .await
            .map(drop),
        );
        refused("rlist", c.resident_list("/").await.map(drop));
        refused("rdel", c.resident_delete("/data/private").await.map(drop));
        let evil = BytesSrc("evil".into());
        refused(
            "rput",
            c.resident_put("/data/private", &resident_meta(4, "evil"), &evil)
                .await,
        );
    }
    assert_eq!(state(&fx).await, before);

    // A member gets everything, over both sockets.
    let tcp = WorkerClient::new(Endpoint::Tcp(fx.tcp.clone()), key(SECRET));
    let uds = WorkerClient::new(Endpoint::Unix(fx.uds.clone()), key(SECRET));
    for c in [&tcp, &uds] {
        assert_eq!(
            &c.read(&fx.obj, 7..size - 3).await.unwrap()[..],
            &fx.data[7..(size - 3) as usize]
        );
        assert_eq!(c.call(Request::Stats).await.unwrap()["identity"]["id"], "t");
        assert_eq!(
            c.call(Request::load(&fx.obj, 0..size)).await.unwrap()["bytes"],
            size
        );
        assert_eq!(
            &c.resident_get("/data/private", "v1", 0..5).await.unwrap()[..],
            b"hello"
        );
        assert_eq!(
            c.resident_stat("/data/private").await.unwrap().unwrap().tag,
            "v1"
        );
        assert_eq!(c.resident_list("/data").await.unwrap().len(), 1);
    }
    let held = uds
        .lease_copy(&fx.obj)
        .await
        .unwrap()
        .expect("a same-host member is leased the file");
    let mut copy = vec![0u8; fx.data.len()];
    std::os::unix::fs::FileExt::read_exact_at(&held.file, &mut copy, 0).unwrap();
    assert_eq!(copy, fx.data);
    assert_eq!(
        tcp.call(Request::forget(&fx.obj)).await.unwrap()["forgot"],
        true
    );
    assert!(tcp.resident_delete("/data/private").await.unwrap());
    tcp.resident_put(
        "/data/new",
        &resident_meta(3, "v2"),
        &BytesSrc("new".into()),
    )
    .await
    .unwrap();
    assert_eq!(
        &uds.resident_get("/data/new", "v2", 0..3).await.unwrap()[..],
        b"new"
    );
}

/// A TCP proxy in front of `target` for one connection, recording what each side sent.
async fn recording_proxy(target: String) -> (String, tokio::task::JoinHandle<(Vec<u8>, Vec<u8>)>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let server = TcpStream::connect(target).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let up = tokio::spawn(async move {
            let mut rec = Vec::new();
            let mut buf = [0u8; 65536];
            while let Ok(n @ 1..) = cr.read(&mut buf).await {
                rec.extend_from_slice(&buf[..n]);
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            rec
        });
        let mut down = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n @ 1..) = sr.read(&mut buf).await {
            down.extend_from_slice(&buf[..n]);
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        (up.await.unwrap(), down)
    });
    (addr, task)
}

#[tokio::test]
async fn a_recorded_handshake_is_useless_on_a_new_connection() {
    let fx = fixture().await;
    let size = fx.obj.size();
    // A member reads through a recording proxy; the recording holds its proof and request.
    let (proxy, recorded) = recording_proxy(fx.tcp.clone()).await;
    let c = WorkerClient::new(Endpoint::Tcp(proxy), key(SECRET));
    assert_eq!(&c.read(&fx.obj, 0..size).await.unwrap()[..], &fx.data[..]);
    drop(c); // closes the pooled connection: the proxy finishes
    let (from_client, from_worker) = recorded.await.unwrap();
    let before = state(&fx).await;

    // Replayed to the worker on a new connection (after its fresh challenge): refused.
    let mut s = TcpStream::connect(&fx.tcp).await.unwrap();
    let (kind, challenge) = read_frame(&mut s).await.unwrap().unwrap();
    assert_eq!(kind, FrameKind::Json);
    let _ = s.write_all(&from_client).await;
    let mut frames = vec![(kind, challenge)];
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(f)) = read_frame(&mut s).await {
            frames.push(f);
        }
    })
    .await
    .expect("the worker kept a replaying connection open");
    assert_refused("replayed client transcript", &frames);
    assert_eq!(state(&fx).await, before);

    // An impostor replaying the worker's side to a new client: the client refuses it before
    // sending any request.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = l.local_addr().unwrap().to_string();
    // The worker's challenge and proof: the first two frames it sent.
    let frame_end = |at: usize| {
        at + 4 + u32::from_be_bytes(from_worker[at..at + 4].try_into().unwrap()) as usize
    };
    let handshake = from_worker[..frame_end(frame_end(0))].to_vec();
    let impostor = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let _ = s.write_all(&handshake).await;
        let mut heard = Vec::new();
        let _ = s.read_to_end(&mut heard).await;
        heard
    });
    let c = WorkerClient::new(Endpoint::Tcp(fake), key(SECRET));
    match c.read(&fx.obj, 0..size).await {
        Err(CallError::Link(e)) => assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}"),
        other => panic!("a client accepted a replayed worker proof: {other:?}"),
    }
    drop(c);
    let heard = impostor.await.unwrap();
    let mut r = &heard[..];
    let (kind, p) = read_frame(&mut r).await.unwrap().unwrap();
    let v: Value = serde_json::from_slice(&p).unwrap();
    assert_eq!((kind, v["op"].as_str()), (FrameKind::Json, Some("auth")));
    assert!(
        read_frame(&mut r).await.unwrap().is_none(),
        "the client sent a request to an impostor"
    );
}

#[tokio::test]
async fn silent_and_oversized_peers_are_dropped() {
    let fx = fixture().await;
    // Says nothing after the challenge: dropped once the handshake's time is up.
    let s = TcpStream::connect(&fx.tcp).await.unwrap();
    let (mut r, _w) = s.into_split();
    let mut frames = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(f)) = read_frame(&mut r).await {
            frames.push(f);
        }
    })
    .await
    .expect("a silent peer held its connection");
    assert_refused("silent peer", &frames);
    // Announces a 60 MiB frame before proving anything: refused without reading it.
    let mut head = (60u32 << 20).to_be_bytes().to_vec();
    head.push(FrameKind::Json as u8);
    let s = TcpStream::connect(&fx.tcp).await.unwrap();
    assert_refused(
        "oversized frame",
        &attempt(s, &head, &json!({}), None).await,
    );
}

// ---- cluster_tls -------------------------------------------------------------------------

/// The link error of a call that must have been refused.
fn refused_link(what: &str, r: Result<bytes::Bytes, CallError>) -> silt_common::Error {
    match r {
        Err(CallError::Link(e)) => {
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{what}: {e}");
            e
        }
        other => panic!("{what}: not refused: {other:?}"),
    }
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn a_client_with_cluster_tls_reads_through_tls_and_nothing_travels_in_the_clear() {
    // The worker has no cluster_tls: it still upgrades a client that asks.
    let fx = fixture().await;
    let size = fx.obj.size();
    let (proxy, recorded) = recording_proxy(fx.tcp.clone()).await;
    let c = WorkerClient::new(Endpoint::Tcp(proxy), key(SECRET).with_tls(true));
    assert_eq!(&c.read(&fx.obj, 0..size).await.unwrap()[..], &fx.data[..]);
    drop(c);
    let (up, down) = recorded.await.unwrap();
    // In the clear: the worker's challenge, the client's `starttls`; then TLS records only
    // (22 = handshake), and no request, no proof, no byte of the object.
    let mut r = &up[..];
    let (kind, p) = read_frame(&mut r).await.unwrap().unwrap();
    let v: Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(
        (kind, v),
        (FrameKind::Json, json!({"v": 1, "op": "starttls"}))
    );
    assert_eq!(
        r.first(),
        Some(&22),
        "the client's next bytes are not a TLS ClientHello"
    );
    let mut r = &down[..];
    let (kind, p) = read_frame(&mut r).await.unwrap().unwrap();
    let v: Value = serde_json::from_slice(&p).unwrap();
    assert!(kind == FrameKind::Json && v.get("auth").is_some(), "{v}");
    assert_eq!(
        r.first(),
        Some(&22),
        "the worker's next bytes are not a TLS ServerHello"
    );
    for (side, bytes) in [("client", &up), ("worker", &down)] {
        for needle in [&b"\"op\":\"read\""[..], b"\"mac\"", b"/data/private"] {
            assert!(
                !contains(bytes, needle),
                "{side} sent {:?} in the clear",
                String::from_utf8_lossy(needle)
            );
        }
        assert!(
            !contains(bytes, &fx.data[1000..1064]),
            "{side} sent the object's bytes in the clear"
        );
    }
}

#[tokio::test]
async fn a_worker_with_cluster_tls_refuses_plaintext_tcp_and_wrong_secrets_in_tls() {
    let fx = fixture_with(key(SECRET).with_tls(true)).await;
    let before = state(&fx).await;
    let size = fx.obj.size();
    let plain = WorkerClient::new(Endpoint::Tcp(fx.tcp.clone()), key(SECRET));
    let e = refused_link("plaintext member", plain.read(&fx.obj, 0..size).await);
    assert!(
        e.to_string().contains("cluster_tls"),
        "unclear refusal: {e}"
    );
    let wrong = WorkerClient::new(
        Endpoint::Tcp(fx.tcp.clone()),
        key("another-cluster-secret-entirely").with_tls(true),
    );
    refused_link("wrong secret in TLS", wrong.read(&fx.obj, 0..size).await);
    // The raw attack, in TLS: a peer that completes TLS but skips the proof gets nothing.
    for (what, req, data) in requests(&fx) {
        let tls = {
            // One request per connection: the worker closes after refusing.
            let mut s = TcpStream::connect(&fx.tcp).await.unwrap();
            silt_cluster::auth::request_tls(&mut s).await.unwrap();
            silt_cluster::tls::connect(s).await.unwrap().0
        };
        assert_refused(
            &format!("tls {what}"),
            &attempt(tls, &[], &req, data.as_deref()).await,
        );
    }
    // Asking for TLS on the Unix socket is refused too (it is never upgraded)...
    let mut u = UnixStream::connect(&fx.uds).await.unwrap();
    let e = silt_cluster::auth::request_tls(&mut u)
        .await
        .and(silt_cluster::auth::connect(&mut u, &key(SECRET), &[]).await);
    assert_eq!(e.unwrap_err().kind(), ErrorKind::PermissionDenied);
    assert_eq!(state(&fx).await, before);
    // ...while members get everything: in TLS over TCP, in the clear over the Unix socket.
    for ep in [
        (Endpoint::Tcp(fx.tcp.clone()), true),
        (Endpoint::Unix(fx.uds.clone()), false),
    ] {
        let m = WorkerClient::new(ep.0, key(SECRET).with_tls(ep.1));
        assert_eq!(&m.read(&fx.obj, 0..size).await.unwrap()[..], &fx.data[..]);
    }
}

#[tokio::test]
async fn what_tls_holds_back_is_sent_before_a_connection_waits_for_its_peer() {
    // TLS accepts written bytes that the socket cannot take yet and sends them at a later write
    // or flush. A side that ends a response and then waits for the next request must send
    // them first, else its peer waits for the end of the response forever. Small socket
    // buffers, and a reader that stops with a tail outstanding until the writer is done, so
    // part of that tail is held in TLS when the writer turns to reading.
    const TOTAL: usize = 1 << 20;
    const TAIL: usize = 40 << 10;
    let listen = tokio::net::TcpSocket::new_v4().unwrap();
    listen.set_send_buffer_size(4096).unwrap();
    listen.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listen.local_addr().unwrap();
    let l = listen.listen(1).unwrap();
    let (written_tx, written_rx) = tokio::sync::oneshot::channel();
    let writer = tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        let (tls, _) = silt_cluster::tls::accept(tcp).await.unwrap();
        let mut conn = rpc::Conn::Tls(Box::new(tls.into()));
        let body: Vec<u8> = (0..TOTAL).map(|i| (i % 253) as u8).collect();
        conn.write_all(&body).await.unwrap();
        let _ = written_tx.send(());
        // Waits for the peer, as a worker waits for the next request.
        let mut next = [0u8; 1];
        let _ = conn.read(&mut next).await;
    });
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(addr).await.unwrap();
    let (mut tls, _) = silt_cluster::tls::connect(tcp).await.unwrap();
    let mut got = vec![0u8; TOTAL];
    let read = async {
        tls.read_exact(&mut got[..TOTAL - TAIL]).await.unwrap();
        written_rx.await.unwrap();
        tls.read_exact(&mut got[TOTAL - TAIL..]).await.unwrap();
    };
    // Only a guard against the hang this test is about.
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the end of what was written stayed in the writer's TLS buffer");
    assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 253) as u8));
    drop(tls);
    writer.await.unwrap();
}

/// A relay that terminates TLS on both sides (its own certificate towards the client, its own
/// session towards the worker) and passes every byte between them.
async fn tls_relay(target: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = l.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                let mut worker = TcpStream::connect(target).await.unwrap();
                // The plaintext prelude, passed on: challenge down, `starttls` up.
                let (k, challenge) = read_frame(&mut worker).await.unwrap().unwrap();
                write_frame(&mut client, k, &challenge).await.unwrap();
                let Ok(Some((k, ask))) = read_frame(&mut client).await else {
                    return;
                };
                write_frame(&mut worker, k, &ask).await.unwrap();
                let (Ok((mut to_client, _)), Ok((mut to_worker, _))) = tokio::join!(
                    silt_cluster::tls::accept(client),
                    silt_cluster::tls::connect(worker)
                ) else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut to_client, &mut to_worker).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_relay_terminating_tls_on_both_sides_gets_no_member_through() {
    for worker_tls in [false, true] {
        let fx = fixture_with(key(SECRET).with_tls(worker_tls)).await;
        let before = state(&fx).await;
        let failures = silt_common::metrics::RPC_AUTH_FAILURES.get();
        let relay = tls_relay(fx.tcp.clone()).await;
        let c = WorkerClient::new(Endpoint::Tcp(relay), key(SECRET).with_tls(true));
        // Both ends hold the secret, yet each proof covers its own TLS session: refused.
        refused_link("relayed member", c.read(&fx.obj, 0..fx.obj.size()).await);
        assert_eq!(state(&fx).await, before);
        assert!(silt_common::metrics::RPC_AUTH_FAILURES.get() > failures);
    }
}

/// What the handshake costs: a new connection (connect + handshake + one `stats`) against one
/// more `stats` on a pooled connection. A measurement, not a check: run with `--ignored
/// --nocapture`.
#[tokio::test]
#[ignore]
async fn handshake_cost() {
    let fx = fixture().await;
    let n = 2000u32;
    for tls in [false, true] {
        let pooled = WorkerClient::new(Endpoint::Tcp(fx.tcp.clone()), key(SECRET).with_tls(tls));
        pooled.call(Request::Stats).await.unwrap();
        let t = std::time::Instant::now();
        for _ in 0..n {
            pooled.call(Request::Stats).await.unwrap();
        }
        let per_request = t.elapsed() / n;
        let t = std::time::Instant::now();
        for _ in 0..n {
            let fresh = WorkerClient::new(Endpoint::Tcp(fx.tcp.clone()), key(SECRET).with_tls(tls));
            fresh.call(Request::Stats).await.unwrap();
        }
        let per_connection = t.elapsed() / n;
        println!(
            "tls={tls}: stats on a pooled connection: {per_request:?}; on a new connection (connect + handshake + stats): {per_connection:?}"
        );
    }
}

/// The `store_*` calls (a same-host client's calls of the worker's own store) are served to a
/// member over the Unix socket only: over TCP they are `Unsupported` and change nothing.
#[tokio::test]
async fn store_calls_are_served_over_the_unix_socket_only() {
    let fx = fixture().await;
    let uri = fx.store.uri().to_string();
    let tcp = WorkerClient::new(Endpoint::Tcp(fx.tcp.clone()), key(SECRET));
    let before = state(&fx).await;
    for req in [
        Request::StoreInfo { store: uri.clone() },
        Request::StoreStat {
            store: uri.clone(),
            path: "obj".into(),
        },
        Request::StoreDelete {
            store: uri.clone(),
            path: "obj".into(),
        },
    ] {
        match tcp.call(req.clone()).await {
            Err(CallError::Worker(e)) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                assert!(e.to_string().contains("Unix socket"), "{e}");
            }
            other => panic!("{} over TCP: {other:?}", req.name()),
        }
    }
    match tcp
        .store_write(
            &uri,
            "evil",
            &BytesSrc("evil".into()),
            4,
            &Default::default(),
            None,
        )
        .await
    {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}"),
        other => panic!("store_write over TCP: {other:?}"),
    }
    // A refused write changed nothing, and the worker serves on.
    assert_eq!(
        tcp.call(Request::Stats).await.unwrap()["identity"]["id"],
        "t"
    );
    assert_eq!(state(&fx).await, before);

    let uds = WorkerClient::new(Endpoint::Unix(fx.uds.clone()), key(SECRET));
    let info: rpc::answer::StoreInfo = uds
        .ask(&Request::StoreInfo { store: uri.clone() })
        .await
        .unwrap();
    assert_eq!(info.uri, uri);
    let rpc::answer::StoreMeta { meta } = uds
        .ask(&Request::StoreStat {
            store: uri.clone(),
            path: "obj".into(),
        })
        .await
        .unwrap();
    assert_eq!(meta, fx.obj.meta);
    assert_eq!(
        &uds.store_read(&uri, "obj", &meta, 3..9).await.unwrap()[..],
        &fx.data[3..9]
    );
    let big: bytes::Bytes = (0..(9u32 << 20)).map(|i| (i % 251) as u8).collect();
    let written = uds
        .store_write(
            &uri,
            "dir/big",
            &BytesSrc(big.clone()),
            big.len() as u64,
            &Default::default(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(written.size, big.len() as u64);
    assert_eq!(
        fx.store
            .read("dir/big", 0..u64::MAX, &written)
            .await
            .unwrap(),
        big
    );
    let rpc::answer::StoreEntries { entries } = uds
        .ask(&Request::StoreList {
            store: uri.clone(),
            path: "dir".into(),
            recursive: false,
            paged: false,
        })
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    // A listing of more than a page comes in pages when asked so, whole, in order; in one
    // frame when not (as an older worker answers either way).
    let n = 2 * rpc::store::LIST_PAGE + 5;
    for i in 0..n {
        fx.store
            .write(&format!("many/f{i:06}"), bytes::Bytes::from_static(b"x"))
            .await
            .unwrap();
    }
    let list = |paged| Request::StoreList {
        store: uri.clone(),
        path: "many".into(),
        recursive: false,
        paged,
    };
    let names = |pages: Vec<rpc::answer::StoreEntries>| -> Vec<String> {
        pages
            .into_iter()
            .flat_map(|p| p.entries)
            .map(|e| e.path)
            .collect()
    };
    let paged: Vec<rpc::answer::StoreEntries> = uds.ask_pages(&list(true)).await.unwrap();
    assert_eq!(paged.len(), 3);
    let whole: Vec<rpc::answer::StoreEntries> = uds.ask_pages(&list(false)).await.unwrap();
    assert_eq!(whole.len(), 1);
    let want: Vec<String> = (0..n).map(|i| format!("many/f{i:06}")).collect();
    assert_eq!(names(paged), want);
    assert_eq!(names(whole), want);
    // Errors keep their kind; a store not in the worker's table is not served.
    match uds
        .ask::<rpc::answer::StoreMeta>(&Request::StoreStat {
            store: uri.clone(),
            path: "missing".into(),
        })
        .await
    {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
        other => panic!("stat of a missing file: {other:?}"),
    }
    match uds
        .ask::<rpc::answer::StoreInfo>(&Request::StoreInfo {
            store: "s3://elsewhere".into(),
        })
        .await
    {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        other => panic!("another store: {other:?}"),
    }
    // Nor by a member: no read, write or delete through a store outside the table (a local
    // directory this process could reach, here), and the connection serves on.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("kept"), b"not the worker's").unwrap();
    let foreign = format!("file://{}", elsewhere.path().display());
    let expected = silt_ufs::ObjectMeta {
        path: "kept".into(),
        size: 16,
        ..fx.obj.meta.clone()
    };
    for req in [
        Request::StoreDelete {
            store: foreign.clone(),
            path: "kept".into(),
        },
        Request::StoreRead {
            store: foreign.clone(),
            path: "kept".into(),
            expected,
            offset: 0,
            len: 16,
        },
    ] {
        match uds.call(req.clone()).await {
            Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
            other => panic!("{} through another store: {other:?}", req.name()),
        }
    }
    match uds
        .store_write(
            &foreign,
            "planted",
            &BytesSrc("planted".into()),
            7,
            &Default::default(),
            None,
        )
        .await
    {
        Err(CallError::Worker(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        other => panic!("store_write through another store: {other:?}"),
    }
    assert_eq!(
        std::fs::read(elsewhere.path().join("kept")).unwrap(),
        b"not the worker's"
    );
    assert!(!elsewhere.path().join("planted").exists());
    assert!(uds.call(Request::Stats).await.is_ok());
}
