//! Writes through the client library against a real S3 server (versitygw behind the counting
//! proxy): `through` and `store-only` end to end, rewrites of existing objects, deletes, and
//! the errors of a read-only client and of a key the store cannot hold.

use std::net::SocketAddr;
use std::sync::Arc;

use silt_client::{Client, ClientOptions};
use silt_common::write::WriteType;
use silt_common::ErrorKind;
use silt_testkit::{S3Proxy, S3Server};
use silt_ufs::{OpendalStore, S3Options, UnderStore};

mod common;

const PS: u64 = 4096;

struct Fx {
    proxy: S3Proxy,
    store: Arc<OpendalStore>,
    /// Where writers keep the bytes until commit.
    spool: tempfile::TempDir,
    _server: S3Server,
}

fn fixture() -> Fx {
    let server = S3Server::start();
    server.create_bucket("bkt");
    let proxy = S3Proxy::start(SocketAddr::from(([127, 0, 0, 1], server.port()))).unwrap();
    let opts = S3Options {
        endpoint: proxy.endpoint(),
        ..server.s3_options()
    };
    let store = Arc::new(OpendalStore::s3("bkt", "w", &opts).unwrap());
    Fx {
        proxy,
        store,
        spool: tempfile::tempdir().unwrap(),
        _server: server,
    }
}

fn client(fx: &Fx, write_type: WriteType) -> Client {
    let opts = ClientOptions {
        prefetch_max: 0,
        ..ClientOptions::from_config(&silt_common::config::Config::default())
    };
    Client::new(
        common::at_d(fx.store.clone()),
        common::worker(PS, 16 << 20),
        opts,
        tokio::runtime::Handle::current(),
    )
    .with_writes(write_type, fx.spool.path().to_path_buf())
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let f = c.open(path).await.unwrap();
    c.read(&f, 0, f.size() + 1).await.unwrap().to_vec()
}

async fn names(c: &Client, dir: &str) -> Vec<String> {
    let list = c.list(dir).await.unwrap();
    list.iter().map(|e| e.name().to_string()).collect()
}

