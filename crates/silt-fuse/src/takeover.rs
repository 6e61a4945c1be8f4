//! Keeping the kernel mount alive across the daemon: silt mounts by itself (not through
//! `fuser`), keeps the kernel's one INIT request, and leaves a duplicate of the `/dev/fuse`
//! descriptor with a holder process (`silt fuse-holder`), so the kernel does not abort the
//! connection when the daemon dies. A later daemon takes the descriptor back from the holder
//! and serves the same mount.
//!
//! `fuser` insists on an INIT handshake when it is given a descriptor, and the kernel sends
//! INIT once per mount. So fuser is handed one end of a `SOCK_SEQPACKET` socket pair, the
//! INIT bytes go in at the other end, fuser's reply comes out there (and goes to the device
//! on the first mount only), and then the real device is `dup3`ed over fuser's end.
//!
//! Every thread of the session reads the one shared open file description (no
//! `FUSE_DEV_IOC_CLONE`), which the holder also holds: requests the dead daemon had read but
//! not answered stay on the connection's processing list, and `FUSE_NOTIFY_RESEND` (Linux
//! ≥ 6.9) queues them again for the new daemon, with bit 63 of their unique id set (fuser
//! echoes the id as read, so the replies match).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use silt_common::{Error, ErrorKind, Result};

pub use silt_common::sys::{
    holder_alive, holder_pid, open_pidfd, release_holder, HOLDER_PID, HOLDER_SOCKET,
};
use silt_common::sys::{
    send_with_fd, HOLDER_GET as CMD_GET, HOLDER_IO_TIMEOUT as IO_TIMEOUT, HOLDER_QUIT as CMD_QUIT,
};
/// The kernel's INIT request of the mount, kept for the daemons that take it over.
const INIT_FILE: &str = "fuse-init";

/// `fuse_out_header` notification code of `FUSE_NOTIFY_RESEND` (include/uapi/linux/fuse.h).
const FUSE_NOTIFY_RESEND: i32 = 7;
/// A read of `/dev/fuse` must offer room for the largest request (fuser's buffer size).
const DEV_READ_BUF: usize = 16 * 1024 * 1024 + 4096;

fn os_err(what: &str) -> Error {
    Error::from(std::io::Error::last_os_error()).context(what.to_string())
}

fn cstr(p: &Path) -> Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::invalid(format!("{} contains a NUL byte", p.display())))
}

/// Opens `/dev/fuse` and mounts it at `mountpoint` as `fuse.silt` (source `silt`).
pub fn mount_device(mountpoint: &Path, read_only: bool, allow_other: bool) -> Result<OwnedFd> {
    use std::os::unix::fs::PermissionsExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| Error::from(e).context("opening /dev/fuse"))?;
    let mode = std::fs::metadata(mountpoint)?.permissions().mode();
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // The kernel checks the mode bits we report (default_permissions).
    let mut data = format!(
        "fd={},rootmode={:o},user_id={uid},group_id={gid},default_permissions",
        dev.as_raw_fd(),
        mode & libc::S_IFMT
    );
    if allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    let target = cstr(mountpoint)?;
    let data = std::ffi::CString::new(data).map_err(|_| Error::invalid("mount options"))?;
    // SAFETY: valid C strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"silt".as_ptr(),
            target.as_ptr(),
            c"fuse.silt".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(os_err(&format!(
            "mounting FUSE at {}",
            mountpoint.display()
        )));
    }
    Ok(OwnedFd::from(dev))
}

/// Detaches the mount at `mountpoint` (after a failed start).
pub fn detach(mountpoint: &Path) {
    if let Ok(c) = cstr(mountpoint) {
        // SAFETY: a valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// `mountpoint` with its parent resolved, without touching the mount itself: a mount whose
/// daemon is gone would block the caller until a daemon serves it.
pub fn resolved(mountpoint: &Path) -> std::path::PathBuf {
    let abs = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or(abs),
        _ => abs,
    }
}

/// Reads the kernel's INIT request (the first request of a new mount).
pub fn read_init(dev: BorrowedFd<'_>) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; DEV_READ_BUF];
    loop {
        // SAFETY: reading into a buffer we own, within its length.
        let n = unsafe { libc::read(dev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(
                e.raw_os_error(),
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT)
            ) {
                continue;
            }
            return Err(Error::from(e).context("reading FUSE INIT"));
        }
        buf.truncate(n as usize);
        return Ok(buf);
    }
}

/// Writes the INIT request where the next daemon finds it (a file in the state dir; the
/// holder keeps the mount, the page cache keeps the file even across a crash).
pub fn save_init(state_dir: &Path, init: &[u8]) -> Result<()> {
    let path = state_dir.join(INIT_FILE);
    let tmp = path.with_extension("tmp");
    silt_common::private::write(&tmp, init)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| Error::from(e).context(format!("saving {}", path.display())))
}

pub fn load_init(state_dir: &Path) -> Result<Vec<u8>> {
    let path = state_dir.join(INIT_FILE);
    std::fs::read(&path).map_err(|e| Error::from(e).context(format!("reading {}", path.display())))
}

