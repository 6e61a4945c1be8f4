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

fn stat_of(p: &Path) -> std::fs::Metadata {
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
}

/// chmod, chown and utimensat through the mount, as root, of a file and a directory.
fn set_attributes(root: &Path) {
    std::fs::write(root.join("f"), b"bytes").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    for p in [root.join("f"), root.join("d")] {
        let c = cstr(&p);
        // SAFETY: valid C strings.
        unsafe {
            assert_eq!(libc::chmod(c.as_ptr(), 0o750), 0, "chmod {}", p.display());
            assert_eq!(
                libc::lchown(c.as_ptr(), 1234, 5678),
                0,
                "chown {}",
                p.display()
            );
        }
        utimes(&p, Some(Some(PAST + 10)), Some(Some(PAST + 20))).unwrap();
    }
}

/// What `set_attributes` set, as a stat through the mount (or of the store's own file) shows.
/// The atime only while nothing read the file (a local read moves it, as POSIX says).
fn check_attributes(root: &Path, what: &str, atime: bool) {
    let f = stat_of(&root.join("f"));
    assert_eq!(f.mode() & 0o7777, 0o750, "{what}: file mode");
    assert_eq!((f.uid(), f.gid()), (1234, 5678), "{what}: file owner");
    assert_eq!(f.mtime(), PAST + 20, "{what}: file mtime");
    if atime {
        assert_eq!(f.atime(), PAST + 10, "{what}: file atime");
    }
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"bytes", "{what}");
    let d = stat_of(&root.join("d"));
    assert_eq!(d.mode() & 0o7777, 0o750, "{what}: directory mode");
    assert_eq!((d.uid(), d.gid()), (1234, 5678), "{what}: directory owner");
    assert_eq!(d.mtime(), PAST + 20, "{what}: directory mtime");
}

/// `silt up` again in `dir` with files written through (after a stop, or a crash).
fn restart(dir: &Path, uri: &str, args: &[String]) -> Silt {
    let mut extra = vec!["--write-type", "through"];
    extra.extend(args.iter().map(String::as_str));
    Silt::restart(&[("/data", uri)], &extra, dir)
}

#[test]
fn attributes_hold_across_remount_and_restart_local() {
    let fx = LocalFx::new();
    let silt = fx.up();
    let root = silt.path("data");
    set_attributes(&root);
    check_attributes(fx.store.path(), "the store's own files", true);
    check_attributes(&root, "through the mount", true);
    silt.stop();
    let silt = restart(fx.dir.path(), &fx.uri(), &[]);
    check_attributes(&root, "after a remount", false);
    let mut silt = silt;
    silt.crash();
    let silt = restart(fx.dir.path(), &fx.uri(), &[]);
    check_attributes(&root, "after a daemon restart", false);
    silt.stop();
}

