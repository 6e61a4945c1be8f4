//! One behaviour suite for every under-store: the in-memory fake, a local directory and a real
//! S3-compatible server (versitygw on loopback). Each case is written once against `DynStore`
//! and instantiated per backend by `suite!`.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_common::metrics::{UFS_READ_BYTES, UFS_REQUESTS};
use silt_common::ErrorKind;
use silt_testkit::S3Server;
use silt_ufs::{
    open_store, DynStore, EntryKind, Fault, FaultOp, FaultStore, MemStore, ObjectMeta, S3Options,
    SetAttrs, SpecialKind,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Mem,
    Fs,
    S3,
    Gcs,
    Azure,
    Webhdfs,
}

struct Fixture {
    store: DynStore,
    backend: Backend,
    /// Keeps the temporary directory or the server alive for the test.
    _guard: Box<dyn Any + Send>,
}

async fn mem() -> Fixture {
    Fixture {
        store: Arc::new(MemStore::new("mem://behaviour")),
        backend: Backend::Mem,
        _guard: Box::new(()),
    }
}

async fn fs() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let store = open_store(&uri, &S3Options::default()).await.unwrap();
    Fixture {
        store,
        backend: Backend::Fs,
        _guard: Box::new(dir),
    }
}

/// The store is `s3://bkt/data/set`, with decoys next to it (`data/settled.txt`,
/// `data/set-2/x`, `top.txt`) that a sloppy prefix would leak into listings.
async fn s3() -> Fixture {
    let server = S3Server::start();
    server.create_bucket("bkt");
    let opts = server.s3_options();
    let whole = open_store(&server.uri("bkt", ""), &opts).await.unwrap();
    for decoy in ["data/settled.txt", "data/set-2/x", "top.txt"] {
        whole
            .write(decoy, Bytes::from_static(b"decoy"))
            .await
            .unwrap();
    }
    let store = open_store(&server.uri("bkt", "data/set"), &opts)
        .await
        .unwrap();
    Fixture {
        store,
        backend: Backend::S3,
        _guard: Box::new(server),
    }
}

/// Writes the decoys beside `data/set` through `whole` (the store one level up).
async fn decoys(whole: &DynStore) {
    for decoy in ["data/settled.txt", "data/set-2/x", "top.txt"] {
        whole
            .write(decoy, Bytes::from_static(b"decoy"))
            .await
            .unwrap();
    }
}

/// `gs://bkt/data/set` on fake-gcs-server (anonymous), with the same decoys as `s3()`.
async fn gcs() -> Fixture {
    let server = silt_testkit::FakeGcs::start();
    server.create_bucket("bkt");
    let uri = |p: &str| format!("gs://bkt/{p}?endpoint={}&anonymous=true", server.endpoint());
    let opts = S3Options::default();
    decoys(&open_store(&uri(""), &opts).await.unwrap()).await;
    let store = open_store(&uri("data/set"), &opts).await.unwrap();
    Fixture {
        store,
        backend: Backend::Gcs,
        _guard: Box::new(server),
    }
}

/// `azblob://bkt/data/set` on Azurite (shared key from an environment variable), with the
/// same decoys as `s3()`.
async fn azure() -> Fixture {
    let server = silt_testkit::Azurite::start();
    server.create_container("bkt");
    // The same well-known development key in every test.
    std::env::set_var("SILT_TEST_AZURITE_KEY", server.account_key());
    let uri = |p: &str| {
        format!(
            "azblob://bkt/{p}?account={}&endpoint={}&account_key_env=SILT_TEST_AZURITE_KEY",
            server.account_name(),
            server.endpoint()
        )
    };
    let opts = S3Options::default();
    decoys(&open_store(&uri(""), &opts).await.unwrap()).await;
    let store = open_store(&uri("data/set"), &opts).await.unwrap();
    Fixture {
        store,
        backend: Backend::Azure,
        _guard: Box::new(server),
    }
}

/// `webhdfs://HOST:PORT/behaviour-N/data/set` on the process's MiniHdfs, each test below a
/// directory of its own, with the same decoys as `s3()`.
async fn webhdfs() -> Fixture {
    hdfs_store(|hdfs, path, user| format!("webhdfs://{}{path}?user={user}", hdfs.http_addr())).await
}

/// The same through `hdfs://NAMENODE:RPC_PORT/...` (Hadoop's own form), its WebHDFS at the
/// namenode's `http_port`.
async fn hdfs() -> Fixture {
    hdfs_store(|hdfs, path, user| {
        format!(
            "hdfs://{}{path}?http_port={}&user={user}",
            hdfs.namenode(),
            hdfs.http_addr().port()
        )
    })
    .await
}

async fn hdfs_store(uri_of: impl Fn(&silt_testkit::MiniHdfs, &str, &str) -> String) -> Fixture {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let hdfs = silt_testkit::MiniHdfs::shared();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = format!("/behaviour-{}-{n}", std::process::id());
    hdfs.mkdirs(&base);
    // As the cluster's own user, its superuser: only that one may change owners.
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let user = String::from_utf8_lossy(&me.stdout).trim().to_string();
    let opts = S3Options::default();
    let uri = |p: &str| uri_of(hdfs, &format!("{base}{p}"), &user);
    decoys(&open_store(&uri(""), &opts).await.unwrap()).await;
    hdfs.mkdirs(&format!("{base}/data/set"));
    let store = open_store(&uri("/data/set"), &opts).await.unwrap();
    Fixture {
        store,
        backend: Backend::Webhdfs,
        _guard: Box::new(()),
    }
}

async fn put(f: &Fixture, path: &str, data: &[u8]) {
    f.store
        .write(path, Bytes::copy_from_slice(data))
        .await
        .unwrap_or_else(|e| panic!("write {path}: {e}"));
}

/// The whole current content of `path`.
async fn get(f: &Fixture, path: &str) -> Vec<u8> {
    let m = f
        .store
        .stat(path)
        .await
        .unwrap_or_else(|e| panic!("stat {path}: {e}"));
    let got = f.store.read(path, 0..m.size, &m).await;
    got.unwrap_or_else(|e| panic!("read {path}: {e}")).to_vec()
}

fn sorted(mut v: Vec<ObjectMeta>) -> Vec<(String, EntryKind)> {
    v.sort_by(|a, b| {
        a.path
            .cmp(&b.path)
            .then(format!("{:?}", a.kind).cmp(&format!("{:?}", b.kind)))
    });
    v.into_iter().map(|m| (m.path, m.kind)).collect()
}

fn file(p: &str) -> (String, EntryKind) {
    (p.to_string(), EntryKind::File)
}

fn dir(p: &str) -> (String, EntryKind) {
    (p.to_string(), EntryKind::Dir)
}

/// `len` bytes that are zeros except `head` at 0 and `tail` at the end, and say so: the
/// middle is a hole (as a sparse write buffer or log record reports it).
struct Holey {
    len: u64,
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl silt_common::io::ReadAt for Holey {
    fn read_at(&self, offset: u64, len: usize) -> silt_common::Result<Bytes> {
        assert!(offset + len as u64 <= self.len, "read past the end");
        let tail_at = self.len - self.tail.len() as u64;
        let out: Vec<u8> = (offset..offset + len as u64)
            .map(|i| {
                if i < self.head.len() as u64 {
                    self.head[i as usize]
                } else if i >= tail_at {
                    self.tail[(i - tail_at) as usize]
                } else {
                    0
                }
            })
            .collect();
        Ok(Bytes::from(out))
    }

    fn is_hole(&self, offset: u64, len: u64) -> bool {
        offset >= self.head.len() as u64 && offset + len <= self.len - self.tail.len() as u64
    }
}

mod cases {
    use super::*;

    /// A source with a hole is written whole: zeros where the hole was (S3 materialises them)
    /// and, in a local directory, a sparse file.
    pub async fn sparse_write_from(f: Fixture) {
        let len = 40u64 << 20;
        let src = Holey {
            len,
            head: b"head".to_vec(),
            tail: b"tail".to_vec(),
        };
        let m = f.store.write_from("sp/arse", &src, len).await.unwrap();
        assert_eq!(m.size, len);
        let m = f.store.stat("sp/arse").await.unwrap();
        let all = f.store.read("sp/arse", 0..len, &m).await.unwrap();
        assert_eq!(all.len() as u64, len);
        assert_eq!(&all[..4], b"head");
        assert_eq!(&all[all.len() - 4..], b"tail");
        assert!(all[4..all.len() - 4].iter().all(|&b| b == 0));
        if f.backend == Backend::Fs {
            use std::os::unix::fs::MetadataExt;
            let dir = f._guard.downcast_ref::<tempfile::TempDir>().unwrap();
            let md = std::fs::metadata(dir.path().join("sp/arse")).unwrap();
            assert_eq!(md.len(), len);
            assert!(
                md.blocks() * 512 < 4 << 20,
                "{} bytes on disk for 8 bytes of data",
                md.blocks() * 512
            );
        }
    }

