//! Paths of a local store, resolved inside its root and never through a link.
//!
//! A link in a local store is an entry of its own (listed as a link, read with `readlink`,
//! resolved by the kernel in the mount), never a way out of the root: `a/b`, where `a` is a
//! link to `/etc`, must not reach `/etc/b` — not for an S3 key the gateway serves (the daemon
//! often runs as root), nor for a mount whose cached metadata still shows `a` as the directory
//! it was before someone swapped it for a link. So every local operation opens the parent
//! directory of its path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (a walk of
//! `O_NOFOLLOW` opens where the kernel lacks `openat2`) and names the last component through
//! that descriptor, `/proc/self/fd/N/name`: the standard library's path calls then act on that
//! directory, whatever happens to the names above it meanwhile. Whether the last component is
//! followed is each operation's own choice (lstat, `O_NOFOLLOW`, rename and unlink do not).
//! Links in the root's own path are followed: the root is configuration, not data.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A store path made safe to use: the descriptor that pins its parent directory (or the
/// entry itself, see [`whole`]) and the path that names the entry through it.
#[derive(Debug)]
pub(crate) struct Beneath {
    /// Held as long as `path` is used: `path` goes through it.
    _pin: Option<OwnedFd>,
    dir: PathBuf,
    path: PathBuf,
}

impl Beneath {
    /// The directory the entry is in (the pinned parent), as a path.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl std::ops::Deref for Beneath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Beneath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// `path` (a normalized store path: no `.`, `..` or empty components) of the store rooted at
/// `root`, its parent directory opened without following any link. `create`: missing parent
/// directories are made (as `mkdir -p` would, each one beneath the last). A parent that is a
/// link or a file is `ENOTDIR`, a missing one `ENOENT`. The empty path is the root itself.
pub(crate) fn parent(root: &Path, path: &str, create: bool) -> io::Result<Beneath> {
    if path.is_empty() {
        return Ok(Beneath {
            _pin: None,
            dir: root.to_path_buf(),
            path: root.to_path_buf(),
        });
    }
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let fd = open_dir_beneath(root, dir, create)?;
    let dir = fd_path(&fd);
    Ok(Beneath {
        path: dir.join(name),
        dir,
        _pin: Some(fd),
    })
}

/// `path` of the store rooted at `root`, the entry itself opened: [`Beneath::entry`] of its
/// [`parent`].
pub(crate) fn whole(root: &Path, path: &str) -> io::Result<Beneath> {
    parent(root, path, false)?.entry()
}

impl Beneath {
    /// The entry itself opened (`O_PATH`) through the pinned parent, not followed: a link
    /// there is `ELOOP`. For calls that follow their path (listing a directory, `chmod`),
    /// which then act on that very entry. The root is opened as configured.
    pub(crate) fn entry(&self) -> io::Result<Beneath> {
        let fd = match (&self._pin, self.path.file_name()) {
            (Some(dir), Some(name)) => open_at(dir, name.as_bytes(), 0)?,
            _ => open_root(&self.path)?,
        };
        // SAFETY: fstat into a zeroed struct of the right type, on a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        let p = fd_path(&fd);
        Ok(Beneath {
            dir: p.clone(),
            path: p,
            _pin: Some(fd),
        })
    }
}

/// The root directory, opened `O_PATH`; its own path may go through links (configuration).
fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let c = cstring(root.as_os_str().as_bytes())?;
    // SAFETY: a valid C string.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The directory `rel` below `root`, opened `O_PATH` without following links: a link (or a
/// file) on the way is `ENOTDIR`.
fn open_dir_beneath(root: &Path, rel: &str, create: bool) -> io::Result<OwnedFd> {
    let root_fd = open_root(root)?;
    if rel.is_empty() {
        return Ok(root_fd);
    }
    match openat2(&root_fd, rel) {
        Ok(fd) => Ok(fd),
        // No openat2 (before Linux 5.6, or refused by a seccomp filter): walk instead.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            walk(root_fd, rel, create)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => walk(root_fd, rel, create),
        // A link on the way: the path is not there, as with a file on the way.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            Err(io::Error::from_raw_os_error(libc::ENOTDIR))
        }
        // EXDEV: `..` or an absolute link on the way, never in a normalized path.
        Err(e) => Err(e),
    }
}

