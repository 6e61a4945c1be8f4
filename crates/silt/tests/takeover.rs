//! A mount that survives its daemon: after SIGKILL of `silt up`, the next start takes over the
//! same kernel mount (readers continue), or, where nothing kept the mount alive, detaches the
//! dead mount and mounts anew.

mod common;

use std::path::Path;

use common::*;

/// The pid of the process holding the mount's FUSE connection, if there is one.
fn holder_pid(state: &Path) -> Option<i32> {
    std::fs::read_to_string(state.join("fuse-holder.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// SIGKILL of the holder (if any), waiting until it is gone.
fn kill_holder(state: &Path) {
    let Some(pid) = holder_pid(state) else {
        return;
    };
    // SAFETY: plain kill(2); the pid is the holder's (it removes its pid file as it exits).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // Bounded wait for the process to vanish (it is not our child: poll /proc).
    for _ in 0..10_000 {
        if !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
        {
            return;
        }
        std::thread::yield_now();
        std::thread::park_timeout(std::time::Duration::from_millis(1));
    }
    panic!("holder {pid} did not die");
}

/// (d)+(b): the daemon and whatever holds the mount both die (the mount is dead: ENOTCONN);
/// the next start on the same mountpoint detaches it by itself and mounts anew.
#[test]
fn a_dead_mount_is_detached_by_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("f"), b"hello").unwrap();
    let uri = format!("file://{}", data.display());
    let mut s = Silt::up(&[("/data", &uri)], &[], dir.path()).unwrap();
    assert_eq!(std::fs::read(s.path("/data/f")).unwrap(), b"hello");
    let state = s.state_dir.clone();
    s.crash();
    kill_holder(&state);
    // A name the kernel has not cached, so the request reaches the (dead) connection.
    let err = std::fs::metadata(s.path("/data/never-looked-up")).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOTCONN),
        "a mount nobody serves answers ENOTCONN"
    );
    let s2 = Silt::up(&[("/data", &uri)], &[], dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(std::fs::read(s2.path("/data/f")).unwrap(), b"hello");
    assert!(
        s2.log_text().contains("removed the dead mount"),
        "{}",
        s2.log_text()
    );
    s2.stop();
    drop(s);
}
