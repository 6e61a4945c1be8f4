//! Integration tests on real FUSE mounts over a local directory and a real S3 server.

mod common;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use rand::{Rng, SeedableRng};
use silt_testkit::S3Server;

/// A backend under test: a URI to mount and a way to write objects behind Silt's back.
enum Backend {
    Local(tempfile::TempDir),
    S3 {
        server: Box<S3Server>,
        bucket: String,
        rt: tokio::runtime::Runtime,
        store: silt_ufs::DynStore,
    },
}

impl Backend {
    fn local() -> Self {
        Backend::Local(tempfile::tempdir().unwrap())
    }

    fn s3() -> Self {
        let server = S3Server::start();
        let bucket = "silt-test".to_string();
        server.create_bucket(&bucket);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = rt
            .block_on(silt_ufs::open_store(
                &format!("s3://{bucket}/ds"),
                &server.s3_options(),
            ))
            .unwrap();
        Backend::S3 {
            server: Box::new(server),
            bucket,
            rt,
            store,
        }
    }

    fn uri(&self) -> String {
        match self {
            Backend::Local(d) => format!("file://{}", d.path().display()),
            Backend::S3 { bucket, .. } => format!("s3://{bucket}/ds"),
        }
    }

    /// Options silt needs to reach the backend.
    fn args(&self) -> Vec<String> {
        match self {
            Backend::Local(_) => vec![],
            Backend::S3 { server, .. } => s3_args(server),
        }
    }

    fn put(&self, path: &str, data: &[u8]) {
        match self {
            Backend::Local(d) => {
                let p = d.path().join(path);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                // Write a new file and rename it in, as an out-of-band writer would.
                let tmp = p.with_extension("tmp-upload");
                std::fs::write(&tmp, data).unwrap();
                std::fs::rename(&tmp, &p).unwrap();
            }
            Backend::S3 { rt, store, .. } => {
                rt.block_on(store.write(path, Bytes::copy_from_slice(data)))
                    .unwrap();
            }
        }
    }

    /// An out-of-band removal of `path`.
    fn delete(&self, path: &str) {
        match self {
            Backend::Local(d) => std::fs::remove_file(d.path().join(path)).unwrap(),
            Backend::S3 { rt, store, .. } => rt.block_on(store.delete(path)).unwrap(),
        }
    }

    fn put_many(&self, files: &[(String, Vec<u8>)]) {
        match self {
            Backend::Local(d) => write_local(d.path(), files),
            Backend::S3 { rt, store, .. } => rt.block_on(async {
                use futures::stream::{self, StreamExt};
                let results: Vec<_> = stream::iter(files.iter())
                    .map(|(p, b)| store.write(p, Bytes::copy_from_slice(b)))
                    .buffer_unordered(16)
                    .collect()
                    .await;
                for r in results {
                    r.unwrap();
                }
            }),
        }
    }
}

fn up(backend: &Backend, extra: &[&str], dir: &Path) -> Silt {
    Silt::up_data(&backend.uri(), backend.args(), extra, dir)
}

fn differential(backend: Backend, extra: &[&str]) {
    differential_ordered(backend, extra, false);
}

