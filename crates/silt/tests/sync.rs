//! Sync policies and explicit revalidation on real FUSE mounts: what the mount shows after the
//! store changed behind Silt's back under `never`, `always` and per-prefix rules; what
//! `silt fs sync` reports; that a failing store (a listing page, 503 SlowDown, a HEAD that never
//! answers) never leaves a hole in the view; and what one bulk listing costs in requests.
//!
//! The out-of-band writer is an `S3Store` pointed straight at the S3 server (or plain file
//! operations for a local store); faults go through `silt_testkit::S3Proxy`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant, SystemTime};

use common::*;
use silt_testkit::{FaultAction, S3Op, S3Proxy};
use silt_ufs::{EntryKind, ObjectMeta};

impl S3Fx {
    fn proxy(&self) -> &S3Proxy {
        self.proxy.as_ref().expect("started without a proxy")
    }

    fn put_all(&self, files: &BTreeMap<String, Vec<u8>>) {
        for (p, b) in files {
            self.put(p, b);
        }
    }

    fn delete(&self, path: &str) {
        self.rt
            .block_on(self.store.delete(path))
            .unwrap_or_else(|e| panic!("out-of-band delete {path}: {e}"));
    }

    fn stat(&self, path: &str) -> ObjectMeta {
        self.rt
            .block_on(self.store.stat(path))
            .unwrap_or_else(|e| panic!("out-of-band stat {path}: {e}"))
    }

    /// Every object of the store and its bytes: the truth the mount is compared with.
    fn contents(&self) -> BTreeMap<String, Vec<u8>> {
        self.rt.block_on(async {
            let mut out = BTreeMap::new();
            for m in self.store.list("", true).await.unwrap() {
                if m.kind != EntryKind::File {
                    continue;
                }
                let b = self.store.read(&m.path, 0..m.size, &m).await.unwrap();
                out.insert(m.path.clone(), b.to_vec());
            }
            out
        })
    }

    /// Sets the modification time of an object's file in the server's posix backend, so that
    /// a later re-write of the same bytes gets a Last-Modified that certainly differs (S3 dates
    /// have one-second resolution).
    fn backdate(&self, path: &str) {
        let file = self.server.root().join(BUCKET).join(PREFIX).join(path);
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000))
            .unwrap();
    }
}

/// What `silt fs sync` printed: the counts of its first line and one (kind, path) per change.
#[derive(Debug, Default)]
struct SyncOut {
    checked: u64,
    added: u64,
    removed: u64,
    content: u64,
    metadata: u64,
    dropped: u64,
    changes: BTreeSet<(String, String)>,
}

fn parse_sync(o: &Output) -> SyncOut {
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "silt fs sync failed: {}{text}",
        stderr(o)
    );
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    assert!(first.starts_with("synced "), "unexpected output: {text}");
    let counts = first.split_once(": ").expect("counts").1;
    let mut out = SyncOut::default();
    for part in counts.split([',', ';']) {
        let part = part.trim();
        if let Some(n) = part.strip_prefix("cached pages of ") {
            out.dropped = n.split(' ').next().unwrap().parse().unwrap();
            continue;
        }
        let (n, what) = part.split_once(' ').expect("count and label");
        let n: u64 = n.parse().unwrap_or_else(|_| panic!("count in {first:?}"));
        match what {
            "checked" => out.checked = n,
            "added" => out.added = n,
            "removed" => out.removed = n,
            "content changed" => out.content = n,
            "metadata changed" => out.metadata = n,
            other => panic!("unknown count {other:?} in {first:?}"),
        }
    }
    for l in lines {
        let mut it = l.split_whitespace();
        let (Some(kind), Some(path), None) = (it.next(), it.next(), it.next()) else {
            panic!("unexpected change line {l:?} in {text}");
        };
        out.changes.insert((kind.to_string(), path.to_string()));
    }
    out
}

fn changes(list: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    list.iter()
        .map(|(k, p)| (k.to_string(), p.to_string()))
        .collect()
}

fn sync(silt: &Silt, path: &str, recursive: bool) -> Output {
    let mut args = vec!["fs", "sync", path];
    if recursive {
        args.push("--recursive");
    }
    silt.cli(&args)
}

/// `silt fs stat PATH` as JSON.
fn fs_stat(silt: &Silt, path: &str) -> serde_json::Value {
    let o = silt.cli(&["fs", "stat", path]);
    assert!(o.status.success(), "silt fs stat {path}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("stat JSON")
}

/// Every file below `root` through the mount (std::fs), with its bytes; each file's size (as
/// the daemon gives it) must be the number of bytes read.
fn walk(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                go(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                let len = fresh(&p).unwrap().size;
                let b = std::fs::read(&p).unwrap_or_else(|e| panic!("reading {rel}: {e}"));
                assert_eq!(len, b.len() as u64, "{rel}: size and bytes read disagree");
                out.insert(rel, b);
            }
        }
    }
    let mut out = BTreeMap::new();
    go(root, root, &mut out);
    out
}

