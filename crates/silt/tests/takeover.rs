//! A mount that survives its daemon: after SIGKILL of `silt up`, the next start takes over the
//! same kernel mount (readers continue), or, where nothing kept the mount alive, detaches the
//! dead mount and mounts anew.

mod common;

use std::fs::File;
use std::io::{BufRead, Read, Write};
use std::os::fd::IntoRawFd;
use std::path::{Path, PathBuf};

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
    let s2 = restart(dir.path(), &uri, &[]);
    assert_eq!(std::fs::read(s2.path("/data/f")).unwrap(), b"hello");
    assert!(
        s2.log_text().contains("removed the dead mount"),
        "{}",
        s2.log_text()
    );
    s2.stop();
    drop(s);
}

const BIG: usize = 48 << 20;
const CHUNK: usize = 1 << 20;

fn args() -> Vec<&'static str> {
    // Reads through the daemon (no passthrough), files written through to the store.
    vec!["--passthrough", "off", "--write-type", "through"]
}

/// A store with the big file; the URI.
fn store(dir: &Path) -> String {
    let data = dir.join("store");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("big"), bytes(1, BIG)).unwrap();
    format!("file://{}", data.display())
}

fn restart(dir: &Path, uri: &str, extra: &[&str]) -> Silt {
    Silt::restart(&[("/data", uri)], extra, dir)
}

/// Helper processes: the test binary itself, running `helper` with a role. Readers and
/// writers must be other processes than the test's: a process forking (as the test does to
/// start the next daemon) while it holds files of a mount whose daemon is dead blocks in the
/// child's close of them (FLUSH) until a daemon answers.
struct Helper {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Helper {
    fn start(role: &str, path: &Path, out: &Path) -> Helper {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "helper", "--nocapture", "--test-threads=1"])
            .env("TAKEOVER_HELPER", role)
            .env("TAKEOVER_PATH", path)
            .env("TAKEOVER_OUT", out)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        Helper { child, out }
    }

    /// The next protocol line (`@@ ...`), `None` at the end of its output.
    fn line(&mut self) -> Option<String> {
        loop {
            let mut l = String::new();
            if self.out.read_line(&mut l).ok()? == 0 {
                return None;
            }
            // libtest may have written "test helper ... " before it on the line.
            if let Some(at) = l.find("@@ ") {
                return Some(l[at + 3..].trim().to_string());
            }
        }
    }

    fn go(&mut self) {
        let _ = writeln!(self.child.stdin.as_mut().unwrap(), "go");
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn errno_of(r: std::io::Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// The helper processes' side (does nothing when run as a test).
#[test]
fn helper() {
    let Ok(role) = std::env::var("TAKEOVER_HELPER") else {
        return;
    };
    let path = PathBuf::from(std::env::var("TAKEOVER_PATH").unwrap());
    let out = PathBuf::from(std::env::var("TAKEOVER_OUT").unwrap());
    let say = |s: &str| {
        println!("@@ {s}");
        let _ = std::io::stdout().flush();
    };
    let wait_go = || {
        let mut l = String::new();
        let _ = std::io::stdin().read_line(&mut l);
    };
    match role.as_str() {
        // Reads 8 chunks, says "half", waits, reads the rest; writes what it read to `out`.
        "reader" => {
            let mut f = File::open(&path).unwrap();
            let mut got = vec![0u8; CHUNK * 8];
            f.read_exact(&mut got).unwrap();
            say("half");
            wait_go();
            match f.read_to_end(&mut got) {
                Ok(_) => {
                    std::fs::write(&out, &got).unwrap();
                    say("ok");
                }
                Err(e) => say(&format!("err {e}")),
            }
        }
        // Writes a chunk, says "written", waits, writes another and closes: "W C" errnos.
        "writer" => {
            let mut f = File::create(&path).unwrap();
            f.write_all(&bytes(2, CHUNK)).unwrap();
            say("written");
            wait_go();
            let w = errno_of(f.write_all(&bytes(3, CHUNK)));
            let fd = f.into_raw_fd();
            // SAFETY: closing the fd we own, to see close(2)'s answer (File's drop ignores it).
            let c = if unsafe { libc::close(fd) } == 0 {
                0
            } else {
                std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
            };
            say(&format!("{w} {c}"));
        }
        // Reads the file whole again and again, checking each pass, until `out` exists.
        "steady" => {
            let want = bytes(1, BIG);
            let mut passes = 0;
            say("started");
            loop {
                match std::fs::read(&path) {
                    Ok(b) if b == want => passes += 1,
                    Ok(b) => return say(&format!("err pass {passes}: {} wrong bytes", b.len())),
                    Err(e) => return say(&format!("err pass {passes}: {e}")),
                }
                if out.exists() {
                    return say(&format!("ok {passes}"));
                }
            }
        }
        // A listing and a lookup of a name never seen: "ls-errno lookup-errno names...".
        "ls" => {
            let listing = std::fs::read_dir(&path).map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            });
            let never = errno_of(std::fs::metadata(path.join("never-looked-up")).map(|_| ()));
            match listing {
                Ok(names) => say(&format!("0 {never} {}", names.join(" "))),
                Err(e) => say(&format!("{} {never}", e.raw_os_error().unwrap_or(-1))),
            }
        }
        _ => panic!("unknown helper role {role}"),
    }
}

