//! Writes through real FUSE mounts: files created, rewritten, truncated, appended to, removed
//! and renamed, directories made, removed and renamed, over a real S3 server (versitygw) and a
//! local directory; what a read-only mount and per-prefix write rules refuse; name limits.
//!
//! The truth is the store itself, read with an `S3Store` (or `FsStore`) pointed straight at the server
//! (or the local directory), never through Silt.

mod common;

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::*;
use silt_common::ErrorKind;
use silt_ufs::EntryKind;

impl S3Fx {
    /// The object's bytes, or `None` if the store has no such object.
    fn get(&self, path: &str) -> Option<Vec<u8>> {
        self.rt.block_on(async {
            let m = match self.store.stat(path).await {
                Ok(m) => m,
                Err(e) if e.kind() == ErrorKind::NotFound => return None,
                Err(e) => panic!("stat {path} in the store: {e}"),
            };
            assert_eq!(
                m.kind,
                EntryKind::File,
                "{path} is a directory in the store"
            );
            let b = self.store.read(path, 0..m.size, &m).await.unwrap();
            Some(b.to_vec())
        })
    }

    /// What the store says `path` is (`None`: nothing).
    fn kind(&self, path: &str) -> Option<EntryKind> {
        match self.rt.block_on(self.store.stat(path)) {
            Ok(m) => Some(m.kind),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => panic!("stat {path} in the store: {e}"),
        }
    }

    /// Every file path of the store below `dir` ("" for all).
    fn files(&self, dir: &str) -> Vec<String> {
        let mut v: Vec<String> = match self.rt.block_on(self.store.list(dir, true)) {
            Ok(l) => l
                .into_iter()
                .filter(|m| m.kind == EntryKind::File)
                .map(|m| m.path)
                .collect(),
            Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("list {dir}: {e}"),
        };
        v.sort();
        v
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("error without errno: {e}")),
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `truncate(2)`: by path, no open file.
fn truncate_path(p: &Path, len: i64) -> std::io::Result<()> {
    // SAFETY: a valid C string.
    match unsafe { libc::truncate(cstr(p).as_ptr(), len) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `renameat2(2)` with `flags`.
fn rename2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: valid C strings; AT_FDCWD with absolute paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Writes `data` in 1 MiB pieces and closes the file checking close's own result (the commit).
fn write_and_close(f: std::fs::File, data: &[u8]) {
    use std::os::fd::IntoRawFd;
    let mut f = f;
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    let fd = f.into_raw_fd();
    // SAFETY: `fd` is ours (taken out of the File), closed once.
    let rc = unsafe { libc::close(fd) };
    assert_eq!(rc, 0, "close: {}", std::io::Error::last_os_error());
}

fn create_file(path: &Path, data: &[u8]) {
    write_and_close(std::fs::File::create(path).unwrap(), data);
}

#[test]
fn through_writes_reach_the_store_and_read_back_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");

    // 3 MiB: one PUT. While it is open, the new file is listed and has the size written.
    let small = bytes(1, 3 << 20);
    let mut f = std::fs::File::create(root.join("a.bin")).unwrap();
    f.write_all(&small[..1 << 20]).unwrap();
    assert_eq!(names(&root), ["a.bin"], "a new file shows while open");
    assert_eq!(
        std::fs::metadata(root.join("a.bin")).unwrap().len(),
        1 << 20
    );
    assert!(
        fx.get("a.bin").is_none(),
        "nothing reaches the store before close"
    );
    // A child process inheriting the descriptor closes it at exec (close-on-exec): not the
    // opener's close, so nothing is uploaded for it.
    let status = std::process::Command::new("true").status().unwrap();
    assert!(status.success());
    assert!(
        fx.get("a.bin").is_none(),
        "a forked child's close commits nothing"
    );
    // Another handle reading it sees what was written so far, from the file's write session:
    // still nothing is uploaded before the writer's close.
    assert!(std::fs::read(root.join("a.bin")).unwrap() == small[..1 << 20]);
    assert!(fx.get("a.bin").is_none(), "a reader's open commits nothing");
    f.write_all(&small[1 << 20..]).unwrap();
    write_and_close(f, &[]);
    assert!(fx.get("a.bin").unwrap() == small, "the store has the bytes");
    assert!(std::fs::read(root.join("a.bin")).unwrap() == small);
    assert_eq!(
        std::fs::metadata(root.join("a.bin")).unwrap().len(),
        3 << 20
    );

    // 20 MiB: a multipart upload.
    let big = bytes(2, 20 << 20);
    create_file(&root.join("big.bin"), &big);
    assert_eq!(names(&root), ["a.bin", "big.bin"], "listed at once");
    assert!(fx.get("big.bin").unwrap() == big);
    assert!(std::fs::read(root.join("big.bin")).unwrap() == big);

    // An empty file exists once closed.
    create_file(&root.join("empty"), b"");
    assert_eq!(fx.get("empty").unwrap(), b"");
    assert_eq!(names(&root), ["a.bin", "big.bin", "empty"]);

    // A second, fresh view of the store (a new silt) sees the same.
    silt.stop();
    let dir2 = tempfile::tempdir().unwrap();
    let again = fx.up(&[], dir2.path());
    let root2 = again.path("data");
    assert_eq!(names(&root2), ["a.bin", "big.bin", "empty"]);
    assert!(std::fs::read(root2.join("big.bin")).unwrap() == big);
    again.stop();
}

#[test]
fn truncate_rewrite_and_append_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let p = silt.path("data/t.txt");

    create_file(&p, b"hello world");
    assert_eq!(fx.get("t.txt").unwrap(), b"hello world");

    // open(O_TRUNC) and rewrite.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    write_and_close(f, b"new");
    assert_eq!(fx.get("t.txt").unwrap(), b"new");
    assert_eq!(std::fs::read(&p).unwrap(), b"new");

    // A write into the middle of the existing object (no truncation): the rest stays.
    put_and_reopen(&fx, &p);
    let mut f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.seek(SeekFrom::Start(2)).unwrap();
    write_and_close(f, b"XY");
    assert_eq!(fx.get("t.txt").unwrap(), b"01XY456789");

    // truncate(2), shorter then to zero.
    truncate_path(&p, 4).unwrap();
    assert_eq!(fx.get("t.txt").unwrap(), b"01XY");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 4);
    truncate_path(&p, 0).unwrap();
    assert_eq!(fx.get("t.txt").unwrap(), b"");
    assert_eq!(std::fs::read(&p).unwrap(), b"");