    pub async fn stat_file_dir_missing(f: Fixture) {
        let s = &f.store;
        put(&f, "a/b.txt", b"hello").await;
        put(&f, "a/b.txtx", b"decoy").await;
        put(&f, "a/c/d.bin", b"0123456789").await;

        let m = s.stat("a/b.txt").await.unwrap();
        assert_eq!(
            (m.path.as_str(), m.kind, m.size),
            ("a/b.txt", EntryKind::File, 5)
        );
        assert_eq!(m.name(), "b.txt");
        assert!(m.mtime.is_some());
        match f.backend {
            Backend::S3 | Backend::Mem | Backend::Gcs | Backend::Azure => {
                let etag = m.etag.as_deref().expect("etag");
                assert!(!etag.is_empty() && !etag.contains('"'), "{etag:?}");
            }
            // HDFS has no ETags; its permission bits are real.
            Backend::Fs | Backend::Webhdfs => {
                assert_eq!(m.etag, None);
                assert_eq!(m.mode.map(|m| m & 0o400), Some(0o400), "{m:?}");
            }
        }

        for d in ["a", "a/c", ""] {
            let m = s.stat(d).await.unwrap();
            assert_eq!((m.path.as_str(), m.kind, m.size), (d, EntryKind::Dir, 0));
        }
        for missing in ["nope", "a/nope", "a/b.tx", "a/b.txt/x", "a/c/d"] {
            let e = s.stat(missing).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{missing}: {e}");
        }
        assert_eq!(
            s.stat("a/../etc").await.unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    /// The version a write reports is the store's: same content fingerprint as a later stat,
    /// and a read guarded by it succeeds. `write_from` likewise, past one upload part (S3
    /// multipart: 8 MiB parts).
    pub async fn written_version_is_the_stored_one(f: Fixture) {
        let s = &f.store;
        // The reported version is the one stat sees, and reads of it give `data` back.
        let check = |path: &'static str, w: ObjectMeta, data: Vec<u8>| async move {
            let st = s.stat(path).await.unwrap();
            assert_eq!(
                w.content_fingerprint(),
                st.content_fingerprint(),
                "{w:?} vs {st:?}"
            );
            assert_eq!((w.size, st.size), (data.len() as u64, data.len() as u64));
            let back = s.read(path, 0..w.size, &w).await.unwrap();
            assert!(back == data, "{path}: the stored bytes differ");
        };
        let small = b"written once".to_vec();
        let w = s
            .write("w/small", Bytes::from(small.clone()))
            .await
            .unwrap();
        check("w/small", w, small).await;

        let big: Vec<u8> = (0..(9u32 << 20) + 123).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &big).unwrap();
        let w = s
            .write_from("w/big", &file, big.len() as u64)
            .await
            .unwrap();
        check("w/big", w, big).await;
    }

    pub async fn list_direct_vs_recursive(f: Fixture) {
        let s = &f.store;
        for p in ["top.txt", "d/x", "d/y", "d/sub/z", "d/sub/deeper/w", "dd/q"] {
            put(&f, p, p.as_bytes()).await;
        }

        let direct = s.list("d", false).await.unwrap();
        assert_eq!(
            sorted(direct.clone()),
            vec![dir("d/sub"), file("d/x"), file("d/y")]
        );
        let x = direct.iter().find(|m| m.path == "d/x").unwrap();
        assert_eq!(x.size, 3);
        // Metadata from a listing and from a stat must agree, or caches would see changes.
        let stat_x = s.stat("d/x").await.unwrap();
        assert_eq!(x.content_fingerprint(), stat_x.content_fingerprint());
        assert_eq!(sorted(s.list("d/", false).await.unwrap()), sorted(direct));

        let rec = s.list("d", true).await.unwrap();
        let files: Vec<_> = sorted(rec.clone())
            .into_iter()
            .filter(|(_, k)| *k == EntryKind::File)
            .collect();
        assert_eq!(
            files,
            vec![
                file("d/sub/deeper/w"),
                file("d/sub/z"),
                file("d/x"),
                file("d/y")
            ]
        );
        let all = sorted(rec);
        let mut dedup = all.clone();
        dedup.dedup();
        assert_eq!(all, dedup, "each entry once");
        for (p, k) in &all {
            assert!(!p.ends_with('/') && p.starts_with("d/"), "{p}");
            if *k == EntryKind::Dir {
                assert!(p == "d/sub" || p == "d/sub/deeper", "{p}");
            }
        }

        assert_eq!(
            sorted(s.list("", false).await.unwrap()),
            vec![dir("d"), dir("dd"), file("top.txt")]
        );
        let every: Vec<_> = sorted(s.list("", true).await.unwrap())
            .into_iter()
            .filter(|(_, k)| *k == EntryKind::File)
            .collect();
        assert_eq!(every.len(), 6, "{every:?}");
    }

    pub async fn list_missing_dir_and_file(f: Fixture) {
        let s = &f.store;
        put(&f, "top.txt", b"t").await;
        put(&f, "d/sub/x", b"x").await;
        for (d, recursive) in [
            ("nope", false),
            ("nope", true),
            ("d/s", false),
            ("d/sub/x/y", true),
        ] {
            let e = s.list(d, recursive).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{d}: {e}");
        }
        for (d, recursive) in [("top.txt", false), ("d/sub/x", true)] {
            let e = s.list(d, recursive).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotADirectory, "{d}: {e}");
        }
    }

    pub async fn read_ranges(f: Fixture) {
        let s = &f.store;
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        put(&f, "r/data.bin", &data).await;
        let m = s.stat("r/data.bin").await.unwrap();
        let read = |a: u64, b: u64| {
            let m = m.clone();
            async move { s.read("r/data.bin", a..b, &m).await }
        };
        assert_eq!(read(0, 10).await.unwrap(), &data[..10]);
        assert_eq!(read(990, 1000).await.unwrap(), &data[990..]);
        assert_eq!(read(995, 2000).await.unwrap(), &data[995..], "clamped");
        assert!(read(2000, 3000).await.unwrap().is_empty(), "past EOF");
        assert!(read(10, 10).await.unwrap().is_empty(), "empty range");
        assert_eq!(read(0, u64::MAX).await.unwrap(), &data[..]);
        assert_eq!(
            read(5, 3).await.unwrap_err().kind(),
            ErrorKind::InvalidInput
        );

        put(&f, "r/empty", b"").await;
        let e = s.stat("r/empty").await.unwrap();
        assert_eq!((e.kind, e.size), (EntryKind::File, 0));
        assert!(s.read("r/empty", 0..100, &e).await.unwrap().is_empty());

        // Several MiB: one contiguous buffer, byte-exact.
        let big: Vec<u8> = (0..(3u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        put(&f, "r/big", &big).await;
        let bm = s.stat("r/big").await.unwrap();
        let got = s.read("r/big", 1..(3 << 20) - 1, &bm).await.unwrap();
        assert!(got[..] == big[1..big.len() - 1]);
        // The same bytes as page-sized pieces (what a fetch caches), every piece but the last
        // whole, each its own buffer.
        for piece in [1000u64, 4096, 1 << 20] {
            let got = s
                .read_pieces("r/big", 1..(3 << 20) - 1, &bm, piece)
                .await
                .unwrap();
            assert!(got.concat() == big[1..big.len() - 1], "piece {piece}");
            let (last, whole) = got.split_last().unwrap();
            assert!(
                whole.iter().all(|p| p.len() as u64 == piece),
                "piece {piece}"
            );
            assert!(!last.is_empty() && last.len() as u64 <= piece);
        }
        assert!(s
            .read_pieces("r/big", 5..5, &bm, 4096)
            .await
            .unwrap()
            .is_empty());

        let missing = ObjectMeta {
            path: "r/missing".into(),
            ..m.clone()
        };
        let e = s.read("r/missing", 0..10, &missing).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let e = s
            .read_pieces("r/missing", 0..10, &missing, 4)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }

    /// `local_file`: a local directory's own file of exactly the version asked for, opened
    /// read-only; nothing for another version, a link in its place (even to a file of that
    /// version), a directory, a missing file or a path outside the store; nothing ever from an
    /// object store or the in-memory one.
    pub async fn local_file(f: Fixture) {
        use std::io::{Read, Write};
        let s = &f.store;
        put(&f, "l/obj", b"0123456789").await;
        let m1 = s.stat("l/obj").await.unwrap();
        let got = s.local_file("l/obj", &m1).await;
        if f.backend != Backend::Fs {
            assert!(got.is_none(), "{:?} has no local files", f.backend);
            return;
        }
        let mut file = got.expect("the version asked for");
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "0123456789");
        assert!(file.write_all(b"x").is_err(), "opened for writing");

        // Past the file system's timestamp granularity, so the same-size rewrite shows.
        tokio::time::sleep(Duration::from_millis(20)).await;
        put(&f, "l/obj", b"abcdefghij").await;
        assert!(
            s.local_file("l/obj", &m1).await.is_none(),
            "another version"
        );
        let m2 = s.stat("l/obj").await.unwrap();
        assert!(s.local_file("l/obj", &m2).await.is_some());
        // A link to a file of the version asked for is still not that file.
        s.symlink("l/link", "obj").await.unwrap();
        assert!(
            s.local_file("l/link", &m2).await.is_none(),
            "a link followed"
        );
        put(&f, "l/d/x", b"x").await;
        let d = s.stat("l/d").await.unwrap();
        assert!(s.local_file("l/d", &d).await.is_none(), "a directory");
        assert!(
            s.local_file("l/none", &m2).await.is_none(),
            "a missing file"
        );
        assert!(
            s.local_file("../l/obj", &m2).await.is_none(),
            "outside the store"
        );
    }

    pub async fn content_changed_after_overwrite(f: Fixture) {
        if f.backend == Backend::Gcs {
            // fake-gcs-server ignores `ifGenerationMatch` on reads (real GCS enforces it),
            // so the emulator cannot show a refused read.
            return;
        }
        let s = &f.store;
        put(&f, "c/obj", &[b'a'; 100]).await;
        let m1 = s.stat("c/obj").await.unwrap();
        // Local directories fingerprint by size+mtime: let the clock pass the filesystem's
        // timestamp granularity so that a same-size overwrite is visible.
        tokio::time::sleep(Duration::from_millis(20)).await;
        put(&f, "c/obj", &[b'b'; 100]).await;
        for range in [0..100, 10..20, 99..100] {
            let e = s.read("c/obj", range.clone(), &m1).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ContentChanged, "{range:?}: {e}");
            assert!(!e.is_retryable());
            let e = s
                .read_pieces("c/obj", range.clone(), &m1, 32)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ContentChanged, "pieces {range:?}: {e}");
        }
        let m2 = s.stat("c/obj").await.unwrap();
        assert_ne!(m1.content_fingerprint(), m2.content_fingerprint());
        assert_eq!(
            s.read("c/obj", 0..100, &m2).await.unwrap(),
            &[b'b'; 100][..]
        );