#[test]
fn attributes_hold_across_remount_and_restart_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &["--write-type", "through", "--s3-list-attrs", "true"],
        dir.path(),
    );
    let root = silt.path("data");
    set_attributes(&root);
    check_attributes(&root, "through the mount", true);
    // s3fs-fuse's conventions, in the object's user metadata.
    let meta = fx.rt.block_on(fx.store.stat("f")).unwrap();
    assert_eq!(meta.mode, Some(0o750));
    assert_eq!((meta.posix.uid, meta.posix.gid), (Some(1234), Some(5678)));
    // A directory's, in its marker's (`d/`), as s3fs-fuse keeps them.
    let d = fx.rt.block_on(fx.store.stat("d")).unwrap();
    assert_eq!((d.kind, d.mode), (silt_ufs::EntryKind::Dir, Some(0o750)));
    assert_eq!((d.posix.uid, d.posix.gid), (Some(1234), Some(5678)));
    silt.stop();
    let mut args = s3_args(&fx.server);
    args.extend(["--s3-list-attrs".to_string(), "true".to_string()]);
    let silt = restart(dir.path(), &fx.uri(), &args);
    check_attributes(&root, "after a remount", true);
    let mut silt = silt;
    silt.crash();
    let silt = restart(dir.path(), &fx.uri(), &args);
    check_attributes(&root, "after a daemon restart", true);
    // An object written with s3fs-fuse's metadata behind Silt's back shows its mode and owner.
    let set = silt_ufs::SetAttrs {
        mode: Some(0o600),
        uid: Some(42),
        gid: Some(43),
        ..Default::default()
    };
    let data = bytes::Bytes::from_static(b"s3fs");
    fx.rt
        .block_on(fx.store.write_from_attrs("ext", &data, 4, &set, None))
        .unwrap();
    let o = silt.cli(&["fs", "invalidate", "/data"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stat_of(&root.join("ext"));
    assert_eq!(e.mode() & 0o7777, 0o600, "an s3fs object's mode");
    assert_eq!((e.uid(), e.gid()), (42, 43), "an s3fs object's owner");
    // A rewrite keeps them (S3 replaces user metadata with every PUT).
    std::fs::write(root.join("f"), b"bytes").unwrap();
    let f = stat_of(&root.join("f"));
    assert_eq!(f.mode() & 0o7777, 0o750, "a rewrite keeps the mode");
    assert_eq!(
        (f.uid(), f.gid()),
        (1234, 5678),
        "a rewrite keeps the owner"
    );
    silt.stop();
}

/// One POSIX case run by an unprivileged process (uid and gid 65534, umask 022).
enum Op {
    Chmod(CString, u32),
    Chown(CString, u32, u32),
    /// utimensat with explicit times (`false`) or `UTIME_NOW` (`true`).
    Utimens(CString, bool),
    Open(CString, i32),
    Mkdir(CString),
    Rmdir(CString),
    Unlink(CString),
    Rename(CString, CString),
    Truncate(CString),
    Symlink(CString, CString),
    Link(CString, CString),
    /// open(O_WRONLY), one byte written at the start, close.
    Write(CString),
}

const NOBODY: u32 = 65534;

/// Runs `op` in a forked child with uid/gid `NOBODY` and no supplementary groups; its errno
/// (0: success). The child makes only system calls (no allocation) before `_exit`.
fn as_nobody(op: &Op) -> i32 {
    // SAFETY: fork in a test process; the child only makes async-signal-safe calls on data
    // prepared before the fork, then exits.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let fail = |rc: libc::c_int| {
                if rc < 0 {
                    libc::_exit(*libc::__errno_location());
                }
            };
            fail(libc::setgroups(0, std::ptr::null()));
            fail(libc::setgid(NOBODY));
            fail(libc::setuid(NOBODY));
            libc::umask(0o022);
            let now = [
                libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
            ];
            let explicit = [
                libc::timespec {
                    tv_sec: PAST,
                    tv_nsec: 0,
                },
                libc::timespec {
                    tv_sec: PAST,
                    tv_nsec: 0,
                },
            ];
            let rc = match op {
                Op::Chmod(p, m) => libc::chmod(p.as_ptr(), *m),
                Op::Chown(p, u, g) => libc::lchown(p.as_ptr(), *u, *g),
                Op::Utimens(p, is_now) => libc::utimensat(
                    libc::AT_FDCWD,
                    p.as_ptr(),
                    if *is_now {
                        now.as_ptr()
                    } else {
                        explicit.as_ptr()
                    },
                    0,
                ),
                Op::Open(p, flags) => {
                    let fd = libc::open(p.as_ptr(), *flags, 0o666);
                    if fd >= 0 {
                        libc::close(fd)
                    } else {
                        fd
                    }
                }
                Op::Mkdir(p) => libc::mkdir(p.as_ptr(), 0o777),
                Op::Rmdir(p) => libc::rmdir(p.as_ptr()),
                Op::Unlink(p) => libc::unlink(p.as_ptr()),
                Op::Rename(a, b) => libc::rename(a.as_ptr(), b.as_ptr()),
                Op::Truncate(p) => libc::truncate(p.as_ptr(), 0),
                Op::Symlink(t, p) => libc::symlink(t.as_ptr(), p.as_ptr()),
                Op::Link(a, b) => libc::link(a.as_ptr(), b.as_ptr()),
                Op::Write(p) => {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
                    if fd < 0 {
                        fd
                    } else if libc::write(fd, b"w".as_ptr().cast(), 1) != 1 {
                        -1
                    } else {
                        libc::close(fd)
                    }
                }
            };
            fail(rc);
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "the child did not exit");
        libc::WEXITSTATUS(status)
    }
}

fn chown(p: &Path, uid: u32, gid: u32) {
    let c = cstr(p);
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, gid) }, 0);
}

fn chmod(p: &Path, mode: u32) {
    let c = cstr(p);
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::chmod(c.as_ptr(), mode) }, 0);
}