    // O_APPEND: every write at the end.
    create_file(&p, b"start;");
    let f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    let mut f = f;
    f.write_all(b"one;").unwrap();
    write_and_close(f, b"two;");
    assert_eq!(fx.get("t.txt").unwrap(), b"start;one;two;");
    assert_eq!(std::fs::read(&p).unwrap(), b"start;one;two;");

    // O_RDWR: reads see what was written before the close; ftruncate on the handle.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"three").unwrap();
    let mut back = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "start;one;two;three");
    f.set_len(9).unwrap();
    write_and_close(f, b"");
    assert_eq!(fx.get("t.txt").unwrap(), b"start;one");

    // Mode and times are accepted and change nothing (stores keep neither).
    let perm = std::fs::metadata(&p).unwrap().permissions();
    std::fs::set_permissions(&p, perm).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(std::time::SystemTime::now())
        .unwrap();
    assert_eq!(fx.get("t.txt").unwrap(), b"start;one");
    silt.stop();
}

/// Replaces `t.txt` with ten digits through the mount.
fn put_and_reopen(fx: &S3Fx, p: &Path) {
    create_file(p, b"0123456789");
    assert_eq!(fx.get("t.txt").unwrap(), b"0123456789");
}

#[test]
fn unlink_mkdir_rmdir_and_rename_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");

    // mkdir: a marker object; it shows while empty.
    std::fs::create_dir(root.join("d")).unwrap();
    assert_eq!(fx.kind("d"), Some(EntryKind::Dir));
    assert_eq!(names(&root), ["d"]);
    assert!(names(&root.join("d")).is_empty());
    assert_eq!(errno(std::fs::create_dir(root.join("d"))), libc::EEXIST);
    std::fs::create_dir(root.join("d/sub")).unwrap();
    create_file(&root.join("d/f1"), b"f1");
    create_file(&root.join("d/sub/f2"), b"f2");
    assert_eq!(names(&root.join("d")), ["f1", "sub"]);

    // rmdir: a directory with entries stays; an empty one goes.
    assert_eq!(errno(std::fs::remove_dir(root.join("d"))), libc::ENOTEMPTY);
    std::fs::create_dir(root.join("e")).unwrap();
    std::fs::remove_dir(root.join("e")).unwrap();
    assert_eq!(fx.kind("e"), None);
    assert_eq!(names(&root), ["d"]);
    assert_eq!(
        errno(std::fs::metadata(root.join("e"))),
        libc::ENOENT,
        "gone through the mount too"
    );

    // unlink.
    create_file(&root.join("gone"), b"x");
    std::fs::remove_file(root.join("gone")).unwrap();
    assert!(fx.get("gone").is_none());
    assert_eq!(names(&root), ["d"]);
    assert_eq!(errno(std::fs::read(root.join("gone"))), libc::ENOENT);

    // Rename a file (into another directory).
    create_file(&root.join("r1"), b"renamed bytes");
    std::fs::rename(root.join("r1"), root.join("d/r2")).unwrap();
    assert!(fx.get("r1").is_none());
    assert_eq!(fx.get("d/r2").unwrap(), b"renamed bytes");
    assert_eq!(names(&root), ["d"]);
    assert_eq!(names(&root.join("d")), ["f1", "r2", "sub"]);
    assert_eq!(std::fs::read(root.join("d/r2")).unwrap(), b"renamed bytes");
    // Over an existing file.
    create_file(&root.join("d/over"), b"over");
    std::fs::rename(root.join("d/over"), root.join("d/f1")).unwrap();
    assert_eq!(fx.get("d/f1").unwrap(), b"over");
    assert_eq!(std::fs::read(root.join("d/f1")).unwrap(), b"over");
    assert_eq!(names(&root.join("d")), ["f1", "r2", "sub"]);

    // renameat2: NOREPLACE onto an existing name, EXCHANGE at all.
    assert_eq!(
        errno(rename2(
            &root.join("d/r2"),
            &root.join("d/f1"),
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    rename2(
        &root.join("d/r2"),
        &root.join("d/r3"),
        libc::RENAME_NOREPLACE,
    )
    .unwrap();
    assert_eq!(fx.get("d/r3").unwrap(), b"renamed bytes");
    assert_eq!(
        errno(rename2(
            &root.join("d/r3"),
            &root.join("d/f1"),
            libc::RENAME_EXCHANGE
        )),
        libc::EINVAL
    );

    // Rename a directory with files (and an empty subdirectory).
    std::fs::create_dir(root.join("d/empty")).unwrap();
    std::fs::rename(root.join("d"), root.join("d2")).unwrap();
    assert_eq!(
        fx.files("d"),
        Vec::<String>::new(),
        "nothing left at the old name"
    );
    assert_eq!(fx.kind("d"), None);
    assert_eq!(fx.files("d2"), ["d2/f1", "d2/r3", "d2/sub/f2"]);
    assert_eq!(fx.kind("d2/empty"), Some(EntryKind::Dir));
    assert_eq!(fx.get("d2/sub/f2").unwrap(), b"f2");
    assert_eq!(names(&root), ["d2"]);
    assert_eq!(names(&root.join("d2")), ["empty", "f1", "r3", "sub"]);
    assert_eq!(std::fs::read(root.join("d2/sub/f2")).unwrap(), b"f2");
    assert_eq!(errno(std::fs::metadata(root.join("d/f1"))), libc::ENOENT);

    // A file renamed while open for writing: the bytes end up under the new name.
    let mut f = std::fs::File::create(root.join("d2/open")).unwrap();
    f.write_all(b"before;").unwrap();
    std::fs::rename(root.join("d2/open"), root.join("d2/moved")).unwrap();
    write_and_close(f, b"after");
    assert!(fx.get("d2/open").is_none());
    assert_eq!(fx.get("d2/moved").unwrap(), b"before;after");
    silt.stop();
}

#[test]
fn store_only_writes_land_in_the_store_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "store-only"], dir.path());
    let data = bytes(7, (2 << 20) + 77);
    create_file(&silt.path("data/so.bin"), &data);
    assert!(fx.get("so.bin").unwrap() == data);
    assert!(std::fs::read(silt.path("data/so.bin")).unwrap() == data);
    silt.stop();
}

