//! Regression tests of the write-session model (issue 14), each a sequence that once gave a
//! non-POSIX answer or lost or resurrected data, on the client library over an in-memory store
//! (wrapped in the fault-injecting store where a failure or a slow store is part of it).

use std::sync::Arc;
use std::time::Duration;

use silt_client::{Client, ClientOptions, OpenOptions};
use silt_common::write::WriteType;
use silt_common::ErrorKind;
use silt_ufs::{DynStore, Fault, FaultOp, FaultStore, MemStore, UnderStore};

mod common;

const PS: u64 = 4096;

fn client(store: DynStore, spool: &std::path::Path) -> Client {
    let opts = ClientOptions {
        prefetch_max: 0,
        ..ClientOptions::from_config(&silt_common::config::Config::default())
    };
    Client::new(
        common::at_d(store),
        common::worker(PS, 4 << 20),
        opts,
        tokio::runtime::Handle::current(),
    )
    .with_writes(WriteType::Through, spool.to_path_buf())
    .expect("writable client")
}

async fn stored(store: &dyn UnderStore, rel: &str) -> Option<Vec<u8>> {
    let meta = match store.stat(rel).await {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => panic!("stat {rel}: {e}"),
    };
    Some(
        store
            .read(rel, 0..meta.size, &meta)
            .await
            .expect("read")
            .to_vec(),
    )
}

fn wr() -> OpenOptions {
    OpenOptions {
        create: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_keep_both_writes_and_an_ftruncate() {
    let spool = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemStore::new("mem://s"));
    let c = client(mem.clone(), spool.path());
    let w = c.create("/d/f", true).await.unwrap();
    c.write_at(&w, 0, b"..........").unwrap();
    c.close(&w).await.unwrap();

    // pwrite(fd1, "11", 0); pwrite(fd2, "22", 8); close(fd1); close(fd2): both land.
    let fd1 = c.open_write("/d/f", wr()).await.unwrap();
    let fd2 = c.open_write("/d/f", wr()).await.unwrap();
    let before = std::time::SystemTime::now();
    c.write(&fd1, 0, b"11").await.unwrap();
    c.write(&fd2, 8, b"22").await.unwrap();
    let (live, is_live) = c.stat_live("/d/f").await.unwrap();
    assert!(is_live);
    assert!(
        live.mtime.is_some_and(|t| t >= before),
        "a file being written shows the time of its last write"
    );
    c.close(&fd1).await.unwrap();
    c.close(&fd2).await.unwrap();
    assert_eq!(stored(&*mem, "f").await.unwrap(), b"11......22");

    // An ftruncate through one handle is not undone by the other's close; a reader handle
    // sees the other's unclosed write.
    let a = c.open_write("/d/f", wr()).await.unwrap();
    let b = c.open_write("/d/f", wr()).await.unwrap();
    c.write(&a, 2, b"AB").await.unwrap();
    assert_eq!(&c.read_written(&b, 0, 10).await.unwrap()[..], b"11AB....22");
    c.truncate(&b, 3).await.unwrap();
    c.close(&b).await.unwrap();
    c.close(&a).await.unwrap();
    assert_eq!(stored(&*mem, "f").await.unwrap(), b"11A");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_writers_interleave_whole_writes() {
    let spool = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemStore::new("mem://s"));
    let c = client(mem.clone(), spool.path());
    let o = OpenOptions {
        create: true,
        append: true,
        ..Default::default()
    };
    let a = c.open_write("/d/log", o).await.unwrap();
    let b = c.open_write("/d/log", o).await.unwrap();
    for (h, data) in [(&a, b"1111"), (&b, b"2222"), (&a, b"3333")] {
        // The offset asked for is ignored: O_APPEND writes at the end.
        c.write(h, 0, data).await.unwrap();
    }
    c.close(&a).await.unwrap();
    c.close(&b).await.unwrap();
    assert_eq!(stored(&*mem, "log").await.unwrap(), b"111122223333");
}

/// A close whose upload failed, then an unlink: no later commit (the retry at the last close,
/// an fsync of another handle) may bring the file back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_unlinked_after_a_failed_upload_stays_deleted() {
    let spool = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemStore::new("mem://s"));
    let faults = Arc::new(FaultStore::new(mem.clone()));
    let c = client(faults.clone(), spool.path());
    let w = c.open_write("/d/gone", wr()).await.unwrap();
    let other = c.open_write("/d/gone", wr()).await.unwrap();
    c.write(&w, 0, b"data").await.unwrap();
    faults.inject(Fault::fail_next(
        FaultOp::Write,
        100,
        ErrorKind::Unavailable,
    ));
    let e = c.commit(&w).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::Unavailable,
        "the close reports the failure"
    );
    faults.clear();
    c.remove_file("/d/gone").await.unwrap();
    assert!(w.is_detached());
    // Everything that used to retry the upload.
    c.commit(&other).await.unwrap();
    c.close(&w).await.unwrap();
    c.close(&other).await.unwrap();
    assert_eq!(
        stored(&*mem, "gone").await,
        None,
        "the store never got it back"
    );
    let e = c.stat_live("/d/gone").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