/// The POSIX cases of chmod, chown, open, mkdir, rmdir, rename, unlink, truncate, symlink,
/// link, a write to a setuid file and utimensat for an unprivileged caller, each naming the
/// rule it checks. `hard_links`: the store has them (a local directory); elsewhere `link` is
/// EPERM (a documented deviation).
fn posix_cases(root: &Path, hard_links: bool) {
    let p = |n: &str| root.join(n);
    let c = |n: &str| cstr(&root.join(n));
    // Fixtures, made by root: a directory of root's (0755), one of nobody's (0777 inside a
    // root directory), files of root's with several modes, and files of nobody's.
    std::fs::create_dir(p("rootdir")).unwrap();
    chmod(&p("rootdir"), 0o755);
    std::fs::write(p("rootdir/victim"), b"v").unwrap();
    std::fs::create_dir(p("rootdir/sub")).unwrap();
    std::fs::create_dir(p("open")).unwrap();
    chmod(&p("open"), 0o777);
    for (name, mode) in [("r644", 0o644), ("r600", 0o600), ("r666", 0o666)] {
        std::fs::write(p(name), b"data").unwrap();
        chmod(&p(name), mode);
    }
    std::fs::write(p("mine"), b"data").unwrap();
    chown(&p("mine"), NOBODY, NOBODY);
    std::fs::write(p("mine-g0"), b"data").unwrap();
    chown(&p("mine-g0"), NOBODY, 0);
    std::fs::write(p("setuid"), b"data").unwrap();
    chmod(&p("setuid"), 0o6777);
    use libc::{EACCES, EPERM};
    let cases: Vec<(&str, Op, i32)> = vec![
        (
            "chmod: only the file's owner (or a privileged process) may change its mode",
            Op::Chmod(c("r644"), 0o777),
            EPERM,
        ),
        (
            "chmod: the owner may change the mode",
            Op::Chmod(c("mine"), 0o600),
            0,
        ),
        (
            "chown: only a privileged process may change the owner",
            Op::Chown(c("mine"), 1, u32::MAX),
            EPERM,
        ),
        (
            "chown: the owner may change the group only to a group it belongs to",
            Op::Chown(c("mine"), u32::MAX, 0),
            EPERM,
        ),
        (
            "chown: a non-owner may not change the group",
            Op::Chown(c("r644"), u32::MAX, NOBODY),
            EPERM,
        ),
        (
            "utimensat: explicit times need the owner (or privilege), even with write access",
            Op::Utimens(c("r666"), false),
            EPERM,
        ),
        (
            "utimensat: UTIME_NOW is allowed to anyone with write access",
            Op::Utimens(c("r666"), true),
            0,
        ),
        (
            "utimensat: UTIME_NOW without write access is EACCES",
            Op::Utimens(c("r644"), true),
            EACCES,
        ),
        (
            "open: O_RDONLY needs read permission",
            Op::Open(c("r600"), libc::O_RDONLY),
            EACCES,
        ),
        (
            "open: O_WRONLY needs write permission",
            Op::Open(c("r644"), libc::O_WRONLY),
            EACCES,
        ),
        (
            "open: O_RDONLY of a readable file succeeds",
            Op::Open(c("r644"), libc::O_RDONLY),
            0,
        ),
        (
            "open: O_CREAT needs write permission on the directory",
            Op::Open(c("rootdir/new"), libc::O_CREAT | libc::O_WRONLY),
            EACCES,
        ),
        (
            "open: O_CREAT in a writable directory succeeds",
            Op::Open(c("open/created"), libc::O_CREAT | libc::O_WRONLY),
            0,
        ),
        (
            "mkdir: needs write permission on the parent",
            Op::Mkdir(c("rootdir/newdir")),
            EACCES,
        ),
        (
            "mkdir: in a writable directory succeeds",
            Op::Mkdir(c("open/made")),
            0,
        ),
        (
            "rmdir: needs write permission on the parent",
            Op::Rmdir(c("rootdir/sub")),
            EACCES,
        ),
        (
            "unlink: needs write permission on the parent",
            Op::Unlink(c("rootdir/victim")),
            EACCES,
        ),
        (
            "rename: needs write permission on the source's parent",
            Op::Rename(c("rootdir/victim"), c("open/moved")),
            EACCES,
        ),
        (
            "truncate: needs write permission on the file",
            Op::Truncate(c("r644")),
            EACCES,
        ),
        (
            "truncate: of a writable file succeeds",
            Op::Truncate(c("r666")),
            0,
        ),
        (
            "symlink: needs write permission on the directory",
            Op::Symlink(c("r644"), c("rootdir/link")),
            EACCES,
        ),
        (
            "symlink: with write permission on the directory succeeds",
            Op::Symlink(c("r644"), c("open/symlinked")),
            0,
        ),
        if hard_links {
            (
                "link: a second name for one's own file in a writable directory",
                Op::Link(c("open/created"), c("open/hard")),
                0,
            )
        } else {
            (
                "link: an object store has no hard links (documented deviation)",
                Op::Link(c("open/created"), c("open/hard")),
                EPERM,
            )
        },
        (
            "write: another user's write to a writable setuid file succeeds",
            Op::Write(c("setuid")),
            0,
        ),
    ];
    let mut failed = Vec::new();
    for (rule, op, want) in &cases {
        let got = as_nobody(op);
        if got != *want {
            failed.push(format!("{rule}: errno {got}, want {want}"));
        }
    }
    assert!(
        failed.is_empty(),
        "POSIX cases failed:\n{}",
        failed.join("\n")
    );
    // Outcomes the errors do not show.
    assert_eq!(
        stat_of(&p("mine")).mode() & 0o7777,
        0o600,
        "the owner's chmod took"
    );
    assert_eq!(std::fs::read(p("r666")).unwrap(), b"", "the truncate took");
    let created = stat_of(&p("open/created"));
    assert_eq!(
        (created.uid(), created.gid()),
        (NOBODY, NOBODY),
        "a new file is the creator's"
    );
    assert_eq!(
        created.mode() & 0o7777,
        0o644,
        "a new file has the mode asked, less the umask"
    );
    let linked = stat_of(&p("open/symlinked"));
    assert!(linked.file_type().is_symlink(), "the new link");
    assert_eq!(
        (linked.uid(), linked.gid(), linked.len()),
        (NOBODY, NOBODY, p("r644").as_os_str().len() as u64),
        "a new link is the creator's, its size its target's length"
    );
    let made = stat_of(&p("open/made"));
    assert_eq!(
        (made.uid(), made.gid()),
        (NOBODY, NOBODY),
        "a new directory is the creator's"
    );
    assert_eq!(made.mode() & 0o7777, 0o755);
    // chmod by an owner outside the file's group drops S_ISGID (POSIX: chmod).
    assert_eq!(as_nobody(&Op::Chmod(c("mine-g0"), 0o2755)), 0);
    assert_eq!(
        stat_of(&p("mine-g0")).mode() & 0o7777,
        0o755,
        "S_ISGID cleared"
    );
    // root may chown (POSIX: chown by a privileged process).
    chown(&p("r644"), NOBODY, NOBODY);
    assert_eq!(stat_of(&p("r644")).uid(), NOBODY);
    // A write by another user clears S_ISUID and (the group may execute) S_ISGID (POSIX:
    // write, "shall clear"; Linux: file_remove_privs).
    let su = stat_of(&p("setuid"));
    assert_eq!(
        su.mode() & 0o7777,
        0o0777,
        "a non-owner's write clears the bits"
    );
    assert_eq!(
        std::fs::read(p("setuid")).unwrap(),
        b"wata",
        "and the write took"
    );
    if hard_links {
        assert_eq!(stat_of(&p("open/hard")).nlink(), 2, "the second name");
        assert_eq!(stat_of(&p("open/created")).nlink(), 2);
    }
}