/// Names in one directory through the mount.
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("error without errno: {e}")),
    }
}

fn errno_name(n: i32) -> String {
    std::io::Error::from_raw_os_error(n).to_string()
}

/// Attributes of a path through the mount, as a plain `stat` sees them (see [`fresh`]).
#[derive(Debug, PartialEq, Eq)]
struct Fresh {
    size: u64,
    /// Permission bits.
    mode: u32,
    mtime: SystemTime,
}

/// Attributes through the mount with a plain `stat`: after `silt fs sync` returns, the kernel's
/// caches must already have dropped what changed, so this sees the store's new state.
fn fresh(path: &Path) -> std::io::Result<Fresh> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(path)?;
    Ok(Fresh {
        size: m.len(),
        mode: m.permissions().mode() & 0o7777,
        mtime: m.modified()?,
    })
}

/// The files of the differential tests and the changes made behind Silt's back.
struct Scenario {
    before: BTreeMap<String, Vec<u8>>,
    added: &'static str,
    removed: &'static str,
    overwritten: &'static str,
    rewritten: &'static str,
    new_bytes: Vec<u8>,
    added_bytes: Vec<u8>,
}

impl Scenario {
    fn new() -> Scenario {
        let before: BTreeMap<String, Vec<u8>> = [
            ("a/keep.bin", bytes(1, 5000)),
            ("a/gone.bin", bytes(2, 70_000)),
            ("a/over.bin", bytes(3, (1 << 20) + 4321)),
            ("b/same.bin", bytes(4, 1234)),
            ("b/c/deep.bin", bytes(5, 10)),
        ]
        .into_iter()
        .map(|(p, b)| (p.to_string(), b))
        .collect();
        Scenario {
            before,
            added: "b/new.bin",
            removed: "a/gone.bin",
            overwritten: "a/over.bin",
            rewritten: "b/same.bin",
            // A different size: longer than the kernel's cached i_size.
            new_bytes: bytes(33, 2 * (1 << 20) + 17),
            added_bytes: bytes(6, 777),
        }
    }

    /// Writes the initial files, with the re-written one dated in the past so that its
    /// re-write gets a different Last-Modified.
    fn setup(&self, fx: &S3Fx) {
        fx.put_all(&self.before);
        fx.backdate(self.rewritten);
    }

    /// The changes behind Silt's back: one new file, one deleted, one overwritten with other
    /// bytes (another size), one re-written with the same bytes (metadata only).
    fn change(&self, fx: &S3Fx) -> (ObjectMeta, ObjectMeta) {
        fx.put(self.added, &self.added_bytes);
        fx.delete(self.removed);
        fx.put(self.overwritten, &self.new_bytes);
        let old = fx.stat(self.rewritten);
        fx.put(self.rewritten, &self.before[self.rewritten]);
        let new = fx.stat(self.rewritten);
        // What S3 gives for "the same bytes again": the ETag (MD5 of the content) is the same,
        // Last-Modified is the time of the new PUT.
        assert_eq!(old.etag, new.etag, "same bytes, same ETag");
        assert!(old.etag.is_some(), "the S3 server gives ETags");
        assert_ne!(old.mtime, new.mtime, "a new PUT has a new Last-Modified");
        (old, new)
    }

    fn after(&self) -> BTreeMap<String, Vec<u8>> {
        let mut after = self.before.clone();
        after.remove(self.removed);
        after.insert(self.added.into(), self.added_bytes.clone());
        after.insert(self.overwritten.into(), self.new_bytes.clone());
        after
    }
}

