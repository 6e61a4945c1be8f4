//! The metadata snapshot's decoder fed arbitrary bytes and damaged snapshots: it restores the
//! records that are whole and valid, answers an error for a bad header, and never panics.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use silt_client::{Client, ClientOptions};
use silt_common::sync::{SyncPolicy, SyncRules};
use silt_ufs::MemStore;

mod common;

fn client(store: Arc<MemStore>) -> Client {
    let opts = ClientOptions {
        prefetch_max: 8192,
        ..common::options(SyncRules::new(
            SyncPolicy::Interval(Duration::from_secs(3600)),
            Vec::new(),
        ))
    };
    Client::new(
        common::at_d(store),
        common::worker(4096, 1 << 20),
        opts,
        tokio::runtime::Handle::current(),
    )
}

fn store() -> Arc<MemStore> {
    let mem = Arc::new(MemStore::new("mem://a"));
    for i in 0..5 {
        mem.put(&format!("dir/f{i}"), vec![i as u8; 10 + i])
            .unwrap();
    }
    mem
}

/// A valid snapshot of a client that listed /d/dir and stat'ed /d/dir/f1.
fn valid_snapshot(rt: &tokio::runtime::Runtime, mem: Arc<MemStore>) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    rt.block_on(async {
        let c = client(mem);
        c.list("/d/dir").await.unwrap();
        c.stat("/d").await.unwrap();
        assert!(c.save_metadata(&snap).unwrap() >= 2);
    });
    std::fs::read(&snap).unwrap()
}

/// Restores `bytes` as a snapshot into a fresh client; the client must still answer from
/// the store afterwards (what was restored is checked against it).
fn restore(
    rt: &tokio::runtime::Runtime,
    mem: &Arc<MemStore>,
    bytes: &[u8],
) -> std::io::Result<usize> {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    std::fs::write(&snap, bytes).unwrap();
    rt.block_on(async {
        let c = client(mem.clone());
        let r = c.restore_metadata(&snap);
        assert!(!snap.exists(), "a snapshot is used once, even a bad one");
        r
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// One valid snapshot, made once.
fn snapshot() -> &'static [u8] {
    static SNAP: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SNAP.get_or_init(|| valid_snapshot(runtime(), store()))
}

/// A record whose mtime is beyond what the clock can hold is skipped, not a panic.
#[test]
fn a_record_with_a_time_out_of_range_is_skipped() {
    let rt = runtime();
    let mem = store();
    let text = String::from_utf8(snapshot().to_vec()).unwrap();
    let header = text.lines().next().unwrap();
    let rec = r#"{"Stat":{"age_ms":0,"entry":{"path":"/d/dir/f1","dir":false,"size":11,"mtime_ns":340282366920938463463374607431768211455,"mode":null,"store":"mem://a","rel":"dir/f1","etag":null,"version":null}}}"#;
    let snap = format!("{header}\n{rec}\n");
    assert_eq!(restore(rt, &mem, snap.as_bytes()).unwrap(), 0);
    let far = rec.replace(
        "340282366920938463463374607431768211455",
        "18446744073709551615000000000",
    );
    let snap = format!("{header}\n{far}\n");
    assert_eq!(restore(rt, &mem, snap.as_bytes()).unwrap(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = restore(runtime(), &store(), &bytes);
    }

    /// Flipped bytes, cuts and spliced-in garbage in a valid snapshot: the whole records
    /// that still parse are restored (never more than were saved), others skipped.
    #[test]
    fn damaged_snapshots_restore_at_most_the_saved_records(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        splice in proptest::option::of((any::<prop::sample::Index>(), proptest::collection::vec(any::<u8>(), 0..64))),
    ) {
        let rt = runtime();
        let mem = store();
        let mut snap = snapshot().to_vec();
        let saved = snap.iter().filter(|&&b| b == b'\n').count() - 1;
        for (at, x) in flips {
            let i = at.index(snap.len());
            snap[i] ^= x;
        }
        if let Some((at, junk)) = splice {
            let i = at.index(snap.len());
            snap.splice(i..i, junk);
        }
        if let Some(at) = cut {
            snap.truncate(at.index(snap.len() + 1));
        }
        if let Ok(n) = restore(rt, &mem, &snap) {
            prop_assert!(n <= saved, "{n} restored of {saved} saved");
        }
    }
}