/// Lets the unprivileged caller reach the mount: temporary directories are 0700.
fn open_path_to(p: &Path) {
    for a in p.ancestors() {
        if a.starts_with(std::env::temp_dir()) && a != std::env::temp_dir() {
            chmod(a, 0o755);
        }
    }
}

#[test]
fn posix_permission_cases_local() {
    let fx = LocalFx::new();
    open_path_to(fx.dir.path());
    chmod(fx.store.path(), 0o755);
    let silt = fx.up();
    let root = silt.path("data");
    posix_cases(&root, true);
    // The store holds the real owners and modes.
    let made = stat_of(&fx.store.path().join("open/made"));
    assert_eq!((made.uid(), made.gid()), (NOBODY, NOBODY));
    silt.stop();
}

/// `S_IFLNK`, the type bits of a symbolic link.
const S_IFLNK: u32 = 0o120000;

/// Symbolic links through the mount: to a file, to a directory, and dangling; read through,
/// `readlink`, `lstat`, the listing's type, then rename and unlink of a link (its target stays).
/// Leaves `l_dir` and `l_dangling` for `check_kept_links`.
fn symlinks(root: &Path) {
    std::fs::write(root.join("t.txt"), b"target bytes").unwrap();
    std::fs::create_dir(root.join("td")).unwrap();
    std::fs::write(root.join("td/in"), b"inside").unwrap();
    std::os::unix::fs::symlink("t.txt", root.join("l_file")).unwrap();
    std::os::unix::fs::symlink("td", root.join("l_dir")).unwrap();
    std::os::unix::fs::symlink("missing", root.join("l_dangling")).unwrap();
    // Creating a link where something is: EEXIST.
    let err = std::os::unix::fs::symlink("x", root.join("t.txt")).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EEXIST),
        "symlink onto a file"
    );
    assert_eq!(std::fs::read(root.join("l_file")).unwrap(), b"target bytes");
    let l = stat_of(&root.join("l_file"));
    assert!(l.file_type().is_symlink(), "lstat shows a link");
    assert_eq!(l.mode() & 0o170000, S_IFLNK);
    assert_eq!(
        l.len(),
        "t.txt".len() as u64,
        "a link's size is its target's length"
    );
    assert_eq!(
        std::fs::read_link(root.join("l_file")).unwrap(),
        Path::new("t.txt")
    );
    // A name that is not UTF-8 can be made nowhere (store paths and keys are UTF-8): EINVAL
    // for every way of making one, not ENOENT, which reads as a missing parent; looked up,
    // nothing is there.
    let bad = root.join(std::ffi::OsStr::from_bytes(b"bad\xff"));
    let made: [(&str, std::io::Result<()>); 4] = [
        ("create", std::fs::write(&bad, b"x")),
        ("mkdir", std::fs::create_dir(&bad)),
        ("symlink", std::os::unix::fs::symlink("t.txt", &bad)),
        ("rename", std::fs::rename(root.join("t.txt"), &bad)),
    ];
    for (what, r) in made {
        let err = r.expect_err(what);
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EINVAL),
            "{what} of a non-UTF-8 name"
        );
    }
    let err = std::fs::symlink_metadata(&bad).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOENT),
        "lookup of a non-UTF-8 name"
    );
    // readlink of something that is not a link: EINVAL.
    let err = std::fs::read_link(root.join("t.txt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "readlink of a file");
    // The listing's type (readdir's d_type) says link.
    let types: std::collections::HashMap<String, std::fs::FileType> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.file_type().unwrap(),
            )
        })
        .collect();
    for name in ["l_file", "l_dir", "l_dangling"] {
        assert!(types[name].is_symlink(), "{name} is listed as a link");
    }
    assert!(types["t.txt"].is_file() && types["td"].is_dir());
    // Rename then unlink the link: the target is untouched.
    std::fs::rename(root.join("l_file"), root.join("l_moved")).unwrap();
    assert_eq!(
        std::fs::symlink_metadata(root.join("l_file"))
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::NotFound
    );
    assert_eq!(
        std::fs::read_link(root.join("l_moved")).unwrap(),
        Path::new("t.txt")
    );
    assert_eq!(
        std::fs::read(root.join("l_moved")).unwrap(),
        b"target bytes"
    );
    std::fs::remove_file(root.join("l_moved")).unwrap();
    assert!(std::fs::symlink_metadata(root.join("l_moved")).is_err());
    assert_eq!(std::fs::read(root.join("t.txt")).unwrap(), b"target bytes");
    check_kept_links(root, "through the mount");
}