/// Test 1. Under `never` the mount keeps the view it learned until `silt fs sync`, which
/// reports exactly the changes and makes the mount show exactly the store's state, although
/// the kernel was given every answer with 1h TTLs (plain `stat`s right after the sync).
#[test]
fn never_keeps_the_learned_view_until_sync_s3() {
    let fx = S3Fx::start(false);
    let sc = Scenario::new();
    sc.setup(&fx);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--sync-policy", "never"], dir.path());
    let root = silt.path("data");

    let seen = walk(&root);
    assert_eq!(seen, sc.before, "first walk differs from the store");
    let old_over = std::fs::metadata(root.join(sc.overwritten)).unwrap();

    let (_, rewritten_meta) = sc.change(&fx);
    assert_eq!(fx.contents(), sc.after());

    // `never`: the view is the one learned. The deleted file is still listed, and its bytes
    // (every page was read above) still come from the cache; the overwritten file keeps its
    // old size and bytes; the new file does not exist.
    assert_eq!(walk(&root), sc.before, "the view changed under `never`");
    assert_eq!(
        std::fs::metadata(root.join(sc.overwritten)).unwrap().len(),
        old_over.len()
    );
    assert_eq!(
        errno(std::fs::metadata(root.join(sc.added))),
        libc::ENOENT,
        "a file created behind Silt's back appeared under `never`"
    );
    assert!(!names(&root.join("b")).contains("new.bin"));
    // The CLI sees the same view.
    assert_eq!(
        fs_stat(&silt, &format!("/data/{}", sc.overwritten))["size"],
        old_over.len()
    );

    let o = sync(&silt, "/data", true);
    println!("{}", String::from_utf8_lossy(&o.stdout));
    let r = parse_sync(&o);
    assert_eq!((r.added, r.removed, r.content), (1, 1, 1), "{r:?}");
    // The re-write with the same bytes is a metadata-only change: same ETag, so same content
    // fingerprint, but a new Last-Modified (S3 has no mode; the mtime is part of the metadata
    // fingerprint next to an ETag). Its cached pages stay: only the overwritten and the deleted
    // file's versions are dropped.
    assert_eq!(r.metadata, 1, "{r:?}");
    assert_eq!(r.dropped, 2, "{r:?}");
    assert!(r.checked >= sc.after().len() as u64, "{r:?}");
    assert_eq!(
        r.changes,
        changes(&[
            ("added", "/data/b/new.bin"),
            ("removed", "/data/a/gone.bin"),
            ("content", "/data/a/over.bin"),
            ("metadata", "/data/b/same.bin"),
        ])
    );

    // The mount now shows exactly the store: new bytes of the overwritten file (the kernel had
    // its old pages and size for 1h), the deleted file gone, the new one listed and readable.
    assert_eq!(
        fresh(&root.join(sc.overwritten)).unwrap().size,
        sc.new_bytes.len() as u64
    );
    let over = std::fs::read(root.join(sc.overwritten)).unwrap();
    assert!(
        over == sc.new_bytes,
        "overwritten file after sync: {} bytes, not the new version ({} bytes){}",
        over.len(),
        sc.new_bytes.len(),
        if over.len() <= sc.new_bytes.len() && over[..] == sc.new_bytes[..over.len()] {
            " but a prefix of it (stale kernel size)"
        } else {
            ""
        }
    );
    assert_eq!(errno(fresh(&root.join(sc.removed))), libc::ENOENT);
    assert_eq!(errno(std::fs::read(root.join(sc.removed))), libc::ENOENT);
    assert_eq!(std::fs::read(root.join(sc.added)).unwrap(), sc.added_bytes);
    let want = sc.after();
    assert_eq!(
        walk(&root),
        want,
        "the mount differs from the store after sync"
    );
    for d in ["", "a", "b", "b/c"] {
        let store_names: BTreeSet<String> = want
            .keys()
            .filter_map(|p| {
                let rest = if d.is_empty() {
                    p.as_str()
                } else {
                    p.strip_prefix(&format!("{d}/"))?
                };
                Some(rest.split('/').next().unwrap().to_string())
            })
            .collect();
        assert_eq!(names(&root.join(d)), store_names, "readdir of /data/{d}");
    }
    // The metadata-only change: the new mtime, the same bytes.
    let m = fresh(&root.join(sc.rewritten)).unwrap();
    assert_eq!(Some(m.mtime), rewritten_meta.mtime);
    // A second sync finds nothing to do.
    let r = parse_sync(&sync(&silt, "/data", true));
    assert_eq!(
        (r.added, r.removed, r.content, r.metadata, r.dropped),
        (0, 0, 0, 0, 0),
        "{r:?}"
    );
    assert!(r.changes.is_empty(), "{r:?}");
    silt.stop();
}

/// Test 2. Under `always` every change is visible at once through the mount, without any sync
/// command, and every read is exactly one version.
#[test]
fn always_shows_every_change_at_once_s3() {
    let fx = S3Fx::start(false);
    let sc = Scenario::new();
    sc.setup(&fx);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--sync-policy", "always"], dir.path());
    let root = silt.path("data");
    assert_eq!(walk(&root), sc.before);

    let (_, rewritten_meta) = sc.change(&fx);

    // The overwritten file: new size and new bytes at once.
    let m = std::fs::metadata(root.join(sc.overwritten)).unwrap();
    assert_eq!(m.len(), sc.new_bytes.len() as u64);
    let got = std::fs::read(root.join(sc.overwritten)).unwrap();
    assert!(
        got == sc.new_bytes,
        "overwritten file: {} bytes read, neither all of the new version nor {}",
        got.len(),
        if got == sc.before[sc.overwritten] {
            "(it is the old version: stale under `always`)"
        } else {
            "the old one (a torn read)"
        }
    );
    // The deleted file is gone, the new one listed and readable.
    assert_eq!(
        errno(std::fs::metadata(root.join(sc.removed))),
        libc::ENOENT
    );
    assert!(!names(&root.join("a")).contains("gone.bin"));
    assert!(names(&root.join("b")).contains("new.bin"));
    assert_eq!(std::fs::read(root.join(sc.added)).unwrap(), sc.added_bytes);
    // The re-written file: same bytes, the new mtime.
    let m = std::fs::metadata(root.join(sc.rewritten)).unwrap();
    assert_eq!(Some(m.modified().unwrap()), rewritten_meta.mtime);
    assert_eq!(walk(&root), sc.after());

    // A second overwrite, read in a loop right after: each read is one whole version.
    let v3 = bytes(44, 3000);
    fx.put(sc.overwritten, &v3);
    for _ in 0..3 {
        let got = std::fs::read(root.join(sc.overwritten)).unwrap();
        assert!(
            got == v3,
            "read {} bytes, not the latest version",
            got.len()
        );
    }
    assert_eq!(
        fs_stat(&silt, &format!("/data/{}", sc.overwritten))["sync"]["policy"],
        "always"
    );
    silt.stop();
}

