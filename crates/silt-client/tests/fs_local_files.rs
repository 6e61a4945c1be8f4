//! The file-system core's local-file rules without a kernel, through a front end that records
//! what it is handed (as FUSE passthrough would register backings):
//!
//! - a version whole on local disk is handed over as a local file, shared by every handle of
//!   the same version, closed once when the last of them is released;
//! - an inode is read through local files or through the core, never both at once;
//! - an open for writing meeting a local-file reader is `EBUSY` (after a bounded wait), and a
//!   file written here is read through the core from then on.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use silt_cache::{Arena, ArenaConfig, PageStore, PageStoreConfig};
use silt_client::fs::{FileSystem, Frontend, FsOptions, OpenedAs};
use silt_client::{Client, ClientOptions, Clock, OpenOptions, WriteSetup};
use silt_common::config::DiskTierSpec;
use silt_common::write::{WriteRules, WriteType};
use silt_common::ErrorKind;
use silt_reader::{PageReader, PageReaderOptions};
use silt_ufs::FsStore;

mod common;

const PS: u64 = 4096;

/// Hands out ids for the files it is given and remembers which are still registered.
#[derive(Default)]
struct Recorder {
    next: AtomicU32,
    registered: Mutex<HashSet<u32>>,
    closed: Mutex<Vec<u32>>,
}

impl Frontend for Recorder {
    fn reads_local_files(&self) -> bool {
        true
    }

    fn register_local_file(&self, _: &std::fs::File) -> std::io::Result<u32> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.registered.lock().insert(id);
        Ok(id)
    }

    fn close_local_file(&self, id: u32) {
        assert!(self.registered.lock().remove(&id), "closed {id} twice");
        self.closed.lock().push(id);
    }
}

#[test]
fn local_files_are_shared_exclusive_and_given_up_for_writers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (store_dir, disk, spill) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let data: Vec<u8> = (0..5 * PS + 17).map(|i| (i % 251) as u8).collect();
    std::fs::write(store_dir.path().join("f.bin"), &data).expect("write");

    let _guard = rt.enter();
    let pages = PageStore::open(PageStoreConfig {
        disk_tiers: vec![DiskTierSpec {
            dir: disk.path().to_path_buf(),
            quota: 64 << 20,
        }],
        // No memory tier: what is read lands on disk, whole.
        ..PageStoreConfig::in_memory(PS, 0)
    })
    .expect("page store");
    let reader = Arc::new(PageReader::new(
        Arc::new(pages),
        &PageReaderOptions {
            fetch_concurrency: 4,
            buffer_memory: 1 << 20,
            request_size: 2 * PS,
        },
        rt.handle().clone(),
    ));
    let store = Arc::new(FsStore::new(store_dir.path(), Duration::from_secs(30)).expect("store"));
    let opts = ClientOptions {
        prefetch_max: 0,
        clock: Clock::system(),
        ..ClientOptions::from_config(&silt_common::config::Config::default())
    };
    let setup = WriteSetup {
        rules: WriteRules::new(WriteType::Through, Vec::new()),
        arena: Arena::open(ArenaConfig {
            chunk_size: PS,
            memory_ceiling: 1 << 20,
            file_memory: 1 << 20,
            spill: vec![DiskTierSpec {
                dir: spill.path().to_path_buf(),
                quota: 1 << 30,
            }],
            jobs: Vec::new(),
        })
        .expect("arena"),
        cache_only_ttl: None,
        wal_dir: None,
        upload_delay: Duration::ZERO,
    };
    let client = Client::new(common::at_d(store), reader, opts, rt.handle().clone())
        .with_write_setup(setup)
        .expect("client");
    let front = Arc::new(Recorder::default());
    let fs = FileSystem::new(Arc::new(client), FsOptions::default(), front.clone());
    drop(_guard);

    let d = fs.lookup(1, OsStr::new("d")).expect("/d").attr.ino;
    let ino = fs.lookup(d, OsStr::new("f.bin")).expect("f.bin").attr.ino;

    // Not cached: read through the core, which caches it whole on disk.
    let cold = fs.open_read(ino).expect("open cold");
    assert!(matches!(cold.how, OpenedAs::Core { .. }), "{:?}", cold.how);
    let got = fs.read(ino, cold.fh, 0, 8 * PS).expect("read cold");
    assert!(got[..] == data[..]);
    fs.release(cold.fh);
    // Whole on disk now: handed over as a local file, shared by the next handle.
    let a = fs.open_read(ino).expect("open a");
    let OpenedAs::LocalFile { id, .. } = a.how else {
        panic!("not a local file: {:?}", a.how);
    };
    let b = fs.open_read(ino).expect("open b");
    assert!(
        matches!(b.how, OpenedAs::LocalFile { id: shared, .. } if shared == id),
        "the second handle of the version got {:?}",
        b.how
    );
    assert_eq!(front.registered.lock().len(), 1, "one file per inode");

    // A writer meets the local-file readers: refused, nothing written.
    let e = fs
        .open_write(ino, None, OpenOptions::default())
        .expect_err("a writer next to local-file readers");
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    fs.release(a.fh);
    assert!(
        front.closed.lock().is_empty(),
        "closed while a handle reads it"
    );
    fs.release(b.fh);
    assert_eq!(*front.closed.lock(), vec![id], "the last release closes it");

    // Now it may be written; from then on it is read through the core.
    let w = fs
        .open_write(ino, None, OpenOptions::default())
        .expect("open for writing");
    fs.write(w, 0, b"NEW").expect("write");
    let r = fs.open_read(ino).expect("open while written");
    assert!(
        matches!(r.how, OpenedAs::Core { .. }),
        "a file open for writing here handed over as {:?}",
        r.how
    );
    assert_eq!(&fs.read(ino, r.fh, 0, 3).expect("read")[..], b"NEW");
    fs.flush(w, || None).expect("commit");
    fs.release(w);
    fs.release(r.fh);
    let again = fs.open_read(ino).expect("open after the write");
    assert!(
        matches!(again.how, OpenedAs::Core { .. }),
        "a file written here was handed over as {:?}",
        again.how
    );
    let got = fs.read(ino, again.fh, 0, 8 * PS).expect("read");
    assert_eq!(&got[..3], b"NEW");
    assert!(got[3..] == data[3..], "the rest of the file changed");
    // A second handle next to one read through the core is read through the core as well.
    let next = fs.open_read(ino).expect("open next");
    assert!(matches!(next.how, OpenedAs::Core { .. }), "{:?}", next.how);
    fs.release(again.fh);
    fs.release(next.fh);
    assert!(front.registered.lock().is_empty());
    drop(fs);
    rt.shutdown_timeout(Duration::from_secs(5));
}
