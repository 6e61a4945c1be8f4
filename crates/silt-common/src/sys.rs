//! Operating-system helpers written once for every crate that needs them: passing a file
//! descriptor over a Unix socket (`SCM_RIGHTS`: the worker leasing a cache file, the FUSE
//! holder handing over `/dev/fuse`), waiting for a process by pidfd, reading
//! `/proc/self/mountinfo`, and the client side of the FUSE holder (the process that keeps a
//! mount's connection open across daemon restarts), which the mount and the CSI node both use.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Space for one `cmsghdr` carrying one fd, aligned for `cmsghdr`.
#[repr(C)]
union CmsgBuf {
    _align: libc::cmsghdr,
    buf: [u8; 64],
}

fn one_fd_len() -> usize {
    // SAFETY: CMSG_LEN is arithmetic.
    unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize }
}

/// Sends `payload` (at least one byte) on `sock` with `fd` attached (`SCM_RIGHTS`).
pub fn send_with_fd(sock: RawFd, payload: &[u8], fd: RawFd) -> std::io::Result<()> {
    if payload.is_empty() {
        return Err(std::io::Error::other("an fd goes with at least one byte"));
    }
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut _,
        iov_len: payload.len(),
    };
    // SAFETY: CmsgBuf and msghdr are plain C data; all-zero is a valid empty value of each.
    let (mut cbuf, mut msg): (CmsgBuf, libc::msghdr) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: a pointer to a union field of plain bytes, `space` of which fit in it.
    msg.msg_control = unsafe { cbuf.buf.as_mut_ptr().cast() };
    msg.msg_controllen = space as _;
    // SAFETY: the header is filled as cmsg(3) describes, within the control buffer; every
    // pointer in `msg` points at locals that outlive the call (the kernel only reads iov).
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(std::io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = one_fd_len() as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        match libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) {
            n if n < 0 => Err(std::io::Error::last_os_error()),
            0 => Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "socket closed",
            )),
            _ => Ok(()),
        }
    }
}

/// Receives at most `max` bytes from `sock` and the fd attached to them, if exactly one came
/// (`SCM_RIGHTS`, close-on-exec). No bytes: the peer closed the socket.
pub fn recv_with_fd(sock: RawFd, max: usize) -> std::io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut buf = vec![0u8; max.max(1)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CmsgBuf and msghdr are plain C data; all-zero is a valid empty value of each.
    let (mut cbuf, mut msg): (CmsgBuf, libc::msghdr) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: a pointer to a union field of plain bytes.
    msg.msg_control = unsafe { cbuf.buf.as_mut_ptr().cast() };
    msg.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
    // SAFETY: the kernel writes at most `iov_len` bytes into `buf` and `msg_controllen` into
    // the control buffer; the fd is read only from a SCM_RIGHTS message of the right length.
    unsafe {
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        let fd = if !cmsg.is_null()
            && (*cmsg).cmsg_level == libc::SOL_SOCKET
            && (*cmsg).cmsg_type == libc::SCM_RIGHTS
            && (*cmsg).cmsg_len as usize == one_fd_len()
        {
            Some(OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
            )))
        } else {
            None
        };
        Ok((buf, fd))
    }
}

/// A value that belongs to the process that made it: dropped there, and left as the fork left
/// it (not dropped) in a forked child. For what a child may come to free without having made
/// it (the Python SDK's objects: garbage its GC finds, as in a DataLoader worker importing
/// numpy) but whose threads, I/O registrations (an epoll set the child shares with its parent)
/// and connections are the parent's: a tokio runtime dropped in a child detached threads the
/// child does not have (a crash seen under PyTorch's DataLoader).
pub struct ForkLocal<T> {
    value: std::mem::ManuallyDrop<T>,
    pid: u32,
}

impl<T> ForkLocal<T> {
    pub fn new(value: T) -> Self {
        ForkLocal {
            value: std::mem::ManuallyDrop::new(value),
            pid: std::process::id(),
        }
    }

    /// Whether this is the process that made it.
    pub fn here(&self) -> bool {
        std::process::id() == self.pid
    }
}

impl<T> std::ops::Deref for ForkLocal<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for ForkLocal<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> Drop for ForkLocal<T> {
    fn drop(&mut self) {
        if self.here() {
            // SAFETY: dropped once, here; the wrapper is gone after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.value) }
        }
    }
}