/// Starts a `fuser` session on the device `dev` whose INIT request was `init`: the handshake
/// runs over a socket pair; returns the session, now reading `dev`, and fuser's INIT reply.
pub fn start_session<FS: fuser::Filesystem>(
    fs: FS,
    dev: BorrowedFd<'_>,
    init: &[u8],
    cfg: fuser::Config,
) -> Result<(fuser::Session<FS>, Vec<u8>)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair fills two fds we then own.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(os_err("socketpair"));
    }
    // SAFETY: fresh fds from socketpair, owned here.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut ours = std::fs::File::from(ours);
    ours.write_all(init)
        .map_err(|e| Error::from(e).context("passing INIT to the session"))?;
    let acl = cfg.acl;
    let session = fuser::Session::from_fd(fs, theirs, acl, cfg)
        .map_err(|e| Error::from(e).context("FUSE INIT"))?;
    let mut reply = vec![0u8; 64 * 1024];
    let n = ours
        .read(&mut reply)
        .map_err(|e| Error::from(e).context("reading the INIT reply"))?;
    reply.truncate(n);
    let at = session.as_fd().as_raw_fd();
    // SAFETY: both fds are open; dup3 atomically replaces the socket end fuser reads.
    if unsafe { libc::dup3(dev.as_raw_fd(), at, libc::O_CLOEXEC) } < 0 {
        return Err(os_err("handing the FUSE device to the session"));
    }
    Ok((session, reply))
}

/// Writes one whole message (a reply or notification) to the device.
pub fn write_device(dev: BorrowedFd<'_>, msg: &[u8]) -> Result<()> {
    // SAFETY: writing from a buffer we own.
    let n = unsafe { libc::write(dev.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    if n < 0 {
        return Err(os_err("writing to /dev/fuse"));
    }
    Ok(())
}

/// Asks the kernel to queue again every request a dead daemon had read but not answered.
pub fn resend(dev: BorrowedFd<'_>) -> Result<()> {
    // fuse_out_header { len: u32, error: i32 (the notify code), unique: u64 (0) }.
    let mut h = Vec::with_capacity(16);
    h.extend_from_slice(&16u32.to_ne_bytes());
    h.extend_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    h.extend_from_slice(&0u64.to_ne_bytes());
    write_device(dev, &h)
}

// ---- the holder ---------------------------------------------------------------------------

/// What a daemon gets from the holder.
pub struct Held {
    pub dev: OwnedFd,
    /// How many daemons took the mount over before (1 for the first takeover).
    pub generation: u64,
}

/// Takes the device from the holder of `state_dir`, if one answers; checks that it holds
/// `mountpoint`.
pub fn take_from_holder(state_dir: &Path, mountpoint: &Path) -> Result<Option<Held>> {
    let Ok(mut s) = UnixStream::connect(state_dir.join(HOLDER_SOCKET)) else {
        return Ok(None);
    };
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    // A holder exiting as we ask (its mount ended, or a clean stop told it to) closes the
    // connection unanswered: there is nothing to take over, so the mount is made anew.
    let gone = |e: &std::io::Error| {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
        matches!(e.kind(), ConnectionReset | BrokenPipe | UnexpectedEof)
    };
    let went_away = || {
        tracing::info!("the FUSE holder went away during the handover; mounting anew");
        Ok(None)
    };
    if let Err(e) = s.write_all(&[CMD_GET]) {
        return if gone(&e) { went_away() } else { Err(e.into()) };
    }
    let (payload, fd) = match silt_common::sys::recv_with_fd(s.as_raw_fd(), 8192) {
        Ok((p, None)) if p.is_empty() => return went_away(),
        Ok(answer) => answer,
        Err(e) if gone(&e) => return went_away(),
        Err(e) => return Err(Error::from(e).context("receiving from the FUSE holder")),
    };
    let Some(dev) = fd else {
        return Err(Error::new(
            ErrorKind::Unavailable,
            "the FUSE holder sent no descriptor",
        ));
    };
    if payload.len() < 8 {
        return Err(Error::new(
            ErrorKind::Unavailable,
            "short answer from the FUSE holder",
        ));
    }
    let generation = u64::from_le_bytes(payload[..8].try_into().unwrap_or_default());
    let held_mp = String::from_utf8_lossy(&payload[8..]).into_owned();
    let ours = resolved(mountpoint).to_string_lossy().into_owned();
    if held_mp != ours {
        return Err(Error::new(
            ErrorKind::Busy,
            format!(
                "the state dir's FUSE holder keeps the mount at {held_mp}, not {ours}; use another --state-dir"
            ),
        ));
    }
    Ok(Some(Held { dev, generation }))
}

/// Spawns `exe fuse-holder --state-dir DIR --mountpoint MP` with `dev` as its fd 3, in its own
/// session (it outlives this process), and waits until it serves its socket.
pub fn spawn_holder(
    exe: &Path,
    state_dir: &Path,
    mountpoint: &Path,
    dev: BorrowedFd<'_>,
) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let log = silt_common::private::options()
        .create(true)
        .append(true)
        .open(state_dir.join("fuse-holder.log"))?;
    let mp = resolved(mountpoint);
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("fuse-holder")
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--mountpoint")
        .arg(&mp)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log);
    let fd = dev.as_raw_fd();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::from(e).context("starting the FUSE holder"))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "the FUSE holder did not start (see {})",
                state_dir.join("fuse-holder.log").display()
            ),
        ));
    }
    // Not waited for: it lives as long as the mount (reaped by init once this process exits).
    std::mem::forget(child);
    Ok(())
}