/// An unlink while an upload of the file is in flight waits for it, then deletes: the upload
/// cannot land after the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlink_during_an_upload_is_not_undone_by_it() {
    let spool = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemStore::new("mem://s"));
    let faults = Arc::new(FaultStore::new(mem.clone()));
    let c = Arc::new(client(faults.clone(), spool.path()));
    let w = c.open_write("/d/race", wr()).await.unwrap();
    c.write(&w, 0, b"old bytes").await.unwrap();
    faults.inject(Fault::latency(FaultOp::Write, Duration::from_millis(300)));
    let writes_before = faults.calls(FaultOp::Write);
    let committer = {
        let c = c.clone();
        tokio::spawn(async move {
            let r = c.commit(&w).await.map(drop);
            (r, w)
        })
    };
    // The upload has reached the store (and sleeps in it) before the unlink starts.
    while faults.calls(FaultOp::Write) == writes_before {
        tokio::task::yield_now().await;
    }
    c.remove_file("/d/race").await.unwrap();
    let (r, w) = committer.await.unwrap();
    r.unwrap();
    faults.clear();
    c.close(&w).await.unwrap();
    assert_eq!(stored(&*mem, "race").await, None);
}

/// A write arriving while an upload reads the buffer goes to a copy: the upload sends one
/// consistent state and the new bytes stay unsaved for the next commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_during_an_upload_is_kept_for_the_next_commit() {
    let spool = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemStore::new("mem://s"));
    let faults = Arc::new(FaultStore::new(mem.clone()));
    let c = Arc::new(client(faults.clone(), spool.path()));
    let w = Arc::new(c.open_write("/d/f", wr()).await.unwrap());
    c.write(&w, 0, b"aaaa").await.unwrap();
    faults.inject(Fault::latency(FaultOp::Write, Duration::from_millis(300)));
    let writes_before = faults.calls(FaultOp::Write);
    let committer = {
        let (c, w) = (c.clone(), w.clone());
        tokio::spawn(async move { c.commit(&w).await.map(drop) })
    };
    while faults.calls(FaultOp::Write) == writes_before {
        tokio::task::yield_now().await;
    }
    c.write(&w, 0, b"bb").await.unwrap();
    committer.await.unwrap().unwrap();
    faults.clear();
    assert_eq!(stored(&*mem, "f").await.unwrap(), b"aaaa");
    assert!(
        w.is_dirty(),
        "the write made during the upload is not saved yet"
    );
    c.commit(&w).await.unwrap();
    assert_eq!(stored(&*mem, "f").await.unwrap(), b"bbaa");
}

/// `rename_noreplace` (FUSE's `RENAME_NOREPLACE`) never replaces: not a stored file, not a
/// file being created (not committed yet), and of eight renames racing onto one free name
/// over a slow store exactly one lands, whatever the timing (the check and the rename are
/// one step under the name's lock; the mount did a stat, then a rename).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rename_noreplace_never_replaces_even_racing() {
    let spool = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemStore::new("mem://s"));
    let faults = Arc::new(FaultStore::new(mem.clone()));
    let c = client(faults.clone(), spool.path());
    for (name, body) in [("a", b"aaa"), ("b", b"bbb")] {
        let w = c.create(&format!("/d/{name}"), true).await.unwrap();
        c.write_at(&w, 0, body).unwrap();
        c.close(&w).await.unwrap();
    }
    let e = c.rename_noreplace("/d/a", "/d/b").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert_eq!(stored(&*mem, "a").await.unwrap(), b"aaa");
    assert_eq!(stored(&*mem, "b").await.unwrap(), b"bbb");
    let creating = c.create("/d/c", true).await.unwrap();
    let e = c.rename_noreplace("/d/a", "/d/c").await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::AlreadyExists,
        "a file being created: {e}"
    );
    c.close(&creating).await.unwrap();
    let e = c.rename_noreplace("/d/a", "/d/a").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "onto itself: {e}");
    c.rename_noreplace("/d/a", "/d/free").await.unwrap();
    assert_eq!(stored(&*mem, "free").await.unwrap(), b"aaa");

    for i in 0..8u8 {
        let w = c.create(&format!("/d/s{i}"), true).await.unwrap();
        c.write_at(&w, 0, &[i; 3]).unwrap();
        c.close(&w).await.unwrap();
    }
    faults.inject(Fault::Latency {
        op: None,
        delay: Duration::from_millis(20),
    });
    // All at once on this task: they interleave at every store call.
    let sources: Vec<String> = (0..8u8).map(|i| format!("/d/s{i}")).collect();
    let renames = sources.iter().map(|s| c.rename_noreplace(s, "/d/t"));
    let results = futures::future::join_all(renames).await;
    let mut won = Vec::new();
    for (i, r) in (0..8u8).zip(results) {
        match r {
            Ok(_) => won.push(i),
            Err(e) => assert_eq!(e.kind(), ErrorKind::AlreadyExists, "s{i}: {e}"),
        }
    }
    assert_eq!(won.len(), 1, "renames that landed: {won:?}");
    faults.clear();
    assert_eq!(stored(&*mem, "t").await.unwrap(), [won[0]; 3]);
    for i in (0..8u8).filter(|i| *i != won[0]) {
        assert_eq!(
            stored(&*mem, &format!("s{i}")).await.unwrap(),
            [i; 3],
            "s{i} lost"
        );
    }
}