/// `differential`, the random ranges read first (on a cold cache, many first opens at once)
/// if `ranges_first`. Returns `silt report` as it was at the end.
fn differential_ordered(backend: Backend, extra: &[&str], ranges_first: bool) -> serde_json::Value {
    let files = Arc::new(dataset());
    backend.put_many(&files);
    let dir = tempfile::tempdir().unwrap();
    // A small memory tier so reads exercise memory, disk and the store.
    let mut args = vec!["--memory-capacity", "4MiB"];
    args.extend(extra);
    let silt = up(&backend, &args, dir.path());

    // Whole files, read with std (and the kernel's read-ahead).
    let whole_files = || {
        for (p, b) in files.iter() {
            let got = std::fs::read(silt.path(&format!("data/{p}"))).unwrap();
            assert!(got == *b, "{p}: whole-file read differs");
        }
    };
    if !ranges_first {
        whole_files();
    }
    // Random ranges from many threads at once, each comparing with the source bytes.
    let root = silt.path("data");
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let files = files.clone();
            let root = root.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                for _ in 0..150 {
                    let (p, b) = &files[rng.gen_range(0..files.len())];
                    let f = File::open(root.join(p)).unwrap();
                    let off = rng.gen_range(0..=b.len() as u64 + 10);
                    let len = rng.gen_range(0..3 << 20);
                    let mut buf = vec![0u8; len];
                    let mut n = 0;
                    while n < len {
                        let r = f.read_at(&mut buf[n..], off + n as u64).unwrap();
                        if r == 0 {
                            break;
                        }
                        n += r;
                    }
                    let start = (off as usize).min(b.len());
                    let end = (off as usize + len).min(b.len());
                    assert_eq!(n, end - start, "{p} @{off}+{len}: short or long read");
                    assert!(buf[..n] == b[start..end], "{p} @{off}+{len}: bytes differ");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    if ranges_first {
        whole_files();
    }
    // Python's open() reads the same bytes. It also asks whether the file is a terminal
    // (ioctl TCGETS): the answer must be ENOTTY, not "ioctl not implemented" (ENOSYS).
    let (p, b) = &files[7];
    let script = "import sys, hashlib, fcntl, termios\n\
        f = open(sys.argv[1], 'rb')\n\
        print(hashlib.sha256(f.read()).hexdigest())\n\
        try:\n    fcntl.ioctl(f.fileno(), termios.TCGETS, bytes(64))\n    print('no error')\n\
        except OSError as e:\n    print(e.errno)\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(silt.path(&format!("data/{p}")))
        .output()
        .unwrap();
    assert!(out.status.success());
    let want = {
        use std::fmt::Write;
        let digest = sha256(b);
        digest.iter().fold(String::new(), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(want.as_str()));
    assert_eq!(lines.next(), Some("25"), "TCGETS must fail with ENOTTY");
    // Listing matches the source.
    let mut names: Vec<String> = std::fs::read_dir(silt.path("data/b"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = files
        .iter()
        .filter_map(|(p, _)| {
            p.strip_prefix("b/")
                .map(|r| r.split('/').next().unwrap().to_string())
        })
        .collect();
    want.sort();
    want.dedup();
    assert_eq!(names, want);
    let report = silt.report();
    // Read from the store through the daemon, fetched whole at open, or read by the kernel
    // from the store's own file.
    let opened_from_store = [
        "silt_fuse_opens_filled_total",
        "silt_fuse_opens_source_total",
    ]
    .iter()
    .any(|m| report["metrics"][m].as_u64().is_some_and(|n| n > 0));
    assert!(
        report["bytes_by_source"]["under_store"].as_u64().unwrap() > 0 || opened_from_store,
        "nothing was read from the store"
    );
    silt.stop();
    report
}

/// Minimal SHA-256 via the system's sha256sum, to compare with Python's digest.
fn sha256(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    let hex = String::from_utf8_lossy(&out.stdout);
    let hex = hex.split_whitespace().next().unwrap();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn differential_reads_local_dir() {
    differential(Backend::local(), &[]);
}

#[test]
fn differential_reads_s3() {
    differential(Backend::s3(), &[]);
}

/// The same reads with `fuse_cold_direct_io`: each file's first open bypasses the page cache
/// (no read-ahead: every read(2) is a request of its own size), later ones do not.
#[test]
fn differential_reads_local_dir_cold_direct_io() {
    differential(Backend::local(), &["--fuse-cold-direct-io", "true"]);
}

/// The same reads with `fuse_open_fill_max` above every file's size: each cold open fetches
/// its file whole and opens it in passthrough, many opens at once from 8 threads.
#[test]
fn differential_reads_s3_open_fill() {
    let report = differential_ordered(Backend::s3(), &["--fuse-open-fill-max", "1GiB"], true);
    let filled = &report["metrics"]["silt_fuse_opens_filled_total"];
    assert!(
        filled.as_u64().unwrap() > 0,
        "no open fetched its file: {filled}"
    );
}

/// How the mount served each recent open of a path ending in `name`, oldest first: (mode,
/// reason) as `silt report` gives them.
fn opens_of(silt: &Silt, name: &str) -> Vec<(String, String)> {
    let opens = silt.report()["opens"]["recent"].clone();
    opens
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["path"].as_str().unwrap_or("").ends_with(name))
        .map(|o| {
            (
                o["mode"].as_str().unwrap().to_string(),
                o["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The same reads with `fuse_source_passthrough`: each cold open hands the kernel the store's
/// own file while the cache is filled behind it, many opens at once from 8 threads, so opens
/// meet files half filled, filled, and being filled.
#[test]
fn differential_reads_local_dir_source_passthrough() {
    let report = differential_ordered(
        Backend::local(),
        &["--fuse-source-passthrough", "true"],
        true,
    );
    let source = &report["metrics"]["silt_fuse_opens_source_total"];
    assert!(
        source.as_u64().unwrap() > 0,
        "no open read the store's file: {source}"
    );
}

const FROM_SOURCE: &str = "the store's own file (the cache filled behind)";

/// Waits until no fill behind a reader of the store's own file is in flight.
fn fills_behind_done(silt: &Silt) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while silt.metric("silt_fills_behind_started_total")
        != silt.metric("silt_fills_behind_finished_total")
    {
        assert!(
            Instant::now() < deadline,
            "a fill behind a reader never ended"
        );
    }
}

/// `fuse_source_passthrough`: a cold open of a file of a `file://` store hands the kernel the
/// store's own file (no byte through the daemon) and fills the cache behind the reader: the
/// next open reads the local copy, and the store's bytes were read once, by the fill.
#[test]
fn source_passthrough_reads_the_store_file_and_fills_the_cache_behind() {
    let backend = Backend::local();
    let data = bytes(41, (5 << 20) + 3);
    backend.put("a.bin", &data);
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &["--fuse-source-passthrough", "true"], dir.path());
    let read = |mut f: &File| {
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        got
    };
    let first = File::open(silt.path("data/a.bin")).unwrap();
    assert!(read(&first) == data, "the store's file read wrong bytes");
    let passthrough = |reason: &str| ("passthrough".to_string(), reason.to_string());
    assert_eq!(opens_of(&silt, "a.bin"), [passthrough(FROM_SOURCE)]);
    fills_behind_done(&silt);
    let fetched = silt.metric("silt_ufs_read_bytes_total");
    assert_eq!(
        fetched,
        data.len() as u64,
        "the fill fetched each byte once"
    );

    // Opened again while the first handle is open: it shares that handle's file, the store's.
    let second = File::open(silt.path("data/a.bin")).unwrap();
    assert!(read(&second) == data);
    assert_eq!(opens_of(&silt, "a.bin")[1], passthrough(FROM_SOURCE));
    drop((first, second));
    // Once both are released, the filled copy. The kernel sends the release after close(2)
    // has returned, and an open before it shares the store's file still: opened until not.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = std::fs::read(silt.path("data/a.bin")).unwrap();
        assert!(got == data, "the filled copy read wrong bytes");
        let last = opens_of(&silt, "a.bin").pop().unwrap();
        if last != passthrough(FROM_SOURCE) {
            assert_eq!(last, passthrough("whole file in local disk tier"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store's file was never released"
        );
    }
    assert_eq!(
        silt.metric("silt_ufs_read_bytes_total"),
        fetched,
        "the second open read the store again"
    );
    silt.stop();

    // Off (the default), and on under a writable prefix (a writer there would change the
    // store's file under the reader): the same cold open goes through the daemon.
    for extra in [
        &[][..],
        &[
            "--fuse-source-passthrough",
            "true",
            "--write-type",
            "through",
        ],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let silt = up(&backend, extra, dir.path());
        assert!(std::fs::read(silt.path("data/a.bin")).unwrap() == data);
        assert_eq!(opens_of(&silt, "a.bin")[0].0, "daemon", "{extra:?}");
        silt.stop();
    }
}

/// A store file that changed after Silt read its metadata is never handed to the kernel: not
/// one rewritten in place (new bytes, new mtime), not a link put in its place to a file
/// elsewhere with the same size and mtime. Such an open is read through the daemon, which
/// finds the version it knew gone (ESTALE): never the new bytes, never the link's target.
#[test]
fn source_passthrough_hands_over_only_the_version_silt_knows() {
    use std::io::Write;
    let backend = Backend::local();
    let Backend::Local(root) = &backend else {
        unreachable!()
    };
    let (v1, v2) = (bytes(51, 200_000), bytes(52, 200_000));
    backend.put("inplace.bin", &v1);
    backend.put("linked.bin", &v1);
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &["--fuse-source-passthrough", "true"], dir.path());
    // Stat'ed through the mount: the versions Silt knows (kept for the sync interval, 1 h).
    for name in ["inplace.bin", "linked.bin"] {
        let md = std::fs::metadata(silt.path(&format!("data/{name}"))).unwrap();
        assert_eq!(md.len(), v1.len() as u64);
    }
    let src = |name: &str| root.path().join(name);

    let mtime = std::fs::metadata(src("inplace.bin"))
        .unwrap()
        .modified()
        .unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(src("inplace.bin"))
        .unwrap();
    f.write_all(&v2).unwrap();
    f.set_modified(mtime + Duration::from_secs(1)).unwrap();
    drop(f);

    let secret = dir.path().join("secret.bin");
    std::fs::write(&secret, &v2).unwrap();
    let mtime = std::fs::metadata(src("linked.bin"))
        .unwrap()
        .modified()
        .unwrap();
    File::options()
        .write(true)
        .open(&secret)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::remove_file(src("linked.bin")).unwrap();
    std::os::unix::fs::symlink(&secret, src("linked.bin")).unwrap();

    for name in ["inplace.bin", "linked.bin"] {
        match std::fs::read(silt.path(&format!("data/{name}"))) {
            Ok(got) => assert!(got == v1, "{name}: read bytes of a version Silt never knew"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{name}: {e}"),
        }
        let opens = opens_of(&silt, name);
        assert!(
            opens.iter().all(|(_, reason)| reason != FROM_SOURCE),
            "{name}: handed to the kernel: {opens:?}"
        );
    }
    silt.stop();
}

/// `fuse_open_fill_max`: a cold open of a file no larger is served in passthrough from the
/// copy it fetched whole (the kernel then reads it without the daemon); a larger one, and any
/// file with the option off, is read through the daemon as before. A file gone from the store
/// before its open still opens (the fetch fails; its reads answer as they would without it).
#[test]
fn open_fill_fetches_a_small_cold_file_whole_and_passes_it_through() {
    let backend = Backend::local();
    let small = bytes(31, (3 << 20) + 5);
    let large = bytes(32, (5 << 20) + 1);
    let gone = bytes(33, 4096);
    backend.put("small.bin", &small);
    backend.put("large.bin", &large);
    backend.put("gone.bin", &gone);
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &["--fuse-open-fill-max", "4MiB"], dir.path());
    let mode_of = |name: &str| opens_of(&silt, name);
    let got = std::fs::read(silt.path("data/small.bin")).unwrap();
    assert!(got == small, "the filled file read wrong bytes");
    assert_eq!(
        mode_of("small.bin"),
        [(
            "passthrough".to_string(),
            "fetched whole at open".to_string()
        )]
    );
    let got = std::fs::read(silt.path("data/large.bin")).unwrap();
    assert!(got == large, "the large file read wrong bytes");
    assert_eq!(
        mode_of("large.bin")[0].0,
        "daemon",
        "a file above the limit is not fetched whole"
    );

    // Looked up, then removed behind Silt: the open's fetch fails, the open does not.
    let meta = std::fs::metadata(silt.path("data/gone.bin")).unwrap();
    assert_eq!(meta.len(), gone.len() as u64);
    backend.delete("gone.bin");
    let f = File::open(silt.path("data/gone.bin")).expect("an open whose fetch failed");
    assert_eq!(mode_of("gone.bin")[0].0, "daemon");
    // Its bytes, or ESTALE (docs/SEMANTICS.md): never other bytes, never an early end.
    let mut buf = Vec::new();
    match (&f).read_to_end(&mut buf) {
        Ok(_) => assert!(
            buf == gone,
            "a read of a vanished file answered other bytes"
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}"),
    }
    silt.stop();

    // Off (the option's 0): the same cold open goes through the daemon.
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &["--fuse-open-fill-max", "0"], dir.path());
    let got = std::fs::read(silt.path("data/small.bin")).unwrap();
    assert!(got == small);
    let opens = silt.report()["opens"]["recent"].clone();
    assert_eq!(opens[0]["mode"], "daemon", "{opens}");
    silt.stop();
}

/// A fill fetches a file only where a disk tier has room for it without evicting anything: in
/// a full cache the admission policy may refuse what a fill fetched, and the open's reads would
/// fetch it again (B4's hit ratio fell from 0.48 to 0.15 that way). Such an open is served by
/// the daemon as without the option. The memory tier is one page, so it cannot keep what the
/// disk tier refused.
#[test]
fn open_fill_fetches_only_into_free_disk_space() {
    let backend = Backend::local();
    let files: Vec<Vec<u8>> = (0..3).map(|i| bytes(50 + i, 6 << 20)).collect();
    for (i, data) in files.iter().enumerate() {
        backend.put(&format!("f{i}"), data);
    }
    let dir = tempfile::tempdir().unwrap();
    let tier = format!("{}:16MiB", dir.path().join("tier").display());
    let silt = up(
        &backend,
        &[
            "--fuse-open-fill-max",
            "8MiB",
            "--disk-tiers",
            &tier,
            "--memory-capacity",
            "1MiB",
        ],
        dir.path(),
    );
    let mut modes = Vec::new();
    let (mut at_open, mut fetched) = (Vec::new(), Vec::new());
    for (i, data) in files.iter().enumerate() {
        let before = silt.metric("silt_ufs_read_bytes_total");
        let mut f = File::open(silt.path(&format!("data/f{i}"))).unwrap();
        at_open.push(silt.metric("silt_ufs_read_bytes_total") - before);
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        assert!(&got == data, "f{i} read wrong bytes");
        fetched.push(silt.metric("silt_ufs_read_bytes_total") - before);
        let opens = silt.report()["opens"]["recent"].clone();
        let open = opens
            .as_array()
            .unwrap()
            .iter()
            .find(|o| {
                o["path"]
                    .as_str()
                    .unwrap_or("")
                    .ends_with(&format!("/f{i}"))
            })
            .unwrap_or_else(|| panic!("no open of f{i} in {opens}"))
            .clone();
        modes.push((
            open["mode"].as_str().unwrap().to_string(),
            open["reason"].as_str().unwrap().to_string(),
        ));
    }
    let filled = (
        "passthrough".to_string(),
        "fetched whole at open".to_string(),
    );
    // 16 MiB: the first two fit unevicted (6 and 12 MiB used), the third does not (4 MiB free).
    assert_eq!(modes[0], filled, "{modes:?}");
    assert_eq!(modes[1], filled, "{modes:?}");
    assert_eq!(
        modes[2].0, "daemon",
        "a fill into a full disk tier: {modes:?}"
    );
    // The third open fetched nothing: a fill into the full tier, whose refused pages the reads
    // then fetch again, was the cost. (How much the daemon's reads of it fetch in a full cache
    // depends on read-ahead timing: a page refused before it was read is fetched again.)
    assert_eq!(
        at_open,
        [6 << 20, 6 << 20, 0],
        "bytes fetched by each open (fetched in all: {fetched:?})"
    );
    assert_eq!(
        fetched[..2],
        [6 << 20; 2],
        "a filled file read from the store again"
    );
    silt.stop();
}

/// "At most half the FUSE threads fetch at once": against a store whose GETs hang, cold opens
/// beyond the fill slots are opened through the daemon at once instead of queuing behind the
/// hung fetches, and a lookup and another open are still answered, so a frozen store cannot
/// take every FUSE thread through opens. Once the store answers, the waiting opens complete and
/// read their bytes.
#[test]
fn open_fill_leaves_fuse_threads_free_when_the_store_freezes() {
    use silt_testkit::{FaultAction, S3Op};
    let fx = S3Fx::start(true);
    let files: Vec<Vec<u8>> = (0..6)
        .map(|i| bytes(40 + i, (1 << 20) + i as usize))
        .collect();
    for (i, data) in files.iter().enumerate() {
        fx.put(&format!("f{i}"), data);
    }
    let dir = tempfile::tempdir().unwrap();
    // 4 threads: 2 fill slots. A long store deadline, so the hung fetches hold their slots.
    let silt = fx.up(
        &[
            "--fuse-threads",
            "4",
            "--fuse-open-fill-max",
            "4MiB",
            "--ufs-timeout",
            "600s",
        ],
        dir.path(),
    );
    let path = |i: usize| silt.path(&format!("data/f{i}"));
    for (i, data) in files.iter().enumerate().take(4) {
        assert_eq!(std::fs::metadata(path(i)).unwrap().len(), data.len() as u64);
    }
    let proxy = fx.proxy.as_ref().unwrap();
    proxy.inject(S3Op::Get, 0, usize::MAX, FaultAction::Hang);

    // As many cold opens as FUSE threads, each off the test thread so a regression fails
    // instead of hanging the test.
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..4 {
        let (tx, p) = (tx.clone(), path(i));
        std::thread::spawn(move || {
            let _ = tx.send((i, File::open(&p)));
        });
    }
    let wait = Duration::from_secs(120);
    let mut opened = Vec::new();
    for _ in 0..2 {
        let (i, f) = rx
            .recv_timeout(wait)
            .expect("with every fill slot taken by a hung fetch, a cold open did not return");
        opened.push((i, f.unwrap_or_else(|e| panic!("open f{i}: {e}"))));
    }
    // A lookup of a name not seen yet and another open are answered meanwhile.
    let (tx2, rx2) = std::sync::mpsc::channel();
    let (p4, p5) = (path(4), path(5));
    std::thread::spawn(move || {
        let _ = tx2.send((
            std::fs::metadata(&p4).map(|m| m.len()),
            File::open(&p5).map(|_| ()),
        ));
    });
    let (len, open) = rx2
        .recv_timeout(wait)
        .expect("a lookup and an open waited behind the hung fetches");
    assert_eq!(len.unwrap(), files[4].len() as u64);
    open.unwrap();
    // Two fetches hold their slots: no other open came back while the store hangs.
    assert!(
        rx.try_recv().is_err(),
        "more opens returned than a hung store allows"
    );

    proxy.clear_faults();
    for _ in 0..2 {
        let (i, f) = rx
            .recv_timeout(wait)
            .expect("an open waiting on its fetch never returned after the store answered");
        opened.push((i, f.unwrap_or_else(|e| panic!("open f{i}: {e}"))));
    }
    for (i, mut f) in opened {
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        assert!(got == files[i], "f{i} read other bytes");
    }
    silt.stop();
}

/// Pages of `f` (open) in the page cache, by `mincore` over a shared mapping of `len` bytes.
fn resident_pages(f: &File, len: usize) -> usize {
    use std::os::fd::AsRawFd;
    let page = 4096;
    let pages = len.div_ceil(page);
    // SAFETY: a fresh read-only shared mapping of an open file, unmapped below; mincore
    // writes one byte per page into a vector of that many.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let mut vec = vec![0u8; pages];
        let rc = libc::mincore(p, len, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(p, len);
        assert_eq!(rc, 0, "mincore: {err}");
        vec.iter().filter(|b| *b & 1 == 1).count()
    }
}

/// `fuse_cold_direct_io`: the first open of a file reads without filling the kernel's page
/// cache (what a cached open then finds there is nothing), the next open fills it as usual
/// (which shows `mincore` sees this mount's page cache at all), and a file opened the direct
/// way can still be mapped shared (the kernel must have agreed to FUSE_DIRECT_IO_ALLOW_MMAP).
#[test]
fn cold_direct_io_first_open_leaves_the_page_cache_empty() {
    let backend = Backend::local();
    let (f, g) = (bytes(21, (3 << 20) + 5), bytes(22, (1 << 20) + 77));
    backend.put("f.bin", &f);
    backend.put("g.bin", &g);
    let dir = tempfile::tempdir().unwrap();
    // Without passthrough, so the second open is a cached one through the daemon.
    let silt = up(
        &backend,
        &["--fuse-cold-direct-io", "true", "--passthrough", "off"],
        dir.path(),
    );
    let path = silt.path("data/f.bin");
    let first = File::open(&path).unwrap();
    let mut got = Vec::new();
    (&first).read_to_end(&mut got).unwrap();
    assert!(got == f, "the direct open read wrong bytes");
    let mut tail = vec![0u8; 100];
    let n = first.read_at(&mut tail, f.len() as u64 - 5).unwrap();
    assert_eq!(&tail[..n], &f[f.len() - 5..], "a read across the end");
    assert_eq!(first.read_at(&mut tail, f.len() as u64 + 1).unwrap(), 0);

    let second = File::open(&path).unwrap();
    assert_eq!(
        resident_pages(&second, f.len()),
        0,
        "the first open's reads filled the page cache"
    );
    let mut again = Vec::new();
    (&second).read_to_end(&mut again).unwrap();
    assert!(again == f, "the cached open read wrong bytes");
    assert!(
        resident_pages(&second, f.len()) > 0,
        "a cached open's reads left nothing in the page cache"
    );
    let opens = silt.report()["opens"]["recent"].clone();
    let modes: Vec<&str> = opens
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["path"].as_str().unwrap_or("").ends_with("f.bin"))
        .map(|o| o["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["direct", "daemon"], "{opens}");
    drop((first, second));

    // A shared mapping of a file open the direct way reads its bytes.
    let h = File::open(silt.path("data/g.bin")).unwrap();
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh read-only shared mapping of `g.len()` bytes, read then unmapped.
        let mapped = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                g.len(),
                libc::PROT_READ,
                libc::MAP_SHARED,
                h.as_raw_fd(),
                0,
            );
            assert_ne!(
                p,
                libc::MAP_FAILED,
                "mmap of a direct open: {}",
                std::io::Error::last_os_error()
            );
            let v = std::slice::from_raw_parts(p.cast::<u8>(), g.len()).to_vec();
            libc::munmap(p, g.len());
            v
        };
        assert!(mapped == g, "the mapping read wrong bytes");
    }
    silt.stop();
}

fn readdir_10k(backend: Backend) {
    let files: Vec<(String, Vec<u8>)> = (0..10_000)
        .map(|i| (format!("big/e{i:05}"), vec![(i % 251) as u8; i % 7]))
        .collect();
    backend.put_many(&files);
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &[], dir.path());
    let mut names: Vec<String> = std::fs::read_dir(silt.path("data/big"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let want: Vec<String> = (0..10_000).map(|i| format!("e{i:05}")).collect();
    assert_eq!(names.len(), 10_000);
    assert_eq!(names, want);
    // Sizes from readdirplus/lookup agree with the source.
    for i in [0usize, 1, 4999, 9999] {
        let m = std::fs::metadata(silt.path(&format!("data/big/e{i:05}"))).unwrap();
        assert_eq!(m.len(), (i % 7) as u64);
    }
    silt.stop();
}

#[test]
fn readdir_of_10000_entries_local_dir() {
    readdir_10k(Backend::local());
}

#[test]
fn readdir_of_10000_entries_s3() {
    readdir_10k(Backend::s3());
}

fn change_behind_back(backend: Backend) {
    let size = 3 * (1 << 20) + 777;
    let v1 = bytes(11, size);
    let v2 = bytes(22, size);
    backend.put("obj.bin", &v1);
    let dir = tempfile::tempdir().unwrap();
    let ttl = [
        "--sync-policy",
        "interval=300ms",
        "--attr-ttl",
        "300ms",
        "--entry-ttl",
        "300ms",
    ];
    let silt = up(&backend, &ttl, dir.path());
    let path = silt.path("data/obj.bin");
    assert!(std::fs::read(&path).unwrap() == v1);

    // A reader that opened v1 keeps getting v1 bytes, or an error — never v2 bytes.
    let mut held = File::open(&path).unwrap();
    let mut first = vec![0u8; 1 << 20];
    held.read_exact(&mut first).unwrap();
    assert!(first[..] == v1[..1 << 20]);

    backend.put("obj.bin", &v2);

    let mut rest = Vec::new();
    match held.read_to_end(&mut rest) {
        Ok(_) => assert!(rest[..] == v1[1 << 20..], "an open file mixed versions"),
        Err(e) => assert!(
            matches!(e.raw_os_error(), Some(libc::ESTALE) | Some(libc::EIO)),
            "unexpected error {e}"
        ),
    }
    drop(held);

    // New opens see v1 until the TTL has passed, then v2; every read is wholly one version.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reads = 0;
    loop {
        let got = std::fs::read(&path).unwrap();
        reads += 1;
        if got == v2 {
            break;
        }
        assert!(
            got == v1,
            "read {reads} is neither v1 nor v2: a mix of versions"
        );
        assert!(
            Instant::now() < deadline,
            "v2 not visible 30s after the change with a 300ms TTL"
        );
    }
    // And it stays v2, from the cache too.
    for _ in 0..3 {
        assert!(std::fs::read(&path).unwrap() == v2);
    }
    let mut f = File::open(&path).unwrap();
    f.seek(SeekFrom::Start(size as u64 - 10)).unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).unwrap();
    assert!(tail[..] == v2[size - 10..]);
    drop(f);
    silt.stop();
}

#[test]
fn changed_object_seen_after_ttl_never_mixed_local_dir() {
    change_behind_back(Backend::local());
}

#[test]
fn changed_object_seen_after_ttl_never_mixed_s3() {
    change_behind_back(Backend::s3());
}

/// Under a writable prefix (`--write-type through` for the whole mount), a file never opened
/// for writing here is still read in passthrough; an open for writing or a truncate of it
/// while such a reader is open waits for the reader, then fails with EBUSY (the kernel would
/// refuse the daemon open), and succeeds once the reader closed; from then on the file is
/// read through the daemon, so a writer no longer meets passthrough readers.
#[test]
fn a_writable_mount_reads_in_passthrough_until_a_file_is_written_here() {
    let backend = Backend::local();
    let (data, ckpt) = (bytes(41, (2 << 20) + 3), bytes(42, (1 << 20) + 9));
    backend.put("ds.bin", &data);
    backend.put("ckpt.bin", &ckpt);
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &["--write-type", "through"], dir.path());
    let o = silt.cli(&["load", "/data"]);
    assert!(o.status.success(), "load failed: {}", stderr(&o));
    let enabled = silt.report()["passthrough"]["enabled"] == true;
    let last_open = |name: &str| opens_of(&silt, name).pop().unwrap();
    let ds = silt.path("data/ds.bin");

    let reader = File::open(&ds).unwrap();
    let mut got = Vec::new();
    (&reader).read_to_end(&mut got).unwrap();
    assert!(got == data, "the dataset file read other bytes");
    if !enabled {
        // Without kernel support every open is the daemon's: nothing below can differ.
        assert_eq!(last_open("ds.bin").0, "daemon");
        silt.stop();
        return;
    }
    assert_eq!(
        last_open("ds.bin"),
        (
            "passthrough".to_string(),
            "whole file in local disk tier".to_string()
        ),
        "a file never written here was not passed through under a writable prefix"
    );
    let busy = std::fs::OpenOptions::new().write(true).open(&ds);
    assert_eq!(
        busy.map(|_| ()).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EBUSY)),
        "an open for writing met a passthrough reader"
    );
    drop(reader);
    let new = bytes(43, 5000);
    std::fs::write(&ds, &new).unwrap();
    let reader = File::open(&ds).unwrap();
    let mut got = Vec::new();
    (&reader).read_to_end(&mut got).unwrap();
    assert!(got == new, "the rewritten file read other bytes");
    assert_eq!(last_open("ds.bin").0, "daemon", "a file written here");
    // A daemon reader does not stand in a writer's way.
    std::fs::write(&ds, &data).unwrap();
    drop(reader);
    assert!(std::fs::read(&ds).unwrap() == data);

    // truncate(2) by path waits for passthrough readers as an open for writing does.
    let ck = silt.path("data/ckpt.bin");
    let reader = File::open(&ck).unwrap();
    assert_eq!(last_open("ckpt.bin").0, "passthrough");
    // truncate(2), not truncate(1): that one opens the file for writing, then ftruncates.
    let truncate = |len: i64| {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(ck.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        if unsafe { libc::truncate(c.as_ptr(), len) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error())
        }
    };
    assert_eq!(
        truncate(100),
        Err(Some(libc::EBUSY)),
        "a truncate met a passthrough reader"
    );
    let mut got = Vec::new();
    (&reader).read_to_end(&mut got).unwrap();
    assert!(got == ckpt, "the passthrough reader read other bytes");
    drop(reader);
    truncate(100).unwrap();
    assert!(std::fs::read(&ck).unwrap() == ckpt[..100]);
    let Backend::Local(store) = &backend else {
        unreachable!()
    };
    assert!(std::fs::read(store.path().join("ckpt.bin")).unwrap() == ckpt[..100]);
    silt.stop();
}

/// `silt fs free` drops the kernel's pages of the mount too: a read after it is a cold one
/// (the store is read again), not one the page cache answers at warm speed.
#[test]
fn free_drops_the_kernels_pages_too() {
    let backend = Backend::local();
    let (f, g) = (bytes(44, (3 << 20) + 5), bytes(45, (1 << 20) + 7));
    backend.put("d/f.bin", &f);
    backend.put("d/g.bin", &g);
    let dir = tempfile::tempdir().unwrap();
    // Without passthrough, so the mount's own page cache holds what was read.
    let silt = up(&backend, &["--passthrough", "off"], dir.path());
    let open_read = |name: &str, want: &[u8]| {
        let h = File::open(silt.path(&format!("data/d/{name}"))).unwrap();
        let mut got = Vec::new();
        (&h).read_to_end(&mut got).unwrap();
        assert!(got == want, "{name} read other bytes");
        h
    };
    let (hf, hg) = (open_read("f.bin", &f), open_read("g.bin", &g));
    assert!(
        resident_pages(&hf, f.len()) > 0,
        "nothing in the page cache"
    );
    assert!(
        resident_pages(&hg, g.len()) > 0,
        "nothing in the page cache"
    );
    let o = silt.cli(&["fs", "free", "/data/d/f.bin"]);
    assert!(o.status.success(), "free: {}", stderr(&o));
    assert_eq!(
        resident_pages(&hf, f.len()),
        0,
        "free left the kernel's pages"
    );
    assert!(
        resident_pages(&hg, g.len()) > 0,
        "free of another file dropped these"
    );
    let fetched = silt.metric("silt_ufs_read_bytes_total");
    drop(open_read("f.bin", &f));
    assert!(
        silt.metric("silt_ufs_read_bytes_total") >= fetched + f.len() as u64,
        "the read after free was not a cold one"
    );
    // A directory: every file below it.
    let o = silt.cli(&["fs", "free", "/data/d"]);
    assert!(o.status.success(), "free: {}", stderr(&o));
    assert_eq!(resident_pages(&hf, f.len()), 0);
    assert_eq!(
        resident_pages(&hg, g.len()),
        0,
        "free of the directory left pages"
    );
    drop((hf, hg));
    silt.stop();
}

#[test]
fn worker_restart_keeps_disk_tier_warm_and_passthrough() {
    let backend = Backend::s3();
    let files = dataset();
    backend.put_many(&files);
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &[], dir.path());
    let o = silt.cli(&["load", "/data"]);
    assert!(o.status.success(), "load failed: {}", stderr(&o));
    let fetched = silt.metric("silt_ufs_read_bytes_total");
    let total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    assert_eq!(fetched, total, "load fetches every byte once");
    silt.stop();

    // Same state dir: the disk tier is recovered and serves every byte; nothing is refetched.
    let silt = up(&backend, &[], dir.path());
    for (p, b) in &files {
        assert!(
            std::fs::read(silt.path(&format!("data/{p}"))).unwrap() == *b,
            "{p} differs after restart"
        );
    }
    let r = silt.report();
    assert_eq!(
        r["metrics"]["silt_ufs_read_bytes_total"].as_u64().unwrap(),
        0,
        "restart refetched data: {r}"
    );
    assert_eq!(r["bytes_by_source"]["under_store"].as_u64().unwrap(), 0);
    // The listings `load` made were saved at the clean shutdown and restored: every lookup of
    // the warm pass was answered without the store.
    assert_eq!(
        r["metrics"]["silt_meta_cache_misses_total"]
            .as_u64()
            .unwrap(),
        0,
        "metadata not restored after a clean restart: {r}"
    );
    // Every non-empty file was fully cached on disk, so with kernel support each open is
    // passthrough; without it, each is served by the daemon from the disk tier.
    let opens = &r["opens"];
    let nonempty = files.iter().filter(|(_, b)| !b.is_empty()).count() as u64;
    if r["passthrough"]["enabled"] == true {
        assert!(opens["passthrough"].as_u64().unwrap() >= nonempty, "{r}");
    } else {
        assert!(r["bytes_by_source"]["disk"].as_u64().unwrap() > 0, "{r}");
    }
    silt.stop();
}

