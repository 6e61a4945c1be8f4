//! Structured logs: `--log-format json` writes one JSON object a line on stderr (the `silt: `
//! status lines stay as they are), and a warning that repeats per page is logged once, with
//! the count of its repeats on a later line.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

/// The daemon's stderr as JSON objects, checking on the way that every line other than a
/// `silt: ` status line is one, with the fields a log pipeline needs.
fn json_lines(log: &str, role: &str, pid: u32) -> Vec<Value> {
    let mut out = Vec::new();
    for line in log.lines() {
        if line.starts_with("silt: ") {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        let ts = v["timestamp"].as_str().unwrap_or_default();
        // RFC 3339 in UTC, e.g. 2025-01-02T03:04:05.678901Z
        let b = ts.as_bytes();
        assert!(
            b.len() >= 20
                && b[4] == b'-'
                && b[7] == b'-'
                && b[10] == b'T'
                && b[13] == b':'
                && b[16] == b':'
                && ts.ends_with('Z'),
            "timestamp {ts:?} in {line}"
        );
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
                .contains(&v["level"].as_str().unwrap_or("")),
            "level in {line}"
        );
        assert!(
            !v["target"].as_str().unwrap_or_default().is_empty(),
            "target in {line}"
        );
        assert!(v["message"].is_string(), "message in {line}");
        assert!(
            v.get("fields").is_none_or(Value::is_object),
            "fields in {line}"
        );
        assert_eq!(v["role"], role, "{line}");
        assert_eq!(v["pid"], pid, "{line}");
        out.push(v);
    }
    out
}

#[test]
fn json_logs_of_silt_up_are_one_object_a_line() {
    let src = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    std::fs::create_dir(src.path().join("d")).unwrap();
    std::fs::write(src.path().join("d/f.bin"), &bytes).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", src.path().display());
    // Debug: many events (with fields, and `log` records of dependencies) to check.
    let silt = Silt::up(
        &[("/data", &uri)],
        &["--log-format", "json", "--log", "debug"],
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let pid = silt.pid().unwrap();
    assert!(std::fs::read(silt.path("data/d/f.bin")).unwrap() == bytes);
    silt.stop();
    let log = std::fs::read_to_string(dir.path().join("state.log")).unwrap();
    // The status line scripts wait for is still there, as it was.
    assert!(
        log.lines().any(|l| l.starts_with("silt: serving /data=")),
        "{log}"
    );
    let lines = json_lines(&log, "up", pid);
    assert!(
        lines.len() >= 10,
        "too few JSON lines at debug to check much: {log}"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["fields"].as_object().is_some_and(|f| !f.is_empty())),
        "no event with fields: {log}"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["target"].as_str().unwrap().starts_with("silt_")),
        "no event of Silt's own: {log}"
    );
}

#[test]
fn json_logs_of_a_worker_name_it() {
    let src = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(SILT);
    cmd.args(["worker", "--worker-id", "w7", "--listen", &addr])
        .args(["--workers", &format!("w7={addr}")])
        .args(["--mount", &format!("/data=file://{}", src.path().display())])
        .args(["--state-dir", state.to_str().unwrap()])
        .args(["--log-format", "json", "--log", "debug"]);
    let worker = Silt::spawn(cmd, None, &state).unwrap_or_else(|e| panic!("{e}"));
    let pid = worker.pid().unwrap();
    worker.stop();
    let log = std::fs::read_to_string(dir.path().join("state.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.starts_with("silt: serving as worker w7")),
        "{log}"
    );
    let lines = json_lines(&log, "worker", pid);
    // The id is known once the worker read it: from then on, every line carries it.
    let named: Vec<&Value> = lines.iter().filter(|v| v.get("worker").is_some()).collect();
    assert!(!named.is_empty(), "no line names the worker: {log}");
    assert!(named.iter().all(|v| v["worker"] == "w7"), "{log}");
}

#[test]
fn a_full_disk_tier_logs_its_warning_once_with_the_count() {
    let src = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..64 << 10).map(|i: u32| (i % 253) as u8).collect();
    for i in 0..64 {
        std::fs::write(src.path().join(format!("{i:02}.bin")), &bytes).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    // The file system under the tier has bytes to spare but few inodes: once they are used
    // up, every new object's data file fails to be made (ENOSPC), whatever the free space
    // says (the tier's quota follows free bytes, so a small tmpfs no longer fills).
    let tmpfs = Tmpfs::mount(&dir.path().join("tier"), "size=64m,nr_inodes=16");
    let tiers = format!("{}:64MiB", tmpfs.0.display());
    let uri = format!("file://{}", src.path().display());
    let silt = Silt::up(
        &[("/data", &uri)],
        &[
            "--log-format",
            "json",
            "--disk-tiers",
            &tiers,
            "--page-size",
            "64KiB",
            // Longer than the test: exactly one line in the interval, then the count.
            "--log-repeat-interval",
            "1h",
        ],
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let pid = silt.pid().unwrap();
    for i in 0..64 {
        assert!(std::fs::read(silt.path(&format!("data/{i:02}.bin"))).unwrap() == bytes);
    }
    silt.stop();
    // The count comes at exit (`silt down`), after the daemon stopped.
    let log = std::fs::read_to_string(dir.path().join("state.log")).unwrap();
    let lines = json_lines(&log, "up", pid);
    let writes: Vec<&Value> = lines
        .iter()
        .filter(|v| v["message"] == "cannot create a cache data file")
        .collect();
    assert_eq!(writes.len(), 2, "one line, then the count: {log}");
    let first = &writes[0]["fields"];
    assert!(
        first["error"]
            .as_str()
            .unwrap_or_default()
            .contains("No space left"),
        "{log}"
    );
    assert!(first.get("suppressed").is_none(), "{log}");
    let suppressed = writes[1]["fields"]["suppressed"].as_u64().unwrap_or(0);
    assert!(suppressed >= 40, "{suppressed} repeats counted: {log}");
}
