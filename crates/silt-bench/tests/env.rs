//! End-to-end tests of the benchmark environment: namespaces, veth, tbf, versitygw and the
//! proxy for real. They need root, `ip`/`tc` and versitygw (as the rest of the suite does:
//! `scripts/test.sh` installs them); without them they fail with a message saying what is
//! missing, rather than pass without testing anything. Each test uses
//! its own instance id so they run in parallel, and a guard tears its instance down also when
//! an assertion fails.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use rand::RngCore;
use silt_bench::env::{self, run_dir};
use silt_bench::{Env, Profile, UpOptions};
use silt_ufs::S3Options;

const EXE: &str = env!("CARGO_BIN_EXE_silt-bench");

fn enabled() -> bool {
    let missing = if !silt_testkit::is_root() {
        Some("not root".to_string())
    } else if env::which("ip").is_none() || env::which("tc").is_none() {
        Some("`ip`/`tc` not found".to_string())
    } else if let Err(e) = env::versitygw_path() {
        Some(e.to_string())
    } else {
        None
    };
    match missing {
        None => true,
        Some(why) => panic!("the namespace tests cannot run: {why} (run scripts/test.sh as root)"),
    }
}

/// Tears instance `id` down when dropped (also after a failed assertion).
struct Guard(u8);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = Env::down(self.0) {
            eprintln!("guard: {e:#}");
        }
    }
}

fn opts(id: u8, profile: Profile) -> UpOptions {
    let mut o = UpOptions::new(id, profile);
    o.exe = Some(EXE.into());
    o
}

/// Small knobs: shaping paths active, the test still quick.
fn small_shaped() -> Profile {
    Profile {
        rtt: Duration::from_millis(4),
        per_conn_rate: Some(8_000_000),
        aggregate_rate: Some(16_000_000),
    }
}

/// PUT, then GET (stat + ranged read) of a random object through `endpoint`.
fn s3_round_trip(endpoint: &str, data_dir: &Path, bucket: &str, size: usize) {
    std::fs::create_dir_all(data_dir.join(bucket)).unwrap();
    let opts = S3Options {
        endpoint: endpoint.to_string(),
        access_key_id: "silt-bench-access".to_string(),
        secret_access_key: "silt-bench-secret-do-not-use".to_string(),
        timeout: Duration::from_secs(30),
        retries: 0,
        ..Default::default()
    };
    let mut payload = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut payload);
    let payload = Bytes::from(payload);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = silt_ufs::open_store(&format!("s3://{bucket}"), &opts)
            .await
            .unwrap();
        store.write("dir/obj", payload.clone()).await.unwrap();
        let meta = store.stat("dir/obj").await.unwrap();
        assert_eq!(meta.size, size as u64);
        let got = store.read("dir/obj", 0..size as u64, &meta).await.unwrap();
        assert!(got == payload, "object changed in the round trip");
        let tail = store
            .read("dir/obj", (size as u64 / 2)..size as u64, &meta)
            .await
            .unwrap();
        assert!(tail == payload.slice(size / 2..), "range read differs");
    });
    // The object really is on the server's disk.
    let on_disk = std::fs::read(data_dir.join(bucket).join("dir/obj")).unwrap();
    assert!(on_disk == payload);
}

fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
            !matches!(state.as_deref(), Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Reaps our own zombie children among `pids` (no-op for others).
fn reap(pids: &[i32]) {
    for &pid in pids {
        let mut status = 0;
        // SAFETY: plain syscall on one specific pid.
        unsafe {
            libc::waitpid(pid, &mut status, libc::WNOHANG);
        }
    }
}

fn output(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(env::which(cmd).unwrap())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Nothing of instance `id` is left: namespace, links, qdiscs, processes, run dir.
fn assert_gone(id: u8, pids: &[i32]) {
    let ns = env::netns_name(id);
    let netns = output("ip", &["netns", "list"]);
    assert!(
        !netns.split_whitespace().any(|w| w == ns),
        "namespace left: {netns}"
    );
    let links = output("ip", &["-o", "link", "show"]);
    for name in [env::host_if(id), env::ns_if(id)] {
        assert!(
            !links.contains(&format!(" {name}:")) && !links.contains(&format!(" {name}@")),
            "link {name} left: {links}"
        );
    }
    let qdiscs = output("tc", &["qdisc", "show"]);
    assert!(
        !qdiscs.contains(&format!("sbv{id}h")),
        "qdisc left: {qdiscs}"
    );
    for &pid in pids {
        assert!(!is_alive(pid), "process {pid} left");
    }
    assert!(!run_dir(id).exists(), "run dir left");
}

#[test]
fn fast_profile_round_trip_and_clean_down() {
    if !enabled() {
        return;
    }
    let id = 240;
    let _guard = Guard(id);
    let env = Env::up_with(opts(id, Profile::fast())).unwrap();
    assert_eq!(env.endpoint(), "http://198.18.240.2:9000");
    assert_eq!(env.pids().len(), 1, "no proxy in the fast profile");
    let qdiscs = output("tc", &["qdisc", "show", "dev", env.host_if()]);
    assert!(!qdiscs.contains("tbf"), "{qdiscs}");
    s3_round_trip(env.endpoint(), env.data_dir(), "fast", 3 << 20);
    let pids = env.pids();
    drop(env);
    assert_gone(id, &pids);
}

#[test]
fn shaped_profile_round_trip_through_proxy_and_tbf() {
    if !enabled() {
        return;
    }
    let id = 241;
    let _guard = Guard(id);
    let env = Env::up_with(opts(id, small_shaped())).unwrap();
    assert_eq!(env.pids().len(), 2, "versitygw and the proxy");
    let host_q = output("tc", &["qdisc", "show", "dev", env.host_if()]);
    assert!(
        host_q.contains("tbf") && host_q.contains("128Mbit"),
        "{host_q}"
    );
    let ns_q = output(
        "ip",
        &[
            "netns",
            "exec",
            env.netns(),
            "tc",
            "qdisc",
            "show",
            "dev",
            &env::ns_if(id),
        ],
    );
    assert!(ns_q.contains("tbf"), "{ns_q}");
    s3_round_trip(env.endpoint(), env.data_dir(), "shaped", 1 << 20);
    let pids = env.pids();
    Env::down(id).unwrap();
    assert_gone(id, &pids);
    drop(env); // Down again from Drop: nothing left to do, no error.
    reap(&pids);
    assert_gone(id, &pids);
}

#[test]
fn up_and_down_are_idempotent() {
    if !enabled() {
        return;
    }
    let id = 242;
    let _guard = Guard(id);
    Env::down(id).unwrap(); // Nothing there: fine.
    let first = Env::up_with(opts(id, small_shaped())).unwrap();
    let first_pids = first.pids();
    // Simulate a harness that lost track of its environment: no Drop for `first`.
    std::mem::forget(first);
    // Up again with the same id replaces the first instance.
    let second = Env::up_with(opts(id, Profile::fast())).unwrap();
    for &pid in &first_pids {
        assert!(!is_alive(pid), "first instance's process {pid} still runs");
    }
    s3_round_trip(second.endpoint(), second.data_dir(), "again", 64 << 10);
    let mut pids = second.pids();
    pids.extend(&first_pids);
    drop(second);
    Env::down(id).unwrap();
    Env::down(id).unwrap();
    reap(&first_pids);
    assert_gone(id, &pids);
}

#[test]
fn down_without_state_file_removes_by_name() {
    if !enabled() {
        return;
    }
    let id = 244;
    let _guard = Guard(id);
    let env = Env::up_with(opts(id, small_shaped())).unwrap();
    let pids = env.pids();
    std::mem::forget(env);
    std::fs::remove_file(run_dir(id).join("state.json")).unwrap();
    // Processes found through the namespace, links and namespace by name.
    Env::down(id).unwrap();
    reap(&pids);
    assert_gone(id, &pids);
}

#[test]
fn cli_up_survives_its_process_and_cli_down_cleans() {
    if !enabled() {
        return;
    }
    let id = 243;
    let _guard = Guard(id);
    // The CLI's children outlive it; make them ours when orphaned so they can be reaped here
    // (this VM's init does not reap orphans).
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let out = Command::new(EXE)
        .args(["env", "up", "--id", "243", "--profile", "remote"])
        .args([
            "--rtt",
            "2ms",
            "--per-conn-rate",
            "4MB",
            "--aggregate-rate",
            "8MB",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let endpoint = stdout
        .lines()
        .find_map(|l| l.strip_prefix("endpoint="))
        .expect("endpoint printed");
    assert_eq!(endpoint, "http://198.18.243.2:9000");
    // The CLI process is gone (as after a crash of the harness); the environment is not.
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir(id).join("state.json")).unwrap()).unwrap();
    let pids: Vec<i32> = state["procs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_i64().unwrap() as i32)
        .collect();
    assert_eq!(pids.len(), 2);
    for &pid in &pids {
        assert!(is_alive(pid), "process {pid} died with the CLI");
    }
    s3_round_trip(endpoint, &run_dir(id).join("data"), "cli", 256 << 10);
    let status = Command::new(EXE).args(["env", "status"]).output().unwrap();
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        status.contains("id 243: http://198.18.243.2:9000"),
        "{status}"
    );

    let down = Command::new(EXE)
        .args(["env", "down", "--id", "243"])
        .output()
        .unwrap();
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    reap(&pids);
    assert_gone(id, &pids);
    let again = Command::new(EXE)
        .args(["env", "down", "--id", "243"])
        .output()
        .unwrap();
    assert!(again.status.success());
}

#[test]
fn cli_rejects_bad_knobs_without_side_effects() {
    for args in [
        &["env", "up", "--id", "245", "--rtt", "soon"][..],
        &["env", "up", "--id", "245", "--per-conn-rate", "5XB"][..],
        &["env", "up", "--id", "245", "--aggregate-rate", "-1MB"][..],
        &["env", "up", "--id", "300"][..],
        &["env", "up", "--id", "245", "--profile", "slow"][..],
    ] {
        let out = Command::new(EXE).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(!out.stderr.is_empty());
    }
    assert!(!run_dir(245).exists());
}
