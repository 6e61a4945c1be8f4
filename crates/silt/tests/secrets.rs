//! The cluster secret through the real binary: `silt up` makes one with no set-up (owner-only),
//! cluster members without one refuse to start, a worker process refuses raw unauthenticated
//! frames and logs it, members with the secret (from a file, from the environment) work
//! together, a wrong secret gets nothing from the worker, and no secret shows in logs (at
//! debug level), reports, or command lines; a secret given as a flag draws a warning.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// `silt up` of `data` at `dir/mnt` with state in `dir/state`, no cluster secret given, under
/// umask 000 (so the secret file's mode is what silt asked for, not what a umask left).
fn up_without_secret(data: &Path, dir: &Path) -> Silt {
    let mp = dir.join("mnt");
    let state = dir.join("state");
    std::fs::create_dir_all(&mp).unwrap();
    let mut cmd = Command::new(SILT);
    cmd.args(["up", "--mount", &format!("/d=file://{}", data.display())])
        .args(["--mountpoint", mp.to_str().unwrap()])
        .args(["--state-dir", state.to_str().unwrap()])
        .env_remove("SILT_CLUSTER_SECRET");
    // SAFETY: umask(2) is async-signal-safe and touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("silt up: {e}"))
}

#[test]
fn a_single_node_generates_an_owner_only_secret_with_no_set_up() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("f"), b"hello").unwrap();
    let s = up_without_secret(&data, dir.path());
    assert_eq!(std::fs::read(s.path("d/f")).unwrap(), b"hello");
    let file = s.state_dir.join("cluster-secret");
    let meta = std::fs::metadata(&file).expect("silt up generated no cluster secret");
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "{}",
        file.display()
    );
    let secret = std::fs::read_to_string(&file).unwrap();
    assert!(
        secret.trim().len() >= 16,
        "secret of {} bytes",
        secret.trim().len()
    );
    assert!(
        !s.log_text().contains(secret.trim()),
        "the secret is in the log"
    );
    s.stop();
    // The next start keeps it.
    let s = up_without_secret(&data, dir.path());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), secret);
    s.stop();
}

#[test]
fn cluster_members_without_a_usable_secret_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mount = format!("/data=file://{}", data.display());
    let list = format!("w1={addr}");
    let state = dir.path().join("w");
    let mp = dir.path().join("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let run = |role: &[&str], env: Option<&str>, extra: &[&str]| {
        let mut cmd = Command::new(SILT);
        cmd.args(role)
            .args(["--workers", &list, "--mount", &mount])
            .args(["--state-dir", state.to_str().unwrap()])
            .args(extra)
            .env("SILT_LOG", "warn");
        match env {
            Some(v) => cmd.env("SILT_CLUSTER_SECRET", v),
            None => cmd.env_remove("SILT_CLUSTER_SECRET"),
        };
        let o = cmd.output().unwrap();
        assert!(!o.status.success(), "{role:?} {extra:?} started");
        assert!(!is_mounted(&mp), "{role:?} left a mount");
        stderr(&o)
    };
    let worker = ["worker", "--worker-id", "w1", "--listen", &addr];
    let client = ["up", "--mountpoint", mp.to_str().unwrap()];
    for role in [&worker[..], &client[..]] {
        let e = run(role, None, &[]);
        assert!(
            e.contains("no cluster secret") && e.contains("--cluster-secret-file"),
            "{e}"
        );
        let e = run(role, Some("tiny-Zq7"), &[]);
        assert!(e.contains("too short") && !e.contains("tiny-Zq7"), "{e}");
    }
    // Both a value and a file: which one was meant is unclear.
    let file = dir.path().join("secret");
    std::fs::write(&file, "a-secret-in-a-file-0123456789").unwrap();
    let e = run(
        &worker,
        Some("a-secret-in-the-environment"),
        &["--cluster-secret-file", file.to_str().unwrap()],
    );
    assert!(e.contains("give one of them"), "{e}");
    // The worker never listened.
    assert!(std::net::TcpStream::connect(&addr).is_err());
}