        put(&f, "c/obj", &[b'c'; 50]).await;
        let e = s.read("c/obj", 0..50, &m2).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}");
        let e = s.read_pieces("c/obj", 0..50, &m2, 16).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}");

        s.delete("c/obj").await.unwrap();
        let e = s.read("c/obj", 0..50, &m2).await.unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ContentChanged),
            "{e}"
        );
        // A directory at the version's path now, or a file where its parent was: the version
        // is gone, not "is a directory" / "not a directory" (an open descriptor of the deleted
        // file reads ESTALE through the mount, never EISDIR).
        put(&f, "c/obj/inner", b"x").await;
        put(&f, "c/dir/obj", &[b'd'; 10]).await;
        let m3 = s.stat("c/dir/obj").await.unwrap();
        s.delete("c/dir/obj").await.unwrap();
        let _ = s.remove_dir("c/dir").await;
        put(&f, "c/dir", b"now a file").await;
        for (path, m) in [("c/obj", &m2), ("c/dir/obj", &m3)] {
            let e = s.read(path, 0..m.size, m).await.unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ContentChanged),
                "{path}: {e}"
            );
            let e = s.read_pieces(path, 0..m.size, m, 4).await.unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ContentChanged),
                "{path} pieces: {e}"
            );
        }
    }

    pub async fn write_delete(f: Fixture) {
        let s = &f.store;
        put(&f, "w/x", b"1").await;
        put(&f, "w/y", b"22").await;
        assert_eq!(s.stat("w/x").await.unwrap().size, 1);
        s.delete("w/x").await.unwrap();
        assert_eq!(s.stat("w/x").await.unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(sorted(s.list("w", false).await.unwrap()), vec![file("w/y")]);
        s.delete("w/x").await.unwrap();
        s.delete("never/existed").await.unwrap();
        assert_eq!(
            s.write("", Bytes::from_static(b"x"))
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
        put(&f, "w/x", b"again").await;
        let m = s.stat("w/x").await.unwrap();
        assert_eq!(s.read("w/x", 0..5, &m).await.unwrap(), "again");
    }

    /// Whole writes of one path racing each other and readers, as PUTs of one key do: every
    /// write succeeds, a read returns one write's bytes whole (or fails as changed), the last
    /// write is what stays, and a listing meanwhile shows the file and nothing else (docs/
    /// SEMANTICS.md: "each commit writes a whole object, the last wins"). A write keeps the
    /// permission bits of the file it replaces where writes keep attributes.
    pub async fn racing_writes_replace_whole(f: Fixture) {
        const SIZE: usize = 3 << 20;
        const WRITERS: u8 = 6;
        let s = f.store.clone();
        put(&f, "race/k", b"zzzz").await;
        if let Some(dir) = f._guard.downcast_ref::<tempfile::TempDir>() {
            // What a daemon killed mid-write leaves in a local directory: never listed.
            std::fs::write(
                dir.path().join("race/.silt-write-0123456789abcdef"),
                b"torn",
            )
            .unwrap();
        }
        if !s.capabilities().write_replaces_attrs {
            let mode = SetAttrs {
                mode: Some(0o640),
                ..SetAttrs::default()
            };
            s.set_attrs("race/k", &mode).await.unwrap();
        }
        for round in 0..4u8 {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let reader = {
                let (s, stop) = (s.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut whole = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let listed = sorted(s.list("race", false).await.unwrap());
                        assert_eq!(listed, vec![file("race/k")], "a write showed in a listing");
                        let Ok(m) = s.stat("race/k").await else {
                            panic!("the path was missing between writes");
                        };
                        match s.read("race/k", 0..m.size, &m).await {
                            Ok(b) => {
                                assert_eq!(b.len() as u64, m.size);
                                assert!(
                                    b.iter().all(|&x| x == b[0]),
                                    "a read returned the bytes of two writes"
                                );
                                whole += 1;
                            }
                            Err(e) => assert!(
                                matches!(e.kind(), ErrorKind::ContentChanged | ErrorKind::NotFound),
                                "{e}"
                            ),
                        }
                        tokio::task::yield_now().await;
                    }
                    whole
                })
            };
            // Another process reading the local directory itself: the old bytes or one
            // write's, whole, never part of one or a mix (docs/SEMANTICS.md).
            let outside = f._guard.downcast_ref::<tempfile::TempDir>().map(|dir| {
                let (file, stop) = (dir.path().join("race/k"), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let b = std::fs::read(&file).expect("the file was missing");
                        assert!(
                            (b.len() == SIZE || b == b"zzzz") && b.iter().all(|&x| x == b[0]),
                            "a reader of the directory saw {} bytes, not one write whole",
                            b.len()
                        );
                    }
                })
            });
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let s = s.clone();
                    let byte = round * WRITERS + w + 1;
                    tokio::spawn(
                        async move { s.write("race/k", Bytes::from(vec![byte; SIZE])).await },
                    )
                })
                .collect();
            let mut written = Vec::new();
            for (w, h) in writers.into_iter().enumerate() {
                let m = h
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("round {round} writer {w}: {e}"));
                assert_eq!(m.size, SIZE as u64);
                written.push(round * WRITERS + w as u8 + 1);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.await.unwrap();
            if let Some(outside) = outside {
                outside.join().expect("the reader of the directory failed");
            }
            let m = s.stat("race/k").await.unwrap();
            let b = s.read("race/k", 0..m.size, &m).await.unwrap();
            assert_eq!(b.len(), SIZE, "round {round}");
            assert!(
                written.contains(&b[0]) && b.iter().all(|&x| x == b[0]),
                "round {round}: the stored file is not one write whole"
            );
            if !s.capabilities().write_replaces_attrs {
                assert_eq!(m.mode.map(|m| m & 0o777), Some(0o640), "{m:?}");
            }
        }
    }

    /// `create_dir` makes a directory that shows while empty; `remove_dir` refuses a directory
    /// with anything below it and removes an empty one.
    pub async fn create_and_remove_dirs(f: Fixture) {
        let s = &f.store;
        let m = s.create_dir("e/sub").await.unwrap();
        assert_eq!((m.path.as_str(), m.kind), ("e/sub", EntryKind::Dir));
        s.create_dir("e/sub/").await.expect("an existing directory");
        assert_eq!(s.stat("e/sub").await.unwrap().kind, EntryKind::Dir);
        assert_eq!(s.stat("e").await.unwrap().kind, EntryKind::Dir);
        assert!(s.list("e/sub", false).await.unwrap().is_empty());
        assert_eq!(
            sorted(s.list("e", false).await.unwrap()),
            vec![dir("e/sub")]
        );
        let rec = sorted(s.list("e", true).await.unwrap());
        assert_eq!(rec, vec![dir("e/sub")], "an empty directory is in a sweep");
        let tree = sorted(s.list_tree("", 100).await.unwrap().unwrap());
        assert!(tree.contains(&dir("e/sub")), "{tree:?}");

        put(&f, "e/sub/x", b"x").await;
        for d in ["e/sub", "e"] {
            let e = s.remove_dir(d).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotEmpty, "{d}: {e}");
        }
        assert_eq!(s.stat("e/sub/x").await.unwrap().size, 1, "nothing removed");
        s.delete("e/sub/x").await.unwrap();
        s.remove_dir("e/sub").await.unwrap();
        assert_eq!(
            s.stat("e/sub").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        match f.backend {
            // A real directory stays; on an object store `e` was implied by `e/sub/` alone.
            Backend::Fs | Backend::Webhdfs => {
                assert_eq!(s.stat("e").await.unwrap().kind, EntryKind::Dir);
                s.remove_dir("e").await.unwrap();
            }
            Backend::S3 | Backend::Mem | Backend::Gcs | Backend::Azure => {}
        }
        assert_eq!(s.stat("e").await.unwrap_err().kind(), ErrorKind::NotFound);
        s.remove_dir("never/existed")
            .await
            .expect("nothing to remove");

        // A directory implied by keys only cannot be removed while they are there.
        put(&f, "imp/deep/y", b"y").await;
        let e = s.remove_dir("imp").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotEmpty, "{e}");
        assert_eq!(s.stat("imp/deep/y").await.unwrap().size, 1);

        if !matches!(f.backend, Backend::S3 | Backend::Gcs | Backend::Azure) {
            // A file has the path (an object store could hold both `f` and `f/`).
            put(&f, "afile", b"f").await;
            assert!(s.create_dir("afile").await.is_err());
        }
    }

    /// `set_attrs` changes what it is given and nothing else: the bytes and the content
    /// fingerprint stay (except where the mtime is the fingerprint); `stat` and a write that
    /// passes the attributes keep them; a missing path is `NotFound`.
    pub async fn set_attrs(f: Fixture) {
        let s = &f.store;
        put(&f, "at/f", b"attr bytes").await;
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        // Owners the test can set: the store's own uid/gid are kept on a local directory
        // (a process that is not root may not give files away).
        let own = s.stat("at/f").await.unwrap().posix;
        let (uid, gid) = (own.uid.unwrap_or(4321), own.gid.unwrap_or(8765));
        let set = SetAttrs {
            mode: Some(0o640),
            uid: Some(uid),
            gid: Some(gid),
            atime: Some(t),
            mtime: Some(t),
        };
        let m = s.set_attrs("at/f", &set).await.unwrap();
        let st = s.stat("at/f").await.unwrap();
        for (what, m) in [("returned", &m), ("stat", &st)] {
            assert_eq!(m.mode, Some(0o640), "{what}");
            assert_eq!((m.posix.uid, m.posix.gid), (Some(uid), Some(gid)), "{what}");
            assert_eq!(m.mtime, Some(t), "{what}");
            assert_eq!(m.size, 10, "{what}");
        }
        assert!(s.read("at/f", 0..10, &st).await.unwrap() == b"attr bytes"[..]);
        // Only what is given changes.
        let m = s
            .set_attrs(
                "at/f",
                &SetAttrs {
                    mode: Some(0o600),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(m.mode, Some(0o600));
        assert_eq!((m.posix.uid, m.posix.gid), (Some(uid), Some(gid)));
        // A rewrite passing them keeps them.
        let keep = SetAttrs {
            mode: Some(0o604),
            ..Default::default()
        };
        let w = s
            .write_from_attrs("at/f", &bytes::Bytes::from_static(b"new"), 3, &keep, None)
            .await
            .unwrap();
        assert_eq!(w.mode, Some(0o604));
        assert_eq!(s.stat("at/f").await.unwrap().mode, Some(0o604));
        let e = s.set_attrs("at/missing", &keep).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }

    /// An object's S3 headers (`Content-Type` and the like, user metadata, checksums, part
    /// sizes) are kept with it in the store's own form: written with the object, read back
    /// for its version, kept by a copy and a rename, replaced by a rewrite (as a PUT replaces
    /// them); asked for a version the object no longer has, `ContentChanged`.
    pub async fn headers(f: Fixture) {
        let s = &f.store;
        let h = silt_ufs::Headers {
            content_type: Some("text/csv; charset=utf-8".into()),
            cache_control: Some("max-age=3600".into()),
            content_disposition: Some("attachment; filename=\"report 1.csv\"".into()),
            content_encoding: Some("gzip".into()),
            content_language: Some("fr-CH".into()),
            expires: Some("Thu, 01 Dec 2044 16:00:00 GMT".into()),
            user: [
                ("owner".to_string(), "etl team".to_string()),
                ("my-key".to_string(), "v=1".to_string()),
            ]
            .into(),
            checksums: [(
                "sha256".to_string(),
                "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=".to_string(),
            )]
            .into(),
            checksum_type: Some("FULL_OBJECT".into()),
            parts: vec![5 << 20, 5 << 20, 17],
        };
        let data = bytes::Bytes::from_static(b"a,b\n1,2\n");
        let w = s
            .write_from_attrs(
                "h/f.csv",
                &data,
                data.len() as u64,
                &SetAttrs::default(),
                Some(&h),
            )
            .await
            .unwrap();
        assert_eq!(get(&f, "h/f.csv").await, data.to_vec());
        let m = s.stat("h/f.csv").await.unwrap();
        assert_eq!(m.content_fingerprint(), w.content_fingerprint());
        assert_eq!(s.headers("h/f.csv", &m).await.unwrap(), h);
        // A copy keeps them, a rename moves them.
        s.copy("h/f.csv", "h/copy.csv").await.unwrap();
        let c = s.stat("h/copy.csv").await.unwrap();
        assert_eq!(s.headers("h/copy.csv", &c).await.unwrap(), h, "copy");
        s.rename("h/copy.csv", "h/moved.csv").await.unwrap();
        let r = s.stat("h/moved.csv").await.unwrap();
        assert_eq!(s.headers("h/moved.csv", &r).await.unwrap(), h, "rename");
        // A rewrite without them has none (a PUT replaces the metadata) but the store's own
        // default type, where it gives every object one (S3 and Azure do).
        put(&f, "h/f.csv", b"x").await;
        let now = s.stat("h/f.csv").await.unwrap();
        let mut after = s.headers("h/f.csv", &now).await.unwrap();
        let default_type = after.content_type.take();
        assert!(
            default_type
                .as_deref()
                .is_none_or(|t| t.ends_with("/octet-stream")),
            "{default_type:?}"
        );
        assert_eq!(after, silt_ufs::Headers::default());
        // Asked for the old version: it is gone.
        let e = s.headers("h/f.csv", &m).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}");
        // With POSIX attributes beside them, where the store keeps both.
        let attrs = SetAttrs {
            mode: Some(0o640),
            ..Default::default()
        };
        let both = s
            .write_from_attrs("h/both", &data, data.len() as u64, &attrs, Some(&h))
            .await
            .unwrap();
        // The POSIX attributes are user metadata where the store keeps them there (s3fs-fuse's
        // keys: `x-amz-meta-mode`, ...), and S3 clients see them as such.
        let mut got = s.headers("h/both", &both).await.unwrap();
        got.user.retain(|k, _| h.user.contains_key(k));
        assert_eq!(got, h);
        if f.backend != Backend::Mem {
            assert_eq!(s.stat("h/both").await.unwrap().mode, Some(0o640));
        }
        // A change of attributes (a chmod through the mount) keeps them: on an object store it
        // rewrites the object, which must not strip what an S3 client stored with it.
        let chmod = SetAttrs {
            mode: Some(0o600),
            ..Default::default()
        };
        let after = s.set_attrs("h/both", &chmod).await.unwrap();
        let mut got = s.headers("h/both", &after).await.unwrap();
        got.user.retain(|k, _| h.user.contains_key(k));
        assert_eq!(got, h, "after a chmod");
        let e = s.headers("h/missing", &m).await.unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ContentChanged),
            "{e}"
        );
    }

    /// `rename` moves a file (replacing one at the destination), `copy` copies it; a
    /// directory moves whole only where the store says it can.
    pub async fn rename_and_copy(f: Fixture) {
        let s = &f.store;
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
        put(&f, "r/a", &data).await;
        let m = s.rename("r/a", "r2/deep/b").await.unwrap();
        assert_eq!(
            (m.path.as_str(), m.kind, m.size),
            ("r2/deep/b", EntryKind::File, 70_000)
        );
        let st = s.stat("r2/deep/b").await.unwrap();
        assert_eq!(m.content_fingerprint(), st.content_fingerprint());
        assert!(s.read("r2/deep/b", 0..m.size, &m).await.unwrap() == data);
        assert_eq!(s.stat("r/a").await.unwrap_err().kind(), ErrorKind::NotFound);

        // Onto an existing file: replaced.
        put(&f, "r2/other", b"old").await;
        let m2 = s.rename("r2/deep/b", "r2/other").await.unwrap();
        assert_eq!(m2.size, 70_000);
        let st = s.stat("r2/other").await.unwrap();
        assert!(s.read("r2/other", 0..st.size, &st).await.unwrap() == data);
        let e = s.rename("r2/missing", "r2/x").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

        let c = s.copy("r2/other", "r3/copy").await.unwrap();
        assert_eq!(c.size, 70_000);
        assert!(s.read("r3/copy", 0..c.size, &c).await.unwrap() == data);
        assert_eq!(
            s.stat("r2/other").await.unwrap().size,
            70_000,
            "source kept"
        );

        // Directories.
        put(&f, "d1/x", b"x").await;
        put(&f, "d1/s/y", b"yy").await;
        if s.capabilities().rename_dirs {
            let m = s.rename("d1", "d2").await.unwrap();
            assert_eq!(m.kind, EntryKind::Dir);
            let moved: Vec<_> = sorted(s.list("d2", true).await.unwrap())
                .into_iter()
                .filter(|(_, k)| *k == EntryKind::File)
                .collect();
            assert_eq!(moved, vec![file("d2/s/y"), file("d2/x")]);
            assert_eq!(s.stat("d1").await.unwrap_err().kind(), ErrorKind::NotFound);
            // Onto a directory that is not empty: refused.
            put(&f, "d3/z", b"z").await;
            let e = s.rename("d2", "d3").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotEmpty, "{e}");
        } else {
            let e = s.rename("d1", "d2").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::IsADirectory, "{e}");
            assert_eq!(s.stat("d1/s/y").await.unwrap().size, 2, "nothing moved");
        }
    }

    pub async fn fault_injection(f: Fixture) {
        put(&f, "f/a.bad", b"bad").await;
        put(&f, "f/b.good", b"good").await;
        let faulty = Arc::new(FaultStore::new(f.store.clone()));
        let s: DynStore = faulty.clone();
        assert_eq!(s.uri(), f.store.uri());

        faulty.inject(Fault::fail_next(FaultOp::Stat, 2, ErrorKind::Unavailable));
        for _ in 0..2 {
            let e = s.stat("f/b.good").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unavailable);
            assert!(e.is_retryable());
        }
        let good = s.stat("f/b.good").await.unwrap();
        let bad = s.stat("f/a.bad").await.unwrap();
        assert_eq!(faulty.calls(FaultOp::Stat), 4);

        faulty.inject(Fault::fail_reads(
            |p| p.ends_with(".bad"),
            ErrorKind::Timeout,
        ));
        assert_eq!(
            s.read("f/a.bad", 0..3, &bad).await.unwrap_err().kind(),
            ErrorKind::Timeout
        );
        assert_eq!(s.read("f/b.good", 0..4, &good).await.unwrap(), "good");

        faulty.inject(Fault::latency(FaultOp::List, Duration::from_millis(100)));
        let t = Instant::now();
        assert_eq!(s.list("f", false).await.unwrap().len(), 2);
        assert!(t.elapsed() >= Duration::from_millis(100));

        faulty.clear();
        assert_eq!(s.read("f/a.bad", 0..3, &bad).await.unwrap(), "bad");
        assert_eq!(faulty.calls(FaultOp::Read), 3);
        assert_eq!(faulty.calls(FaultOp::List), 1);
    }

    /// The trait's symlink invariants: a link is a link (never what it points to), its size
    /// is its target's length, it may dangle, and delete/rename act on the link itself.
    pub async fn symlinks(f: Fixture) {
        let s = &f.store;
        if f.backend == Backend::Webhdfs {
            // HDFS keeps symbolic links disabled, and WebHDFS cannot read one's target.
            let e = s.symlink("k/lf", "t.txt").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            return;
        }
        put(&f, "k/t.txt", b"target").await;
        s.create_dir("k/d").await.unwrap();
        put(&f, "k/d/in", b"in").await;
        for (link, target) in [("k/lf", "t.txt"), ("k/ld", "d"), ("k/dangling", "../nope")] {
            let m = s.symlink(link, target).await.unwrap();
            assert_eq!((m.kind, m.size), (EntryKind::Symlink, target.len() as u64));
            let m = s.stat(link).await.unwrap();
            assert_eq!((m.kind, m.size), (EntryKind::Symlink, target.len() as u64));
            assert_eq!(s.read_link(link).await.unwrap(), target);
        }
        let err = s.symlink("k/t.txt", "x").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
        let err = s.read_link("k/t.txt").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let err = s.read_link("k/none").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        let listed: Vec<_> = s
            .list("k", false)
            .await
            .unwrap()
            .into_iter()
            .filter(|m| m.kind == EntryKind::Symlink)
            .map(|m| m.path)
            .collect();
        let mut listed = listed;
        listed.sort();
        match f.backend {
            // A listing carries no user metadata (`list_attrs` off): links show on stat.
            Backend::S3 | Backend::Gcs | Backend::Azure => {}
            _ => assert_eq!(listed, ["k/dangling", "k/ld", "k/lf"]),
        }
        if let Backend::Fs = f.backend {
            // chmod follows links in the OS; the store must not let it reach the target.
            let before = s.stat("k/t.txt").await.unwrap().mode;
            let set = SetAttrs {
                mode: Some(0o700),
                ..Default::default()
            };
            s.set_attrs("k/lf", &set).await.unwrap();
            assert_eq!(
                s.stat("k/t.txt").await.unwrap().mode,
                before,
                "a mode set on a link changed its target"
            );
        }
        // Rename and delete act on the link; the targets stay.
        let m = s.rename("k/dangling", "k/moved").await.unwrap();
        assert_eq!(m.kind, EntryKind::Symlink);
        assert_eq!(s.read_link("k/moved").await.unwrap(), "../nope");
        assert_eq!(
            s.stat("k/dangling").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        s.delete("k/moved").await.unwrap();
        s.delete("k/ld").await.unwrap();
        s.delete("k/lf").await.unwrap();
        for gone in ["k/moved", "k/ld", "k/lf"] {
            assert_eq!(s.stat(gone).await.unwrap_err().kind(), ErrorKind::NotFound);
        }
        assert_eq!(s.stat("k/d").await.unwrap().kind, EntryKind::Dir);
        let t = s.stat("k/t.txt").await.unwrap();
        assert_eq!(s.read("k/t.txt", 0..6, &t).await.unwrap(), "target");
    }

    /// `mknod` makes each special kind, typed in `stat` (and `list` where listings carry
    /// attributes), a device with its number; never read; `delete`, `rename` and `copy` act
    /// on the node itself; `AlreadyExists` over any entry.
    pub async fn special_files(f: Fixture) {
        let s = &f.store;
        if f.backend == Backend::Webhdfs {
            // HDFS has no FIFOs, sockets or device nodes.
            let e = s
                .mknod("sp/fifo", SpecialKind::Fifo, 0, &SetAttrs::default())
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            return;
        }
        s.create_dir("sp").await.unwrap();
        put(&f, "sp/file", b"bytes").await;
        let kinds = [
            ("sp/fifo", SpecialKind::Fifo, 0),
            ("sp/sock", SpecialKind::Socket, 0),
            ("sp/chr", SpecialKind::CharDevice, (1 << 8) | 7),
            ("sp/blk", SpecialKind::BlockDevice, (7 << 8) | 200),
        ];
        let set = SetAttrs {
            mode: Some(0o640),
            ..Default::default()
        };
        for (path, kind, rdev) in kinds {
            let m = s.mknod(path, kind, rdev, &set).await.unwrap();
            let st = s.stat(path).await.unwrap();
            for (what, m) in [("returned", &m), ("stat", &st)] {
                assert_eq!(m.kind, EntryKind::Special(kind), "{what} {path}");
                assert_eq!((m.size, m.posix.rdev), (0, rdev), "{what} {path}");
                assert_eq!(m.mode, Some(0o640), "{what} {path}");
            }
            let e = s.read(path, 0..10, &st).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "read of {path}: {e}");
        }
        // A socket or FIFO has no device number, whatever is asked.
        let m = s
            .mknod("sp/fifo2", SpecialKind::Fifo, 99, &set)
            .await
            .unwrap();
        assert_eq!(m.posix.rdev, 0);
        for over in ["sp/fifo", "sp/file", "sp"] {
            let e = s.mknod(over, SpecialKind::Fifo, 0, &set).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::AlreadyExists, "mknod over {over}: {e}");
        }
        if !s.capabilities().list_without_attrs {
            let listed: Vec<(String, EntryKind)> = sorted(s.list("sp", false).await.unwrap());
            assert!(
                listed.contains(&("sp/chr".into(), EntryKind::Special(SpecialKind::CharDevice))),
                "{listed:?}"
            );
        }
        let m = s.rename("sp/chr", "sp/chr2").await.unwrap();
        assert_eq!(
            (m.kind, m.posix.rdev),
            (EntryKind::Special(SpecialKind::CharDevice), (1 << 8) | 7)
        );
        assert_eq!(
            s.stat("sp/chr").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        let m = s.copy("sp/fifo", "sp/fifo3").await.unwrap();
        assert_eq!(m.kind, EntryKind::Special(SpecialKind::Fifo));
        assert_eq!(
            s.stat("sp/fifo3").await.unwrap().kind,
            EntryKind::Special(SpecialKind::Fifo)
        );
        for p in [
            "sp/fifo", "sp/fifo2", "sp/fifo3", "sp/sock", "sp/chr2", "sp/blk",
        ] {
            s.delete(p).await.unwrap();
            assert_eq!(
                s.stat(p).await.unwrap_err().kind(),
                ErrorKind::NotFound,
                "{p}"
            );
        }
    }

    /// `hard_link` where the store has them (a local directory): one file, two names, both
    /// counted; elsewhere `Unsupported` and nothing made.
    pub async fn hard_links(f: Fixture) {
        let s = &f.store;
        put(&f, "hl/a", b"linked").await;
        match f.backend {
            Backend::Fs => {
                let m = s.hard_link("hl/a", "hl/b").await.unwrap();
                assert_eq!((m.kind, m.posix.nlink), (EntryKind::File, Some(2)));
                assert_eq!(s.stat("hl/a").await.unwrap().posix.nlink, Some(2));
                // A rewrite through one name is the other's (written in place).
                let w = s
                    .write("hl/b", bytes::Bytes::from_static(b"changed!"))
                    .await
                    .unwrap();
                assert_eq!(w.posix.nlink, Some(2), "still one file");
                assert_eq!(get(&f, "hl/a").await, b"changed!");
                let e = s.hard_link("hl/a", "hl/b").await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
                let e = s.hard_link("hl/none", "hl/c").await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
                s.delete("hl/a").await.unwrap();
                assert_eq!(s.stat("hl/b").await.unwrap().posix.nlink, Some(1));
                assert_eq!(get(&f, "hl/b").await, b"changed!");
            }
            _ => {
                let e = s.hard_link("hl/a", "hl/b").await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                assert_eq!(
                    s.stat("hl/b").await.unwrap_err().kind(),
                    ErrorKind::NotFound
                );
            }
        }
    }

    /// A directory keeps its mode, owner and mtime (a local directory's own; an S3 marker's
    /// user metadata, made for a directory implied by keys only), and a listing's entry is
    /// still a directory.
    pub async fn directory_attrs(f: Fixture) {
        let s = &f.store;
        s.create_dir("da/marked").await.unwrap();
        put(&f, "da/implied/f", b"x").await;
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        let own = s.stat("da/marked").await.unwrap().posix;
        let (uid, gid) = (own.uid.unwrap_or(4321), own.gid.unwrap_or(8765));
        let set = SetAttrs {
            mode: Some(0o710),
            uid: Some(uid),
            gid: Some(gid),
            atime: None,
            mtime: Some(t),
        };
        for d in ["da/marked", "da/implied"] {
            let m = s.set_attrs(d, &set).await.unwrap();
            let st = s.stat(d).await.unwrap();
            for (what, m) in [("returned", &m), ("stat", &st)] {
                assert_eq!(
                    (m.kind, m.mode),
                    (EntryKind::Dir, Some(0o710)),
                    "{what} {d}"
                );
                assert_eq!(
                    (m.posix.uid, m.posix.gid),
                    (Some(uid), Some(gid)),
                    "{what} {d}"
                );
                assert_eq!(m.mtime, Some(t), "{what} {d}");
            }
        }
        let listed = sorted(s.list("da", false).await.unwrap());
        assert_eq!(listed, [dir("da/implied"), dir("da/marked")]);
        // Its files are untouched, and it goes once empty.
        assert_eq!(get(&f, "da/implied/f").await, b"x");
        s.delete("da/implied/f").await.unwrap();
        s.remove_dir("da/implied").await.unwrap();
        assert_eq!(
            s.stat("da/implied").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }

    pub async fn capabilities_uri_and_metrics(f: Fixture) {
        let s = &f.store;
        let caps = s.capabilities();
        match f.backend {
            Backend::Mem => {
                assert!(caps.conditional_read && caps.native_recursive_list && !caps.rename_dirs)
            }
            Backend::Fs => {
                assert!(!caps.conditional_read && !caps.native_recursive_list);
                assert!(caps.rename_dirs, "rename(2) moves directories");
                assert!(s.uri().starts_with("file:///"), "{}", s.uri());
            }
            Backend::S3 => {
                assert!(caps.conditional_read && caps.native_recursive_list);
                assert!(!caps.rename_dirs, "S3 has no rename");
                assert!(s.uri().starts_with("s3://bkt/data/set"), "{}", s.uri());
                assert!(!s.uri().contains("secret"), "{}", s.uri());
            }
            Backend::Gcs | Backend::Azure => {
                assert!(caps.conditional_read && caps.native_recursive_list);
                assert!(!caps.rename_dirs && caps.write_replaces_attrs);
                let scheme = if f.backend == Backend::Gcs {
                    "gs"
                } else {
                    "azblob"
                };
                assert!(
                    s.uri().starts_with(&format!("{scheme}://bkt/data/set")),
                    "{}",
                    s.uri()
                );
                // The key is named by its variable, never given.
                assert!(!s.uri().contains("Eby8vdM02x"), "{}", s.uri());
            }
            Backend::Webhdfs => {
                assert!(!caps.conditional_read && !caps.native_recursive_list);
                assert!(caps.rename_dirs, "WebHDFS renames directories");
                let uri = s.uri();
                assert!(
                    uri.starts_with("webhdfs://127.0.0.1:") || uri.starts_with("hdfs://127.0.0.1:"),
                    "{uri}"
                );
            }
        }
        put(&f, "m/x", &[7u8; 4096]).await;
        let (req0, bytes0) = (UFS_REQUESTS.get(), UFS_READ_BYTES.get());
        let m = s.stat("m/x").await.unwrap();
        s.read("m/x", 0..4096, &m).await.unwrap();
        if f.backend != Backend::Mem {
            // Process-wide counters (other tests run in parallel): at least our share.
            assert!(UFS_REQUESTS.get() >= req0 + 2);
            assert!(UFS_READ_BYTES.get() >= bytes0 + 4096);
        }
    }
}

