//! Sparse files through the client library: a truncate or a write past the end makes a hole
//! that costs neither memory, spill space, cache pages nor (on a local store) disk blocks,
//! and a size past `max_file_size` is EFBIG at once.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use silt_client::{Client, ClientOptions, WriteSetup};
use silt_common::config::Config;
use silt_common::write::WriteType;
use silt_common::ErrorKind;
use silt_reader::PageReader;
use silt_ufs::FsStore;

mod common;

const PS: u64 = 4096;
const GIB: u64 = 1 << 30;

fn client(root: &std::path::Path, setup: WriteSetup) -> (Client, Arc<PageReader>) {
    let store = Arc::new(FsStore::new(root, std::time::Duration::from_secs(30)).unwrap());
    let worker = common::worker(PS, 64 << 20);
    let opts = ClientOptions {
        prefetch_max: 0,
        ..ClientOptions::from_config(&Config::default())
    };
    let c = Client::new(
        common::at_d(store),
        worker.clone(),
        opts,
        tokio::runtime::Handle::current(),
    )
    .with_write_setup(setup)
    .unwrap();
    (c, worker)
}

/// `truncate -s 2G` plus a few bytes, committed to a file:// store: a sparse file with the
/// data where it was written and zeros elsewhere; nothing but the written pages is cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncating_to_2_gib_and_committing_is_sparse() {
    let root = tempfile::tempdir().unwrap();
    let spool = tempfile::tempdir().unwrap();
    let setup = WriteSetup::simple(WriteType::Through, PS, 64 << 20, spool.path().into()).unwrap();
    let arena = setup.arena.clone();
    let (c, worker) = client(root.path(), setup);

    let w = c.create("/d/big", true).await.unwrap();
    c.set_len(&w, 2 * GIB).unwrap();
    c.write_at(&w, GIB + 10, b"middle").unwrap();
    c.write_at(&w, 2 * GIB - 3, b"end").unwrap();
    // Two chunks written: that is all the arena holds, in memory or spilled.
    let s = arena.stats();
    assert_eq!(s.memory_used + s.spilled, 2 * PS);
    let e = c.commit(&w).await.unwrap();
    assert_eq!(e.size, 2 * GIB);
    c.close(&w).await.unwrap();

    let md = std::fs::metadata(root.path().join("big")).unwrap();
    assert_eq!(md.len(), 2 * GIB);
    assert!(
        md.blocks() * 512 < 4 << 20,
        "{} bytes allocated on disk for 9 bytes of data",
        md.blocks() * 512
    );
    // Only the written pages went to the cache (a hole page would be a page of zeros).
    let cached: u64 = worker
        .page_store()
        .stats()
        .tiers
        .iter()
        .map(|t| t.pages)
        .sum();
    assert!(cached <= 2, "{cached} pages cached");

    let f = c.open("/d/big").await.unwrap();
    assert_eq!(f.size(), 2 * GIB);
    assert_eq!(
        &c.read(&f, GIB + 8, 10).await.unwrap()[..],
        b"\0\0middle\0\0"
    );
    assert_eq!(&c.read(&f, 2 * GIB - 5, 100).await.unwrap()[..], b"\0\0end");
    let hole = c.read(&f, GIB / 2, 1 << 20).await.unwrap();
    assert_eq!(hole.len(), 1 << 20);
    assert!(hole.iter().all(|&x| x == 0));
}

/// Past `max_file_size` (default 5 TiB, the S3 object limit; here set in the configuration),
/// a truncate or write fails with EFBIG at once and the file is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_past_the_maximum_is_efbig() {
    assert_eq!(Config::default().max_file_size, 5 << 40);
    let root = tempfile::tempdir().unwrap();
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = Config::default();
    cfg.write_type = WriteType::Through;
    cfg.max_file_size = 1 << 20;
    let setup = WriteSetup::from_config(&cfg, Vec::new(), spool.path().join("wal")).unwrap();
    let (c, _worker) = client(root.path(), setup);

    let w = c.create("/d/f", true).await.unwrap();
    c.write_at(&w, 0, b"kept").unwrap();
    c.set_len(&w, 1 << 20).unwrap();
    for e in [
        c.set_len(&w, (1 << 20) + 1).unwrap_err(),
        c.set_len(&w, 999_999_999_999_999).unwrap_err(),
        c.write_at(&w, (1 << 20) - 1, b"ab").unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::FileTooLarge, "{e}");
        assert_eq!(e.errno(), libc::EFBIG);
    }
    c.commit(&w).await.unwrap();
    c.close(&w).await.unwrap();
    let f = c.open("/d/f").await.unwrap();
    assert_eq!(f.size(), 1 << 20);
    assert_eq!(&c.read(&f, 0, 6).await.unwrap()[..], b"kept\0\0");

    // The default limit: 5 TiB is fine (a hole), one byte more is not.
    let spool2 = tempfile::tempdir().unwrap();
    let setup = WriteSetup::simple(WriteType::Through, PS, 1 << 20, spool2.path().into()).unwrap();
    let (c, _worker) = client(root.path(), setup);
    let w = c.create("/d/g", true).await.unwrap();
    c.set_len(&w, 5 << 40).unwrap();
    let e = c.set_len(&w, (5 << 40) + 1).unwrap_err();
    assert_eq!(e.errno(), libc::EFBIG);
    c.set_len(&w, 3).unwrap();
    c.commit(&w).await.unwrap();
    c.close(&w).await.unwrap();
}

/// Reopening a sparse file to change it (no `O_TRUNC`: its bytes are loaded) keeps its holes
/// as holes: the buffer holds only the pages with data, and the committed file stays sparse.
/// A truncate past the maximum is refused before anything is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_a_sparse_file_keeps_its_holes() {
    let root = tempfile::tempdir().unwrap();
    let spool = tempfile::tempdir().unwrap();
    let setup = WriteSetup::simple(WriteType::Through, PS, 64 << 20, spool.path().into()).unwrap();
    let arena = setup.arena.clone();
    let (c, _worker) = client(root.path(), setup);
    let len = 64u64 << 20;
    let w = c.create("/d/s", true).await.unwrap();
    c.write_at(&w, 5, b"start").unwrap();
    c.set_len(&w, len).unwrap();
    c.commit(&w).await.unwrap();
    c.close(&w).await.unwrap();

    let before = arena.stats();
    let opts = silt_client::OpenOptions {
        load_now: true,
        ..Default::default()
    };
    let w = c.open_write("/d/s", opts).await.unwrap();
    let s = arena.stats();
    assert_eq!(
        s.memory_used + s.spilled,
        before.memory_used + before.spilled + PS,
        "only the page with data is held ({before:?} before)"
    );
    c.write(&w, len, b"more").await.unwrap();
    let e = c.truncate(&w, (5 << 40) + 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FileTooLarge);
    c.commit(&w).await.unwrap();
    c.close(&w).await.unwrap();

    let md = std::fs::metadata(root.path().join("s")).unwrap();
    assert_eq!(md.len(), len + 4);
    assert!(md.blocks() * 512 < 4 << 20, "{} bytes", md.blocks() * 512);
    let f = c.open("/d/s").await.unwrap();
    assert_eq!(
        &c.read(&f, 0, 12).await.unwrap()[..],
        b"\0\0\0\0\0start\0\0"
    );
    assert_eq!(&c.read(&f, len - 2, 10).await.unwrap()[..], b"\0\0more");
}