/// Test 3. A chmod on a local store is a metadata change: invisible under `never` until
/// `silt fs sync`, which reports it as such; then the mount shows the new mode bits and the
/// file's bytes still come from the cache (no new under-store reads).
/// The kernel keeps directory listings (no opendir), so a directory's mtime must tell it when
/// its copy is stale. A local directory has an mtime of its own that changes only when Silt
/// next stats it: under `always` a name created or removed behind Silt's back must still show
/// in the very next readdir, and under `never` it must not until `silt fs sync`.
#[test]
fn local_directory_listings_follow_the_policy_through_the_kernel_cache() {
    for policy in ["always", "never"] {
        let src = tempfile::tempdir().unwrap();
        write_local(src.path(), &[("d/a".to_string(), b"a".to_vec())]);
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("file://{}", src.path().display());
        let silt = Silt::up(&[("/data", &uri)], &["--sync-policy", policy], dir.path())
            .unwrap_or_else(|e| panic!("{e}"));
        let d = silt.path("data/d");
        for _ in 0..2 {
            assert_eq!(names(&d), ["a"].map(String::from).into(), "{policy}");
        }
        std::fs::write(src.path().join("d/b"), b"b").unwrap();
        std::fs::remove_file(src.path().join("d/a")).unwrap();
        let want_now: BTreeSet<String> = if policy == "always" {
            ["b"].map(String::from).into()
        } else {
            ["a"].map(String::from).into()
        };
        assert_eq!(names(&d), want_now, "{policy}: right after the change");
        sync(&silt, "/data/d", false);
        assert_eq!(
            names(&d),
            ["b"].map(String::from).into(),
            "{policy}: after sync"
        );
        silt.stop();
    }
}

#[test]
fn chmod_on_a_local_store_is_a_metadata_change() {
    let src = tempfile::tempdir().unwrap();
    let data = bytes(7, 3 * (1 << 20) + 99);
    let file = src.path().join("m/f.bin");
    write_local(src.path(), &[("m/f.bin".to_string(), data.clone())]);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", src.path().display());
    let silt = Silt::up(&[("/data", &uri)], &["--sync-policy", "never"], dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let path = silt.path("data/m/f.bin");
    assert!(std::fs::read(&path).unwrap() == data);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&path), 0o444, "0644 shown read-only");
    let fetched = silt.metric("silt_ufs_read_bytes_total");
    assert_eq!(
        fetched,
        data.len() as u64,
        "the first read fetched every byte once"
    );

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(mode(&path), 0o444, "a chmod appeared under `never`");
    assert_eq!(
        fs_stat(&silt, "/data/m/f.bin")["mode"],
        "644",
        "the daemon saw a chmod under `never`"
    );

    let o = sync(&silt, "/data/m/f.bin", false);
    println!("{}", String::from_utf8_lossy(&o.stdout));
    let r = parse_sync(&o);
    assert_eq!(
        (r.checked, r.added, r.removed, r.content, r.metadata, r.dropped),
        (1, 0, 0, 0, 1, 0),
        "{r:?}"
    );
    assert_eq!(r.changes, changes(&[("metadata", "/data/m/f.bin")]));

    // A plain `stat` right after `silt fs sync`: the kernel's attributes were invalidated.
    assert_eq!(
        fresh(&path).unwrap().mode,
        0o400,
        "new mode bits, read-only"
    );
    assert_eq!(mode(&path), 0o400);
    assert_eq!(fs_stat(&silt, "/data/m/f.bin")["mode"], "600");
    // The bytes are still served from the cache: through the mount and through the daemon
    // (`silt fs cat` reads Silt's page cache, not the kernel's), with no under-store read.
    assert!(std::fs::read(&path).unwrap() == data);
    let o = silt.cli(&["fs", "cat", "/data/m/f.bin"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout == data, "silt fs cat after a metadata change");
    assert_eq!(
        silt.metric("silt_ufs_read_bytes_total"),
        fetched,
        "a metadata-only change made Silt fetch the file again"
    );
    assert!(silt.metric("silt_meta_metadata_changes_total") >= 1);
    silt.stop();
}

