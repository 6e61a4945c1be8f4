//! The cache is private: Silt's local state is owner-only whatever the umask, and a cache file
//! altered on disk is never served.

mod common;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// `silt up` over `file://{store}` at `dir/mnt` with state in `dir/state`, started with
/// umask 000 so any file created without an explicit mode would be world-writable.
fn up_umask_000(store: &Path, extra: &[&str], dir: &Path) -> Silt {
    let (mp, state) = (dir.join("mnt"), dir.join("state"));
    std::fs::create_dir_all(&mp).unwrap();
    let mut cmd = Command::new(SILT);
    cmd.args(["up", "--mountpoint"])
        .arg(&mp)
        .arg("--state-dir")
        .arg(&state)
        .arg("--mount")
        .arg(format!("/data=file://{}", store.display()))
        .args(extra);
    // SAFETY: umask(2) is async-signal-safe and cannot fail.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("{e}"))
}

/// Every entry under `root` (itself included) that group or others may read, write or
/// search, with its mode.
fn not_owner_only(root: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut todo: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue; // removed while we walked
        };
        if meta.file_type().is_symlink() {
            bad.push(format!("{} (a symlink)", p.display()));
            continue;
        }
        if meta.mode() & 0o077 != 0 {
            bad.push(format!("{} {:o}", p.display(), meta.mode() & 0o7777));
        }
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                todo.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    bad
}

/// Number of regular files under `root`.
fn files_under(root: &Path) -> usize {
    let mut n = 0;
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn state_is_owner_only_under_umask_000() {
    let store = tempfile::tempdir().unwrap();
    let data = bytes(1, 3 << 20);
    std::fs::write(store.path().join("a.bin"), &data).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // An older version left the state dir 0755: it is tightened at start-up.
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Write-back with a long delay and a small write memory: the written file stays in the
    // write-ahead log and spills.
    let silt = up_umask_000(
        store.path(),
        &[
            "--write-type",
            "back",
            "--upload-delay",
            "1h",
            "--write-memory",
            "1MiB",
            "--write-file-memory",
            "1MiB",
        ],
        dir.path(),
    );
    assert!(std::fs::read(silt.path("data/a.bin")).unwrap() == data);
    let written = bytes(2, 5 << 20);
    {
        let mut f = std::fs::File::create(silt.path("data/w.bin")).unwrap();
        for c in written.chunks(256 << 10) {
            f.write_all(c).unwrap();
        }
        f.sync_all().unwrap();
    }
    assert!(std::fs::read(silt.path("data/w.bin")).unwrap() == written);
    // Populated: the disk tier holds the read file, the log the written one.
    assert!(files_under(&state.join("cache")) >= 1, "disk tier empty");
    assert!(
        files_under(&state.join("wal")) >= 1,
        "write-ahead log empty"
    );
    let bad = not_owner_only(&state);
    assert!(
        bad.is_empty(),
        "not owner-only while running:\n{}",
        bad.join("\n")
    );
    silt.stop();
    // What a clean shutdown writes (metadata snapshot, clean markers) is private too.
    let bad = not_owner_only(&state);
    assert!(
        bad.is_empty(),
        "not owner-only after stop:\n{}",
        bad.join("\n")
    );
}

/// The data file of the `size`-byte object in the disk tier under `state`.
fn cache_file_of_size(state: &Path, size: u64) -> PathBuf {
    let mut todo = vec![state.join("cache").join("objects")];
    let mut found = Vec::new();
    while let Some(p) = todo.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            } else if m.len() == size {
                found.push(e.path());
            }
        }
    }
    assert_eq!(found.len(), 1, "cache files of {size} bytes: {found:?}");
    found.remove(0)
}

/// Inverts `len` bytes of `path` at `offset` in place, as another user with write access
/// could.
fn tamper(path: &Path, offset: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, offset).unwrap();
    b.iter_mut().for_each(|x| *x = !*x);
    f.write_all_at(&b, offset).unwrap();
}

/// Opens `path` afresh, drops the kernel's cached pages of it (so the read reaches Silt or
/// the passthrough backing file) and reads it whole.
fn read_fresh(path: &Path) -> Vec<u8> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut f = std::fs::File::open(path).unwrap();
    // SAFETY: advice on an fd we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut out = Vec::new();
    f.read_to_end(&mut out).unwrap();
    out
}

fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes read, {} expected, first difference at {at:?}",
            got.len(),
            want.len()
        );
    }
}

/// A cache data file altered on disk while Silt runs is never served: not through a
/// passthrough open (whether or not one was made before the change) nor by the daemon.
fn tampered_cache_file_is_not_served(extra: &[&str]) {
    let store = tempfile::tempdir().unwrap();
    // `a` gets a passthrough open before the change, `b` is changed right after it is cached.
    let a = bytes(3, (3 << 20) + 123);
    let b = bytes(4, (2 << 20) + 55);
    std::fs::write(store.path().join("a.bin"), &a).unwrap();
    std::fs::write(store.path().join("b.bin"), &b).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", store.path().display());
    let silt = Silt::up_data(&uri, vec![], extra, dir.path());
    let (pa, pb) = (silt.path("data/a.bin"), silt.path("data/b.bin"));
    same(&std::fs::read(&pa).unwrap(), &a, "a, first read");
    same(&std::fs::read(&pb).unwrap(), &b, "b, first read");
    // Whole in the disk tier now: this open may be passthrough (and is, where supported).
    same(&read_fresh(&pa), &a, "a, second read");
    let r = silt.report();
    let passthrough = r["passthrough"]["enabled"] == true;
    if passthrough {
        assert!(r["opens"]["passthrough"].as_u64().unwrap() >= 1, "{r}");
    }

    let state = &silt.state_dir;
    tamper(
        &cache_file_of_size(state, a.len() as u64),
        (1 << 20) + 17,
        100,
    );
    tamper(&cache_file_of_size(state, b.len() as u64), 5, 4096);
    same(&read_fresh(&pa), &a, "a after its cache file changed");
    same(&read_fresh(&pb), &b, "b after its cache file changed");
    // Caught by checksum (a page each), not by luck of some cache.
    assert!(
        silt.metric("silt_checksum_failures_total") >= 2,
        "{}",
        silt.report()
    );
    // Refetched and whole again: served right from now on.
    same(&read_fresh(&pa), &a, "a, refetched");
    same(&read_fresh(&pb), &b, "b, refetched");
    silt.stop();
}