#[test]
fn down_with_files_open_detaches_and_exits_cleanly() {
    let backend = Backend::local();
    backend.put("x.bin", &bytes(5, 10_000));
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &[], dir.path());
    let held = File::open(silt.path("data/x.bin")).unwrap();
    // stop() checks exit status 0, no panic and no mount left behind.
    silt.stop();
    let mut buf = [0u8; 16];
    assert!(
        held.read_at(&mut buf, 0).is_err(),
        "reads after the daemon exited must fail, not hang"
    );
}

/// Reads a class-per-directory image tree the way torchvision's `ImageFolder` does (sorted
/// class dirs, sorted files, PIL decode to RGB) — with torchvision itself when it is installed —
/// and checks every decoded image equals the one decoded from the source directory.
#[test]
fn python_imagefolder_reads_through_the_mount() {
    let backend = Backend::local();
    let Backend::Local(src) = &backend else {
        unreachable!()
    };
    let gen = r#"
import os, random, sys
from PIL import Image
root = sys.argv[1]
rng = random.Random(3)
for c in range(4):
    os.makedirs(f"{root}/imgs/class{c}", exist_ok=True)
    for i in range(25):
        w, h = rng.randint(16, 300), rng.randint(16, 300)
        img = Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3))
        img.save(f"{root}/imgs/class{c}/{i:03}.{'png' if i % 2 else 'jpg'}")
