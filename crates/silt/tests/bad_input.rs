//! Bad input gets a clear message and a non-zero exit (or the right errno); nothing panics
//! and no mount is left behind.

mod common;

use std::path::Path;

use common::*;
use silt_testkit::S3Server;

/// Runs `silt ARGS`, expecting failure with `needle` in the message, no panic, nothing mounted.
fn fails_with(args: &[&str], needle: &str, mountpoint: Option<&Path>) {
    let o = silt(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} succeeded; stderr: {err}");
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "{args:?}: expected {needle:?} in: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    if let Some(mp) = mountpoint {
        assert!(!is_mounted(mp), "{args:?} left a mount behind");
    }
}

struct Dirs {
    _tmp: tempfile::TempDir,
    mp: String,
    state: String,
    data: String,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let mp = tmp.path().join("mnt");
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&mp).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("x"), b"hello").unwrap();
    Dirs {
        mp: mp.display().to_string(),
        state: tmp.path().join("state").display().to_string(),
        data: data.display().to_string(),
        _tmp: tmp,
    }
}

#[test]
fn unknown_uri_scheme() {
    let d = dirs();
    fails_with(
        &["mount", "ftp://host/x", &d.mp, "--state-dir", &d.state],
        "ftp",
        Some(Path::new(&d.mp)),
    );
    fails_with(
        &[
            "up",
            "--mount",
            "/d=gopher://x",
            "--mountpoint",
            &d.mp,
            "--state-dir",
            &d.state,
        ],
        "gopher",
        Some(Path::new(&d.mp)),
    );
    fails_with(
        &[
            "up",
            "--mount",
            "/d=no-scheme",
            "--mountpoint",
            &d.mp,
            "--state-dir",
            &d.state,
        ],
        "scheme",
        Some(Path::new(&d.mp)),
    );
}

#[test]
fn missing_local_directory() {
    let d = dirs();
    fails_with(
        &[
            "mount",
            "file:///does/not/exist",
            &d.mp,
            "--state-dir",
            &d.state,
        ],
        "/does/not/exist",
        Some(Path::new(&d.mp)),
    );
}

#[test]
fn s3_errors_missing_bucket_wrong_credentials_unreachable() {
    let server = S3Server::start();
    server.create_bucket("exists");
    let d = dirs();
    let ep = server.endpoint();
    let creds = [
        "--s3-access-key-id",
        server.access_key(),
        "--s3-secret-access-key",
        server.secret_key(),
    ];
    let mp = Path::new(&d.mp);
    let mut a = vec![
        "mount",
        "s3://no-such-bucket/p",
        &d.mp,
        "--state-dir",
        &d.state,
        "--s3-endpoint",
        &ep,
    ];
    a.extend(creds);
    fails_with(&a, "no-such-bucket", Some(mp));

    let a = [
        "mount",
        "s3://exists",
        &d.mp,
        "--state-dir",
        &d.state,
        "--s3-endpoint",
        &ep,
        "--s3-access-key-id",
        "wrong",
        "--s3-secret-access-key",
        "wrong-secret",
    ];
    fails_with(&a, "credentials refused", Some(mp));
    let o = silt(&a);
    assert!(
        !stderr(&o).contains("wrong-secret"),
        "secret leaked into an error message"
    );

    // A loopback port with nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ep2 = format!("http://127.0.0.1:{closed}");
    let mut a = vec![
        "mount",
        "s3://exists",
        &d.mp,
        "--state-dir",
        &d.state,
        "--s3-endpoint",
        &ep2,
        "--ufs-timeout",
        "3s",
        "--ufs-retries",
        "0",
    ];
    a.extend(creds);
    fails_with(&a, &format!("127.0.0.1:{closed}"), Some(mp));
}