#[test]
fn read_only_mount_and_a_writable_prefix_s3() {
    let fx = S3Fx::start(false);
    fx.put("in.txt", b"inside");
    fx.put("out/old.txt", b"old");

    // The default: read-only everywhere.
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&[], dir.path());
    let root = silt.path("data");
    assert_eq!(errno(std::fs::File::create(root.join("new"))), libc::EROFS);
    assert_eq!(
        errno(
            std::fs::OpenOptions::new()
                .write(true)
                .open(root.join("in.txt"))
        ),
        libc::EROFS
    );
    assert_eq!(errno(std::fs::create_dir(root.join("nd"))), libc::EROFS);
    assert_eq!(
        errno(std::fs::remove_file(root.join("in.txt"))),
        libc::EROFS
    );
    assert_eq!(
        errno(std::fs::rename(root.join("in.txt"), root.join("x"))),
        libc::EROFS
    );
    assert!(std::fs::metadata(root.join("in.txt"))
        .unwrap()
        .permissions()
        .readonly());
    silt.stop();
    assert_eq!(fx.get("in.txt").unwrap(), b"inside");

    // Read-only, except below /data/out.
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &[
            "--write-type",
            "read-only",
            "--write-rules",
            "/data/out=through",
        ],
        dir.path(),
    );
    let root = silt.path("data");
    create_file(&root.join("out/new.txt"), b"written");
    assert_eq!(fx.get("out/new.txt").unwrap(), b"written");
    std::fs::create_dir(root.join("out/sub")).unwrap();
    std::fs::rename(root.join("out/old.txt"), root.join("out/sub/old.txt")).unwrap();
    assert_eq!(fx.get("out/sub/old.txt").unwrap(), b"old");
    std::fs::remove_file(root.join("out/new.txt")).unwrap();
    assert!(fx.get("out/new.txt").is_none());
    assert!(!std::fs::metadata(root.join("out/sub/old.txt"))
        .unwrap()
        .permissions()
        .readonly());
    // Elsewhere: EROFS.
    assert_eq!(errno(std::fs::File::create(root.join("new"))), libc::EROFS);
    assert_eq!(errno(std::fs::create_dir(root.join("nd"))), libc::EROFS);
    assert_eq!(
        errno(std::fs::remove_file(root.join("in.txt"))),
        libc::EROFS
    );
    assert_eq!(
        errno(std::fs::rename(
            root.join("in.txt"),
            root.join("out/in.txt")
        )),
        libc::EROFS
    );
    assert_eq!(
        errno(
            std::fs::OpenOptions::new()
                .append(true)
                .open(root.join("in.txt"))
        ),
        libc::EROFS
    );
    assert!(std::fs::metadata(root.join("in.txt"))
        .unwrap()
        .permissions()
        .readonly());
    assert_eq!(fx.get("in.txt").unwrap(), b"inside");
    silt.stop();
}

