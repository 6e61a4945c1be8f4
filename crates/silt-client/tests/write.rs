//! Writes through the client library against a real S3 server (versitygw behind the counting
//! proxy): every write type end to end (`through`, `store-only`, `cache-only` with its TTL,
//! `back` with its log, its upload and its recovery after the client is gone), rewrites of
//! existing objects, deletes, spilling past the write memory, 1,000 concurrent streams, and the
//! errors of a read-only client, of a full client and of a key the store cannot hold.

use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use silt_cache::{Arena, ArenaConfig};
use silt_client::{Client, ClientOptions, Clock, FileState, WriteSetup};
use silt_common::config::DiskTierSpec;
use silt_common::write::{WriteRule, WriteRules, WriteType};
use silt_common::ErrorKind;
use silt_testkit::{S3Proxy, S3Server};
use silt_ufs::{S3Options, S3Store, UnderStore};

mod common;

const PS: u64 = 4096;

struct Fx {
    proxy: S3Proxy,
    store: Arc<S3Store>,
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
    let store = Arc::new(S3Store::new("bkt", "w", &opts).unwrap());
    Fx {
        proxy,
        store,
        spool: tempfile::tempdir().unwrap(),
        _server: server,
    }
}

fn bare_client(fx: &Fx, clock: Clock) -> Client {
    let opts = ClientOptions {
        prefetch_max: 0,
        clock,
        ..ClientOptions::from_config(&silt_common::config::Config::default())
    };
    Client::new(
        common::at_d(fx.store.clone()),
        common::worker(PS, 16 << 20),
        opts,
        tokio::runtime::Handle::current(),
    )
}

fn client(fx: &Fx, write_type: WriteType) -> Client {
    bare_client(fx, Clock::system())
        .with_writes(write_type, fx.spool.path().to_path_buf())
        .unwrap()
}