#[test]
fn mountpoint_missing_or_busy() {
    let d = dirs();
    let uri = format!("file://{}", d.data);
    fails_with(
        &[
            "mount",
            &uri,
            "/nonexistent/mountpoint",
            "--state-dir",
            &d.state,
        ],
        "/nonexistent/mountpoint",
        None,
    );
    let file_mp = format!("{}/x", d.data);
    fails_with(
        &["mount", &uri, &file_mp, "--state-dir", &d.state],
        "not a directory",
        None,
    );

    let tmp = tempfile::tempdir().unwrap();
    let silt1 = Silt::up(&[("/d", &uri)], &[], tmp.path()).unwrap();
    // A second silt on the same mountpoint (own state dir): busy.
    let other_state = tmp.path().join("state2");
    fails_with(
        &[
            "mount",
            &uri,
            silt1.mountpoint.to_str().unwrap(),
            "--state-dir",
            other_state.to_str().unwrap(),
        ],
        "busy",
        None,
    );
    // A second silt on the same state dir: busy, naming the way out.
    fails_with(
        &[
            "mount",
            &uri,
            &d.mp,
            "--state-dir",
            silt1.state_dir.to_str().unwrap(),
        ],
        "in use",
        Some(Path::new(&d.mp)),
    );
    assert!(
        is_mounted(&silt1.mountpoint),
        "the first mount must survive the failed attempts"
    );
    silt1.stop();
}

#[test]
fn invalid_config_values() {
    let d = dirs();
    let uri = format!("file://{}", d.data);
    let mp = Path::new(&d.mp);
    fails_with(
        &[
            "mount",
            &uri,
            &d.mp,
            "--state-dir",
            &d.state,
            "--page-size",
            "3MiB",
        ],
        "power of two",
        Some(mp),
    );
    fails_with(
        &[
            "mount",
            &uri,
            &d.mp,
            "--state-dir",
            &d.state,
            "--sync-policy",
            "sometimes",
        ],
        "sync_policy",
        Some(mp),
    );
    fails_with(
        &[
            "mount",
            &uri,
            &d.mp,
            "--state-dir",
            &d.state,
            "--passthrough",
            "maybe",
        ],
        "passthrough",
        Some(mp),
    );
    fails_with(
        &[
            "up",
            "--mount",
            "relative=file:///tmp",
            "--mountpoint",
            &d.mp,
            "--state-dir",
            &d.state,
        ],
        "absolute",
        Some(mp),
    );

    // The same names through the environment and a config file.
    let o = std::process::Command::new(SILT)
        .args(["mount", &uri, &d.mp, "--state-dir", &d.state])
        .env("SILT_MEMORY_CAPACITY", "lots")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("SILT_MEMORY_CAPACITY"),
        "{}",
        stderr(&o)
    );
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "low_watermark = 1.5\n").unwrap();
    fails_with(
        &[
            "mount",
            &uri,
            &d.mp,
            "--state-dir",
            &d.state,
            "--config",
            cfg.path().to_str().unwrap(),
        ],
        "low_watermark",
        Some(mp),
    );
    std::fs::write(cfg.path(), "not toml [").unwrap();
    fails_with(
        &[
            "mount",
            &uri,
            &d.mp,
            "--state-dir",
            &d.state,
            "--config",
            cfg.path().to_str().unwrap(),
        ],
        "TOML",
        Some(mp),
    );
    fails_with(
        &[
            "mount",
            &uri,
            &d.mp,
            "--state-dir",
            &d.state,
            "--config",
            "/no/such/config.toml",
        ],
        "/no/such/config.toml",
        Some(mp),
    );
}