#[test]
fn names_and_paths_over_the_limits_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");

    assert_eq!(
        errno(std::fs::File::create(root.join("n".repeat(256)))),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno(std::fs::create_dir(root.join("m".repeat(256)))),
        libc::ENAMETOOLONG
    );
    create_file(&root.join("n".repeat(255)), b"255");
    assert_eq!(fx.get(&"n".repeat(255)).unwrap(), b"255");

    // Directories of 200-byte names: the fifth ends at 1,004 bytes of key, so a file in it
    // of 30 bytes (1,035) and a sixth directory (1,205) are over S3's 1,024.
    let mut p = root.clone();
    for i in 0..5 {
        p = p.join(char::from(b'a' + i).to_string().repeat(200));
        std::fs::create_dir(&p).unwrap();
    }
    assert_eq!(
        errno(std::fs::create_dir(p.join("f".repeat(200)))),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno(std::fs::File::create(p.join("x".repeat(30)))),
        libc::ENAMETOOLONG
    );
    create_file(&p.join("short"), b"ok");
    assert_eq!(std::fs::read(p.join("short")).unwrap(), b"ok");
    silt.stop();
}

/// A local directory takes paths as long as a local file system does (PATH_MAX): past S3's
/// 1,024 bytes of key, a tree of 250-byte names 3,700 bytes deep is made, written and read
/// through the mount and is in the directory (it was ENAMETOOLONG at 1,024 on every store).
#[test]
fn paths_past_1024_bytes_on_a_local_directory() {
    let backing = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", "through"], dir.path());
    let mut rel = std::path::PathBuf::new();
    for i in 0..14u8 {
        rel.push(char::from(b'a' + i).to_string().repeat(250));
        std::fs::create_dir(silt.path("data").join(&rel)).unwrap();
    }
    let file = rel.join("f".repeat(200));
    assert!(file.as_os_str().len() > 3600);
    create_file(&silt.path("data").join(&file), b"deep");
    assert_eq!(
        std::fs::read(silt.path("data").join(&file)).unwrap(),
        b"deep"
    );
    assert_eq!(std::fs::read(backing.path().join(&file)).unwrap(), b"deep");
    silt.stop();
}