/// The holder: keeps fd 3 (the mount's `/dev/fuse`) open, never reads it, hands it to
/// daemons that ask, and exits when the connection ends (unmounted or aborted: the device
/// then polls `POLLERR`) or when told to at a clean unmount.
pub fn run_holder(state_dir: &Path, mountpoint: &Path) -> Result<()> {
    // SAFETY: fd 3 is the device the daemon passed (checked by fstat below).
    let dev = unsafe { OwnedFd::from_raw_fd(3) };
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a local struct.
    if unsafe { libc::fstat(dev.as_raw_fd(), &mut st) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFCHR
    {
        return Err(Error::invalid("fuse-holder needs the FUSE device as fd 3"));
    }
    // SAFETY: setting FD_CLOEXEC on our own fd.
    unsafe { libc::fcntl(dev.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let sock_path = state_dir.join(HOLDER_SOCKET);
    let pid_path = state_dir.join(HOLDER_PID);
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path)
        .map_err(|e| Error::from(e).context(format!("binding {}", sock_path.display())))?;
    // Whoever connects gets the mount's device: the owner only.
    silt_common::private::restrict(&sock_path)?;
    silt_common::private::write(&pid_path, std::process::id().to_string())?;
    let cleanup = || {
        let _ = std::fs::remove_file(&sock_path);
        let _ = std::fs::remove_file(&pid_path);
    };
    println!("ready");
    let _ = std::io::stdout().flush();
    let mp = mountpoint.to_string_lossy().into_owned();
    let mut generation = 0u64;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            // No events asked: only POLLERR/POLLHUP, once the connection is gone.
            libc::pollfd {
                fd: dev.as_raw_fd(),
                events: 0,
                revents: 0,
            },
        ];
        // SAFETY: polling two valid fds in a local array.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            cleanup();
            return Err(os_err("poll"));
        }
        if fds[1].revents != 0 {
            eprintln!("silt fuse-holder: the mount at {mp} is gone; exiting");
            cleanup();
            return Ok(());
        }
        if fds[0].revents & libc::POLLIN == 0 {
            continue;
        }
        let Ok((mut conn, _)) = listener.accept() else {
            continue;
        };
        // A client that never speaks must not stall the holder.
        let _ = conn.set_read_timeout(Some(IO_TIMEOUT));
        let _ = conn.set_write_timeout(Some(IO_TIMEOUT));
        let mut cmd = [0u8; 1];
        if conn.read_exact(&mut cmd).is_err() {
            continue;
        }
        match cmd[0] {
            CMD_GET => {
                generation += 1;
                let mut payload = generation.to_le_bytes().to_vec();
                payload.extend_from_slice(mp.as_bytes());
                if let Err(e) = send_with_fd(conn.as_raw_fd(), &payload, dev.as_raw_fd()) {
                    eprintln!("silt fuse-holder: passing the device: {e}");
                } else {
                    eprintln!("silt fuse-holder: handed the mount at {mp} to a daemon (generation {generation})");
                }
            }
            CMD_QUIT => {
                eprintln!("silt fuse-holder: released the mount at {mp}");
                cleanup();
                return Ok(());
            }
            _ => {}
        }
    }
}

/// Waits up to `timeout` for process `pid` to exit (pidfd); `false` if it is still running.
pub fn wait_for_exit(pid: i32, timeout: std::time::Duration) -> Result<bool> {
    silt_common::sys::wait_for_exit(pid, timeout)
        .map_err(|e| Error::from(e).context("waiting for the old daemon"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder that closes the connection without answering (it was exiting: its mount ended,
    /// or a clean stop told it to) leaves nothing to take over: the daemon mounts anew instead
    /// of failing to start ("receiving from the FUSE holder: Connection reset by peer").
    #[test]
    fn a_holder_that_closes_unanswered_is_no_holder() {
        let dir = std::env::temp_dir().join(format!("silt-takeover-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for read_first in [false, true] {
            let listener = UnixListener::bind(dir.join(HOLDER_SOCKET)).unwrap();
            let t = std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                if read_first {
                    let mut b = [0u8; 1];
                    let _ = conn.read_exact(&mut b);
                }
                // Dropped unanswered, the listener with it.
            });
            let got = take_from_holder(&dir, Path::new("/mnt/x"));
            t.join().unwrap();
            assert!(
                matches!(got, Ok(None)),
                "read_first {read_first}: {:?}",
                got.map(|h| h.map(|h| h.generation))
            );
            let _ = std::fs::remove_file(dir.join(HOLDER_SOCKET));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