/// (a) SIGKILL of the daemon while a process reads a large file through it, another reads in
/// a loop and another writes; the restarted daemon takes the mount over: the readers get
/// exactly the file's bytes, listings and lookups never answer ENOTCONN, the writer's next
/// write and its close answer EIO (its unwritten bytes died with the daemon), never a hang,
/// and a file committed before the crash is intact.
#[test]
fn a_restart_after_sigkill_takes_the_mount_over() {
    let dir = tempfile::tempdir().unwrap();
    let uri = store(dir.path());
    let mut s = Silt::up(&[("/data", &uri)], &args(), dir.path()).unwrap();
    let committed = bytes(4, 3 * CHUNK + 17);
    std::fs::write(s.path("/data/committed"), &committed).unwrap();

    let (read_out, stop) = (dir.path().join("read"), dir.path().join("stop"));
    let mut reader = Helper::start("reader", &s.path("/data/big"), &read_out);
    let mut writer = Helper::start("writer", &s.path("/data/w"), &read_out);
    let mut steady = Helper::start("steady", &s.path("/data/big"), &stop);
    assert_eq!(reader.line().as_deref(), Some("half"));
    assert_eq!(writer.line().as_deref(), Some("written"));
    assert_eq!(steady.line().as_deref(), Some("started"));

    s.crash();
    // Requests now wait for the next daemon (the holder keeps the connection).
    reader.go();
    writer.go();
    let mut ls = Helper::start("ls", &s.path("/data"), &stop);

    let s2 = restart(dir.path(), &uri, &args());
    assert!(
        s2.log_text().contains("took over the running mount"),
        "{}",
        s2.log_text()
    );
    assert_eq!(
        reader.line().as_deref(),
        Some("ok"),
        "the reader's reads across the restart"
    );
    assert!(
        std::fs::read(&read_out).unwrap() == bytes(1, BIG),
        "the reader got other bytes than the file's"
    );
    let listing = ls.line().unwrap();
    let mut f = listing.split(' ');
    assert_eq!(f.next(), Some("0"), "listing during the restart: {listing}");
    assert_eq!(
        f.next().map(str::to_string),
        Some(libc::ENOENT.to_string()),
        "lookup during the restart: {listing}"
    );
    let names: Vec<&str> = f.collect();
    assert!(
        names.contains(&"big") && names.contains(&"committed"),
        "{listing}"
    );
    // Its unwritten bytes died with the daemon: the next write and close say so.
    assert_eq!(
        writer.line(),
        Some(format!("{} {}", libc::EIO, libc::EIO)),
        "the writer's write and close after the crash"
    );
    std::fs::write(&stop, b"").unwrap();
    let passes = steady.line().unwrap();
    assert!(passes.starts_with("ok "), "steady reader: {passes}");
    assert_eq!(
        std::fs::read(s2.path("/data/committed")).unwrap(),
        committed
    );
    // New files and reads work as ever.
    std::fs::write(s2.path("/data/after"), b"after").unwrap();
    assert_eq!(std::fs::read(s2.path("/data/after")).unwrap(), b"after");
    drop((reader, writer, steady, ls));
    s2.stop();
    drop(s);
    assert!(
        holder_pid(&dir.path().join("state")).is_none(),
        "the holder ends with the mount"
    );
}

/// (c) A planned upgrade: `silt up --takeover` replaces a running daemon without unmounting;
/// a reader open across it carries on, and a file open for writing is committed by the old
/// daemon before it leaves (its handle then answers EIO).
#[test]
fn takeover_flag_hands_over_without_unmounting() {
    let dir = tempfile::tempdir().unwrap();
    let uri = store(dir.path());
    let mut s = Silt::up(&[("/data", &uri)], &args(), dir.path()).unwrap();
    let read_out = dir.path().join("read");
    let mut reader = Helper::start("reader", &s.path("/data/big"), &read_out);
    let mut writer = Helper::start("writer", &s.path("/data/w"), &read_out);
    assert_eq!(reader.line().as_deref(), Some("half"));
    assert_eq!(writer.line().as_deref(), Some("written"));

    let mut a = args();
    a.push("--takeover");
    let s2 = restart(dir.path(), &uri, &a);
    let status = s.wait_exit().expect("old daemon");
    assert!(status.success(), "old daemon: {status}: {}", s.log_text());
    reader.go();
    writer.go();
    assert_eq!(
        reader.line().as_deref(),
        Some("ok"),
        "reads across the handover"
    );
    assert!(
        std::fs::read(&read_out).unwrap() == bytes(1, BIG),
        "the reader got other bytes than the file's"
    );
    assert_eq!(writer.line(), Some(format!("{} {}", libc::EIO, libc::EIO)));
    // What was written before the handover was committed by the old daemon.
    let stored = std::fs::read(dir.path().join("store/w")).unwrap();
    assert!(
        stored == bytes(2, CHUNK),
        "the store has {} bytes of w",
        stored.len()
    );
    drop((reader, writer));
    s2.stop();
    drop(s);
}