#[test]
fn path_outside_any_mount_and_no_daemon() {
    let d = dirs();
    let tmp = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", d.data);
    let silt1 = Silt::up(&[("/d", &uri)], &[], tmp.path()).unwrap();
    let o = silt1.cli(&["fs", "stat", "/elsewhere/x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("outside every mount"), "{}", stderr(&o));
    let o = silt1.cli(&["fs", "cat", "/d/missing"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/d/missing"), "{}", stderr(&o));
    let o = silt1.cli(&["fs", "cat", "/d/x"]);
    assert!(o.status.success());
    assert_eq!(o.stdout, b"hello");
    let o = silt1.cli(&["fs", "ls", "relative"]);
    assert!(!o.status.success());
    // Through the mount: the right errnos.
    let e = std::fs::metadata(silt1.path("nope")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(silt1.path("d/x"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    silt1.stop();
    // No daemon running: a clear message.
    fails_with(
        &["report", "--state-dir", &d.state],
        "no running silt",
        None,
    );
}

#[test]
fn cluster_options_and_unreachable_cluster() {
    let d = dirs();
    let uri = format!("/data=file://{}", d.data);
    let mp = Path::new(&d.mp);
    let worker = |extra: &[&str]| {
        let mut a = vec!["worker", "--state-dir", &d.state, "--mount", &uri];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>, needle: &str, mp: Option<&Path>| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&a, needle, mp)
    };
    run(worker(&[]), "needs a cluster", None);
    run(
        worker(&["--etcd", "https://127.0.0.1:2379"]),
        "http://",
        None,
    );
    run(worker(&["--workers", "w1"]), "ID=HOST:PORT", None);
    run(worker(&["--workers", "w/1=127.0.0.1:1"]), "worker id", None);
    run(worker(&["--listen", "nowhere"]), "HOST:PORT", None);
    run(worker(&["--member-ttl", "100ms"]), "at least 1s", None);
    run(
        worker(&["--etcd", "http://127.0.0.1:1", "--workers", "a=127.0.0.1:2"]),
        "give one of them",
        None,
    );
    // Listening on every address without saying where others reach this worker.
    run(
        worker(&["--etcd", "http://127.0.0.1:1", "--worker-id", "a"]),
        "--advertise",
        None,
    );
    // etcd that does not answer: a clear error naming it, at once, for workers and clients.
    run(
        worker(&[
            "--etcd",
            "http://127.0.0.1:1",
            "--worker-id",
            "a",
            "--listen",
            "127.0.0.1:0",
        ]),
        "127.0.0.1:1",
        None,
    );
    fails_with(
        &[
            "mount",
            &d.mp,
            "--state-dir",
            &d.state,
            "--etcd",
            "http://127.0.0.1:1",
        ],
        "127.0.0.1:1",
        Some(mp),
    );
    // A client-only mount needs a cluster.
    fails_with(
        &["mount", &d.mp, "--state-dir", &d.state],
        "--etcd",
        Some(mp),
    );
}

/// Thread counts that cannot work are refused at start, before mounting (30000 FUSE threads
/// used to hang after the mount).
#[test]
fn impossible_thread_counts_are_refused() {
    let d = dirs();
    let mount = format!("/d=file://{}", d.data);
    for n in ["30000", "1025"] {
        fails_with(
            &[
                "up",
                "--mount",
                &mount,
                "--mountpoint",
                &d.mp,
                "--state-dir",
                &d.state,
                "--fuse-threads",
                n,
            ],
            "fuse_threads",
            Some(Path::new(&d.mp)),
        );
    }
    fails_with(
        &[
            "mount",
            &format!("file://{}", d.data),
            &d.mp,
            "--state-dir",
            &d.state,
            "--fuse-threads",
            "0",
        ],
        "fuse_threads",
        Some(Path::new(&d.mp)),
    );
}

/// Every number has an upper bound and a clear message: a huge concurrency panicked in
/// tokio's semaphore (exit 101), a duration of millennia was taken and then panicked a
/// signer at every S3 read.
#[test]
fn numbers_past_their_bounds_are_refused() {
    let d = dirs();
    let uri = format!("file://{}", d.data);
    for (flag, value, needle) in [
        (
            "--fetch-concurrency",
            "18446744073709551615",
            "fetch_concurrency",
        ),
        (
            "--fetch-concurrency",
            "4611686018427387904",
            "fetch_concurrency",
        ),
        ("--ufs-timeout", "10000years", "366 days"),
        ("--ufs-retries", "1000000", "ufs_retries"),
        ("--cache-only-ttl", "999999999d", "cache_only_ttl"),
    ] {
        fails_with(
            &["mount", &uri, &d.mp, "--state-dir", &d.state, flag, value],
            needle,
            Some(Path::new(&d.mp)),
        );
    }
}
