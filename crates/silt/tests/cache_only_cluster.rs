//! Cache-only files replicated to workers: a static cluster of three `silt worker`s on
//! loopback, a client mount writing `cache-only` with `--cache-only-replicas 2`. Nothing
//! reaches the store; SIGKILL of a worker holding replicas loses nothing, for the writing
//! client and for a client started afterwards.

mod common;

use std::process::Command;

use common::*;
use silt_cluster::rpc::{Endpoint, WorkerClient};
use silt_testkit::S3Server;

const BUCKET: &str = "replicas";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// How many replicated cache-only files the worker at `addr` holds.
fn held(addr: &str) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        WorkerClient::new(Endpoint::Tcp(addr.to_string()), cluster_key())
            .resident_list("/")
            .await
            .map(|v| v.len())
            .unwrap_or_else(|e| panic!("listing the files of worker {addr}: {e}"))
    })
}

fn check_files(root: &std::path::Path, files: &[(String, Vec<u8>)], who: &str) {
    for (p, b) in files {
        let got = std::fs::read(root.join(p)).unwrap_or_else(|e| panic!("{who}: read {p}: {e}"));
        assert!(
            got == *b,
            "{who}: {p} differs ({} bytes read, {} written)",
            got.len(),
            b.len()
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(root.join("out"))
        .unwrap_or_else(|e| panic!("{who}: listing out: {e}"))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = files
        .iter()
        .filter_map(|(p, _)| p.strip_prefix("out/"))
        .map(|n| n.split('/').next().unwrap().to_string())
        .collect();
    want.sort();
    want.dedup();
    assert_eq!(names, want, "{who}: listing of out");
}

#[test]
fn cache_only_with_two_replicas_survives_a_killed_worker() {
    let s3 = S3Server::start();
    s3.create_bucket(BUCKET);
    let dir = tempfile::tempdir().unwrap();
    let ids = ["a", "b", "c"];
    let addrs: Vec<String> = ids
        .iter()
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let list = ids
        .iter()
        .zip(&addrs)
        .map(|(id, a)| format!("{id}={a}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut args = s3_args(&s3);
    args.extend([
        "--workers".into(),
        list,
        "--mount".into(),
        format!("/data=s3://{BUCKET}/ds"),
    ]);
    let mut workers: Vec<Option<Silt>> = ids
        .iter()
        .zip(&addrs)
        .map(|(id, addr)| {
            let state = dir.path().join(id);
            let mut cmd = Command::new(SILT);
            cmd.arg("worker")
                .args(&args)
                .args(["--worker-id", id, "--listen", addr])
                .args(["--state-dir", state.to_str().unwrap()]);
            Some(Silt::spawn(cmd, None, &state).unwrap_or_else(|e| panic!("worker {id}: {e}")))
        })
        .collect();
    args.extend(
        [
            "--write-type",
            "cache-only",
            "--cache-only-replicas",
            "2",
            "--passthrough",
            "off",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let client_dir = dir.path().join("client1");
    let client = Silt::up(&[], &args, &client_dir).unwrap_or_else(|e| panic!("client: {e}"));

    // Small files, one of several RPC frames (1 MiB each), an empty one, one in a subdir.
    let mut files: Vec<(String, Vec<u8>)> = (0..16)
        .map(|i| {
            (
                format!("out/f{i:02}.bin"),
                bytes(500 + i as u64, 3000 + i * 4099),
            )
        })
        .collect();
    files.push(("out/big.bin".into(), bytes(77, (3 << 20) + 5)));
    files.push(("out/empty".into(), Vec::new()));
    files.push(("out/sub/g.bin".into(), bytes(78, 12345)));
    let root = client.path("data");
    for (p, b) in &files {
        let path = root.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b).unwrap_or_else(|e| panic!("write {p}: {e}"));
    }
    check_files(&root, &files, "writer");

    // Nothing reached the store.
    let ds = s3.root().join(BUCKET).join("ds");
    let stored: Vec<_> = silt_testkit::files_below(&ds);
    assert!(
        stored.is_empty(),
        "cache-only files reached the store: {stored:?}"
    );

    // Two copies of each file over the three workers; kill (SIGKILL) the one with most.
    let counts: Vec<usize> = addrs.iter().map(|a| held(a)).collect();
    assert_eq!(
        counts.iter().sum::<usize>(),
        2 * files.len(),
        "replicas per worker: {counts:?}"
    );
    let victim = (0..3).max_by_key(|&k| counts[k]).unwrap();
    assert!(counts[victim] > 0);
    workers[victim].take().unwrap().kill();
    eprintln!(
        "killed worker {} holding {} of {counts:?} replicas",
        ids[victim], counts[victim]
    );

    // Forget what the kernel kept of the written files, so reads go to Silt (best effort).
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    check_files(&root, &files, "writer after the kill");

    // A client that never saw the files: stats, lists and reads from the surviving replicas.
    let second = Silt::up(&[], &args, &dir.path().join("client2"))
        .unwrap_or_else(|e| panic!("second client: {e}"));
    check_files(&second.path("data"), &files, "second client after the kill");

    // Removing a file removes it from every live replica, for both clients.
    std::fs::remove_file(second.path("data").join("out/f00.bin")).unwrap();
    assert!(!second.path("data").join("out/f00.bin").exists());
    let left: usize = (0..3)
        .filter(|&k| k != victim)
        .map(|k| held(&addrs[k]))
        .sum();
    assert!(
        left < counts.iter().sum::<usize>() - counts[victim],
        "the removed file is still on a worker"
    );
    assert!(
        silt_testkit::files_below(&ds).is_empty(),
        "something reached the store"
    );

    second.stop();
    client.stop();
    for w in workers.into_iter().flatten() {
        w.stop();
    }
}