/// A start without --takeover while the daemon runs is refused with a clear message (the
/// running mount is untouched).
#[test]
fn a_second_start_on_a_served_mount_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let uri = store(dir.path());
    let s = Silt::up(&[("/data", &uri)], &args(), dir.path()).unwrap();
    // Run to completion (a harness guard of a failed start would unmount the live mount).
    let (mp, state) = (dir.path().join("mnt"), dir.path().join("state"));
    let mut a = vec![
        "up",
        "--mountpoint",
        mp.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--mount",
    ];
    let m = format!("/data={uri}");
    a.push(&m);
    a.extend(args());
    let o = silt(&a);
    assert!(
        !o.status.success(),
        "a second daemon started on a served mount"
    );
    let err = stderr(&o);
    assert!(err.contains("--takeover"), "{err}");
    assert_eq!(std::fs::read(s.path("/data/big")).unwrap().len(), BIG);
    s.stop();
}

/// (e) A crash restart is warm: the metadata cache the first daemon saved while running is
/// restored, so listing and reading a read-only tree after SIGKILL ask the store nothing.
#[test]
fn a_crash_restart_reuses_the_metadata_saved_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let uri = store(dir.path());
    let ro = ["--passthrough", "off"];
    let mut s = Silt::up(&[("/data", &uri)], &ro, dir.path()).unwrap();
    let names = |s: &Silt| -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(s.path("/data"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&s), ["big"]);
    assert_eq!(std::fs::read(s.path("/data/big")).unwrap(), bytes(1, BIG));
    // The running daemon saves its metadata cache every few seconds once it changed.
    let snapshot = dir.path().join("state").join("metadata-snapshot");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !snapshot.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no periodic snapshot: {}",
            s.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    s.crash();

    let s2 = restart(dir.path(), &uri, &ro);
    let before = s2.metric("silt_ufs_requests_total");
    assert_eq!(names(&s2), ["big"]);
    assert_eq!(std::fs::read(s2.path("/data/big")).unwrap(), bytes(1, BIG));
    assert_eq!(
        s2.metric("silt_ufs_requests_total"),
        before,
        "store requests after a crash restart of a warm read-only mount"
    );
    s2.stop();
    drop(s);
}

/// Passthrough handles across a takeover, planned or after SIGKILL. A reader holds the big file
/// open in passthrough (the kernel reads the disk tier's file, never the daemon) while the new
/// daemon loads another file as large into a disk tier too small for both: the held file's
/// pages must stay (an evicted page is a hole, read as zeros), and the reader gets exactly the
/// file's bytes. The file also opens again meanwhile: the kernel refuses a second backing for
/// an inode it reads through the first (EIO), so the new daemon must reuse the old one. A
/// second, planned takeover hands the same on again; once the reader is gone, the file opens
/// with a backing of its own. With `source`, the held open is of the store's own file
/// (`fuse_source_passthrough`, the file cold before it), which needs no pin but is shared the same way.
fn passthrough_handles_across(crash: bool, source: bool) {
    let dir = tempfile::tempdir().unwrap();
    let uri = store(dir.path());
    std::fs::write(dir.path().join("store/other"), bytes(5, BIG)).unwrap();
    let tier = format!("{}:80MiB", dir.path().join("tier").display());
    let mut a = vec!["--disk-tiers", tier.as_str(), "--memory-capacity", "1MiB"];
    if source {
        a.extend(["--fuse-source-passthrough", "true"]);
    }
    let mut s = Silt::up(&[("/data", &uri)], &a, dir.path()).unwrap();
    let big = s.path("/data/big");
    if !source {
        assert!(std::fs::read(&big).unwrap() == bytes(1, BIG));
    }
    let read_out = dir.path().join("read");
    let mut reader = Helper::start("reader", &big, &read_out);
    assert_eq!(reader.line().as_deref(), Some("half"));
    let last = s.report()["opens"]["recent"]
        .as_array()
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    assert_eq!(last["mode"], "passthrough", "the held open");
    let from_source = last["reason"]
        .as_str()
        .unwrap()
        .starts_with("the store's own file");
    assert_eq!(from_source, source, "the held open: {last}");

    let mut t = a.clone();
    t.push("--takeover");
    let planned = |old: &mut Silt| {
        let new = restart(dir.path(), &uri, &t);
        let status = old.wait_exit().expect("old daemon");
        assert!(status.success(), "old daemon: {status}: {}", old.log_text());
        new
    };
    let mut s2 = if crash {
        s.crash();
        restart(dir.path(), &uri, &a)
    } else {
        planned(&mut s)
    };
    let open_again = |s: &Silt, when: &str| match std::fs::read(s.path("/data/big")) {
        Ok(got) => assert!(
            got == bytes(1, BIG),
            "{when}: another open read other bytes"
        ),
        Err(e) => panic!("{when}: the held file did not open again: {e}"),
    };
    open_again(&s2, "after the first takeover");
    let s3 = planned(&mut s2);
    open_again(&s3, "after the second takeover");
    let o = s3.cli(&["load", "/data/other"]);
    assert!(o.status.success(), "load: {}", stderr(&o));
    reader.go();
    assert_eq!(reader.line().as_deref(), Some("ok"), "the held reader");
    assert!(
        std::fs::read(&read_out).unwrap() == bytes(1, BIG),
        "the reader held across the takeover got other bytes than the file's"
    );
    drop(reader);
    open_again(&s3, "after the reader closed it");
    s3.stop();
    drop((s, s2));
}