macro_rules! suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn stat_file_dir_missing() {
                cases::stat_file_dir_missing(super::$backend().await).await
            }
            #[tokio::test]
            async fn list_direct_vs_recursive() {
                cases::list_direct_vs_recursive(super::$backend().await).await
            }
            #[tokio::test]
            async fn list_missing_dir_and_file() {
                cases::list_missing_dir_and_file(super::$backend().await).await
            }
            #[tokio::test]
            async fn read_ranges() {
                cases::read_ranges(super::$backend().await).await
            }
            #[tokio::test]
            async fn local_file() {
                cases::local_file(super::$backend().await).await
            }
            #[tokio::test]
            async fn content_changed_after_overwrite() {
                cases::content_changed_after_overwrite(super::$backend().await).await
            }
            #[tokio::test]
            async fn written_version_is_the_stored_one() {
                cases::written_version_is_the_stored_one(super::$backend().await).await
            }
            #[tokio::test]
            async fn write_delete() {
                cases::write_delete(super::$backend().await).await
            }
            // Several threads, so that writes really run at once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn racing_writes_replace_whole() {
                cases::racing_writes_replace_whole(super::$backend().await).await
            }
            #[tokio::test]
            async fn create_and_remove_dirs() {
                cases::create_and_remove_dirs(super::$backend().await).await
            }
            #[tokio::test]
            async fn set_attrs() {
                cases::set_attrs(super::$backend().await).await
            }
            #[tokio::test]
            async fn rename_and_copy() {
                cases::rename_and_copy(super::$backend().await).await
            }
            #[tokio::test]
            async fn fault_injection() {
                cases::fault_injection(super::$backend().await).await
            }
            #[tokio::test]
            async fn sparse_write_from() {
                cases::sparse_write_from(super::$backend().await).await
            }
            #[tokio::test]
            async fn symlinks() {
                cases::symlinks(super::$backend().await).await
            }
            #[tokio::test]
            async fn special_files() {
                cases::special_files(super::$backend().await).await
            }
            #[tokio::test]
            async fn hard_links() {
                cases::hard_links(super::$backend().await).await
            }
            #[tokio::test]
            async fn directory_attrs() {
                cases::directory_attrs(super::$backend().await).await
            }
            #[tokio::test]
            async fn headers() {
                cases::headers(super::$backend().await).await
            }
            #[tokio::test]
            async fn capabilities_uri_and_metrics() {
                cases::capabilities_uri_and_metrics(super::$backend().await).await
            }
        }
    };
}