#[test]
fn tampered_cache_file_is_not_served_through_passthrough() {
    tampered_cache_file_is_not_served(&[]);
}

#[test]
fn tampered_cache_page_is_not_served_by_the_daemon() {
    // Every read is the daemon's, from the disk tier (no memory tier to hide the change).
    tampered_cache_file_is_not_served(&["--passthrough", "off", "--memory-capacity", "0"]);
}

/// The same through a worker on the same host: the private copy it leases a client for
/// passthrough is never of a cache file altered on disk.
#[test]
fn tampered_cache_file_is_not_lent_by_a_same_host_worker() {
    let etcd = silt_testkit::Etcd::start();
    let store = tempfile::tempdir().unwrap();
    let data = bytes(5, 300_000);
    std::fs::write(store.path().join("a.bin"), &data).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", store.path().display());
    let wstate = dir.path().join("w");
    let mut cmd = Command::new(SILT);
    cmd.arg("worker")
        .args(["--etcd", &etcd.endpoint(), "--placement-group", "1MiB"])
        .args(["--mount", &format!("/data={uri}")])
        .args(["--listen", "127.0.0.1:0", "--worker-id", "local"])
        .arg("--state-dir")
        .arg(&wstate);
    let worker = Silt::spawn(cmd, None, &wstate).unwrap_or_else(|e| panic!("worker: {e}"));
    let (cstate, mp) = (dir.path().join("c"), dir.path().join("mnt"));
    std::fs::create_dir_all(&mp).unwrap();
    let mut cmd = Command::new(SILT);
    cmd.arg("mount")
        .arg(&mp)
        .args(["--etcd", &etcd.endpoint(), "--placement-group", "1MiB"])
        .arg("--state-dir")
        .arg(&cstate);
    let client = Silt::spawn(cmd, Some(&mp), &cstate).unwrap_or_else(|e| panic!("client: {e}"));
    let path = client.path("data/a.bin");
    same(&std::fs::read(&path).unwrap(), &data, "first read");
    // Whole in the worker's disk tier: this open is leased a copy where passthrough exists.
    // The kernel sends the first handle's RELEASE after close(2) returned, so an open right
    // after may still find it open (and is then served by the daemon, correctly): open again
    // until one is passthrough.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        same(&read_fresh(&path), &data, "second read");
        let r = client.report();
        let opens = r["metrics"]["silt_fuse_opens_passthrough_total"].as_u64();
        if r["passthrough"]["enabled"] != true || opens.unwrap_or(0) >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no passthrough open: {r}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    tamper(&cache_file_of_size(&wstate, data.len() as u64), 1000, 64);
    same(
        &read_fresh(&path),
        &data,
        "after the worker's cache file changed",
    );
    same(&read_fresh(&path), &data, "again");
    client.stop();
    worker.stop();
}

/// A cache file altered while Silt is stopped (after `silt down`, or after SIGKILL) is never
/// handed out at the next start: the first passthrough open after a start reads it back
/// (the journal vouched for the pages and they went to the kernel unread, and readers got the
/// changed bytes). The same with the daemon reading (`--passthrough off`).
#[test]
fn a_cache_file_changed_while_silt_is_stopped_is_not_served_after_the_restart() {
    for (how, extra) in [
        ("clean", &[][..]),
        ("kill", &[][..]),
        (
            "clean, daemon reads",
            &["--passthrough", "off", "--memory-capacity", "0"][..],
        ),
    ] {
        let store = tempfile::tempdir().unwrap();
        let a = bytes(6, (3 << 20) + 321);
        std::fs::write(store.path().join("a.bin"), &a).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("file://{}", store.path().display());
        let silt = Silt::up_data(&uri, vec![], extra, dir.path());
        let pa = silt.path("data/a.bin");
        same(&std::fs::read(&pa).unwrap(), &a, "first read");
        same(&read_fresh(&pa), &a, "second read");
        let state = silt.state_dir.clone();
        if how == "kill" {
            silt.kill();
        } else {
            silt.stop();
        }
        // 8 bytes flipped in the cache file while nothing runs.
        tamper(
            &cache_file_of_size(&state, a.len() as u64),
            (2 << 20) + 9,
            8,
        );
        let mounts = [("/data", uri.as_str())];
        let silt = Silt::restart(&mounts, extra, dir.path());
        same(&read_fresh(&pa), &a, &format!("{how}: after the restart"));
        same(&read_fresh(&pa), &a, &format!("{how}: again"));
        assert!(
            silt.metric("silt_checksum_failures_total") >= 1,
            "{how}: the change was not caught: {}",
            silt.report()
        );
        silt.stop();
    }
}
