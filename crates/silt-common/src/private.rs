//! Owner-only local state. Everything Silt keeps on local disk (state directory, cache tiers,
//! spill, write-ahead log, journals, snapshots, sockets) holds data that the mount serves only
//! to users whose mode bits allow it, so none of it may follow the umask: directories are
//! created 0700 and files 0600 at creation, and directories Silt owns are tightened at start-up
//! (a state dir left by an older version may be 0755).

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every directory Silt creates for its state.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file Silt creates for its state.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` and any missing parents with mode 0700, then makes `dir` itself 0700 if it
/// existed with a wider mode. Parents that existed are left alone (they are not Silt's).
pub fn create_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    tighten(dir)
}

/// Makes the directory `dir` 0700 unless it already is (no group/other bits).
pub fn tighten(dir: &Path) -> io::Result<()> {
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, Permissions::from_mode(mode & 0o700 | DIR_MODE))?;
    }
    Ok(())
}

/// `OpenOptions` whose `create` makes an owner-only (0600) file.
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// `File::create`, owner-only.
pub fn create(path: &Path) -> io::Result<File> {
    options().write(true).create(true).truncate(true).open(path)
}

/// `fs::write`, owner-only for a new file.
pub fn write(path: &Path, data: impl AsRef<[u8]>) -> io::Result<()> {
    io::Write::write_all(&mut create(path)?, data.as_ref())
}

/// Makes the socket (or any file) at `path` owner-only.
pub fn restrict(path: &Path) -> io::Result<()> {
    std::fs::set_permissions(path, Permissions::from_mode(FILE_MODE))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` under umask 000 and restores the old one.
    fn with_open_umask<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: umask(2) cannot fail.
        let old = unsafe { libc::umask(0) };
        let r = f();
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        r
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn created_owner_only_under_an_open_umask() {
        let base = std::env::temp_dir().join(format!("silt-private-{}", std::process::id()));
        let dir = base.join("a/b");
        with_open_umask(|| {
            create_dir(&dir).unwrap();
            write(&dir.join("f"), b"x").unwrap();
        });
        assert_eq!(mode(&base.join("a")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("f")), 0o600);
        // An existing 0755 directory is tightened.
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