suite!(mem);
suite!(fs);
suite!(s3);
suite!(gcs);
suite!(azure);
suite!(webhdfs);
suite!(hdfs);

/// What keeps an S3 attribute change from undoing a write that landed between its read and
/// its rewrite (docs/SEMANTICS.md): the server refuses a PUT whose `If-Match` names a replaced
/// version, and a symlink PUT with `If-None-Match: *` over an existing object. Checked on the
/// real server, since a server that ignored the headers would void both promises.
#[tokio::test]
async fn s3_server_refuses_stale_conditional_writes() {
    use silt_ufs::UnderStore;
    let server = S3Server::start();
    server.create_bucket("bkt");
    let store = silt_ufs::S3Store::new("bkt", "cond", &server.s3_options()).unwrap();
    let op = store.operator();
    op.write("f", b"version one".to_vec()).await.unwrap();
    let one = op.stat("f").await.unwrap().etag().unwrap().to_string();
    // Another writer replaces it.
    op.write("f", b"version two".to_vec()).await.unwrap();
    // The rewrite an attribute change would make from what it read: refused.
    let stale = op
        .write_with("f", b"version one".to_vec())
        .if_match(&one)
        .await
        .expect_err("a PUT with a stale If-Match was accepted");
    assert_eq!(
        stale.kind(),
        opendal::ErrorKind::ConditionNotMatch,
        "{stale}"
    );
    assert_eq!(op.read("f").await.unwrap().to_vec(), b"version two");
    let exists = op
        .write_with("f", b"target".to_vec())
        .if_not_exists(true)
        .await
        .expect_err("a PUT with If-None-Match: * replaced an object");
    assert_eq!(
        exists.kind(),
        opendal::ErrorKind::ConditionNotMatch,
        "{exists}"
    );
    // Through the store: the change lands on the current version, its bytes kept.
    let set = SetAttrs {
        mode: Some(0o600),
        ..Default::default()
    };
    let m = store.set_attrs("f", &set).await.unwrap();
    assert_eq!(m.mode, Some(0o600));
    let dyn_store: DynStore = Arc::new(store);
    let back = dyn_store.read("f", 0..64, &m).await.unwrap();
    assert_eq!(&back[..], b"version two");
}