/// Writes a new file at `path` (under `/d`) and closes it, checking that nothing reaches the
/// store before the close and that the close costs one PUT and nothing else (no HEAD: the
/// PUT's own answer names the version written).
async fn write_file(fx: &Fx, c: &Client, path: &str, data: &[u8]) -> silt_client::Entry {
    let rel = path.strip_prefix("/d/").unwrap();
    let puts = fx.proxy.counts().put;
    let mut w = c.create(path, true).await.unwrap();
    // In pieces, as a FUSE mount delivers them.
    for (i, chunk) in data.chunks(1000).enumerate() {
        c.write_at(&mut w, (i * 1000) as u64, chunk).unwrap();
    }
    assert_eq!(
        fx.proxy.counts().put,
        puts,
        "{path}: a PUT before the close"
    );
    let e = fx.store.stat(rel).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::NotFound,
        "{path} before the close: {e}"
    );

    let before = fx.proxy.counts();
    let entry = c.commit(&mut w).await.unwrap();
    let after = fx.proxy.counts();
    assert_eq!(after.put - before.put, 1, "{path}: {before} -> {after}");
    assert_eq!(
        after.head, before.head,
        "{path}: the commit asked about the object it had just written: {before} -> {after}"
    );
    assert_eq!(
        after.total() - before.total(),
        1,
        "{path}: the close costs its PUT alone: {before} -> {after}"
    );
    entry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_writes_on_close_and_reads_back_from_the_cache() {
    let fx = fixture();
    let c = client(&fx, WriteType::Through);
    let data = pattern(1, 3 * PS as usize + 123);
    let e = write_file(&fx, &c, "/d/a/new.bin", &data).await;
    assert_eq!(e.size, data.len() as u64);
    // The store has exactly the bytes.
    let meta = fx.store.stat("a/new.bin").await.unwrap();
    let from_store = fx
        .store
        .read("a/new.bin", 0..meta.size, &meta)
        .await
        .unwrap();
    assert!(from_store == data, "the store holds other bytes");

    fx.proxy.reset_counts();
    assert_eq!(read_all(&c, "/d/a/new.bin").await, data);
    let counts = fx.proxy.counts();
    assert_eq!(
        counts.total(),
        0,
        "read back after a `through` write: {counts}"
    );
    assert_eq!(names(&c, "/d/a").await, ["new.bin"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_only_writes_on_close_and_caches_nothing() {
    let fx = fixture();
    let c = client(&fx, WriteType::StoreOnly);
    let data = pattern(2, 2 * PS as usize);
    write_file(&fx, &c, "/d/s.bin", &data).await;
    fx.proxy.reset_counts();
    assert_eq!(read_all(&c, "/d/s.bin").await, data);
    assert!(fx.proxy.counts().get >= 1, "read back came from the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_object_is_rewritten_whole_and_truncated() {
    let fx = fixture();
    let c = client(&fx, WriteType::Through);
    let first = pattern(3, 10_000);
    write_file(&fx, &c, "/d/f", &first).await;

    // Open without truncation, write into the middle and past the end.
    let mut w = c.create("/d/f", false).await.unwrap();
    assert_eq!(w.len(), first.len() as u64);
    assert!(!w.is_dirty());
    c.write_at(&mut w, 5000, b"MIDDLE").unwrap();
    c.write_at(&mut w, 12_000, b"END").unwrap();
    let e = c.commit(&mut w).await.unwrap();
    let mut want = first.clone();
    want[5000..5006].copy_from_slice(b"MIDDLE");
    want.resize(12_000, 0);
    want.extend_from_slice(b"END");
    assert_eq!(e.size, want.len() as u64);
    assert_eq!(read_all(&c, "/d/f").await, want);

    // Truncate to 0 and write again.
    let mut w = c.create("/d/f", false).await.unwrap();
    c.set_len(&mut w, 0).unwrap();
    c.write_at(&mut w, 0, b"short").unwrap();
    c.commit(&mut w).await.unwrap();
    assert_eq!(read_all(&c, "/d/f").await, b"short");
    let meta = fx.store.stat("f").await.unwrap();
    assert_eq!(meta.size, 5);
    // An empty file opened and closed exists in the store.
    let mut w = c.create("/d/empty", true).await.unwrap();
    c.commit(&mut w).await.unwrap();
    assert_eq!(fx.store.stat("empty").await.unwrap().size, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_deletes_from_the_store_and_the_view() {
    let fx = fixture();
    let c = client(&fx, WriteType::Through);
    write_file(&fx, &c, "/d/x/gone", b"bye").await;
    write_file(&fx, &c, "/d/x/stays", b"hi").await;
    c.remove_file("/d/x/gone").await.unwrap();
    assert_eq!(
        fx.store.stat("x/gone").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        c.stat("/d/x/gone").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(names(&c, "/d/x").await, ["stays"]);
    let e = c.remove_file("/d/x").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IsADirectory, "{e}");
    let e = c.remove_file("/d/x/never-was").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_and_impossible_names_are_clear_errors() {
    let fx = fixture();
    let ro = client(&fx, WriteType::ReadOnly);
    let e = ro.create("/d/nope", true).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::ReadOnly);
    assert_eq!(e.errno(), libc::EROFS);
    assert!(e.to_string().contains("read-only"), "{e}");
    let e = ro.remove_file("/d/nope").await.unwrap_err();
    assert_eq!(e.errno(), libc::EROFS);

    let c = client(&fx, WriteType::Through);
    let long = format!("/d/{}", "k".repeat(1100));
    let e = c.create(&long, true).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::NameTooLong);
    assert!(e.to_string().contains("1024"), "{e}");
    let e = c.create("/", true).await.err().unwrap();
    assert_eq!(e.errno(), libc::EROFS, "{e}");
    let e = c.create("/d", true).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::IsADirectory, "{e}");
    assert_eq!(fx.proxy.counts().put, 0, "nothing was written");
}