#[test]
fn local_directory_writes() {
    let local = tempfile::tempdir().unwrap();
    let ld = local.path();
    std::fs::write(ld.join("pre.txt"), b"pre").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", ld.display());
    let silt = Silt::up(&[("/data", &uri)], &["--write-type", "through"], dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let root = silt.path("data");

    create_file(&root.join("a.txt"), b"local bytes");
    assert_eq!(std::fs::read(ld.join("a.txt")).unwrap(), b"local bytes");
    std::fs::create_dir(root.join("sub")).unwrap();
    assert!(ld.join("sub").is_dir());
    std::fs::rename(root.join("a.txt"), root.join("sub/b.txt")).unwrap();
    assert!(!ld.join("a.txt").exists());
    assert_eq!(std::fs::read(ld.join("sub/b.txt")).unwrap(), b"local bytes");
    assert_eq!(names(&root), ["pre.txt", "sub"]);

    // A directory: one rename(2).
    std::fs::rename(root.join("sub"), root.join("sub2")).unwrap();
    assert!(!ld.join("sub").exists());
    assert_eq!(
        std::fs::read(ld.join("sub2/b.txt")).unwrap(),
        b"local bytes"
    );
    assert_eq!(names(&root), ["pre.txt", "sub2"]);
    assert_eq!(
        std::fs::read(root.join("sub2/b.txt")).unwrap(),
        b"local bytes"
    );

    assert_eq!(
        errno(std::fs::remove_dir(root.join("sub2"))),
        libc::ENOTEMPTY
    );
    std::fs::remove_file(root.join("sub2/b.txt")).unwrap();
    assert!(!ld.join("sub2/b.txt").exists());
    std::fs::remove_dir(root.join("sub2")).unwrap();
    assert!(!ld.join("sub2").exists());
    assert_eq!(names(&root), ["pre.txt"]);

    // Appending to a file that was there before Silt.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join("pre.txt"))
        .unwrap();
    f.write_all(b"+more").unwrap();
    write_and_close(f, b"");
    assert_eq!(std::fs::read(ld.join("pre.txt")).unwrap(), b"pre+more");
    silt.stop();
}