/// A local file changed while reads of it run — rewritten in place, or replaced by a rename —
/// never yields bytes of two versions: a read returns the version asked for whole, or fails as
/// changed or missing (docs/SEMANTICS.md, "Reads and versions"). The change lands at a
/// different point of the read each round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_reads_racing_changes_never_mix_versions() {
    use std::os::unix::fs::FileExt;
    const SIZE: usize = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let store = open_store(&uri, &S3Options::default()).await.unwrap();
    let path = dir.path().join("f");
    // Version A: 'a' bytes with an old mtime, so any change of the file moves its mtime.
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let (mut whole, mut refused) = (0, 0);
    for round in 0..200u64 {
        let tmp = dir.path().join("tmp");
        std::fs::write(&tmp, vec![b'a'; SIZE]).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(old)
            .unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let meta = store.stat("f").await.unwrap();
        let (p, d) = (path.clone(), dir.path().join("tmp2"));
        let racer = std::thread::spawn(move || {
            for _ in 0..(round * 7919) % 300_000 {
                std::hint::spin_loop();
            }
            if round % 2 == 0 {
                let f = std::fs::File::options().write(true).open(&p).unwrap();
                f.write_all_at(&[b'b'; 4096], (round * 123_457) % (SIZE as u64 - 4096))
                    .unwrap();
            } else {
                std::fs::write(&d, vec![b'c'; SIZE]).unwrap();
                std::fs::rename(&d, &p).unwrap();
            }
        });
        let got = if round % 4 < 2 {
            store
                .read_pieces("f", 0..SIZE as u64, &meta, 1 << 20)
                .await
                .map(|p| p.concat())
        } else {
            store
                .read("f", 0..SIZE as u64, &meta)
                .await
                .map(|b| b.to_vec())
        };
        match got {
            Ok(bytes) => {
                assert_eq!(bytes.len(), SIZE, "round {round}");
                assert!(
                    bytes.iter().all(|&b| b == b'a'),
                    "round {round}: a read returned bytes of two versions"
                );
                whole += 1;
            }
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::ContentChanged | ErrorKind::NotFound),
                    "round {round}: {e}"
                );
                refused += 1;
            }
        }
        racer.join().unwrap();
    }
    eprintln!("{whole} reads whole, {refused} refused as changed");
}

