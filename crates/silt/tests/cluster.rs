//! Multi-host tests: workers in their own network namespaces (each its own address), a real
//! etcd and a real S3 server on the lab's bridge, and a FUSE client in the test's namespace.
//! Every test tears down processes, mounts, namespaces and links when it ends, also on failure
//! (the `Silt`, `NetLab`, `Etcd` and `S3Server` guards).

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use silt_testkit::netlab::NetLab;
use silt_testkit::{Etcd, S3Server};

const BUCKET: &str = "cluster";
/// Small groups so that modest files spread over every worker.
const GROUP: &str = "1MiB";

struct Lab {
    net: NetLab,
    etcd: Etcd,
    s3: S3Server,
    dir: tempfile::TempDir,
}

impl Lab {
    fn new(hosts: usize) -> Lab {
        let net = NetLab::new(hosts).unwrap_or_else(|e| panic!("building the lab network: {e}"));
        let etcd = Etcd::start_on(net.gateway());
        let s3 = S3Server::start_on(net.gateway());
        s3.create_bucket(BUCKET);
        Lab {
            net,
            etcd,
            s3,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn common_args(&self) -> Vec<String> {
        let mut a = s3_args(&self.s3);
        a.extend(
            [
                "--etcd",
                &self.etcd.endpoint(),
                "--member-ttl",
                "2s",
                "--placement-group",
                GROUP,
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        a
    }

    fn state(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Worker `wN` on lab host `host`, with its state in `state/wN`.
    fn worker(&self, host: usize, extra: &[&str]) -> Silt {
        let state = self.state(&format!("w{host}"));
        let mut cmd = self.net.command(host, SILT);
        cmd.arg("worker")
            .args(self.common_args())
            .args(["--mount", &format!("/data=s3://{BUCKET}/ds")])
            .args(["--worker-id", &format!("w{host}")])
            .args(["--listen", &format!("{}:29998", self.net.addr(host))])
            .args(["--state-dir", state.to_str().unwrap()])
            .args(["--memory-capacity", "8MiB"])
            .args(extra);
        Silt::spawn(cmd, None, &state).unwrap_or_else(|e| panic!("worker w{host}: {e}"))
    }

    /// A client-only FUSE mount in the test's own namespace; its namespace is the mount table
    /// the workers published in etcd.
    fn client(&self, extra: &[&str]) -> Silt {
        let state = self.state("client");
        let mp = self.state("mnt");
        std::fs::create_dir_all(&mp).unwrap();
        let mut cmd = Command::new(SILT);
        cmd.arg("mount")
            .arg(&mp)
            .args(self.common_args())
            .args(["--state-dir", state.to_str().unwrap()])
            .args(["--memory-capacity", "64MiB", "--passthrough", "off"])
            .args(extra);
        Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("client: {e}"))
    }

    fn put(&self, files: &[(String, Vec<u8>)]) {
        let root = self.s3.root().join(BUCKET).join("ds");
        write_local(&root, files);
    }
}

/// Per-worker view from the client's report: id -> (live, stats).
fn workers(client: &Silt) -> Vec<Value> {
    client.report()["cluster"]["workers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn worker_stat(client: &Silt, id: &str, key: &str) -> u64 {
    workers(client)
        .iter()
        .find(|w| w["id"] == id)
        .and_then(|w| w[key].as_u64())
        .unwrap_or_else(|| panic!("no {key} for worker {id} in the report"))
}

/// Polls the client's report until `pred` holds on its worker list (membership changes
/// arrive through etcd's watch; there is no event to wait on from outside the process).
fn wait_for_workers(client: &Silt, what: &str, pred: impl Fn(&[Value]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let w = workers(client);
        if pred(&w) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {w:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn cluster_dataset(n_small: usize, large: &[usize]) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = (0..n_small)
        .map(|i| {
            (
                format!("small/s{i:03}.bin"),
                bytes(1000 + i as u64, 20_000 + i * 997),
            )
        })
        .collect();
    for (i, &len) in large.iter().enumerate() {
        files.push((format!("large/l{i}.bin"), bytes(7 + i as u64, len)));
    }
    files
}

/// Reads every file through the mount with `threads` readers in 256 KiB pieces, checking
/// each piece against the source; calls `on_progress(bytes read so far)` as it goes. Returns
/// the slowest single piece.
fn read_all_parallel(
    root: &Path,
    files: &Arc<Vec<(String, Vec<u8>)>>,
    threads: usize,
    progress: &Arc<AtomicU64>,
) -> Duration {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let files = files.clone();
            let root = root.to_path_buf();
            let progress = progress.clone();
            std::thread::spawn(move || {
                let mut slowest = Duration::ZERO;
                for (p, b) in files.iter().skip(t).step_by(threads) {
                    let f = File::open(root.join(p)).unwrap_or_else(|e| panic!("open {p}: {e}"));
                    let mut off = 0usize;
                    while off < b.len() {
                        let len = (256 << 10).min(b.len() - off);
                        let mut buf = vec![0u8; len];
                        let started = Instant::now();
                        f.read_exact_at(&mut buf, off as u64)
                            .unwrap_or_else(|e| panic!("read {p} at {off}: {e}"));
                        slowest = slowest.max(started.elapsed());
                        assert!(buf == b[off..off + len], "{p}: bytes at {off} differ");
                        off += len;
                        progress.fetch_add(len as u64, Ordering::Relaxed);
                    }
                }
                slowest
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("reader thread failed"))
        .max()
        .unwrap_or_default()
}

fn lab_or_skip() -> bool {
    if !NetLab::available() {
        eprintln!("skipped: needs root and iproute2 to build network namespaces");
        return false;
    }
    true
}

#[test]
fn reads_spread_over_owners_and_survive_a_worker_killed_mid_read() {
    if !lab_or_skip() {
        return;
    }
    let lab = Lab::new(3);
    let files = Arc::new(cluster_dataset(40, &[24 << 20, 33 << 20]));
    lab.put(&files);
    let w: Vec<Silt> = (0..3).map(|h| lab.worker(h, &[])).collect();
    // A short read-ahead, so the kill lands while the large file is still being fetched.
    // A generous timeout: only the kill may cause a failover (a refused connection fails at
    // once, whatever the timeout).
    let client = lab.client(&["--worker-timeout", "30s", "--prefetch-max", "2MiB"]);
    wait_for_workers(&client, "3 live workers", |w| {
        w.len() == 3 && w.iter().all(|x| x["live"] == true)
    });

    // First half of the files: every worker serves a share.
    let (first, second): (Vec<_>, Vec<_>) = files
        .iter()
        .cloned()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let first: Arc<Vec<_>> = Arc::new(first.into_iter().map(|(_, f)| f).collect());
    let second: Arc<Vec<_>> = Arc::new(second.into_iter().map(|(_, f)| f).collect());
    let progress = Arc::new(AtomicU64::new(0));
    read_all_parallel(&client.path("data"), &first, 4, &progress);
    for id in ["w0", "w1", "w2"] {
        let served = worker_stat(&client, id, "bytes_served");
        eprintln!("worker {id} served {served} bytes");
        assert!(
            served > 0,
            "worker {id} served nothing: reads did not spread"
        );
    }
    assert_eq!(client.metric("silt_failovers_total"), 0);

    // Second half, 6 readers; SIGKILL w1 once a quarter of it has been read.
    let total: u64 = second.iter().map(|(_, b)| b.len() as u64).sum();
    let progress = Arc::new(AtomicU64::new(0));
    let reader = {
        let root = client.path("data");
        let second = second.clone();
        let progress = progress.clone();
        std::thread::spawn(move || read_all_parallel(&root, &second, 6, &progress))
    };
    let mut w = w;
    let victim = w.remove(1);
    while progress.load(Ordering::Relaxed) < total / 4 && !reader.is_finished() {
        std::thread::yield_now();
    }
    let at = progress.load(Ordering::Relaxed);
    victim.kill();
    let slowest = reader
        .join()
        .expect("a read failed after the worker was killed");
    let failovers = client.metric("silt_failovers_total");
    eprintln!(
        "killed w1 after {at} of {total} bytes; every byte matched; slowest 256 KiB read {slowest:?}; failovers {failovers}"
    );
    // w1 stays in the view for its 2 s lease at least, and the rest of the large file has
    // groups it owns (fixed ids and data), unless the readers were done before the kill.
    assert!(
        failovers >= 1 || at >= total,
        "no read went to the killed worker"
    );
    // The dead worker leaves the membership when its lease expires.
    wait_for_workers(&client, "w1 to leave", |w| {
        w.iter().all(|x| x["id"] != "w1")
    });
    client.stop();
    for x in w {
        x.stop();
    }
}

#[test]
fn a_cut_link_fails_over_after_the_timeout() {
    if !lab_or_skip() {
        return;
    }
    let lab = Lab::new(3);
    let files = Arc::new(cluster_dataset(30, &[]));
    lab.put(&files);
    let w: Vec<Silt> = (0..3).map(|h| lab.worker(h, &[])).collect();
    let client = lab.client(&["--worker-timeout", "2s", "--worker-retry-after", "1h"]);
    wait_for_workers(&client, "3 live workers", |w| {
        w.len() == 3 && w.iter().all(|x| x["live"] == true)
    });
    lab.net.cut(2).unwrap();
    let progress = Arc::new(AtomicU64::new(0));
    let slowest = read_all_parallel(&client.path("data"), &files, 1, &progress);
    // 30 files over 3 workers: w2 owns some (fixed ids, fixed data: deterministic).
    let failovers = client.metric("silt_failovers_total");
    eprintln!(
        "link to w2 cut: every byte matched; failovers {failovers}; slowest read {slowest:?}"
    );
    assert!(failovers >= 1, "no read went to the cut-off worker");
    // A failed worker is tried last from then on, so each worker fails at most once: w2 (which
    // owns about 10 of the files) costs one timeout, not one per file. (Bounded by the number
    // of workers, so a healthy worker slowed past the timeout on a loaded machine cannot fail
    // this check.)
    assert!(
        failovers <= 3,
        "workers were tried {failovers} times after failing"
    );
    lab.net.heal(2).unwrap();
    client.stop();
    for x in w {
        x.stop();
    }
}

#[test]
fn a_joining_worker_takes_only_its_share_and_a_restarted_one_keeps_its_cache() {
    if !lab_or_skip() {
        return;
    }
    let lab = Lab::new(4);
    let files = Arc::new(cluster_dataset(60, &[16 << 20]));
    let total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    lab.put(&files);
    let mut w: Vec<Silt> = (0..3).map(|h| lab.worker(h, &[])).collect();
    let client = lab.client(&[]);
    wait_for_workers(&client, "3 live workers", |w| w.len() == 3);
    let o = client.cli(&["load", "/data"]);
    assert!(o.status.success(), "load failed: {}", stderr(&o));
    let fetched = |id: &str| worker_stat(&client, id, "ufs_read_bytes");
    let before: Vec<u64> = ["w0", "w1", "w2"].iter().map(|id| fetched(id)).collect();
    assert_eq!(
        before.iter().sum::<u64>(),
        total,
        "the load fetched each byte once"
    );

    // A fourth worker joins; a second load fetches only what it now owns.
    w.push(lab.worker(3, &[]));
    wait_for_workers(&client, "4 workers", |w| w.len() == 4);
    let o = client.cli(&["load", "/data"]);
    assert!(o.status.success(), "load failed: {}", stderr(&o));
    for (i, id) in ["w0", "w1", "w2"].iter().enumerate() {
        assert_eq!(
            fetched(id),
            before[i],
            "{id} fetched again: a key moved between old workers"
        );
    }
    let moved = fetched("w3");
    let share = moved as f64 / total as f64;
    eprintln!("join: the new worker took {share:.3} of the bytes (expected about 0.25)");
    assert!(moved > 0 && share < 0.5, "moved share {share}");

    // Restart w0 on the same state dir: same id, same share, pages still on its disk.
    w.remove(0).stop();
    wait_for_workers(&client, "w0 to leave", |w| {
        w.iter().all(|x| x["id"] != "w0")
    });
    w.push(lab.worker(0, &[]));
    wait_for_workers(&client, "w0 back", |w| {
        w.iter().any(|x| x["id"] == "w0" && x["live"] == true)
    });
    assert!(
        worker_stat(&client, "w0", "used") > 0,
        "the restarted worker came back with an empty cache"
    );
    let progress = Arc::new(AtomicU64::new(0));
    read_all_parallel(&client.path("data"), &files, 4, &progress);
    assert!(
        worker_stat(&client, "w0", "bytes_served") > 0,
        "w0 served nothing after restart"
    );
    assert_eq!(
        worker_stat(&client, "w0", "ufs_read_bytes"),
        0,
        "the restarted worker fetched again instead of using its disk tier"
    );
    client.stop();
    for x in w {
        x.stop();
    }
}

/// A worker and a client in one network namespace (same host): files whole on the worker's
/// disk, the 5 MiB one spread over five placement groups included (the only worker owns them
/// all), open in FUSE passthrough from the worker's own cache file (leased over its Unix
/// socket); without passthrough, reads arrive as passed file descriptors; no byte is copied.
#[test]
fn same_host_reads_use_the_unix_socket_and_passed_descriptors() {
    let etcd = Etcd::start();
    let s3 = S3Server::start();
    s3.create_bucket(BUCKET);
    // Small files are one placement group each; the 5 MiB file spans five.
    let files = Arc::new(cluster_dataset(10, &[5 << 20]));
    write_local(&s3.root().join(BUCKET).join("ds"), &files);
    let dir = tempfile::tempdir().unwrap();
    let mut args = s3_args(&s3);
    args.extend([
        "--etcd".into(),
        etcd.endpoint(),
        "--placement-group".into(),
        GROUP.into(),
    ]);
    let wstate = dir.path().join("w");
    let mut cmd = Command::new(SILT);
    cmd.arg("worker")
        .args(&args)
        .args(["--mount", &format!("/data=s3://{BUCKET}/ds")])
        .args(["--listen", "127.0.0.1:0", "--worker-id", "local"])
        .args(["--state-dir", wstate.to_str().unwrap()]);
    let worker = Silt::spawn(cmd, None, &wstate).unwrap_or_else(|e| panic!("worker: {e}"));
    let mount = |name: &str, passthrough: &str| {
        let state = dir.path().join(name);
        let mp = dir.path().join(format!("{name}-mnt"));
        std::fs::create_dir_all(&mp).unwrap();
        let mut cmd = Command::new(SILT);
        cmd.arg("mount")
            .arg(&mp)
            .args(&args)
            .args(["--passthrough", passthrough])
            .args(["--state-dir", state.to_str().unwrap()]);
        Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("client {name}: {e}"))
    };
    let client = mount("c", "auto");
    let o = client.cli(&["load", "/data"]);
    assert!(o.status.success(), "load failed: {}", stderr(&o));
    let progress = Arc::new(AtomicU64::new(0));
    read_all_parallel(&client.path("data"), &files, 2, &progress);
    let report = client.report();
    let passthrough = report["metrics"]["silt_fuse_opens_passthrough_total"]
        .as_u64()
        .unwrap_or(0);
    let leased = worker_stat(&client, "local", "files_leased");
    eprintln!("same host: {passthrough} passthrough opens on {leased} leased files");
    if report["passthrough"]["enabled"] == true {
        assert!(passthrough >= 11, "not every file opened in passthrough");
        assert!(leased >= 11, "the worker leased {leased} files");
    } else {
        eprintln!("kernel without FUSE passthrough: the file-lease checks are skipped");
    }
    assert_eq!(
        worker_stat(&client, "local", "bytes_served"),
        0,
        "bytes were copied although the worker held every file on disk"
    );
    client.stop();

    let client = mount("d", "off");
    read_all_parallel(&client.path("data"), &files, 2, &progress);
    let fd_reads = client.metric("silt_remote_fd_reads_total");
    let served = worker_stat(&client, "local", "bytes_served");
    eprintln!("without passthrough: {fd_reads} reads by passed descriptor, {served} bytes copied over the socket");
    assert!(fd_reads > 0, "no read used a passed file descriptor");
    assert_eq!(
        served, 0,
        "bytes were copied although the worker held every file on disk"
    );
    client.stop();
    worker.stop();
}

/// `--cluster-tls` end to end: workers in their own namespaces require TLS on their TCP port,
/// a TLS client reads every byte through them, and a plaintext client is refused by every
/// worker (its reads fall back to the store).
#[test]
fn with_cluster_tls_members_read_through_workers_and_plaintext_clients_are_refused() {
    if !lab_or_skip() {
        return;
    }
    let lab = Lab::new(2);
    let files = Arc::new(cluster_dataset(20, &[5 << 20]));
    lab.put(&files);
    let w: Vec<Silt> = (0..2)
        .map(|h| lab.worker(h, &["--cluster-tls", "true"]))
        .collect();
    let client = lab.client(&["--cluster-tls", "true"]);
    wait_for_workers(&client, "2 live workers", |w| {
        w.len() == 2 && w.iter().all(|x| x["live"] == true)
    });
    read_all_parallel(
        &client.path("data"),
        &files,
        4,
        &Arc::new(AtomicU64::new(0)),
    );
    for id in ["w0", "w1"] {
        assert!(
            worker_stat(&client, id, "bytes_served") > 0,
            "worker {id} served nothing"
        );
    }
    assert_eq!(client.metric("silt_failovers_total"), 0);
    assert_eq!(client.metric("silt_ufs_read_bytes_total"), 0);
    client.stop();

    let plain = lab.client(&[]);
    read_all_parallel(&plain.path("data"), &files, 4, &Arc::new(AtomicU64::new(0)));
    assert!(
        plain.metric("silt_failovers_total") >= 1,
        "no worker refused a plaintext client"
    );
    assert!(plain.metric("silt_ufs_read_bytes_total") > 0);
    plain.stop();
    for x in w {
        x.stop();
    }
}

/// A static cluster (`--workers`, no etcd) on loopback: a `silt up` client reads through it.
#[test]
fn a_static_worker_list_serves_without_etcd() {
    let s3 = S3Server::start();
    s3.create_bucket(BUCKET);
    // The large file's last placement group is half a group: it fits a worker's 1 MiB disk
    // tier where whole groups do not (the partly refused pin below).
    let files = Arc::new(cluster_dataset(20, &[(3 << 20) + (512 << 10)]));
    write_local(&s3.root().join(BUCKET).join("ds"), &files);
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(2);
    let list = format!("a=127.0.0.1:{},b=127.0.0.1:{}", ports[0], ports[1]);
    let mut args = s3_args(&s3);
    args.extend([
        "--workers".into(),
        list.clone(),
        "--mount".into(),
        format!("/data=s3://{BUCKET}/ds"),
    ]);
    let workers: Vec<Silt> = ["a", "b"]
        .iter()
        .zip(&ports)
        .map(|(id, port)| {
            let state = dir.path().join(id);
            let mut cmd = Command::new(SILT);
            cmd.arg("worker")
                .args(&args)
                .args(["--worker-id", id, "--listen", &format!("127.0.0.1:{port}")])
                .args(["--state-dir", state.to_str().unwrap()])
                .args([
                    "--disk-tiers",
                    &format!("{}:1MiB", state.join("cache").display()),
                ]);
            Silt::spawn(cmd, None, &state).unwrap_or_else(|e| panic!("worker {id}: {e}"))
        })
        .collect();
    args.extend(["--placement-group".into(), GROUP.into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let client = Silt::up(&[], &args, dir.path()).unwrap_or_else(|e| panic!("client: {e}"));
    let progress = Arc::new(AtomicU64::new(0));
    read_all_parallel(&client.path("data"), &files, 2, &progress);
    for id in ["a", "b"] {
        assert!(
            worker_stat(&client, id, "bytes_served") > 0,
            "worker {id} served nothing"
        );
    }
    // Pins, usage and free reach the workers that own each part. A small file is pinned
    // there (the client's stat counts what the workers answer), then unpinned.
    let stat = |path: &str| -> Value {
        let o = client.cli(&["fs", "stat", path]);
        assert!(o.status.success(), "stat {path}: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (small, small_len) = (&files[0].0, files[0].1.len() as u64);
    let small = format!("/data/{small}");
    let o = client.cli(&["fs", "pin", &small]);
    assert!(o.status.success(), "pin: {}", stderr(&o));
    assert_eq!(stat(&small)["cache"]["pinned_bytes"], small_len);
    assert!(client.cli(&["fs", "unpin", &small]).status.success());
    assert_eq!(stat(&small)["cache"]["pinned_bytes"], 0);
    // A 1 MiB group cannot be pinned in a 1 MiB disk tier (its high watermark is below), but
    // the last half group can: the pin is refused with a message, and what its owner did pin
    // is undone, so nothing is left pinned.
    let large = format!("/data/{}", files[20].0);
    let o = client.cli(&["fs", "pin", &large]);
    assert!(
        !o.status.success(),
        "a pin larger than the disk tiers was accepted"
    );
    assert!(stderr(&o).contains("disk tiers can hold"), "{}", stderr(&o));
    assert_eq!(stat(&large)["cache"]["pinned_bytes"], 0);
    // Free drops the pages on the workers too.
    assert!(stat("/data")["cache"]["cached_bytes"].as_u64().unwrap() > 0);
    let o = client.cli(&["fs", "free", "/data"]);
    assert!(o.status.success(), "free: {}", stderr(&o));
    assert_eq!(stat("/data")["cache"]["cached_bytes"], 0);
    // A worker id that is not in the list is refused with a clear message.
    let o = silt(&[
        "worker",
        "--workers",
        &list,
        "--worker-id",
        "c",
        "--mount",
        "/data=file:///tmp",
        "--state-dir",
        dir.path().join("c").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not in --workers"), "{}", stderr(&o));
    // `silt mount MOUNTPOINT --workers ... --mount PATH=URI` joins the same cluster, as the
    // README shows (--mount was refused there); without a mount table it says what to give.
    let mp = dir.path().join("mnt2");
    std::fs::create_dir_all(&mp).unwrap();
    let state = dir.path().join("m2");
    let mut cmd = Command::new(SILT);
    cmd.arg("mount")
        .arg(&mp)
        .args(&args)
        .args(["--state-dir", state.to_str().unwrap()]);
    let m2 = Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("silt mount: {e}"));
    let (name, data) = &files[1];
    assert!(std::fs::read(m2.path(&format!("data/{name}"))).unwrap() == *data);
    m2.stop();
    let o = silt(&[
        "mount",
        mp.to_str().unwrap(),
        "--workers",
        &list,
        "--state-dir",
        dir.path().join("m3").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--mount PATH=URI"), "{}", stderr(&o));
    client.stop();
    for w in workers {
        w.stop();
    }
}

#[test]
fn a_cluster_gateway_serves_whole_objects_through_a_worker_killed_mid_get() {
    if !lab_or_skip() {
        return;
    }
    let lab = Lab::new(3);
    let files = Arc::new(cluster_dataset(6, &[24 << 20, 33 << 20, 28 << 20]));
    lab.put(&files);
    let w: Vec<Silt> = (0..3).map(|h| lab.worker(h, &[])).collect();
    // A gateway on this host, a client of the cluster (workers from etcd).
    let state = lab.state("gateway");
    let mut cmd = Command::new(SILT);
    cmd.args(["gateway", "--listen", "127.0.0.1:0", "--anonymous"])
        .args(lab.common_args())
        .args(["--state-dir", state.to_str().unwrap()])
        .args(["--worker-timeout", "30s", "--prefetch-max", "2MiB"])
        .args(["--memory-capacity", "64MiB"]);
    let gw = Silt::spawn(cmd, None, &state).unwrap_or_else(|e| panic!("gateway: {e}"));
    let log = gw.log_text();
    let addr = log
        .lines()
        .find_map(|l| l.strip_prefix("silt: serving S3 gateway at http://"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no gateway address in {log}"))
        .to_string();
    // Every file GET at once, 256 KiB at a time. Each reader stops once it has a quarter of
    // its object; w1 is killed while they wait; then they read the rest (much of it not
    // fetched yet: the gateway reads at most 12 MiB ahead of a response).
    let readers_n = files.len();
    let paused = Arc::new(std::sync::Barrier::new(readers_n + 1));
    let resumed = Arc::new(std::sync::Barrier::new(readers_n + 1));
    let read_before = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = files
        .iter()
        .cloned()
        .map(|(path, want)| {
            let (addr, paused, resumed, read_before) = (
                addr.clone(),
                paused.clone(),
                resumed.clone(),
                read_before.clone(),
            );
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(&addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                let quarter = want.len() as u64 / 4;
                let mut waited = false;
                let got = raw_get(&mut s, &addr, &format!("/data/{path}"), |got| {
                    if !waited && got >= quarter {
                        waited = true;
                        read_before.fetch_add(got, Ordering::Relaxed);
                        paused.wait();
                        resumed.wait();
                    }
                });
                // A GET that failed before its pause still takes its part in the barriers, so
                // the test fails instead of waiting for it for ever.
                if !waited {
                    paused.wait();
                    resumed.wait();
                }
                let (status, body) = got.unwrap_or_else(|e| panic!("GET {path}: {e}"));
                assert_eq!(status, 200, "{path}");
                assert!(body == want, "{path}: the bytes differ");
            })
        })
        .collect();
    let mut w = w;
    let victim = w.remove(1);
    paused.wait();
    victim.kill();
    resumed.wait();
    let total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    let at = read_before.load(Ordering::Relaxed);
    for r in readers {
        r.join().expect("a GET failed after the worker was killed");
    }
    eprintln!("killed w1 after {at} of {total} bytes; every GET returned the whole object");
    // A gateway has no control socket for `silt down`: it is killed.
    gw.kill();
    for x in w {
        x.stop();
    }
}
