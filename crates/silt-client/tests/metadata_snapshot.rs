//! The metadata cache carried across a clean restart: what is restored answers without the
//! store, keeps its age, and only under the same mount; a bad snapshot is ignored, not trusted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use silt_client::{Client, ClientOptions};
use silt_common::sync::{SyncPolicy, SyncRules};
use silt_common::write::WriteType;
use silt_common::ErrorKind;
use silt_ufs::MemStore;

mod common;

fn client(store: Arc<MemStore>, ttl: Duration) -> Client {
    let opts = ClientOptions {
        prefetch_max: 8192,
        ..common::options(SyncRules::new(SyncPolicy::Interval(ttl), Vec::new()))
    };
    Client::new(
        common::at_d(store),
        common::worker(4096, 1 << 20),
        opts,
        tokio::runtime::Handle::current(),
    )
}

fn store(uri: &str) -> Arc<MemStore> {
    let mem = Arc::new(MemStore::new(uri));
    for i in 0..20 {
        mem.put(&format!("dir/f{i:02}"), vec![i as u8; 100 + i])
            .unwrap();
    }
    mem.put("top", vec![1u8; 7]).unwrap();
    mem
}

const HOUR: Duration = Duration::from_secs(3600);

/// A first client over `mem` that lists /d/dir and stats /d/top, then saves its cache to a
/// snapshot in a fresh directory. Returns the directory (kept alive), the snapshot path and the
/// stat of /d/top.
async fn saved_snapshot(mem: Arc<MemStore>) -> (tempfile::TempDir, PathBuf, silt_client::Entry) {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let first = client(mem, HOUR);
    first.list("/d/dir").await.unwrap();
    first.stat("/d").await.unwrap();
    let top = first.stat("/d/top").await.unwrap();
    assert!(first.save_metadata(&snap).unwrap() >= 2);
    (dir, snap, top)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cache_answers_without_the_store_once() {
    let mem = store("mem://a");
    let (_dir, snap, top) = saved_snapshot(mem.clone()).await;

    let second = client(mem.clone(), HOUR);
    assert!(second.restore_metadata(&snap).unwrap() >= 2);
    assert!(!snap.exists(), "a snapshot is used by one start only");
    let n = mem.requests();
    let list = second.list("/d/dir").await.unwrap();
    assert_eq!(list.len(), 20);
    assert_eq!(second.stat("/d/dir/f07").await.unwrap().size, 107);
    assert_eq!(
        second.stat("/d/dir/missing").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let top2 = second.stat("/d/top").await.unwrap();
    assert!(second.stat("/d").await.unwrap().is_dir());
    assert_eq!(mem.requests(), n, "no store request for restored metadata");
    // Same object identity, so cached pages (keyed by it) are found again.
    assert_eq!(
        top.object.as_ref().unwrap().id,
        top2.object.as_ref().unwrap().id
    );
    assert_eq!(top.mtime, top2.mtime);
    // The bytes still read right through restored metadata.
    let f = second.open("/d/dir/f03").await.unwrap();
    assert_eq!(second.read(&f, 0, 1000).await.unwrap(), vec![3u8; 103]);

    // Nothing is left for a third start.
    let third = client(mem.clone(), HOUR);
    assert_eq!(third.restore_metadata(&snap).unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_keep_their_age() {
    let mem = store("mem://a");
    let (_dir, snap, _) = saved_snapshot(mem.clone()).await;
    // A TTL shorter than the entries' age (any age is >= 0): nothing may be restored.
    let second = client(mem.clone(), Duration::ZERO);
    assert_eq!(second.restore_metadata(&snap).unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_mount_table_restores_nothing_of_the_old_store() {
    let (_dir, snap, _) = saved_snapshot(store("mem://a")).await;
    // /d now points at another store holding different data.
    let other = Arc::new(MemStore::new("mem://b"));
    other.put("dir/only-here", vec![0u8; 3]).unwrap();
    let second = client(other.clone(), HOUR);
    assert_eq!(second.restore_metadata(&snap).unwrap(), 0);
    let list = second.list("/d/dir").await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name(), "only-here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    std::fs::write(&snap, b"{not json\n").unwrap();
    let mem = store("mem://a");
    let c = client(mem.clone(), HOUR);
    assert!(c.restore_metadata(&snap).is_err());
    assert!(!snap.exists());
    let n = mem.requests();
    assert_eq!(c.list("/d/dir").await.unwrap().len(), 20);
    assert_eq!(mem.requests(), n + 1, "the cache started empty");

    // A good snapshot with one damaged record appended: every good record is kept, the bad
    // one skipped.
    let (_dir2, snap2, _) = saved_snapshot(mem.clone()).await;
    let mut text = std::fs::read_to_string(&snap2).unwrap();
    let good_records = text.lines().count() - 1; // minus the header
    text.push_str("{\"List\": 42}\n");
    std::fs::write(&snap2, text).unwrap();
    let c = client(mem.clone(), HOUR);
    assert_eq!(c.restore_metadata(&snap2).unwrap(), good_records);
}

/// A snapshot saved while running (for a crash restart) is restored for paths this client
/// cannot change; under a writable mount it restores nothing, so a file deleted after the save
/// does not come back after a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_snapshot_restores_only_what_this_client_cannot_change() {
    let mem = store("mem://a");
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");

    let first = client(mem.clone(), HOUR);
    first.list("/d/dir").await.unwrap();
    first.stat("/d/top").await.unwrap();
    let mut since = 0;
    let saved = first.save_metadata_if_changed(&snap, &mut since).unwrap();
    assert!(saved.is_some_and(|n| n >= 2), "{saved:?}");
    assert_eq!(
        first.save_metadata_if_changed(&snap, &mut since).unwrap(),
        None,
        "nothing changed: no second save"
    );
    // The first instance "crashes" (no clean save); a read-only restart restores it all.
    drop(first);
    let second = client(mem.clone(), HOUR);
    assert!(second.restore_metadata(&snap).unwrap() >= 2);
    let n = mem.requests();
    assert_eq!(second.list("/d/dir").await.unwrap().len(), 20);
    assert_eq!(mem.requests(), n, "no store request after a crash restart");

    let spool = tempfile::tempdir().unwrap();
    let writable = |mem| {
        client(mem, HOUR)
            .with_writes(WriteType::Through, spool.path().to_path_buf())
            .unwrap()
    };
    let w = writable(mem.clone());
    w.list("/d/dir").await.unwrap();
    w.stat("/d/top").await.unwrap();
    let mut since = 0;
    assert!(w
        .save_metadata_if_changed(&snap, &mut since)
        .unwrap()
        .is_some());
    w.remove_file("/d/top").await.unwrap();
    drop(w);
    let third = writable(mem.clone());
    assert_eq!(third.restore_metadata(&snap).unwrap(), 0);
    assert_eq!(
        third.stat("/d/top").await.unwrap_err().kind(),
        ErrorKind::NotFound,
        "a file deleted after the periodic save stays deleted"
    );
}