/// A hidden write file a killed daemon left in a local directory (never listed) does not keep
/// that directory from being removed for ever: one unchanged for ten minutes is taken for
/// abandoned and removed by `remove_dir`; a fresh one (a write in progress) is left alone, and
/// the directory is then not empty (docs/SEMANTICS.md).
#[tokio::test]
async fn local_rmdir_clears_abandoned_writes_only() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let store = open_store(&uri, &S3Options::default()).await.unwrap();
    store.create_dir("d").await.unwrap();
    let plant = |name: &str, age: Duration| {
        let p = dir.path().join("d").join(name);
        std::fs::write(&p, b"part of a write").unwrap();
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(std::time::SystemTime::now() - age).unwrap();
        p
    };
    let old = plant(".silt-write-00000000000000aa", Duration::from_secs(3600));
    let fresh = plant(".silt-write-00000000000000bb", Duration::from_secs(5));
    assert!(store.list("d", false).await.unwrap().is_empty());
    let e = store.remove_dir("d").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotEmpty, "{e}");
    assert!(!old.exists(), "the abandoned write was kept");
    assert!(fresh.exists(), "a write in progress was removed");
    std::fs::File::options()
        .write(true)
        .open(&fresh)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(601))
        .unwrap();
    store.remove_dir("d").await.unwrap();
    assert_eq!(
        store.stat("d").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

/// A link in a local store is an entry, never a way out of its root (docs/SECURITY.md): no
/// operation on a path through a link (`out/…`, `out` a link to a directory outside) reaches
/// outside, and a directory swapped for a link after its file's metadata was read (a cache's
/// stale view) does not send the read, with that metadata, to the file outside. A daemon
/// running as root must not serve or change the host's files through a link in a dataset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_links_never_lead_out_of_the_root() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    let (root, outside) = (t.path().join("root"), t.path().join("outside"));
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    let secret = outside.join("f");
    std::fs::write(&secret, b"outside!").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(root.join("d/f"), b"inside!!").unwrap();
    std::fs::write(root.join("keep"), b"keep").unwrap();
    // Same size and mtime as the store's file: a followed link would pass the version check.
    let mtime = std::fs::metadata(root.join("d/f"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::File::options()
        .write(true)
        .open(&secret)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    symlink(&outside, root.join("out")).unwrap();
    let store = open_store(&format!("file://{}", root.display()), &S3Options::default())
        .await
        .unwrap();
    let seen = store.stat("d/f").await.unwrap();
    let outside_listing = || {
        let mut v: Vec<_> = walkdir(&outside);
        v.sort();
        v
    };
    let before = outside_listing();

    // Reads through the link: nothing there.
    let e = store.stat("out/f").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = store.list("out/sub", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(store.stat("out").await.unwrap().kind, EntryKind::Symlink);
    let e = store.list("out", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotADirectory, "{e}");
    assert!(store.read_link("out/f").await.is_err());
    let mut outside_meta = seen.clone();
    outside_meta.path = "out/f".into();
    assert!(store.read("out/f", 0..8, &outside_meta).await.is_err());
    assert!(store.local_file("out/f", &outside_meta).await.is_none());
    assert!(store.copy("out/f", "copied").await.is_err());
    assert!(store.stat("copied").await.is_err());
    // A link to a file outside is copied as the link, not as the file's bytes.
    symlink(&secret, root.join("flink")).unwrap();
    assert_eq!(
        store.copy("flink", "copied").await.unwrap().kind,
        EntryKind::Symlink
    );
    assert_eq!(std::fs::read_link(root.join("copied")).unwrap(), secret);

    // Changes through the link: refused, and nothing outside changes.
    assert!(store
        .write("out/new", Bytes::from_static(b"x"))
        .await
        .is_err());
    assert!(store
        .write("out/sub/new", Bytes::from_static(b"x"))
        .await
        .is_err());
    assert!(store.create_dir("out/newdir").await.is_err());
    assert!(store.rename("keep", "out/stolen").await.is_err());
    assert_eq!(
        store.rename("out/f", "taken").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(store.symlink("out/l", "/").await.is_err());
    assert!(
        store.delete("out/f").await.is_ok(),
        "a path that is not there is deleted"
    );
    assert!(
        store.remove_dir("out/sub").await.is_ok(),
        "a missing directory is removed"
    );
    let chmod = SetAttrs {
        mode: Some(0o666),
        ..SetAttrs::default()
    };
    assert!(store.set_attrs("out/f", &chmod).await.is_err());
    // The link itself: chmod has no mode of it to change, and never its target's.
    store.set_attrs("out", &chmod).await.unwrap();
    assert_eq!(
        before,
        outside_listing(),
        "something outside the root changed"
    );
    assert_eq!(std::fs::read(&secret).unwrap(), b"outside!");
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(std::fs::read(root.join("keep")).unwrap(), b"keep");

    // `d` swapped for a link to `outside` after `d/f` was seen: the read with the old
    // metadata does not find the file outside, nor a write its directory.
    std::fs::rename(root.join("d"), root.join("d-old")).unwrap();
    symlink(&outside, root.join("d")).unwrap();
    match store.read("d/f", 0..8, &seen).await {
        Ok(b) => panic!("read {:?} through a swapped link", b),
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ContentChanged),
            "{e}"
        ),
    }
    assert!(store.read_pieces("d/f", 0..8, &seen, 4).await.is_err());
    assert!(store.local_file("d/f", &seen).await.is_none());
    assert!(store
        .write("d/f", Bytes::from_static(b"overwrite"))
        .await
        .is_err());
    assert!(store.delete("d/f").await.is_ok());
    assert_eq!(
        before,
        outside_listing(),
        "something outside the root changed"
    );
    assert_eq!(std::fs::read(&secret).unwrap(), b"outside!");
}

/// Every path below `dir` with its bytes (files) or nothing (directories, links).
fn walkdir(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let md = std::fs::symlink_metadata(&p).unwrap();
        if md.is_dir() {
            out.extend(walkdir(&p));
            out.push((p, None));
        } else {
            out.push((p.clone(), md.is_file().then(|| std::fs::read(&p).unwrap())));
        }
    }
    out
}

/// OpenDAL trims white space from both ends of every path, so on S3 `a ` would reach the key
/// `a`: names that begin or end with white space are refused for writes there and invisible
/// otherwise, never another object's (docs/SEMANTICS.md); a local directory and the memory
/// store keep them as they are. Fails on S3 without the guard (the write replaces `a`, the
/// delete removes it).
#[tokio::test]
async fn names_ending_in_white_space_are_theirs_or_refused() {
    for f in [mem().await, fs().await, s3().await] {
        put(&f, "a", b"hello").await;
        put(&f, "d/k", b"kept").await;
        let s3 = f.backend == Backend::S3;
        for name in ["a ", "a\n", " a", "d/k\t"] {
            let written = f.store.write(name, Bytes::from_static(b"other")).await;
            if s3 {
                let e = written.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{name:?}: {e}");
                let e = f.store.stat(name).await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::NotFound, "{name:?}: {e}");
                f.store.delete(name).await.unwrap();
                let e = f.store.copy("a", name).await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{name:?}: {e}");
            } else {
                assert_eq!(written.unwrap().path, name);
                let m = f.store.stat(name).await.unwrap();
                assert_eq!((m.path.as_str(), m.size), (name, 5));
                assert_eq!(get(&f, name).await, b"other");
                f.store.delete(name).await.unwrap();
            }
        }
        // The objects next to them are untouched.
        assert_eq!(get(&f, "a").await, b"hello", "{:?}", f.backend);
        assert_eq!(get(&f, "d/k").await, b"kept", "{:?}", f.backend);
        let files: Vec<_> = sorted(f.store.list("", true).await.unwrap())
            .into_iter()
            .filter(|(_, kind)| *kind == EntryKind::File)
            .collect();
        assert_eq!(files, [file("a"), file("d/k")], "{:?}", f.backend);
    }
}

