//! The node's mount table: bind mounts into pods' volume directories, unmounts, and what
//! `/proc/self/mountinfo` says is mounted where.

use std::ffi::CString;
use std::io;
use std::path::Path;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn mount_lines() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The mount point field (5) of a mountinfo line, unescaped.
fn target_of(line: &str) -> Option<String> {
    line.split(' ')
        .nth(4)
        .map(silt_common::sys::unescape_mountinfo)
}

/// How many mounts sit on `path` (stacked mounts count one each).
pub fn mounts_on(path: &Path) -> usize {
    let target = path.to_string_lossy();
    mount_lines()
        .iter()
        .filter(|l| target_of(l).as_deref() == Some(&*target))
        .count()
}

/// Whether a silt FUSE mount sits on `path`.
pub fn is_silt_mount(path: &Path) -> bool {
    let target = path.to_string_lossy();
    mount_lines()
        .iter()
        .any(|l| silt_common::sys::is_silt_mount_of(l, &target))
}

/// Bind-mounts `source` on `target`, read-only if asked (a bind mount takes the read-only
/// flag only on a remount).
pub fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    let (s, t) = (cpath(source)?, cpath(target)?);
    // SAFETY: valid C strings; no data argument.
    let rc = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if read_only {
        // SAFETY: as above, on the bind mount just made.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                t.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            let _ = unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts everything stacked on `target`; a busy mount is detached (it leaves the
/// namespace now, and the kernel drops it when its last user goes).
pub fn unmount(target: &Path) -> io::Result<()> {
    let t = cpath(target)?;
    while mounts_on(target) > 0 {
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(t.as_ptr(), 0) } == 0 {
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EBUSY) | Some(libc::ENOTCONN) => {
                // SAFETY: as above.
                if unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) } != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Some(libc::EINVAL) | Some(libc::ENOENT) => return Ok(()),
            _ => return Err(e),
        }
    }
    Ok(())
}

/// `statvfs(2)` of `path`: (total, free for users, used) in bytes and in inodes.
pub fn usage(path: &Path) -> io::Result<([u64; 3], [u64; 3])> {
    let p = cpath(path)?;
    // SAFETY: a valid C string and a zeroed out-struct.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(p.as_ptr(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        st
    };
    let unit = st.f_frsize as u64;
    let bytes = [
        st.f_blocks as u64 * unit,
        st.f_bavail as u64 * unit,
        (st.f_blocks as u64).saturating_sub(st.f_bfree as u64) * unit,
    ];
    let inodes = [
        st.f_files as u64,
        st.f_favail as u64,
        (st.f_files as u64).saturating_sub(st.f_ffree as u64),
    ];
    Ok((bytes, inodes))
}

/// Whether `path` answers at all (a dead FUSE mount answers `ENOTCONN`).
pub fn answers(path: &Path) -> bool {
    usage(path).is_ok()
}