/// The links `symlinks` leaves: one to a directory (followed by the kernel) and a dangling one
/// (`ENOENT` on open, but `readlink` works).
fn check_kept_links(root: &Path, what: &str) {
    assert!(
        stat_of(&root.join("l_dir")).file_type().is_symlink(),
        "{what}"
    );
    assert_eq!(
        std::fs::read(root.join("l_dir/in")).unwrap(),
        b"inside",
        "{what}: read through a link to a directory"
    );
    assert_eq!(
        std::fs::read_link(root.join("l_dangling")).unwrap(),
        Path::new("missing"),
        "{what}"
    );
    let err = std::fs::File::open(root.join("l_dangling")).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOENT),
        "{what}: open a dangling link"
    );
    assert_eq!(
        std::fs::read(root.join("t.txt")).unwrap(),
        b"target bytes",
        "{what}"
    );
}

#[test]
fn symlinks_local() {
    let fx = LocalFx::new();
    let silt = fx.up();
    let root = silt.path("data");
    symlinks(&root);
    // The store holds real links.
    assert_eq!(
        std::fs::read_link(fx.store.path().join("l_dir")).unwrap(),
        Path::new("td")
    );
    assert_eq!(
        std::fs::read_link(fx.store.path().join("l_dangling")).unwrap(),
        Path::new("missing")
    );
    silt.stop();
    let mut silt = restart(fx.dir.path(), &fx.uri(), &[]);
    check_kept_links(&root, "after a remount");
    silt.crash();
    let silt = restart(fx.dir.path(), &fx.uri(), &[]);
    check_kept_links(&root, "after a daemon crash and restart");
    silt.stop();
}

#[test]
fn symlinks_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &["--write-type", "through", "--s3-list-attrs", "true"],
        dir.path(),
    );
    let root = silt.path("data");
    symlinks(&root);
    // s3fs-fuse's form: the body is the target, the mode has the link type bits.
    let (body, meta) = raw_object(&fx, "l_dir");
    assert_eq!(body, b"td");
    assert_eq!(
        meta("mode"),
        (S_IFLNK | 0o777).to_string(),
        "x-amz-meta-mode"
    );
    silt.stop();
    let mut args = s3_args(&fx.server);
    args.extend(["--s3-list-attrs".to_string(), "true".to_string()]);
    let mut silt = restart(dir.path(), &fx.uri(), &args);
    check_kept_links(&root, "after a remount");
    silt.crash();
    let silt = restart(dir.path(), &fx.uri(), &args);
    check_kept_links(&root, "after a daemon crash and restart");
    // A link written the s3fs way behind Silt's back shows as a link.
    let raw = raw_store(&fx);
    fx.rt
        .block_on(async {
            raw.operator()
                .write_with("ext_link", b"t.txt".to_vec())
                .user_metadata([("mode".to_string(), (S_IFLNK | 0o777).to_string())])
                .await
        })
        .unwrap();
    let o = silt.cli(&["fs", "invalidate", "/data"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stat_of(&root.join("ext_link"));
    assert!(e.file_type().is_symlink(), "an s3fs link object is a link");
    assert_eq!(
        std::fs::read_link(root.join("ext_link")).unwrap(),
        Path::new("t.txt")
    );
    assert_eq!(
        std::fs::read(root.join("ext_link")).unwrap(),
        b"target bytes"
    );
    silt.stop();
}

#[test]
fn posix_permission_cases_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    open_path_to(dir.path());
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");
    posix_cases(&root, false);
    // The directories' modes and owners are their markers' metadata (s3fs-fuse's form).
    let open = fx.rt.block_on(fx.store.stat("open")).unwrap();
    assert_eq!(open.kind, silt_ufs::EntryKind::Dir);
    assert_eq!(open.mode, Some(0o777), "x-amz-meta-mode of open/");
    let made = fx.rt.block_on(fx.store.stat("open/made")).unwrap();
    assert_eq!(
        (made.posix.uid, made.posix.gid),
        (Some(NOBODY), Some(NOBODY))
    );
    silt.stop();
}

/// `mknod(2)` with an errno (0: made).
fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> i32 {
    let c = cstr(p);
    // SAFETY: a valid C string.
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }
}

/// The body of the store's object `key` (read behind Silt's back) and a lookup of its user
/// metadata (`x-amz-meta-KEY`, empty when absent).
fn raw_object(fx: &S3Fx, key: &str) -> (Vec<u8>, impl Fn(&str) -> String) {
    let raw = raw_store(fx);
    let (body, head) = fx.rt.block_on(async {
        let body = raw.operator().read(key).await.unwrap().to_vec();
        (body, raw.operator().stat(key).await.unwrap())
    });
    let meta = move |k: &str| {
        head.user_metadata()
            .and_then(|m| m.get(k).map(str::to_string))
            .unwrap_or_default()
    };
    (body, meta)
}