/// A client writing `rules` with `memory` bytes of write memory spilling into at most `spill`
/// bytes, a cache-only TTL of an hour, and (with `wal`) a write-ahead log whose uploads wait
/// `delay`.
fn setup_client(
    fx: &Fx,
    clock: Clock,
    rules: WriteRules,
    memory: u64,
    spill: u64,
    wal: Option<&std::path::Path>,
    delay: Duration,
) -> Client {
    let setup = WriteSetup {
        rules,
        arena: Arena::open(ArenaConfig {
            chunk_size: PS,
            memory_ceiling: memory,
            file_memory: memory,
            spill: vec![DiskTierSpec {
                dir: fx.spool.path().join("spill"),
                quota: spill,
            }],
            jobs: Vec::new(),
        })
        .unwrap(),
        cache_only_ttl: Some(Duration::from_secs(3600)),
        wal_dir: wal.map(|p| p.to_path_buf()),
        upload_delay: delay,
    };
    bare_client(fx, clock).with_write_setup(setup).unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The object `rel` as the store holds it (read directly, not through Silt).
async fn in_store(fx: &Fx, rel: &str) -> bytes::Bytes {
    let meta = fx.store.stat(rel).await.unwrap();
    fx.store.read(rel, 0..meta.size, &meta).await.unwrap()
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
    let w = c.create(path, true).await.unwrap();
    // In pieces, as a FUSE mount delivers them.
    for (i, chunk) in data.chunks(1000).enumerate() {
        c.write_at(&w, (i * 1000) as u64, chunk).unwrap();
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
    let entry = c.commit(&w).await.unwrap();
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
    assert!(
        in_store(&fx, "a/new.bin").await == data,
        "the store holds other bytes"
    );

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
    let w = c.create("/d/f", false).await.unwrap();
    assert_eq!(w.len(), first.len() as u64);
    assert!(!w.is_dirty());
    c.write_at(&w, 5000, b"MIDDLE").unwrap();
    c.write_at(&w, 12_000, b"END").unwrap();
    let e = c.commit(&w).await.unwrap();
    let mut want = first.clone();
    want[5000..5006].copy_from_slice(b"MIDDLE");
    want.resize(12_000, 0);
    want.extend_from_slice(b"END");
    assert_eq!(e.size, want.len() as u64);
    assert_eq!(read_all(&c, "/d/f").await, want);

    // Truncate to 0 and write again.
    let w = c.create("/d/f", false).await.unwrap();
    c.set_len(&w, 0).unwrap();
    c.write_at(&w, 0, b"short").unwrap();
    c.commit(&w).await.unwrap();
    assert_eq!(read_all(&c, "/d/f").await, b"short");
    let meta = fx.store.stat("f").await.unwrap();
    assert_eq!(meta.size, 5);
    // An empty file opened and closed exists in the store.
    let w = c.create("/d/empty", true).await.unwrap();
    c.commit(&w).await.unwrap();
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

/// A `back` client logging in `wal`, whose uploads wait an hour (unless persisted).
fn back_client(fx: &Fx, wal: &std::path::Path) -> Client {
    setup_client(
        fx,
        Clock::system(),
        WriteType::Back.into(),
        64 * PS,
        1 << 30,
        Some(wal),
        Duration::from_secs(3600),
    )
}

async fn write_with(
    c: &Client,
    path: &str,
    data: &[u8],
    t: Option<WriteType>,
) -> silt_client::Entry {
    let w = c.create_with(path, true, t).await.unwrap();
    for (i, chunk) in data.chunks(1000).enumerate() {
        c.write_at(&w, (i * 1000) as u64, chunk).unwrap();
    }
    c.commit(&w).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_only_files_never_reach_the_store_and_end_with_their_ttl() {
    let fx = fixture();
    let clock = Clock::manual();
    let rules = WriteRules::new(
        WriteType::Through,
        vec![WriteRule {
            prefix: "/d/shuffle".into(),
            write_type: WriteType::CacheOnly,
        }],
    );
    let c = setup_client(
        &fx,
        clock.clone(),
        rules,
        64 * PS,
        1 << 30,
        None,
        Duration::ZERO,
    );
    let data = pattern(4, 5 * PS as usize + 7);
    write_with(&c, "/d/shuffle/p0", &data, None).await;
    write_with(&c, "/d/shuffle/sub/p1", b"one", None).await;
    // A through file beside them, to see the listing merge both.
    write_with(&c, "/d/shuffle-done", b"x", None).await;
    assert_eq!(
        fx.proxy.counts().put,
        1,
        "only the through file was uploaded"
    );
    assert_eq!(
        fx.store.stat("shuffle/p0").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    fx.proxy.reset_counts();
    assert_eq!(read_all(&c, "/d/shuffle/p0").await, data);
    assert_eq!(read_all(&c, "/d/shuffle/sub/p1").await, b"one");
    assert_eq!(names(&c, "/d/shuffle").await, ["p0", "sub"]);
    assert_eq!(
        fx.proxy.counts().get,
        0,
        "cache-only reads never go to the store"
    );
    // The store's view lists them too once the listing is revalidated.
    c.sync("/d/shuffle", true).await.unwrap();
    assert_eq!(names(&c, "/d/shuffle").await, ["p0", "sub"]);

    // An open file keeps its bytes past the TTL; new opens do not find it, even before the
    // directory is revalidated.
    let open = c.open("/d/shuffle/p0").await.unwrap();
    clock.advance(Duration::from_secs(3601));
    assert_eq!(
        c.stat("/d/shuffle/p0").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    c.sync("/d/shuffle", true).await.unwrap();
    assert_eq!(
        c.stat("/d/shuffle/p0").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(c.read(&open, 0, 10).await.unwrap(), data[..10]);
    drop(open);

    // Removal of a cache-only file touches only Silt.
    write_with(&c, "/d/shuffle/p2", b"two", None).await;
    fx.proxy.reset_counts();
    c.remove_file("/d/shuffle/p2").await.unwrap();
    assert_eq!(
        fx.proxy.counts().delete,
        0,
        "removing a cache-only file asked the store"
    );
    assert_eq!(
        c.stat("/d/shuffle/p2").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let stats = c.write_stats().unwrap();
    assert_eq!(stats.cache_only_files, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_files_are_logged_acknowledged_and_uploaded_later() {
    let fx = fixture();
    let wal = tempfile::tempdir().unwrap();
    let c = Arc::new(back_client(&fx, wal.path()));
    tokio::spawn(c.clone().run_background());
    let data = pattern(5, 9 * PS as usize + 1);
    let e = write_with(&c, "/d/out/part-0", &data, None).await;
    assert_eq!(e.size, data.len() as u64);
    assert_eq!(fx.proxy.counts().put, 0, "acknowledged before any upload");
    assert!(matches!(
        c.persist_status("/d/out/part-0").unwrap()[0].1,
        FileState::Pending { .. }
    ));
    assert_eq!(read_all(&c, "/d/out/part-0").await, data);
    assert_eq!(names(&c, "/d/out").await, ["part-0"]);

    let states = c.persist("/d/out").await.unwrap();
    assert_eq!(
        states,
        vec![("/d/out/part-0".to_string(), FileState::Persisted)]
    );
    assert!(
        in_store(&fx, "out/part-0").await == data,
        "the store holds other bytes"
    );
    // Now a store object, cached from the log as it was uploaded.
    fx.proxy.reset_counts();
    assert_eq!(read_all(&c, "/d/out/part-0").await, data);
    assert_eq!(fx.proxy.counts().get, 0);
    assert_eq!(
        std::fs::read_dir(wal.path()).unwrap().count(),
        0,
        "log emptied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_back_files_survive_the_client_and_upload_after_restart() {
    let fx = fixture();
    let wal = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..5u8)
        .map(|i| (format!("/d/job/f{i}"), pattern(i, (i as usize + 1) * 3000)))
        .collect();
    {
        let c = back_client(&fx, wal.path());
        for (p, d) in &files {
            write_with(&c, p, d, None).await;
        }
        // Rewritten: only the newest version may reach the store.
        write_with(&c, "/d/job/f0", b"newest", None).await;
        // Gone without a clean shutdown: no upload ran.
    }
    assert_eq!(fx.proxy.counts().put, 0);
    let c = Arc::new(back_client(&fx, wal.path()));
    tokio::spawn(c.clone().run_background());
    // Visible (from the log) before the upload.
    assert_eq!(read_all(&c, "/d/job/f3").await, files[3].1);
    for s in c.persist("/d/job").await.unwrap() {
        assert_eq!(s.1, FileState::Persisted, "{s:?}");
    }
    for (p, d) in &files {
        let rel = p.strip_prefix("/d/").unwrap();
        let want: &[u8] = if p == "/d/job/f0" { b"newest" } else { d };
        assert!(
            in_store(&fx, rel).await == want,
            "{p}: the store holds other bytes"
        );
    }
    assert_eq!(
        fx.proxy.counts().put,
        5,
        "one upload per file, the newest version only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_spill_past_write_memory_and_read_back_and_a_full_client_says_enospc() {
    let fx = fixture();
    // 8 pages of memory, 1 MiB of spill space.
    let c = setup_client(
        &fx,
        Clock::system(),
        WriteType::CacheOnly.into(),
        8 * PS,
        1 << 20,
        None,
        Duration::ZERO,
    );
    let files: Vec<(String, Vec<u8>)> = (0..4u8)
        .map(|i| {
            (
                format!("/d/s/{i}"),
                pattern(i, 30 * PS as usize + i as usize),
            )
        })
        .collect();
    for (p, d) in &files {
        write_with(&c, p, d, None).await;
    }
    let st = c.write_stats().unwrap();
    assert!(st.arena.memory_peak <= 8 * PS, "{st:?}");
    assert!(st.arena.spilled > 0, "{st:?}");
    for (p, d) in &files {
        assert_eq!(&read_all(&c, p).await, d, "{p}");
    }
    // Lower the ceiling at run time: memory goes, data stays.
    assert!(c.set_write_memory(2 * PS));
    assert!(c.write_stats().unwrap().arena.memory_used <= 2 * PS);
    assert_eq!(read_all(&c, "/d/s/2").await, files[2].1);

    // Fill the rest: a clear ENOSPC, not a hang; what was written before stays.
    let w = c.create("/d/s/big", true).await.unwrap();
    let chunk = vec![9u8; PS as usize];
    let mut err = None;
    for i in 0..(2 << 20) / PS {
        if let Err(e) = c.write_at(&w, i * PS, &chunk) {
            err = Some(e);
            break;
        }
    }
    let e = err.expect("writing past memory and spill space must fail");
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert_eq!(e.errno(), libc::ENOSPC);
    drop(w);
    assert_eq!(read_all(&c, "/d/s/1").await, files[1].1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_open_write_type_and_read_only_prefixes() {
    let fx = fixture();
    let rules = WriteRules::new(
        WriteType::Through,
        vec![WriteRule {
            prefix: "/d/frozen".into(),
            write_type: WriteType::ReadOnly,
        }],
    );
    let c = setup_client(
        &fx,
        Clock::system(),
        rules,
        64 * PS,
        1 << 30,
        None,
        Duration::ZERO,
    );
    write_with(&c, "/d/tmp", b"scratch", Some(WriteType::CacheOnly)).await;
    assert_eq!(fx.proxy.counts().put, 0);
    assert_eq!(read_all(&c, "/d/tmp").await, b"scratch");
    let e = c
        .create_with("/d/frozen/x", true, Some(WriteType::Through))
        .await
        .err()
        .unwrap();
    assert_eq!(e.errno(), libc::EROFS, "{e}");
    let e = c
        .create_with("/d/y", true, Some(WriteType::Back))
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "no log configured: {e}");
}

/// 1,000 writers then 1,000 readers at once on one client (tasks on two threads, not a thread
/// each), with write memory far below what they write: every byte back, memory within its
/// ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_streams_in_bounded_memory() {
    let fx = fixture();
    let c = Arc::new(setup_client(
        &fx,
        Clock::system(),
        WriteType::CacheOnly.into(),
        64 * PS,
        1 << 30,
        None,
        Duration::ZERO,
    ));
    const STREAMS: usize = 1000;
    let size = |i: usize| 2 * PS as usize + i * 7;
    let mut tasks = Vec::new();
    for i in 0..STREAMS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern((i % 251) as u8, size(i));
            let w = c.create(&format!("/d/m/{i}"), true).await.unwrap();
            for (k, chunk) in data.chunks(1500).enumerate() {
                c.write_at(&w, (k * 1500) as u64, chunk).unwrap();
                tokio::task::yield_now().await;
            }
            c.commit(&w).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut tasks = Vec::new();
    for i in 0..STREAMS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let f = c.open(&format!("/d/m/{i}")).await.unwrap();
            let got = c.read(&f, 0, f.size()).await.unwrap();
            assert!(got == pattern((i % 251) as u8, size(i)), "stream {i}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let st = c.write_stats().unwrap();
    assert_eq!(st.cache_only_files, STREAMS as u64);
    assert!(st.arena.memory_peak <= 64 * PS, "{st:?}");
    assert!(st.arena.spilled > 0, "{st:?}");
    assert_eq!(fx.proxy.counts().put, 0, "cache-only: nothing was uploaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_back_file_leaves_nothing_at_its_old_name() {
    let fx = fixture();
    let wal = tempfile::tempdir().unwrap();
    let c = back_client(&fx, wal.path());
    write_with(&c, "/d/h", b"hello", None).await;
    c.rename("/d/h", "/d/h2").await.unwrap();
    let names: Vec<String> = c
        .list("/d")
        .await
        .unwrap()
        .iter()
        .map(|e| e.path.clone())
        .collect();
    assert_eq!(names, ["/d/h2"]);
    assert_eq!(
        c.stat("/d/h").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

/// A file cannot hold entries, whichever write type keeps it: creating below a cache-only or
/// `back` file (which never asks the store) is `NotADirectory`, as below a stored one. The
/// SDK's differential test found `x/y` made below a cache-only file `x`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_created_below_a_file_of_any_write_type() {
    for wt in [WriteType::Through, WriteType::CacheOnly] {
        let fx = fixture();
        let c = client(&fx, wt);
        write_with(&c, "/d/f", b"", None).await;
        let o = silt_client::OpenOptions {
            create: true,
            exclusive: true,
            ..Default::default()
        };
        let e = c.open_write("/d/f/z", o).await.map(drop).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotADirectory, "{wt}: {e}");
        // And the file is still there (asking below it listed it as a directory, found
        // nothing, and recorded it gone).
        assert!(!c.stat_live("/d/f").await.unwrap().0.is_dir(), "{wt}");
    }
}

/// A directory made under `cache-only` (never in the store) shows the time it was made, as a
/// new directory does; it showed none (the mount made it an older constant).
#[tokio::test]
async fn a_cache_only_directory_shows_the_time_it_was_made() {
    let fx = fixture();
    let c = client(&fx, WriteType::CacheOnly);
    let before = std::time::SystemTime::now();
    c.mkdir("/d/made").await.unwrap();
    let after = std::time::SystemTime::now();
    let made = c.stat("/d/made").await.unwrap().mtime.expect("a time");
    assert!(made >= before && made <= after, "{made:?}");
    // Listed with it too.
    let listed = c.list("/d").await.unwrap();
    let e = listed.iter().find(|e| e.path == "/d/made").unwrap();
    assert_eq!(e.mtime, Some(made));
}

/// A create that keeps what is at the name (an append, a create without truncation) or must
/// be the only one (`O_EXCL`) asks the store about a name the cached listing holds for
/// missing: a file written into the store behind Silt's back since that listing is appended
/// to, not replaced by a new file, and an exclusive create of it is `AlreadyExists`. (A
/// `>>` through the mount replaced the store's file with only the appended bytes.)
#[tokio::test]
async fn a_create_never_takes_a_name_the_store_has_for_a_new_file() {
    let fx = fixture();
    let c = client(&fx, WriteType::Through);
    write_file(&fx, &c, "/d/first", b"1").await;
    // The listing is cached, and trusted for the sync interval.
    assert_eq!(names(&c, "/d").await, ["first"]);
    fx.store
        .write("log", bytes::Bytes::from_static(b"old line\n"))
        .await
        .unwrap();
    fx.store
        .write("lock", bytes::Bytes::from_static(b"theirs"))
        .await
        .unwrap();
    assert_eq!(
        c.stat("/d/log").await.unwrap_err().kind(),
        ErrorKind::NotFound,
        "the cached listing says missing"
    );
    let append = silt_client::OpenOptions {
        create: true,
        append: true,
        load_now: true,
        ..Default::default()
    };
    let w = c.open_write("/d/log", append).await.unwrap();
    c.write(&w, 0, b"appended\n").await.unwrap();
    c.commit(&w).await.unwrap();
    c.close(&w).await.unwrap();
    assert_eq!(&in_store(&fx, "log").await[..], b"old line\nappended\n");
    let exclusive = silt_client::OpenOptions {
        create: true,
        exclusive: true,
        ..Default::default()
    };
    let Err(e) = c.open_write("/d/lock", exclusive).await else {
        panic!("an exclusive create of a name the store has succeeded");
    };
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert_eq!(&in_store(&fx, "lock").await[..], b"theirs");
}