#[test]
fn passthrough_handles_survive_a_planned_takeover() {
    passthrough_handles_across(false, false);
}

#[test]
fn passthrough_handles_of_the_store_file_survive_a_restart_after_sigkill() {
    passthrough_handles_across(true, true);
}

#[test]
fn passthrough_handles_survive_a_restart_after_sigkill() {
    passthrough_handles_across(true, false);
}

/// A file open through the daemon across a takeover (a reader part-way through it) and cached
/// whole meanwhile: a new open after the takeover could be passed through, which the kernel
/// refuses for an inode with handles open through its page cache (EIO). The new daemon must
/// know the old handle and serve such opens through the daemon until it closes; the reader
/// goes on with the file's bytes. Planned takeover and a restart after SIGKILL.
fn daemon_handles_across(crash: bool) {
    let dir = tempfile::tempdir().unwrap();
    let uri = store(dir.path());
    let mut s = Silt::up(&[("/data", &uri)], &[], dir.path()).unwrap();
    let big = s.path("/data/big");
    let read_out = dir.path().join("read");
    let mut reader = Helper::start("reader", &big, &read_out);
    assert_eq!(reader.line().as_deref(), Some("half"));
    // A second one that never reads again: its handle is released without being reopened.
    let mut idle = Helper::start("reader", &big, &dir.path().join("idle"));
    assert_eq!(idle.line().as_deref(), Some("half"));
    let o = s.cli(&["load", "/data/big"]);
    assert!(o.status.success(), "load: {}", stderr(&o));
    let s2 = if crash {
        s.crash();
        restart(dir.path(), &uri, &[])
    } else {
        let s2 = restart(dir.path(), &uri, &["--takeover"]);
        let status = s.wait_exit().expect("old daemon");
        assert!(status.success(), "old daemon: {status}: {}", s.log_text());
        s2
    };
    // Its last MiB only, so the reader's next reads still come to the daemon (through the
    // handle it reopens, which takes over the count the takeover gave it).
    match File::open(s2.path("/data/big")) {
        Ok(f) => {
            use std::os::unix::fs::FileExt;
            let mut tail = vec![0u8; CHUNK];
            f.read_exact_at(&mut tail, (BIG - CHUNK) as u64).unwrap();
            assert!(
                tail[..] == bytes(1, BIG)[BIG - CHUNK..],
                "another open read other bytes"
            );
        }
        Err(e) => panic!("a file open through the daemon did not open again: {e}"),
    }
    reader.go();
    assert_eq!(reader.line().as_deref(), Some("ok"), "the held reader");
    assert!(std::fs::read(&read_out).unwrap() == bytes(1, BIG));
    drop((reader, idle));
    // Once the old handles are released (the kernel sends the release after close(2)), the
    // whole cached file opens in passthrough again: no handle's count leaked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(std::fs::read(s2.path("/data/big")).unwrap() == bytes(1, BIG));
        let last = s2.report()["opens"]["recent"]
            .as_array()
            .unwrap()
            .last()
            .cloned();
        if last.unwrap()["mode"] == "passthrough" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "an old handle's count never went: opens stay off passthrough"
        );
    }
    s2.stop();
    drop(s);
}

#[test]
fn daemon_handles_survive_a_planned_takeover() {
    daemon_handles_across(false);
}

#[test]
fn daemon_handles_survive_a_restart_after_sigkill() {
    daemon_handles_across(true);
}