/// The fixture's store, opened behind Silt's back.
fn raw_store(fx: &S3Fx) -> silt_ufs::S3Store {
    silt_ufs::S3Store::open(
        &silt_ufs::StoreUri::parse(&fx.uri()).unwrap(),
        &fx.server.s3_options(),
    )
    .unwrap()
}

/// The type bits of a mode.
const S_IFMT: u32 = 0o170000;

/// FIFOs, sockets and device nodes through the mount: made (mkfifo, mknod, a Unix socket's
/// bind), typed in stat and readdir, a device's number kept, a pipe and a socket carrying
/// bytes (the kernel's, once the mount has the node), chmod/chown/rename/unlink of the node
/// itself, EEXIST over an existing name. Leaves `kept_fifo` and `kept_chr` for
/// `check_kept_specials`.
fn special_files(root: &Path) {
    use std::io::{Read, Write};
    use std::os::unix::fs::FileTypeExt;
    let p = |n: &str| root.join(n);
    // SAFETY: umask cannot fail; the mode bits below are then exactly what is asked.
    let old_umask = unsafe { libc::umask(0) };
    assert_eq!(mknod(&p("fifo"), libc::S_IFIFO | 0o640, 0), 0, "mkfifo");
    let chr = libc::makedev(1, 7);
    let blk = libc::makedev(7, 200);
    assert_eq!(mknod(&p("chr"), libc::S_IFCHR | 0o600, chr), 0, "mknod c");
    assert_eq!(mknod(&p("blk"), libc::S_IFBLK | 0o660, blk), 0, "mknod b");
    assert_eq!(
        mknod(&p("reg"), libc::S_IFREG | 0o604, 0),
        0,
        "mknod of a regular file"
    );
    // SAFETY: as above.
    unsafe { libc::umask(old_umask) };
    let f = stat_of(&p("fifo"));
    assert!(f.file_type().is_fifo(), "a FIFO");
    assert_eq!((f.mode() & 0o7777, f.len()), (0o640, 0));
    let c = stat_of(&p("chr"));
    assert!(c.file_type().is_char_device(), "a character device");
    assert_eq!(
        (c.mode() & 0o7777, c.rdev()),
        (0o600, chr),
        "its mode and number"
    );
    let b = stat_of(&p("blk"));
    assert!(b.file_type().is_block_device(), "a block device");
    assert_eq!(
        (b.mode() & 0o7777, b.rdev()),
        (0o660, blk),
        "its mode and number"
    );
    let r = stat_of(&p("reg"));
    assert!(
        r.file_type().is_file(),
        "mknod S_IFREG makes a regular file"
    );
    assert_eq!((r.mode() & 0o7777, r.len()), (0o604, 0));
    // The mount is `nodev`: a device node in it never opens the device (here /dev/full).
    let opened = std::fs::OpenOptions::new().write(true).open(p("chr"));
    assert_eq!(
        opened.map_err(|e| e.raw_os_error()).err(),
        Some(Some(libc::EACCES)),
        "open of a device node on a nodev mount"
    );
    assert_eq!(
        mknod(&p("fifo"), libc::S_IFIFO | 0o600, 0),
        libc::EEXIST,
        "over a FIFO"
    );
    assert_eq!(
        mknod(&p("reg"), libc::S_IFIFO | 0o600, 0),
        libc::EEXIST,
        "over a file"
    );
    // A pipe through the FIFO: the kernel's, between two openers.
    let writer = {
        let path = p("fifo");
        std::thread::spawn(move || {
            let mut w = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            w.write_all(b"through the pipe").unwrap();
        })
    };
    let mut got = Vec::new();
    std::fs::File::open(p("fifo"))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    writer.join().unwrap();
    assert_eq!(got, b"through the pipe");
    // A Unix socket bound in the mount, and a connection to it by its name.
    let listener = std::os::unix::net::UnixListener::bind(p("sock")).expect("bind a socket");
    assert!(stat_of(&p("sock")).file_type().is_socket(), "a socket");
    let mut client = std::os::unix::net::UnixStream::connect(p("sock")).expect("connect");
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    drop((client, server, listener));
    // The listing types each (readdir's d_type).
    let types: std::collections::HashMap<String, std::fs::FileType> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.file_type().unwrap(),
            )
        })
        .collect();
    assert!(types["fifo"].is_fifo(), "listed as a FIFO");
    assert!(
        types["chr"].is_char_device(),
        "listed as a character device"
    );
    assert!(types["blk"].is_block_device(), "listed as a block device");
    assert!(types["sock"].is_socket(), "listed as a socket");
    // The node's own attributes, and renames of the node itself.
    chmod(&p("fifo"), 0o604);
    chown(&p("fifo"), 1234, 5678);
    let f = stat_of(&p("fifo"));
    assert_eq!((f.mode() & 0o7777, f.uid(), f.gid()), (0o604, 1234, 5678));
    std::fs::rename(p("fifo"), p("kept_fifo")).unwrap();
    assert!(
        std::fs::symlink_metadata(p("fifo")).is_err(),
        "renamed away"
    );
    assert!(
        stat_of(&p("kept_fifo")).file_type().is_fifo(),
        "still a FIFO"
    );
    std::fs::rename(p("chr"), p("kept_chr")).unwrap();
    for n in ["blk", "sock", "reg"] {
        std::fs::remove_file(p(n)).unwrap_or_else(|e| panic!("unlink {n}: {e}"));
        assert!(std::fs::symlink_metadata(p(n)).is_err(), "{n} unlinked");
    }
    check_kept_specials(root, "through the mount");
}