#[test]
fn secret_flags_draw_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("s");
    for (flag, value) in [
        ("--cluster-secret", "flag-secret-0123456789abcdef"),
        ("--s3-secret-access-key", "flag-s3-key-0123456789"),
    ] {
        // No cluster named: the worker stops right after reading its options.
        let o = Command::new(SILT)
            .args([
                "worker",
                flag,
                value,
                "--state-dir",
                state.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let e = stderr(&o);
        assert!(!o.status.success(), "{e}");
        assert!(
            e.contains(&format!("warning: {flag} is visible")),
            "{flag}: {e}"
        );
        assert!(!e.contains(value), "{flag}: the value is echoed: {e}");
    }
}

/// Waits until `f` holds (a log line written by another process, a metric).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn members_work_strangers_get_nothing_and_secrets_never_show() {
    const WORKER_SECRET: &str = "e2e-cluster-secret-QmFzZTY0U2VjcmV0";
    const S3_MARKER: &str = "e2e-s3-secret-S3cr3tK3yM4rk3r";
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let content = bytes(7, 3 << 20);
    std::fs::write(data.join("f.bin"), &content).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let common = [
        "--workers".to_string(),
        format!("w1={addr}"),
        "--mount".into(),
        format!("/data=file://{}", data.display()),
    ];

    // The worker: secret from the environment, debug logging.
    let wstate = dir.path().join("w");
    let mut cmd = Command::new(SILT);
    cmd.arg("worker")
        .args(&common)
        .args(["--worker-id", "w1", "--listen", &addr])
        .args(["--state-dir", wstate.to_str().unwrap()])
        .env("SILT_CLUSTER_SECRET", WORKER_SECRET)
        .env("SILT_S3_SECRET_ACCESS_KEY", S3_MARKER)
        .env("RUST_LOG", "debug");
    let worker = Silt::spawn(cmd, None, &wstate).unwrap_or_else(|e| panic!("worker: {e}"));

    // A client: the same secret from an owner-only file.
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{WORKER_SECRET}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let client = |name: &str, secret_file: &Path| {
        let state = dir.path().join(name);
        let mp = dir.path().join(format!("{name}-mnt"));
        std::fs::create_dir_all(&mp).unwrap();
        let mut cmd = Command::new(SILT);
        cmd.args(["up", "--mountpoint", mp.to_str().unwrap()])
            .args(&common)
            .args(["--state-dir", state.to_str().unwrap()])
            .args(["--cluster-secret-file", secret_file.to_str().unwrap()])
            .args(["--passthrough", "off", "--memory-capacity", "16MiB"])
            .env_remove("SILT_CLUSTER_SECRET")
            .env("RUST_LOG", "debug");
        Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let member = client("member", &file);
    assert!(std::fs::read(member.path("data/f.bin")).unwrap() == content);
    let served = worker.metric("silt_rpc_reads_served_total");
    assert!(served > 0, "the worker served the member nothing");

    // A client with another secret still reads (from the store), but the worker serves it
    // nothing and says so.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "another-secret-entirely-0123456789").unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let stranger = client("stranger", &wrong);
    assert!(std::fs::read(stranger.path("data/f.bin")).unwrap() == content);
    assert_eq!(worker.metric("silt_rpc_reads_served_total"), served);
    assert!(worker.metric("silt_rpc_auth_failures_total") > 0);
    assert!(stranger.metric("silt_failover_ufs_reads_total") > 0);

    // Raw frames without the handshake: a challenge, a refusal, the end.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        silt_proto::write_json(&mut s, &serde_json::json!({"v": 1, "op": "stats"}))
            .await
            .unwrap();
        let mut kinds = Vec::new();
        while let Ok(Some((k, p))) = silt_proto::read_frame(&mut s).await {
            if k == silt_proto::FrameKind::Error {
                let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
                assert_eq!(
                    v["kind"],
                    silt_common::ErrorKind::PermissionDenied.as_str(),
                    "{v}"
                );
            }
            kinds.push(k);
        }
        assert_eq!(
            kinds,
            [silt_proto::FrameKind::Json, silt_proto::FrameKind::Error]
        );
    });
    eventually("the worker's warning about refused connections", || {
        worker.log_text().contains("refused a worker connection")
            && worker.log_text().contains("127.0.0.1")
    });

    // No secret anywhere: logs at debug level, reports, command lines.
    let mut seen = vec![
        ("worker log".to_string(), worker.log_text()),
        ("member log".into(), member.log_text()),
        ("stranger log".into(), stranger.log_text()),
    ];
    for (name, s) in [("worker", &worker), ("member", &member)] {
        seen.push((format!("{name} report --json"), s.report().to_string()));
        let text = s.cli(&["report"]);
        seen.push((
            format!("{name} report"),
            String::from_utf8_lossy(&text.stdout).into(),
        ));
        let pid = s.pid().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        seen.push((
            format!("{name} cmdline"),
            String::from_utf8_lossy(&cmdline).into(),
        ));
    }
    assert!(
        seen[0].1.contains("DEBUG"),
        "the worker did not log at debug level"
    );
    for (name, text) in &seen {
        for secret in [WORKER_SECRET, S3_MARKER] {
            assert!(!text.contains(secret), "{name} shows a secret: {text}");
        }
    }
    stranger.stop();
    member.stop();
    worker.stop();
}