/// The directory `rel` below the directory `fd`, one `O_NOFOLLOW | O_DIRECTORY` open a
/// component: a link on the way is `ENOTDIR` (opened as itself, it is no directory).
/// `create`: missing directories on the way made.
fn walk(mut fd: OwnedFd, rel: &str, create: bool) -> io::Result<OwnedFd> {
    for name in rel.split('/') {
        let name = name.as_bytes();
        let next = match open_at(&fd, name, libc::O_DIRECTORY) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                let c = cstring(name)?;
                // SAFETY: a valid descriptor and C string.
                if unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), 0o777) } != 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(e);
                    }
                }
                open_at(&fd, name, libc::O_DIRECTORY)
            }
            other => other,
        };
        fd = next?;
    }
    Ok(fd)
}

/// `openat2(dir, rel, O_PATH | O_DIRECTORY, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`.
fn openat2(dir: &OwnedFd, rel: &str) -> io::Result<OwnedFd> {
    let c = cstring(rel.as_bytes())?;
    // SAFETY: open_how is plain data; all-zero is its "no flags" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a valid descriptor, C string and open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `openat(dir, name, O_PATH | O_NOFOLLOW | flags)`.
fn open_at(dir: &OwnedFd, name: &[u8], flags: i32) -> io::Result<OwnedFd> {
    let c = cstring(name)?;
    // SAFETY: a valid descriptor and C string.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW | flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The path that names what `fd` is open on (the kernel's own link to it, not its name).
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno<T>(r: io::Result<T>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    #[test]
    fn paths_stay_beneath_the_root() {
        let t = tempfile::tempdir().unwrap();
        let (root, outside) = (t.path().join("root"), t.path().join("outside"));
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"s").unwrap();
        std::fs::write(root.join("d/e/f"), b"f").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        std::os::unix::fs::symlink("d", root.join("rel")).unwrap();
        std::fs::write(root.join("file"), b"x").unwrap();

        assert_eq!(
            std::fs::read(&*parent(&root, "d/e/f", false).unwrap()).unwrap(),
            b"f"
        );
        assert_eq!(
            std::fs::read(&*parent(&root, "", false).unwrap().join("file")).unwrap(),
            b"x"
        );
        // A link on the way, absolute or relative, is not followed: ENOTDIR, as a file is.
        for p in ["out/secret", "rel/e/f", "file/x"] {
            assert_eq!(errno(parent(&root, p, false)), Some(libc::ENOTDIR), "{p}");
            assert_eq!(
                errno(parent(&root, p, true)),
                Some(libc::ENOTDIR),
                "{p} (create)"
            );
            assert_eq!(errno(whole(&root, p)), Some(libc::ENOTDIR), "{p} (whole)");
        }
        assert!(!outside.join("secret").with_extension("x").exists());
        // The link itself is named, not followed.
        let link = parent(&root, "out", false).unwrap();
        assert!(std::fs::symlink_metadata(&*link).unwrap().is_symlink());
        assert_eq!(errno(whole(&root, "out")), Some(libc::ELOOP));
        assert_eq!(errno(parent(&root, "missing/x", false)), Some(libc::ENOENT));
        // The walk used where the kernel has no openat2 gives the same answers.
        let at_root = || open_root(&root).unwrap();
        for p in ["out/secret", "rel/e/f", "file/x", "out/x/y"] {
            let dir = p.rsplit_once('/').unwrap().0;
            assert_eq!(
                errno(walk(at_root(), dir, false)),
                Some(libc::ENOTDIR),
                "{p}"
            );
            assert_eq!(
                errno(walk(at_root(), dir, true)),
                Some(libc::ENOTDIR),
                "{p}"
            );
        }
        assert!(walk(at_root(), "d/e", false).is_ok());
        assert_eq!(errno(walk(at_root(), "d/x", false)), Some(libc::ENOENT));
        walk(at_root(), "w/v", true).unwrap();
        assert!(root.join("w/v").is_dir());
        // Created parents are real directories below the root.
        let made = parent(&root, "n/m/leaf", true).unwrap();
        std::fs::write(&*made, b"l").unwrap();
        assert_eq!(std::fs::read(root.join("n/m/leaf")).unwrap(), b"l");
        // The pinned parent holds when the name above it is swapped for a link.
        let pinned = parent(&root, "d/e/f", false).unwrap();
        std::fs::rename(root.join("d"), root.join("d-moved")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("d")).unwrap();
        assert_eq!(std::fs::read(&*pinned).unwrap(), b"f");
        assert_eq!(errno(parent(&root, "d/secret", false)), Some(libc::ENOTDIR));
        let listed: Vec<_> = std::fs::read_dir(&*whole(&root, "d-moved/e").unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(listed, ["f"]);
    }
}