/// What `special_files` leaves, as seen after a remount too.
fn check_kept_specials(root: &Path, what: &str) {
    use std::os::unix::fs::FileTypeExt;
    let f = stat_of(&root.join("kept_fifo"));
    assert!(f.file_type().is_fifo(), "{what}: a FIFO");
    assert_eq!(
        (f.mode() & 0o7777, f.uid(), f.gid()),
        (0o604, 1234, 5678),
        "{what}: the FIFO's attributes"
    );
    let c = stat_of(&root.join("kept_chr"));
    assert!(c.file_type().is_char_device(), "{what}: a character device");
    assert_eq!(c.rdev(), libc::makedev(1, 7), "{what}: its number");
}

#[test]
fn special_files_local() {
    let fx = LocalFx::new();
    let silt = fx.up();
    let root = silt.path("data");
    special_files(&root);
    // The store holds the real nodes.
    let f = stat_of(&fx.store.path().join("kept_fifo"));
    assert_eq!(f.mode() & S_IFMT, libc::S_IFIFO, "a real FIFO in the store");
    assert_eq!(
        stat_of(&fx.store.path().join("kept_chr")).rdev(),
        libc::makedev(1, 7)
    );
    silt.stop();
    let mut silt = restart(fx.dir.path(), &fx.uri(), &[]);
    check_kept_specials(&root, "after a remount");
    silt.crash();
    let silt = restart(fx.dir.path(), &fx.uri(), &[]);
    check_kept_specials(&root, "after a daemon crash and restart");
    silt.stop();
}

#[test]
fn special_files_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &["--write-type", "through", "--s3-list-attrs", "true"],
        dir.path(),
    );
    let root = silt.path("data");
    special_files(&root);
    // s3fs-fuse's form: an empty object, the type in the mode, the number in `rdev`.
    let (body, meta) = raw_object(&fx, "kept_chr");
    assert_eq!(
        meta("mode"),
        (libc::S_IFCHR | 0o600).to_string(),
        "x-amz-meta-mode"
    );
    assert_eq!(
        meta("rdev"),
        libc::makedev(1, 7).to_string(),
        "x-amz-meta-rdev"
    );
    assert!(body.is_empty(), "a special file's object is empty");
    // A regular file created and closed unwritten is a regular file in its metadata too
    // (an earlier base for new objects wrote a directory's type bits).
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(root.join("new"))
            .unwrap();
    }
    let (_, meta) = raw_object(&fx, "new");
    assert_eq!(
        meta("mode"),
        (libc::S_IFREG | 0o640).to_string(),
        "a new file's mode"
    );
    silt.stop();
    let mut args = s3_args(&fx.server);
    args.extend(["--s3-list-attrs".to_string(), "true".to_string()]);
    let mut silt = restart(dir.path(), &fx.uri(), &args);
    check_kept_specials(&root, "after a remount");
    assert!(
        stat_of(&root.join("new")).file_type().is_file(),
        "still a file"
    );
    silt.crash();
    let silt = restart(dir.path(), &fx.uri(), &args);
    check_kept_specials(&root, "after a daemon crash and restart");
    silt.stop();
}

/// Hard links on a local store: both names count each other, a write, chmod or chown
/// through one is seen through the other (the mount's caches included), an unlink leaves
/// the other name whole, and the errors link(2) names.
#[test]
fn hard_links_local() {
    hard_links_local_as("through");
}

/// The same where the store is written at close without caching what was written.
#[test]
fn hard_links_local_store_only() {
    hard_links_local_as("store-only");
}

/// And under `back`, where a write is acknowledged in the local log and reaches the store
/// later.
#[test]
fn hard_links_local_back() {
    hard_links_local_as("back");
}