/// Every write makes a new content fingerprint, even one of the same size right after another:
/// a local file's mtime comes from the kernel's coarse clock (a few ms), so size and mtime
/// alone repeated, and a reader kept the pages it had cached of the earlier bytes (seen as
/// zeros in the write model test).
#[tokio::test]
async fn quick_same_size_writes_get_new_fingerprints() {
    for f in [mem().await, fs().await, s3().await] {
        let mut last = f
            .store
            .write("q", Bytes::from_static(b"0000"))
            .await
            .unwrap();
        for i in 1..40u32 {
            let body = Bytes::from(format!("{i:04}"));
            let m = f.store.write("q", body).await.unwrap();
            assert_ne!(
                m.content_fingerprint(),
                last.content_fingerprint(),
                "{:?}: write {i} kept the fingerprint of the one before",
                f.backend
            );
            assert_eq!(
                f.store.stat("q").await.unwrap().content_fingerprint(),
                m.content_fingerprint()
            );
            last = m;
        }
    }
}

/// A local directory whose file system keeps no extended attributes (ramfs) keeps a file's
/// S3 headers in a hidden file beside it (`.silt-s3.NAME`), never listed: it follows the
/// file's rename, goes with its delete and a rewrite without headers, a copy gets its own,
/// and a directory whose files went can be removed.
#[tokio::test]
async fn local_headers_without_extended_attributes_are_kept_beside_the_file() {
    struct Ramfs(tempfile::TempDir);
    impl Drop for Ramfs {
        fn drop(&mut self) {
            let c = std::ffi::CString::new(self.0.path().as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path; unmounting what this test mounted.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let dir = Ramfs(tempfile::tempdir().unwrap());
    let target = std::ffi::CString::new(dir.0.path().as_os_str().as_encoded_bytes()).unwrap();
    let fstype = std::ffi::CString::new("ramfs").unwrap();
    // SAFETY: valid NUL-terminated strings; no data argument.
    let r = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "mount ramfs: {}", std::io::Error::last_os_error());
    let root = dir.0.path();
    let s = open_store(&format!("file://{}", root.display()), &S3Options::default())
        .await
        .unwrap();
    let h = silt_ufs::Headers {
        content_type: Some("image/png".into()),
        user: [("camera".to_string(), "x100".to_string())].into(),
        ..Default::default()
    };
    let data = Bytes::from_static(b"png bytes");
    s.write_from_attrs("d/a.png", &data, 9, &SetAttrs::default(), Some(&h))
        .await
        .unwrap();
    let m = s.stat("d/a.png").await.unwrap();
    assert_eq!(s.headers("d/a.png", &m).await.unwrap(), h);
    assert!(root.join("d/.silt-s3.a.png").exists(), "no sidecar");
    let names: Vec<String> = s
        .list("d", false)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(names, ["d/a.png"]);
    s.copy("d/a.png", "d/b.png").await.unwrap();
    let b = s.stat("d/b.png").await.unwrap();
    assert_eq!(s.headers("d/b.png", &b).await.unwrap(), h, "copy");
    s.rename("d/a.png", "d/c.png").await.unwrap();
    assert!(!root.join("d/.silt-s3.a.png").exists());
    let c = s.stat("d/c.png").await.unwrap();
    assert_eq!(s.headers("d/c.png", &c).await.unwrap(), h, "rename");
    // A rewrite without headers has none, and no sidecar.
    s.write("d/b.png", data.clone()).await.unwrap();
    let b = s.stat("d/b.png").await.unwrap();
    assert!(s.headers("d/b.png", &b).await.unwrap().is_empty());
    assert!(!root.join("d/.silt-s3.b.png").exists());
    s.delete("d/c.png").await.unwrap();
    s.delete("d/b.png").await.unwrap();
    assert!(!root.join("d/.silt-s3.c.png").exists());
    s.remove_dir("d").await.unwrap();
    // One left behind by a crash (its file gone) does not keep a directory from going.
    std::fs::create_dir(root.join("e")).unwrap();
    std::fs::write(root.join("e/.silt-s3.gone"), b"{}").unwrap();
    s.remove_dir("e").await.unwrap();
}
