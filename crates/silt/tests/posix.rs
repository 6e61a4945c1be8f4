//! POSIX attributes through real mounts: inode numbers across renames, link counts, directory
//! times, and (over `file://` and S3) modes, owners, times and symlinks that hold across a
//! remount. Permission rules are checked from an unprivileged child process.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// utimensat(2) on `p` (no symlink following): `None` is `UTIME_OMIT`, `Some(None)` is
/// `UTIME_NOW`, `Some(Some(secs))` an explicit time. The errno on failure.
fn utimes(p: &Path, atime: Option<Option<i64>>, mtime: Option<Option<i64>>) -> Result<(), i32> {
    let ts = |t: Option<Option<i64>>| match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(None) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(Some(s)) => libc::timespec {
            tv_sec: s,
            tv_nsec: 0,
        },
    };
    let times = [ts(atime), ts(mtime)];
    let c = cstr(p);
    // SAFETY: a valid C string and two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// The mtime in whole seconds (a directory's nanoseconds carry Silt's listing digest).
fn mtime(p: &Path) -> i64 {
    std::fs::symlink_metadata(p).unwrap().mtime()
}

fn ctime(p: &Path) -> (i64, i64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.ctime(), m.ctime_nsec())
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

/// Long past: any change now is later, however coarse the clock.
const PAST: i64 = 1_000_000_000;

/// A local store with a writable `silt up` over it at `/data`.
struct LocalFx {
    store: tempfile::TempDir,
    dir: tempfile::TempDir,
}

impl LocalFx {
    fn new() -> Self {
        LocalFx {
            store: tempfile::tempdir().unwrap(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn uri(&self) -> String {
        format!("file://{}", self.store.path().display())
    }

    fn up(&self) -> Silt {
        Silt::up(
            &[("/data", &self.uri())],
            &["--write-type", "through"],
            self.dir.path(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// POSIX: rename(2) moves a directory entry; the file (and a directory's whole tree) stays the
/// same file, so its inode number does not change.
fn renames_keep_inode_numbers(root: &Path) {
    std::fs::create_dir_all(root.join("d/s")).unwrap();
    std::fs::write(root.join("d/f"), b"f").unwrap();
    std::fs::write(root.join("d/s/g"), b"g").unwrap();
    std::fs::write(root.join("x"), b"x").unwrap();
    let before = [
        ino(&root.join("d")),
        ino(&root.join("d/f")),
        ino(&root.join("d/s")),
        ino(&root.join("d/s/g")),
    ];
    let x = ino(&root.join("x"));
    std::fs::rename(root.join("d"), root.join("e")).unwrap();
    std::fs::rename(root.join("x"), root.join("e/s/y")).unwrap();
    let after = [
        ino(&root.join("e")),
        ino(&root.join("e/f")),
        ino(&root.join("e/s")),
        ino(&root.join("e/s/g")),
    ];
    assert_eq!(
        before, after,
        "a renamed directory and its children keep their numbers"
    );
    assert_eq!(
        ino(&root.join("e/s/y")),
        x,
        "a renamed file keeps its number"
    );
    assert_eq!(std::fs::read(root.join("e/s/y")).unwrap(), b"x");
}

/// POSIX: creating, removing or renaming an entry marks the directory's mtime and ctime for
/// update. The directory's mtime is first set long in the past (so the check holds with a
/// coarse clock); each change must move it past that again.
fn entry_changes_move_the_parent_times(root: &Path, set_past: &dyn Fn(&Path)) {
    let p = root.join("times");
    std::fs::create_dir(&p).unwrap();
    let step = |what: &str, change: &dyn Fn()| {
        set_past(&p);
        assert_eq!(mtime(&p), PAST, "{what}: the directory's mtime was set");
        let c0 = ctime(&p);
        change();
        assert!(mtime(&p) > PAST, "{what} moves the parent's mtime");
        assert_ne!(ctime(&p), c0, "{what} moves the parent's ctime");
    };
    step("create", &|| std::fs::write(p.join("a"), b"a").unwrap());
    step("mkdir", &|| std::fs::create_dir(p.join("sub")).unwrap());
    step("rename in", &|| {
        std::fs::rename(p.join("a"), p.join("b")).unwrap()
    });
    step("unlink", &|| std::fs::remove_file(p.join("b")).unwrap());
    step("rmdir", &|| std::fs::remove_dir(p.join("sub")).unwrap());
}

/// POSIX: a new file's times are those of its creation.
fn new_empty_file_has_its_creation_time(root: &Path) {
    let t0 = SystemTime::now();
    let f = std::fs::File::create(root.join("new-empty")).unwrap();
    let m = f.metadata().unwrap();
    assert!(
        m.modified().unwrap() >= t0 - Duration::from_secs(1),
        "an empty new file reports its creation time, not the mount's start"
    );
    drop(f);
    let m = std::fs::metadata(root.join("new-empty")).unwrap();
    assert!(m.modified().unwrap() >= t0 - Duration::from_secs(1));
    assert_eq!(m.len(), 0);
}

/// Link counts: a file has 1; a directory 2 plus one per subdirectory (or 1: not counted).
fn link_counts(root: &Path) {
    std::fs::create_dir_all(root.join("n/a")).unwrap();
    std::fs::create_dir_all(root.join("n/b")).unwrap();
    std::fs::write(root.join("n/f"), b"").unwrap();
    assert_eq!(std::fs::metadata(root.join("n/f")).unwrap().nlink(), 1);
    let _ = std::fs::read_dir(root.join("n")).unwrap().count();
    let n = std::fs::metadata(root.join("n")).unwrap().nlink();
    assert!(
        n == 4 || n == 1,
        "a directory with two subdirectories: {n} links"
    );
}

/// Sets a local directory's mtime behind Silt's back (a utimensat through the mount is
/// tested separately), then has Silt ask the store again.
fn set_local_past<'a>(store: &'a Path, silt: &'a Silt) -> impl Fn(&Path) + 'a {
    move |p: &Path| {
        let root = silt.path("data");
        let rel = p.strip_prefix(&root).unwrap();
        utimes(&store.join(rel), Some(Some(PAST)), Some(Some(PAST))).unwrap();
        let ns = format!("/data/{}", rel.display());
        let o = silt.cli(&["fs", "invalidate", &ns]);
        assert!(o.status.success(), "invalidate: {}", stderr(&o));
    }
}

#[test]
fn inodes_links_and_directory_times_local() {
    let fx = LocalFx::new();
    let silt = fx.up();
    let root = silt.path("data");
    renames_keep_inode_numbers(&root);
    new_empty_file_has_its_creation_time(&root);
    link_counts(&root);
    {
        let set_past = set_local_past(fx.store.path(), &silt);
        entry_changes_move_the_parent_times(&root, &set_past);
    }
    silt.stop();
}

#[test]
fn inodes_and_new_files_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");
    renames_keep_inode_numbers(&root);
    new_empty_file_has_its_creation_time(&root);
    link_counts(&root);
    silt.stop();
}