/// `len` bytes of `file` from `offset`, read into a buffer that is not zeroed first (the read
/// writes every byte of it): a fresh buffer's pages are touched once, by the kernel's copy,
/// not twice. `UnexpectedEof` when the file ends before `len` bytes.
pub fn read_exact_at_fresh(
    file: &std::fs::File,
    len: usize,
    offset: u64,
) -> std::io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let at = buf.len();
        let pos = offset
            .checked_add(at as u64)
            .and_then(|p| libc::off_t::try_from(p).ok())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: the pointer and length name the vector's spare capacity, which pread only
        // writes; `set_len` below counts only the bytes it wrote.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(at).cast(),
                len - at,
                pos,
            )
        };
        match n {
            n if n > 0 => {
                // SAFETY: pread wrote `n` bytes after the first `at`, within the capacity.
                unsafe { buf.set_len(at + n as usize) }
            }
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(buf)
}

/// A pidfd of process `pid` (`pidfd_open(2)`): it polls readable once the process has
/// exited, whoever its parent is. `ESRCH`: no such process (gone already).
pub fn open_pidfd(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open has no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits up to `timeout` for process `pid` to exit (pidfd); `false` if it is still running.
pub fn wait_for_exit(pid: i32, timeout: Duration) -> std::io::Result<bool> {
    let fd = match open_pidfd(pid) {
        Ok(fd) => fd,
        // ESRCH: already gone.
        Err(e) => return Ok(e.raw_os_error() == Some(libc::ESRCH)),
    };
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // SAFETY: polling one valid fd.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            return Ok(false);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Waits (at most `timeout`) for child `pid` to exit and reaps it; at once if it is not a
/// child of this process.
pub fn reap_child(pid: libc::pid_t, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on one pid with a local status word.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r != 0 || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether a `/proc/self/mountinfo` line is a silt FUSE mount at `target`: mounted by silt
/// itself it reads `... - fuse.silt silt ...`; mounted by `fuser` (earlier versions) the
/// subtype is dropped and it reads `... - fuse silt ...` (type `fuse`, source `silt`).
pub fn is_silt_mount_of(line: &str, target: &str) -> bool {
    let Some((head, tail)) = line.split_once(" - ") else {
        return false;
    };
    // Field 5 is the mount point; after the separator come type and source.
    if head.split(' ').nth(4).map(unescape_mountinfo).as_deref() != Some(target) {
        return false;
    }
    let mut t = tail.split(' ');
    matches!(
        (t.next(), t.next()),
        (Some("fuse.silt"), _) | (Some("fuse"), Some("silt"))
    )
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
pub fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// The FUSE holder's socket in a mount's state dir.
pub const HOLDER_SOCKET: &str = "fuse-holder.sock";
/// The holder's pid, while it runs.
pub const HOLDER_PID: &str = "fuse-holder.pid";
/// Holder commands: hand over the device, let go of it.
pub const HOLDER_GET: u8 = b'G';
pub const HOLDER_QUIT: u8 = b'Q';
/// Longest a holder conversation may stall (it is a few bytes both ways).
pub const HOLDER_IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a holder answers on the state dir's socket (without taking anything from it).
pub fn holder_alive(state_dir: &Path) -> bool {
    UnixStream::connect(state_dir.join(HOLDER_SOCKET)).is_ok()
}

/// The pid of the state dir's holder, while it runs.
pub fn holder_pid(state_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(state_dir.join(HOLDER_PID))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Tells the holder to let go (a clean unmount): its descriptor closes, so the connection
/// ends with the last one.
pub fn release_holder(state_dir: &Path) {
    let pid = holder_pid(state_dir).filter(|p| *p > 1);
    if let Ok(mut s) = UnixStream::connect(state_dir.join(HOLDER_SOCKET)) {
        let _ = s.set_read_timeout(Some(HOLDER_IO_TIMEOUT));
        let _ = s.write_all(&[HOLDER_QUIT]);
        // Wait for its answer (the socket closing), so it is gone when this returns.
        let mut b = [0u8; 1];
        let _ = s.read(&mut b);
        // The holder this process spawned is its child: reaped here, or it stays listed
        // (a zombie) after a clean exit where nothing reaps orphans.
        if let Some(pid) = pid {
            reap_child(pid, HOLDER_IO_TIMEOUT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dropped in the process that made it, not in a forked child.
    #[test]
    fn a_fork_local_value_is_dropped_only_where_it_was_made() {
        struct Says(RawFd);
        impl Drop for Says {
            fn drop(&mut self) {
                // SAFETY: a write of one byte from a live buffer to a pipe we hold.
                unsafe { libc::write(self.0, b"x".as_ptr().cast(), 1) };
            }
        }
        let (r, w) = UnixStream::pair().unwrap();
        let made = ForkLocal::new(Says(w.as_raw_fd()));
        assert!(made.here());
        // SAFETY: the child only drops the value, asks `here` and exits (async-signal-safe
        // calls and a getpid); nothing in it allocates or takes a lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = if made.here() { 1 } else { 0 };
            drop(made);
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child made above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child: {status}"
        );
        drop(made);
        drop(w);
        let mut said = Vec::new();
        (&r).read_to_end(&mut said).unwrap();
        assert_eq!(said, b"x", "dropped once, in the parent");
    }

    /// Every byte asked for, from the offset asked; a file that ends first is an error,
    /// not a short buffer.
    #[test]
    fn a_fresh_read_is_exact_or_fails() {
        let path = std::env::temp_dir().join(format!("silt-fresh-{}", std::process::id()));
        std::fs::write(&path, (0..=255u8).cycle().take(10_000).collect::<Vec<_>>()).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let got = read_exact_at_fresh(&f, 5000, 300).unwrap();
        let want: Vec<u8> = (0..=255u8).cycle().skip(300).take(5000).collect();
        assert_eq!(got, want);
        assert!(read_exact_at_fresh(&f, 0, 10_000).unwrap().is_empty());
        let e = read_exact_at_fresh(&f, 101, 9_900).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_fd_and_its_bytes_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = tempfile_fd();
        send_with_fd(a.as_raw_fd(), b"hello", f.as_raw_fd()).unwrap();
        let (bytes, fd) = recv_with_fd(b.as_raw_fd(), 64).unwrap();
        assert_eq!(bytes, b"hello");
        let got = std::fs::File::from(fd.expect("no fd came"));
        assert_eq!(
            got.metadata().unwrap().len(),
            std::fs::File::from(f).metadata().unwrap().len()
        );
        // Bytes without an fd, then the peer closing.
        (&a).write_all(b"x").unwrap();
        let (bytes, fd) = recv_with_fd(b.as_raw_fd(), 64).unwrap();
        assert_eq!((bytes.as_slice(), fd.is_none()), (&b"x"[..], true));
        drop(a);
        let (bytes, fd) = recv_with_fd(b.as_raw_fd(), 64).unwrap();
        assert!(bytes.is_empty() && fd.is_none());
        assert!(send_with_fd(b.as_raw_fd(), b"", 0).is_err());
    }

    fn tempfile_fd() -> OwnedFd {
        let path = std::env::temp_dir().join(format!("silt-sys-test-{}", std::process::id()));
        std::fs::write(&path, b"12345").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        f.into()
    }

    #[test]
    fn silt_mounts_are_recognised_in_mountinfo() {
        // As this kernel writes them for a fuser mount and for silt's own mount(2).
        let fuser = "612 29 0:70 / /tmp/t\\040x/mnt rw,nosuid,nodev,noatime shared:327 - fuse silt rw,user_id=0,group_id=0,default_permissions,allow_other";
        let own =
            "612 29 0:70 / /tmp/m rw,nosuid,nodev,noatime - fuse.silt silt rw,user_id=0,group_id=0";
        assert!(is_silt_mount_of(fuser, "/tmp/t x/mnt"));
        assert!(is_silt_mount_of(own, "/tmp/m"));
        assert!(!is_silt_mount_of(own, "/tmp/m/x"));
        let other = "612 29 0:70 / /tmp/m rw - fuse sshfs rw,user_id=0";
        assert!(!is_silt_mount_of(other, "/tmp/m"));
        let other = "612 29 0:70 / /tmp/m rw - fuse.sshfs silt rw";
        assert!(!is_silt_mount_of(other, "/tmp/m"));
        assert!(!is_silt_mount_of("garbage", "/tmp/m"));
    }

    #[test]
    fn a_process_that_exited_is_waited_for_at_once() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(wait_for_exit(pid, Duration::from_secs(5)).unwrap());
    }
}