/// Test 4. `--sync-rules`: the longest prefix wins. An overwrite under an `always` prefix is
/// visible at once, one under the `never` default only after `silt fs sync` — or after the
/// prefix is switched to `always` at runtime.
#[test]
fn per_prefix_rules_and_runtime_policy_change_s3() {
    let fx = S3Fx::start(false);
    let live_v1 = bytes(1, 3000);
    let frozen_v1 = bytes(2, 4000);
    fx.put("live/x.bin", &live_v1);
    fx.put("frozen/y.bin", &frozen_v1);
    fx.put("frozen/z.bin", &frozen_v1);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &[
            "--sync-policy",
            "never",
            "--sync-rules",
            "/data/live=always",
        ],
        dir.path(),
    );
    let root = silt.path("data");
    let x = root.join("live/x.bin");
    let y = root.join("frozen/y.bin");
    let z = root.join("frozen/z.bin");
    assert!(std::fs::read(&x).unwrap() == live_v1);
    assert!(std::fs::read(&y).unwrap() == frozen_v1);
    assert!(std::fs::read(&z).unwrap() == frozen_v1);

    let s = fs_stat(&silt, "/data/live/x.bin");
    assert_eq!(s["sync"]["policy"], "always", "{s}");
    assert_eq!(s["sync"]["rule"], "/data/live", "{s}");
    let s = fs_stat(&silt, "/data/frozen/y.bin");
    assert_eq!(s["sync"]["policy"], "never", "{s}");
    assert_eq!(s["sync"]["rule"], "/", "{s}");
    assert!(s["sync"]["checked_secs_ago"].is_number(), "{s}");

    // Longer versions: a stale kernel size would cut them short.
    let live_v2 = bytes(11, 5000);
    let frozen_v2 = bytes(22, 6000);
    fx.put("live/x.bin", &live_v2);
    fx.put("frozen/y.bin", &frozen_v2);
    fx.put("frozen/z.bin", &frozen_v2);

    assert!(
        std::fs::read(&x).unwrap() == live_v2,
        "an overwrite under the `always` rule is not visible at once"
    );
    assert!(
        std::fs::read(&y).unwrap() == frozen_v1,
        "an overwrite under `never` became visible without sync"
    );
    assert!(std::fs::read(&z).unwrap() == frozen_v1);

    let r = parse_sync(&sync(&silt, "/data/frozen/y.bin", false));
    assert_eq!((r.content, r.dropped), (1, 1), "{r:?}");
    assert_eq!(fresh(&y).unwrap().size, frozen_v2.len() as u64);
    assert!(std::fs::read(&y).unwrap() == frozen_v2);
    // z was not synced: still the old version.
    assert!(std::fs::read(&z).unwrap() == frozen_v1);

    // Switched to `always` at runtime: Silt asks the store on the next open or stat, without
    // sync (the kernel's entries from `never` were invalidated by the switch; the mount-side
    // check is `runtime_switch_to_always_reaches_the_kernel_caches`).
    let o = silt.cli(&["fs", "sync-policy", "/data/frozen", "always"]);
    assert!(o.status.success(), "{}", stderr(&o));
    println!("{}", String::from_utf8_lossy(&o.stdout));
    let o = silt.cli(&["fs", "cat", "/data/frozen/z.bin"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        o.stdout == frozen_v2,
        "silt fs cat after `sync-policy always`"
    );
    let s = fs_stat(&silt, "/data/frozen/z.bin");
    assert_eq!(s["sync"]["policy"], "always", "{s}");
    assert_eq!(s["sync"]["rule"], "/data/frozen", "{s}");
    assert_eq!(s["size"], frozen_v2.len(), "{s}");
    assert_eq!(fresh(&z).unwrap().size, frozen_v2.len() as u64);
    let got = std::fs::read(&z).unwrap();
    assert!(
        got == frozen_v2,
        "after `sync-policy always`: {} bytes read, {}",
        got.len(),
        if got == frozen_v1 {
            "the old version".to_string()
        } else if got[..] == frozen_v2[..got.len().min(frozen_v2.len())] {
            format!(
                "a prefix of the new version (the kernel kept the old size {})",
                frozen_v1.len()
            )
        } else {
            "a mix".to_string()
        }
    );
    // Showing the policy of a path without setting it.
    let o = silt.cli(&["fs", "sync-policy", "/data/live/x.bin"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("always") && text.contains("/data/live"),
        "{text}"
    );
    silt.stop();
}

/// Ten objects at the root of the mount, for the listing tests.
fn ten() -> BTreeMap<String, Vec<u8>> {
    (0..10)
        .map(|i| (format!("f{i}"), format!("object {i}").into_bytes()))
        .collect()
}

/// Test 5. A recursive sync whose listing fails on page 3 of 5 reports the failure and changes
/// nothing: the directory still shows exactly the old names (never empty, never partial).
#[test]
fn sync_with_a_listing_failing_on_page_three_changes_nothing() {
    let fx = S3Fx::start(true);
    fx.put_all(&ten());
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &[
            "--sync-policy",
            "never",
            "--ufs-list-page",
            "2",
            "--ufs-retries",
            "0",
        ],
        dir.path(),
    );
    let root = silt.path("data");
    let old: BTreeSet<String> = ten().into_keys().collect();
    assert_eq!(names(&root), old);

    fx.put("f10", b"object 10");
    // Pages 1 and 2 pass, then every listing request fails (no retries).
    fx.proxy().reset_counts();
    fx.proxy()
        .inject(S3Op::List, 2, 1000, FaultAction::internal_error());
    let o = sync(&silt, "/data", true);
    let msg = stderr(&o);
    println!("failed sync: {}{msg}", String::from_utf8_lossy(&o.stdout));
    assert!(!o.status.success(), "sync succeeded over a failing listing");
    assert!(
        o.stdout.is_empty(),
        "a failed sync printed a report: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let lower = msg.to_lowercase();
    assert!(
        lower.contains("list") && (lower.contains("internal") || lower.contains("500")),
        "the message should say the store's listing failed: {msg}"
    );
    assert!(
        fx.proxy().counts().list >= 3,
        "the fault was not reached: {}",
        fx.proxy().counts()
    );

    // The old view, whole: through the mount and through the CLI.
    assert_eq!(names(&root), old, "a failed sync left a partial directory");
    for n in &old {
        assert_eq!(
            std::fs::read(root.join(n)).unwrap(),
            ten()[n],
            "{n} after the failed sync"
        );
    }
    let o = silt.cli(&["fs", "ls", "/data"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 10);

    fx.proxy().clear_faults();
    let o = sync(&silt, "/data", true);
    println!("{}", String::from_utf8_lossy(&o.stdout));
    let r = parse_sync(&o);
    assert_eq!((r.added, r.removed, r.content), (1, 0, 0), "{r:?}");
    assert_eq!(r.changes, changes(&[("added", "/data/f10")]));
    let mut new = old.clone();
    new.insert("f10".into());
    assert_eq!(names(&root), new);
    assert_eq!(std::fs::read(root.join("f10")).unwrap(), b"object 10");
    silt.stop();
}

/// Test 6. 503 SlowDown on HEAD and LIST. Under `always` a stat is an error (not stale data);
/// under `interval` a forced revalidation fails and says so, and the old view stays — also
/// once it has expired (served stale, counted).
#[test]
fn slow_down_is_an_error_under_always_and_keeps_the_view_under_interval() {
    let fx = S3Fx::start(true);
    let v1 = bytes(1, 1000);
    let v2 = bytes(2, 2000);
    fx.put("f.bin", &v1);
    fx.put("g.bin", &v1);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &["--sync-policy", "always", "--ufs-retries", "0"],
        dir.path(),
    );
    let root = silt.path("data");
    let f = root.join("f.bin");
    let g = root.join("g.bin");
    assert_eq!(
        names(&root),
        BTreeSet::from(["f.bin".into(), "g.bin".into()])
    );
    assert!(std::fs::read(&f).unwrap() == v1);
    assert!(std::fs::read(&g).unwrap() == v1);

    let throttle = |fx: &S3Fx| {
        for op in [S3Op::Head, S3Op::List] {
            fx.proxy()
                .inject(op, 0, usize::MAX, FaultAction::slow_down());
        }
    };

    // `always`: the store's answer or an error.
    throttle(&fx);
    let e = errno(std::fs::metadata(&f));
    println!("stat under `always` with SlowDown: {}", errno_name(e));
    assert!(
        [libc::EAGAIN, libc::EIO].contains(&e),
        "stat under SlowDown: {}",
        errno_name(e)
    );
    let e = errno(std::fs::read_dir(&root).and_then(|d| d.collect::<Result<Vec<_>, _>>()));
    println!("readdir under `always` with SlowDown: {}", errno_name(e));
    assert!(
        [libc::EAGAIN, libc::EIO].contains(&e),
        "readdir under SlowDown: {}",
        errno_name(e)
    );
    let o = silt.cli(&["fs", "stat", "/data/f.bin"]);
    assert!(
        !o.status.success(),
        "silt fs stat served stale data under `always`"
    );
    println!("silt fs stat under SlowDown: {}", stderr(&o));
    assert!(fx.proxy().counts().head > 0);
    assert_eq!(silt.metric("silt_meta_stale_served_total"), 0);
    fx.proxy().clear_faults();
    assert_eq!(std::fs::metadata(&f).unwrap().len(), v1.len() as u64);
    assert_eq!(names(&root).len(), 2);

    // `interval=1h`: what was learned just now is trusted; a forced revalidation fails and
    // reports it, and changes nothing.
    let o = silt.cli(&["fs", "sync-policy", "/data", "interval=1h"]);
    assert!(o.status.success(), "{}", stderr(&o));
    fx.put("f.bin", &v2);
    throttle(&fx);
    for (path, recursive) in [("/data/f.bin", false), ("/data", true)] {
        let o = sync(&silt, path, recursive);
        let msg = stderr(&o);
        println!("sync {path} under SlowDown: {msg}");
        assert!(!o.status.success(), "sync {path} succeeded under SlowDown");
        let lower = msg.to_lowercase();
        assert!(
            lower.contains("slowdown") || lower.contains("throttl") || lower.contains("503"),
            "the message should say the store throttled: {msg}"
        );
    }
    assert_eq!(std::fs::metadata(&f).unwrap().len(), v1.len() as u64);
    assert!(std::fs::read(&f).unwrap() == v1);
    assert_eq!(fs_stat(&silt, "/data/f.bin")["size"], v1.len());
    assert_eq!(names(&root).len(), 2);

    // Expired (`interval=1ms`): each access revalidates, fails, and is answered from the old
    // view (counted), never with an error. The CLI asks the daemon directly (the kernel keeps
    // f's attributes for the 1h it was given).
    let o = silt.cli(&["fs", "sync-policy", "/data", "interval=1ms"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_eq!(fs_stat(&silt, "/data/f.bin")["size"], v1.len());
        if silt.metric("silt_meta_stale_served_total") > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an expired entry never revalidated"
        );
        // Not a wait for anything: keeps the loop from running CLI processes back to back.
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = silt.cli(&["fs", "ls", "/data"]);
    assert!(
        o.status.success(),
        "listing expired under SlowDown: {}",
        stderr(&o)
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 2);

    // Faults gone: sync succeeds and the mount shows the new version.
    fx.proxy().clear_faults();
    let r = parse_sync(&sync(&silt, "/data", true));
    assert_eq!((r.added, r.removed, r.content), (0, 0, 1), "{r:?}");
    assert_eq!(fresh(&f).unwrap().size, v2.len() as u64);
    assert!(std::fs::read(&f).unwrap() == v2);
    silt.stop();
}

/// Test 7. A HEAD that never gets an answer costs one `ufs_timeout`, then an error — under
/// `always` not stale data, and no hang; once the store answers again, so does the mount.
#[test]
fn hanging_head_times_out_under_always() {
    let fx = S3Fx::start(true);
    let data = bytes(1, 1000);
    fx.put("f.bin", &data);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &[
            "--sync-policy",
            "always",
            "--ufs-timeout",
            "500ms",
            "--ufs-retries",
            "0",
        ],
        dir.path(),
    );
    let f = silt.path("data/f.bin");
    assert!(std::fs::read(&f).unwrap() == data);

    fx.proxy()
        .inject(S3Op::Head, 0, usize::MAX, FaultAction::Hang);
    let e = errno(std::fs::metadata(&f));
    println!("stat with a hanging HEAD: {}", errno_name(e));
    assert!(
        [libc::ETIMEDOUT, libc::EIO].contains(&e),
        "stat with a hanging HEAD: {}",
        errno_name(e)
    );
    assert!(fx.proxy().counts().head > 0, "no HEAD reached the proxy");

    // Once the server answers again, so does the mount (stats failing at once meanwhile:
    // the store stays known stalled for one deadline, then is probed).
    fx.proxy().clear_faults();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let meta = loop {
        match std::fs::metadata(&f) {
            Ok(m) => break m,
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                assert!(std::time::Instant::now() < deadline, "never answered again");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("stat after the fault: {e}"),
        }
    };
    assert_eq!(meta.len(), data.len() as u64);
    assert!(std::fs::read(&f).unwrap() == data);
    silt.stop();
}

/// Test 8. The first walk of a tree (readdir of every directory, stat of every file) costs
/// one recursive listing, split by top-level directory: one delimited LIST finds the 5, then
/// one LIST per subtree (each fits the default page of 1000 keys), and no HEAD. A second walk
/// costs nothing.
#[test]
fn walking_a_tree_costs_one_listing() {
    let fx = S3Fx::start(true);
    let mut files = BTreeMap::new();
    for a in 0..5 {
        for b in 0..5 {
            for f in 0..4 {
                files.insert(
                    format!("d{a}/e{b}/f{f}"),
                    vec![(a * 25 + b * 4 + f) as u8; f],
                );
            }
        }
    }
    fx.put_all(&files);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&[], dir.path());
    println!("requests of the mount's start-up: {}", fx.proxy().counts());
    fx.proxy().reset_counts();

    let root = silt.path("data");
    let stat_walk = || {
        let mut seen = BTreeMap::new();
        let mut dirs = vec![root.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::metadata(&p).unwrap();
                if m.is_dir() {
                    dirs.push(p);
                } else {
                    let rel = p
                        .strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    seen.insert(rel, m.len() as usize);
                }
            }
        }
        seen
    };
    let want: BTreeMap<String, usize> = files.iter().map(|(p, b)| (p.clone(), b.len())).collect();
    assert_eq!(stat_walk(), want);
    let c = fx.proxy().counts();
    println!("first walk of {} files in 30 directories: {c}", files.len());
    assert_eq!(
        (c.list, c.head, c.total()),
        (1 + 5, 0, 1 + 5),
        "first walk: {c}"
    );
    assert_eq!(silt.metric("silt_meta_sweeps_total"), 1);

    fx.proxy().reset_counts();
    assert_eq!(stat_walk(), want);
    let c = fx.proxy().counts();
    assert_eq!(c.total(), 0, "second walk: {c}");
    silt.stop();
}

