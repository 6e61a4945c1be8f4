//! The control socket of a running `silt up` fed arbitrary bytes and damaged requests: each
//! connection gets an answer or is closed, the daemon never panics and keeps serving.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Sends `bytes` to the control socket `sock`, closes the sending side, reads until the
/// daemon closes. A daemon that neither answers nor closes within a minute is a hang.
fn exchange(sock: &Path, bytes: &[u8]) -> Vec<u8> {
    let mut c = UnixStream::connect(sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let _ = c.write_all(bytes);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    match c.read_to_end(&mut out) {
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            panic!("the daemon neither answered nor closed: a hang")
        }
        _ => out,
    }
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut b = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    b.push(kind);
    b.extend_from_slice(payload);
    b
}

/// Requests as the CLI sends them (all but `down`).
fn requests() -> Vec<Vec<u8>> {
    let json = |v: serde_json::Value| frame(1, &serde_json::to_vec(&v).unwrap());
    vec![
        json(serde_json::json!({"v": 1, "op": "report"})),
        json(serde_json::json!({"v": 1, "op": "stat", "path": "/data/d/f"})),
        json(serde_json::json!({"v": 1, "op": "ls", "path": "/data/d"})),
        json(serde_json::json!({"v": 1, "op": "cat", "path": "/data/d/f"})),
        json(serde_json::json!({"v": 1, "op": "sync", "path": "/data", "recursive": true})),
        json(serde_json::json!({"v": 1, "op": "invalidate", "path": "/data/d"})),
        json(
            serde_json::json!({"v": 1, "op": "sync-policy", "path": "/data", "policy": "interval=1h"}),
        ),
        json(serde_json::json!({"v": 1, "op": "persist-state", "path": "/data"})),
        json(serde_json::json!({"v": 1, "op": "memory", "cache_memory": 1_073_741_824u64})),
        json(serde_json::json!({"v": 1, "op": "load", "path": "/data/d"})),
    ]
}

fn config() -> Config {
    Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    }
}

/// One daemon for all cases (run with proptest's runner inside the test, so the daemon and
/// its mount go away with the test, also when it fails).
#[test]
fn control_socket_refuses_arbitrary_and_damaged_requests() {
    let store = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(store.path().join("d")).unwrap();
    std::fs::write(store.path().join("d/f"), bytes(1, 5000)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", store.path().display());
    let silt = Silt::up_data(&uri, vec![], &[], dir.path());
    let sock = silt.state_dir.join("control.sock");

    let arbitrary = proptest::collection::vec(any::<u8>(), 0..512);
    TestRunner::new(config())
        .run(&arbitrary, |b| {
            exchange(&sock, &b);
            Ok(())
        })
        .unwrap();

    // Real requests with flipped bytes, a cut, or a rewritten length field.
    let all = requests();
    let damaged = (
        any::<prop::sample::Index>(),
        proptest::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 0..3),
        proptest::option::of(any::<prop::sample::Index>()),
        proptest::option::of(any::<u32>()),
    );
    TestRunner::new(config())
        .run(&damaged, |(pick, flips, cut, new_len)| {
            let mut s = all[pick.index(all.len())].clone();
            if let Some(l) = new_len {
                s[..4].copy_from_slice(&l.to_be_bytes());
            }
            for (at, x) in flips {
                let i = at.index(s.len());
                s[i] ^= x;
            }
            if let Some(at) = cut {
                s.truncate(at.index(s.len() + 1));
            }
            exchange(&sock, &s);
            Ok(())
        })
        .unwrap();

    // Still well: every undamaged request is answered, nothing panicked.
    for r in &all {
        let out = exchange(&sock, r);
        assert!(
            out.len() >= 5,
            "no answer to {:?}",
            String::from_utf8_lossy(r)
        );
    }
    assert!(silt.report().is_object());
    let log = silt.log_text();
    assert!(!log.contains("panicked"), "{log}");
    silt.stop();
}