"#;
    let st = std::process::Command::new("python3")
        .args(["-c", gen])
        .arg(src.path())
        .status()
        .unwrap();
    assert!(
        st.success(),
        "generating images (needs Pillow: scripts/install-deps.sh)"
    );
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &[], dir.path());
    let digest = r#"
import hashlib, os, sys
from PIL import Image
root = sys.argv[1]
try:
    from torchvision.datasets import ImageFolder
    samples = ImageFolder(root).samples
    how = "torchvision"
except ImportError:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for i, c in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith((".jpg", ".jpeg", ".png")):
                    samples.append((os.path.join(dirpath, f), i))
    how = "imagefolder-equivalent"
h = hashlib.sha256()
for path, label in samples:
    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")
        h.update(os.path.relpath(path, root).encode() + bytes([label]) + img.tobytes())
print(len(samples), h.hexdigest(), how)
"#;
    let run = |root: &Path| {
        let o = std::process::Command::new("python3")
            .args(["-c", digest])
            .arg(root)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let through_mount = run(&silt.path("data/imgs"));
    let from_source = run(&src.path().join("imgs"));
    assert!(through_mount.starts_with("100 "), "{through_mount}");
    assert_eq!(through_mount, from_source);
    silt.stop();
}

/// The daemon runs as root and the mount allows other users, so the kernel must enforce the
/// mode bits: a private file of a local under-store stays private, a public one is readable.
#[test]
fn other_users_get_what_the_mode_bits_allow() {
    use std::os::unix::fs::PermissionsExt;
    let backend = Backend::local();
    backend.put("private.txt", b"secret");
    backend.put("public.txt", b"hello");
    let Backend::Local(src) = &backend else {
        unreachable!()
    };
    std::fs::set_permissions(
        src.path().join("private.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(
        src.path().join("public.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // nobody must be able to reach the mountpoint itself.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let silt = up(&backend, &[], dir.path());
    let as_nobody = |path: &Path| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(path)
            .output()
            .unwrap()
    };
    let o = as_nobody(&silt.path("data/public.txt"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, b"hello");
    let o = as_nobody(&silt.path("data/private.txt"));
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Root (the owner) still reads it.
    assert_eq!(
        std::fs::read(silt.path("data/private.txt")).unwrap(),
        b"secret"
    );
    silt.stop();
}

/// A file open through the daemon becomes fully cached while open; a second open of it must
/// not switch the inode to passthrough (the kernel answers such an open with EIO) and both
/// handles read the right bytes.
#[test]
fn second_open_of_a_file_cached_while_open_succeeds() {
    let backend = Backend::local();
    let data = bytes(99, 3 << 20);
    backend.put("f.bin", &data);
    let dir = tempfile::tempdir().unwrap();
    let silt = up(&backend, &[], dir.path());
    let path = silt.path("data/f.bin");
    let first = File::open(&path).unwrap();
    let mut got = vec![0u8; data.len()];
    first.read_exact_at(&mut got, 0).unwrap();
    assert!(got == data, "first handle read wrong bytes");
    // Every page is now in the disk tier, and the first handle is still open.
    let second = File::open(&path).expect("second open of a file open through the daemon");
    let mut again = vec![0u8; data.len()];
    second.read_exact_at(&mut again, 0).unwrap();
    assert!(again == data, "second handle read wrong bytes");
    drop((first, second));
    // Once both are released, a new open may use passthrough again. The kernel sends RELEASE
    // after close(2) returned, so an open right after may still find them open (and is then
    // served by the daemon, correctly): open again until one is passthrough.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let third = std::fs::read(&path).unwrap();
        assert!(third == data);
        let r = silt.report();
        if r["passthrough"]["enabled"] != true
            || r["opens"]["passthrough"].as_u64().unwrap_or(0) >= 1
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no passthrough open once both handles were closed: {r}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    silt.stop();
}

/// `silt fs pin`: a pinned file stays cached through a scan many times the cache's size; a
/// pin larger than the disk tier is refused whole; `silt fs free` drops the pages now and
/// `silt fs stat` says how much is cached and pinned.
#[test]
fn pinned_files_survive_a_scan_and_free_drops_them() {
    let backend = Backend::local();
    let keep: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    backend.put("keep/model.bin", &keep);
    // 48 MiB of scan files against an 8 MiB disk tier and a 2 MiB memory tier.
    let scan: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("scan/{i:02}.bin"), vec![i as u8; 2 << 20]))
        .collect();
    backend.put_many(&scan);
    let dir = tempfile::tempdir().unwrap();
    let tier = format!("{}:8MiB", dir.path().join("tier").display());
    let silt = up(
        &backend,
        // LRU: the pin, not the admission policy, must be what keeps the file.
        &[
            "--disk-tiers",
            &tier,
            "--memory-capacity",
            "2MiB",
            "--eviction-policy",
            "lru",
        ],
        dir.path(),
    );
    let stat = |p: &str| {
        let o = silt.cli(&["fs", "stat", p]);
        assert!(o.status.success(), "stat: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            v["cache"]["cached_bytes"].as_u64().unwrap(),
            v["cache"]["pinned_bytes"].as_u64().unwrap(),
        )
    };
    let o = silt.cli(&["fs", "pin", "/data/keep"]);
    assert!(o.status.success(), "pin: {}", stderr(&o));
    assert_eq!(stat("/data/keep"), (keep.len() as u64, keep.len() as u64));
    assert_eq!(silt.report()["pinned"]["bytes"], keep.len() as u64);
    // Everything would be 51 MiB: refused, with a message, and nothing more is pinned.
    let o = silt.cli(&["fs", "pin", "/data"]);
    assert!(
        !o.status.success(),
        "a pin larger than the cache was accepted"
    );
    assert!(
        stderr(&o).contains("more than the disk tiers can hold"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stat("/data/scan").1, 0);
    // Read the scan files twice over (12 × the disk tier).
    for _ in 0..2 {
        for (p, b) in &scan {
            assert!(std::fs::read(silt.path(&format!("data/{p}"))).unwrap() == *b);
        }
    }
    assert_eq!(
        stat("/data/keep"),
        (keep.len() as u64, keep.len() as u64),
        "the pinned file was evicted by the scan"
    );
    let fetched = silt.metric("silt_ufs_read_bytes_total");
    assert!(std::fs::read(silt.path("data/keep/model.bin")).unwrap() == keep);
    assert_eq!(
        silt.metric("silt_ufs_read_bytes_total"),
        fetched,
        "refetched a pinned file"
    );
    // free: the pages go now, and the pin with them.
    let o = silt.cli(&["fs", "free", "/data/keep"]);
    assert!(o.status.success(), "free: {}", stderr(&o));
    assert_eq!(stat("/data/keep"), (0, 0));
    // unpin of what is not pinned is fine and says so.
    let o = silt.cli(&["fs", "unpin", "/data/keep"]);
    assert!(o.status.success(), "unpin: {}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("0 files"));
    silt.stop();
}

/// `silt load --from-file` resumes after a crash: what the killed daemon had cached (its disk
/// tier survives SIGKILL) is skipped, and only the rest is fetched. Bad lists are refused.
#[test]
fn load_from_a_file_list_resumes_after_sigkill() {
    let backend = Backend::local();
    let a: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| (format!("a/{i}.bin"), bytes(i, 700_000)))
        .collect();
    let b: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("b/{i}.bin"), bytes(100 + i, 900_000)))
        .collect();
    backend.put_many(&a);
    backend.put_many(&b);
    let size = |f: &[(String, Vec<u8>)]| f.iter().map(|(_, d)| d.len() as u64).sum::<u64>();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.txt");
    std::fs::write(&list, "# the dataset\n/data/a\n\n/data/b/0.bin\n/data/b\n").unwrap();
    let list = list.to_str().unwrap();

    let mut silt = up(&backend, &[], dir.path());
    let o = silt.cli(&["load", "/data/a", "--concurrency", "2"]);
    assert!(o.status.success(), "load a: {}", stderr(&o));
    assert_eq!(silt.metric("silt_ufs_read_bytes_total"), size(&a));
    silt.crash();

    let silt = Silt::restart(
        &[("/data", &backend.uri())],
        &backend
            .args()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        dir.path(),
    );
    let o = silt.cli(&["load", "--from-file", list]);
    assert!(o.status.success(), "load --from-file: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("loaded 11 files"), "{out}");
    // Only b was fetched (b/0.bin once, although listed twice).
    assert_eq!(silt.metric("silt_ufs_read_bytes_total"), size(&b), "{out}");
    for (p, d) in a.iter().chain(&b) {
        assert!(
            std::fs::read(silt.path(&format!("data/{p}"))).unwrap() == *d,
            "{p}"
        );
    }
    assert_eq!(silt.metric("silt_ufs_read_bytes_total"), size(&b));

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "# nothing\n\n").unwrap();
    for (args, says) in [
        (
            vec!["load", "--from-file", empty.to_str().unwrap()],
            "lists no path",
        ),
        (
            vec!["load", "--from-file", "/nonexistent/list"],
            "reading /nonexistent/list",
        ),
        (vec!["load", "/data/a", "--concurrency", "0"], "concurrency"),
        (vec!["load", "/data/missing"], "no such file"),
    ] {
        let o = silt.cli(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    silt.stop();
}