/// Regression: `silt fs sync` used to return before the kernel's caches were invalidated. The
/// daemon handed the changes to its `silt-fuse-inval` thread (crates/silt-fuse/src/lib.rs,
/// `mount`) through a channel and answered the CLI at once, so a `stat` or `read` through the
/// mount right after `silt fs sync` returned could still be answered from the kernel's old
/// attributes (old mode; old size, which cut a read of a longer new version short: observed
/// "read 970 bytes: a prefix of the new version (980 bytes)", i.e. bytes the store never held
/// as one object). A wide tree (many invalidations queued before the ones checked) widened the
/// window: about one round in ten showed it here.
#[test]
fn sync_returns_after_the_kernel_caches_are_invalidated() {
    let src = tempfile::tempdir().unwrap();
    let n = 1000;
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| (format!("d/f{i:04}"), vec![1u8; 10]))
        .collect();
    write_local(src.path(), &files);
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", src.path().display());
    let silt = Silt::up(&[("/data", &uri)], &["--sync-policy", "never"], dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    // The kernel learns every inode (1h TTLs).
    for (p, _) in &files {
        std::fs::metadata(silt.path(&format!("data/{p}"))).unwrap();
    }
    // Changes are handed to the kernel in path order: these two come last.
    let chmodded = silt.path(&format!("data/d/f{:04}", n - 2));
    let rewritten = format!("d/f{:04}", n - 1);
    let rounds = 60;
    let mut stale = Vec::new();
    for round in 0..rounds {
        let mode = if round % 2 == 0 { 0o600 } else { 0o644 };
        for (p, _) in &files[..n - 1] {
            std::fs::set_permissions(src.path().join(p), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        let data = bytes(round, 100 + 10 * round as usize);
        write_local(src.path(), &[(rewritten.clone(), data.clone())]);
        let r = parse_sync(&sync(&silt, "/data/d", true));
        assert_eq!((r.metadata, r.content), (n as u64 - 1, 1), "{r:?}");
        // Right after `silt fs sync` returned: plain stat and read.
        let got = std::fs::read(silt.path(&format!("data/{rewritten}"))).unwrap();
        let got_mode = std::fs::metadata(&chmodded).unwrap().permissions().mode() & 0o7777;
        if got_mode != mode & !0o222 || got != data {
            let what = if got == data {
                "the new version".to_string()
            } else if data.starts_with(&got) {
                format!("{} bytes: a prefix of the new version", got.len())
            } else if let Some(r) = (0..round).find(|r| got == bytes(*r, 100 + 10 * *r as usize)) {
                format!("the version of round {r}")
            } else {
                format!("{} bytes of no version", got.len())
            };
            stale.push(format!(
                "round {round}: mode {got_mode:o} (want {:o}); read {what} ({} bytes)",
                mode & !0o222,
                data.len()
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{} of {rounds} rounds showed the old state right after `silt fs sync` returned:\n{}",
        stale.len(),
        stale.join("\n")
    );
    silt.stop();
}

/// Regression: switching a prefix to `always` at runtime (`silt fs sync-policy PATH always`)
/// used to leave the kernel's caches alone: attributes and entries the kernel had been given
/// under the old policy (with `attr_ttl`/`entry_ttl`, 1h by default) kept answering `stat`
/// through the mount without asking Silt, so `always` ("every open, stat and directory read
/// asks the store") did not hold for them until those TTLs ran out.
#[test]
fn runtime_switch_to_always_reaches_the_kernel_caches() {
    let fx = S3Fx::start(false);
    let v1 = bytes(1, 4000);
    let v2 = bytes(2, 6000);
    fx.put("frozen/z.bin", &v1);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--sync-policy", "never"], dir.path());
    let z = silt.path("data/frozen/z.bin");
    assert!(std::fs::read(&z).unwrap() == v1);
    fx.put("frozen/z.bin", &v2);
    let o = silt.cli(&["fs", "sync-policy", "/data/frozen", "always"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The first thing after the switch: a stat through the mount (nothing has asked Silt
    // yet, which would learn the change and invalidate the kernel's copy).
    let len = std::fs::metadata(&z).unwrap().len();
    // Silt itself answers with the store's current state.
    assert_eq!(fs_stat(&silt, "/data/frozen/z.bin")["size"], v2.len());
    assert_eq!(
        len,
        v2.len() as u64,
        "stat through the mount after `sync-policy always` was answered from the kernel's cache"
    );
    silt.stop();
}