fn hard_links_local_as(write_type: &str) {
    let fx = LocalFx::new();
    let silt = Silt::up(
        &[("/data", &fx.uri())],
        &["--write-type", write_type],
        fx.dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let root = silt.path("data");
    let p = |n: &str| root.join(n);
    std::fs::write(p("a"), b"first bytes").unwrap();
    // Read (and cache) it before the link: nothing cached of it may hide what follows.
    assert_eq!(std::fs::read(p("a")).unwrap(), b"first bytes");
    assert_eq!(stat_of(&p("a")).nlink(), 1);
    std::fs::hard_link(p("a"), p("b")).unwrap();
    assert_eq!((stat_of(&p("a")).nlink(), stat_of(&p("b")).nlink()), (2, 2));
    assert_eq!(std::fs::read(p("b")).unwrap(), b"first bytes");
    // In the store: one file, two names.
    let (sa, sb) = (
        stat_of(&fx.store.path().join("a")),
        stat_of(&fx.store.path().join("b")),
    );
    assert_eq!(sa.ino(), sb.ino(), "one file in the store");
    // A rewrite through one name is the other's too.
    std::fs::write(p("b"), b"second, longer bytes").unwrap();
    assert_eq!(std::fs::read(p("a")).unwrap(), b"second, longer bytes");
    assert_eq!(stat_of(&p("a")).len(), 20);
    // An append (a write at the end of an open file).
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(p("a"))
            .unwrap();
        f.write_all(b"!").unwrap();
    }
    assert_eq!(std::fs::read(p("b")).unwrap(), b"second, longer bytes!");
    chmod(&p("b"), 0o600);
    chown(&p("b"), 1234, 5678);
    let a = stat_of(&p("a"));
    assert_eq!((a.mode() & 0o7777, a.uid(), a.gid()), (0o600, 1234, 5678));
    // A third name, then the first goes: the others count down and keep the bytes.
    std::fs::hard_link(p("b"), p("c")).unwrap();
    assert_eq!(stat_of(&p("a")).nlink(), 3);
    std::fs::remove_file(p("a")).unwrap();
    assert_eq!((stat_of(&p("b")).nlink(), stat_of(&p("c")).nlink()), (2, 2));
    assert_eq!(std::fs::read(p("c")).unwrap(), b"second, longer bytes!");
    // link(2)'s errors: EEXIST onto a name, EPERM of a directory, ENOENT of a missing file.
    let err = std::fs::hard_link(p("b"), p("c")).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EEXIST),
        "onto an existing name"
    );
    std::fs::create_dir(p("dir")).unwrap();
    let err = std::fs::hard_link(p("dir"), p("dir2")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "of a directory");
    let err = std::fs::hard_link(p("missing"), p("x")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "of a missing file");
    // A link to a symbolic link is a link to the link itself (Linux's link(2)).
    std::os::unix::fs::symlink("b", p("sym")).unwrap();
    std::fs::hard_link(p("sym"), p("sym2")).unwrap();
    assert!(stat_of(&p("sym2")).file_type().is_symlink());
    silt.stop();
    // After a remount both names are still one file.
    let silt = Silt::restart(
        &[("/data", &fx.uri())],
        &["--write-type", write_type],
        fx.dir.path(),
    );
    assert_eq!(stat_of(&p("c")).nlink(), 2);
    std::fs::write(p("c"), b"third").unwrap();
    assert_eq!(std::fs::read(p("b")).unwrap(), b"third");
    silt.stop();
}

/// On an object store link(2) is EPERM (an object cannot have two names that stay one file),
/// and nothing is made.
#[test]
fn hard_links_s3_are_eperm() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");
    std::fs::write(root.join("a"), b"bytes").unwrap();
    let err = std::fs::hard_link(root.join("a"), root.join("b")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    assert!(std::fs::symlink_metadata(root.join("b")).is_err());
    let e = fx.rt.block_on(fx.store.stat("b")).unwrap_err();
    assert_eq!(e.kind(), silt_common::ErrorKind::NotFound);
    silt.stop();
}

/// On S3, a rewrite (a truncate) shows the new version's times at once, not the old ones
/// (the PUT's answer names none: the times are those Silt sent), and a new directory's
/// marker carries its making's times (else it showed the mount's start).
#[test]
fn rewrites_and_new_directories_show_their_own_times_s3() {
    use std::os::unix::fs::MetadataExt;
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");
    std::fs::write(root.join("f"), b"some bytes").unwrap();
    utimes(&root.join("f"), Some(Some(PAST)), Some(Some(PAST))).unwrap();
    assert_eq!(stat_of(&root.join("f")).mtime(), PAST);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    std::fs::OpenOptions::new()
        .write(true)
        .open(root.join("f"))
        .unwrap()
        .set_len(3)
        .unwrap();
    let st = stat_of(&root.join("f"));
    assert_eq!(st.len(), 3);
    assert!(
        st.mtime() >= before,
        "mtime {} after a truncate at {before}",
        st.mtime()
    );
    assert!(
        st.ctime() >= before,
        "ctime {} after a truncate at {before}",
        st.ctime()
    );
    std::fs::create_dir(root.join("d")).unwrap();
    let d = stat_of(&root.join("d"));
    assert!(
        d.mtime() >= before && d.ctime() >= before,
        "{} {}",
        d.mtime(),
        d.ctime()
    );
    // The same times as the store keeps for it (before, a new directory showed the mount's
    // start until a later stat).
    let raw = fx
        .rt
        .block_on(silt_ufs::open_store(&fx.uri(), &fx.server.s3_options()))
        .unwrap();
    let stored = fx.rt.block_on(raw.stat("d")).unwrap();
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    };
    assert_eq!(
        Some(d.mtime()),
        stored.mtime.map(secs),
        "the directory's mtime"
    );
    silt.stop();
}