/// S3 keys at trace level: the signer's credential chain logs every provider it tries with
/// `{:?}` (reqsign's static provider printed the secret key there, twice). And either source
/// of each key completes the pair: `AWS_ACCESS_KEY_ID` with `SILT_S3_SECRET_ACCESS_KEY` (or
/// the other way round) was refused as "must be set together", though the README lists them
/// side by side.
#[test]
fn s3_keys_never_show_at_trace_level_and_either_source_completes_the_pair() {
    let s3 = silt_testkit::S3Server::start();
    s3.create_bucket("bkt");
    std::fs::write(s3.root().join("bkt/f.txt"), b"through the keys").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (id, secret) = (s3.access_key(), s3.secret_key());
    let cases: [(&str, [(&str, &str); 2]); 3] = [
        (
            "silt",
            [
                ("SILT_S3_ACCESS_KEY_ID", id),
                ("SILT_S3_SECRET_ACCESS_KEY", secret),
            ],
        ),
        (
            "aws id",
            [
                ("AWS_ACCESS_KEY_ID", id),
                ("SILT_S3_SECRET_ACCESS_KEY", secret),
            ],
        ),
        (
            "aws secret",
            [
                ("SILT_S3_ACCESS_KEY_ID", id),
                ("AWS_SECRET_ACCESS_KEY", secret),
            ],
        ),
    ];
    for (i, (what, env)) in cases.iter().enumerate() {
        let mp = dir.path().join(format!("mnt{i}"));
        let state = dir.path().join(format!("state{i}"));
        std::fs::create_dir_all(&mp).unwrap();
        let mut cmd = Command::new(SILT);
        cmd.args(["mount", "s3://bkt", mp.to_str().unwrap()])
            .args(["--s3-endpoint", &s3.endpoint()])
            .args(["--state-dir", state.to_str().unwrap()])
            .env("RUST_LOG", "trace");
        for k in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "SILT_S3_ACCESS_KEY_ID",
            "SILT_S3_SECRET_ACCESS_KEY",
        ] {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().copied());
        let silt = Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            std::fs::read(mp.join("f.txt")).unwrap(),
            b"through the keys",
            "{what}"
        );
        silt.stop();
        let log = std::fs::read_to_string(state.with_extension("log")).unwrap();
        assert!(log.contains("TRACE"), "{what}: not logged at trace level");
        assert!(
            !log.contains(secret),
            "{what}: the secret key is in the log"
        );
    }
}
