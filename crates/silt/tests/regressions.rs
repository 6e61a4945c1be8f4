//! One test per defect that issue 14 found through real mounts, each checked against what
//! POSIX (or S3) requires, and the store read directly where the defect was in the store.

mod common;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::*;
use silt_common::ErrorKind;
use silt_testkit::{FaultAction, S3Op};
use silt_ufs::EntryKind;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `close(2)` of `f`, with its own result (the commit of a file open for writing).
fn close(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was taken out of the File and is closed once.
    match unsafe { libc::close(fd) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn rw(path: &Path) -> std::fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// `pread`s from offset 0 into `buf` until the end of the file or of `buf`; the bytes read.
fn pread_to_end(f: &std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn append(path: &Path) -> std::fs::File {
    OpenOptions::new().append(true).open(path).unwrap()
}

/// The POSIX sequences over two handles of one file that lost writes before.
fn two_handle_sequences(root: &Path) {
    // pwrite through fd1 and fd2, close both: both writes are in the file.
    let p = root.join("ten");
    std::fs::write(&p, b"..........").unwrap();
    let (f1, f2) = (rw(&p), rw(&p));
    f1.write_at(b"11", 0).unwrap();
    f2.write_at(b"22", 8).unwrap();
    close(f1).unwrap();
    close(f2).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"11......22");

    // Two O_APPEND writers interleave.
    let p = root.join("log");
    std::fs::write(&p, b"").unwrap();
    let (mut a, mut b) = (append(&p), append(&p));
    use std::io::Write;
    a.write_all(b"1111").unwrap();
    b.write_all(b"2222").unwrap();
    a.write_all(b"3333").unwrap();
    close(a).unwrap();
    close(b).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"111122223333");

    // An O_RDWR handle reads another handle's unclosed write.
    let p = root.join("shared");
    std::fs::write(&p, b"old old old").unwrap();
    let (w, r) = (rw(&p), rw(&p));
    w.write_at(b"new", 4).unwrap();
    let mut buf = [0u8; 11];
    r.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(
        &buf, b"old new old",
        "a handle sees another's unclosed write"
    );
    close(w).unwrap();
    close(r).unwrap();

    // An ftruncate through one handle is not undone by the other's close.
    let p = root.join("cut");
    std::fs::write(&p, b"0123456789").unwrap();
    let (f1, f2) = (rw(&p), rw(&p));
    f2.write_at(b"ab", 0).unwrap();
    f1.set_len(4).unwrap();
    close(f1).unwrap();
    close(f2).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"ab23");
}

#[test]
fn two_handles_on_one_file_local_directory() {
    let backing = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", "through"], dir.path());
    two_handle_sequences(&silt.path("data"));
    assert_eq!(
        std::fs::read(backing.path().join("ten")).unwrap(),
        b"11......22"
    );
    assert_eq!(std::fs::read(backing.path().join("cut")).unwrap(), b"ab23");
    silt.stop();
}

#[test]
fn two_handles_on_one_file_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    two_handle_sequences(&silt.path("data"));
    assert_eq!(fx.object("ten").unwrap(), b"11......22");
    assert_eq!(fx.object("log").unwrap(), b"111122223333");
    assert_eq!(fx.object("cut").unwrap(), b"ab23");
    silt.stop();
}

impl S3Fx {
    /// The object's bytes straight from the server, or `None`.
    fn object(&self, path: &str) -> Option<Vec<u8>> {
        self.rt.block_on(async {
            let m = match self.store.stat(path).await {
                Ok(m) if m.kind == EntryKind::File => m,
                Ok(_) => return None,
                Err(e) if e.kind() == ErrorKind::NotFound => return None,
                Err(e) => panic!("stat {path}: {e}"),
            };
            Some(self.store.read(path, 0..m.size, &m).await.unwrap().to_vec())
        })
    }

    /// Whether the server has `dir` as a directory (a marker or keys below it).
    fn has_dir(&self, dir: &str) -> bool {
        match self.rt.block_on(self.store.stat(dir)) {
            Ok(m) => m.kind == EntryKind::Dir,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => panic!("stat {dir}: {e}"),
        }
    }
}

#[test]
fn directory_renames_on_s3_keep_every_directory() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--write-type", "through"], dir.path());
    let root = silt.path("data");

    // mkdir d1 d1/d1; mv d1 f3; rmdir f3/d1: f3 stays, in the mount and in the store.
    std::fs::create_dir_all(root.join("d1/d1")).unwrap();
    std::fs::rename(root.join("d1"), root.join("f3")).unwrap();
    std::fs::remove_dir(root.join("f3/d1")).unwrap();
    assert!(root.join("f3").is_dir());
    assert!(fx.has_dir("f3"), "the store lost f3");
    assert!(!fx.has_dir("d1"), "the store still has d1");

    // mkdir -p p/a/b; mv p/a p/c; rmdir p/c/b; mv p q: q/c stays.
    std::fs::create_dir_all(root.join("p/a/b")).unwrap();
    std::fs::rename(root.join("p/a"), root.join("p/c")).unwrap();
    std::fs::remove_dir(root.join("p/c/b")).unwrap();
    std::fs::rename(root.join("p"), root.join("q")).unwrap();
    assert!(root.join("q/c").is_dir());
    assert!(fx.has_dir("q/c"), "the store lost q/c");
    assert!(!fx.has_dir("p"), "the store still has p");

    // After a sync with the store, and in a fresh Silt, both stay.
    let o = silt.cli(&["fs", "sync", "/data", "--recursive"]);
    assert!(o.status.success(), "sync: {}", stderr(&o));
    assert!(root.join("f3").is_dir() && root.join("q/c").is_dir());
    silt.stop();
    let dir2 = tempfile::tempdir().unwrap();
    let again = fx.up(&[], dir2.path());
    assert!(again.path("data/f3").is_dir());
    assert!(again.path("data/q/c").is_dir());
    again.stop();
}

/// A rewrite whose upload failed (close reported it), then unlinked: no retry brings it back,
/// in the mount or the store, also after the faults end and after a restart.
#[test]
fn unlinked_after_a_failed_upload_stays_deleted() {
    let fx = S3Fx::start(true);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &["--write-type", "through", "--ufs-retries", "1"],
        dir.path(),
    );
    let root = silt.path("data");
    let proxy = fx.proxy.as_ref().unwrap();
    for i in 0..6 {
        let name = format!("f{i}");
        let p = root.join(&name);
        std::fs::write(&p, b"first version").unwrap();
        proxy.inject(S3Op::Put, 0, usize::MAX, FaultAction::internal_error());
        proxy.inject(S3Op::Other, 0, usize::MAX, FaultAction::internal_error());
        let f = std::fs::File::create(&p).unwrap();
        f.write_at(&bytes(i, 100_000), 0).unwrap();
        let closed = close(f);
        assert!(closed.is_err(), "close reports the failed upload");
        proxy.clear_faults();
        std::fs::remove_file(&p).unwrap_or_else(|e| panic!("unlink {name}: {e}"));
        assert!(!p.exists());
        assert!(
            fx.object(&name).is_none(),
            "{name} is in the store after unlink"
        );
    }
    // A sync and a restart on the same state directory: nothing comes back.
    let o = silt.cli(&["fs", "sync", "/data", "--recursive"]);
    assert!(o.status.success(), "sync: {}", stderr(&o));
    silt.stop();
    // The same mountpoint and state directory as before.
    let again = fx.up(&["--write-type", "through"], dir.path());
    for i in 0..6 {
        let name = format!("f{i}");
        assert!(!again.path("data").join(&name).exists(), "{name} came back");
        assert!(fx.object(&name).is_none(), "{name} came back in the store");
    }
    again.stop();
}

/// `truncate(2)` far past the maximum file size fails at once with EFBIG and writes nothing;
/// growing a file to 2 GiB makes a hole, not 2 GiB of zeros on disk.
#[test]
fn huge_truncate_is_efbig_and_growth_is_sparse() {
    let backing = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", "through"], dir.path());
    let p = silt.path("data/f");
    std::fs::write(&p, b"head").unwrap();
    // Off the test thread: a regression writes zeros for hours; the harness then kills silt.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = cstr(&p);
    std::thread::spawn(move || {
        // SAFETY: a valid C string.
        let rc = unsafe { libc::truncate(path.as_ptr(), 999_999_999_999_999) };
        let _ = tx.send((rc, std::io::Error::last_os_error().raw_os_error()));
    });
    let (rc, errno) = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("truncate to 999999999999999 bytes did not return");
    assert_eq!((rc, errno), (-1, Some(libc::EFBIG)));
    assert_eq!(std::fs::read(&p).unwrap(), b"head");

    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(2 << 30).unwrap();
    f.write_at(b"tail", (2 << 30) - 4).unwrap();
    close(f).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 << 30);
    let stored = std::fs::metadata(backing.path().join("f")).unwrap();
    assert_eq!(stored.len(), 2 << 30);
    assert!(
        stored.blocks() * 512 < 64 << 20,
        "the store's file takes {} bytes on disk for 8 bytes of data",
        stored.blocks() * 512
    );
    let f = std::fs::File::open(&p).unwrap();
    let mut buf = vec![0xffu8; 1 << 20];
    f.read_exact_at(&mut buf, 1 << 30).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "a hole reads as zeros");
    let mut end = [0u8; 8];
    f.read_exact_at(&mut end, (2 << 30) - 8).unwrap();
    assert_eq!(&end, b"\0\0\0\0tail");
    drop(f);
    silt.stop();
}

/// With a small configured maximum, a write past it is EFBIG.
#[test]
fn a_configured_max_file_size_refuses_larger_files() {
    let backing = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let silt = Silt::up_data(
        &uri,
        Vec::new(),
        &["--write-type", "through", "--max-file-size", "1MiB"],
        dir.path(),
    );
    let p = silt.path("data/f");
    let f = std::fs::File::create(&p).unwrap();
    f.write_at(b"fits", (1 << 20) - 4).unwrap();
    let e = f.write_at(b"x", 1 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    close(f).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 1 << 20);
    silt.stop();
}

/// A directory rename on S3 whose copies fail part-way changes nothing: the source keeps every
/// object and marker, the target has none.
#[test]
fn a_failed_directory_rename_on_s3_changes_nothing() {
    let fx = S3Fx::start(true);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &["--write-type", "through", "--ufs-retries", "0"],
        dir.path(),
    );
    let root = silt.path("data");
    std::fs::create_dir_all(root.join("t/a/b")).unwrap();
    std::fs::create_dir_all(root.join("t/empty")).unwrap();
    for i in 0..6 {
        std::fs::write(root.join(format!("t/a/f{i}")), bytes(i, 1000 + i as usize)).unwrap();
    }
    let before = store_keys(&fx);
    // Copies are PUTs: the third and later fail.
    let proxy = fx.proxy.as_ref().unwrap();
    proxy.inject(S3Op::Put, 2, usize::MAX, FaultAction::internal_error());
    let e = std::fs::rename(root.join("t"), root.join("u")).unwrap_err();
    proxy.clear_faults();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(store_keys(&fx), before, "the store changed");
    assert!(!root.join("u").exists());
    for i in 0..6 {
        let data = std::fs::read(root.join(format!("t/a/f{i}"))).unwrap();
        assert!(data == bytes(i, 1000 + i as usize));
    }
    assert!(root.join("t/a/b").is_dir() && root.join("t/empty").is_dir());
    silt.stop();
}

/// Every key of the bucket below the fixture's prefix, markers included.
fn store_keys(fx: &S3Fx) -> Vec<String> {
    let mut v: Vec<String> = fx
        .rt
        .block_on(fx.store.list("", true))
        .unwrap()
        .into_iter()
        .map(|m| {
            format!(
                "{}{}",
                m.path,
                if m.kind == EntryKind::Dir { "/" } else { "" }
            )
        })
        .collect();
    v.sort();
    v
}

/// A read against a store that stopped answering returns an error after one deadline, not one
/// per kernel retry: once it timed out, the next reads fail without reaching the server, and
/// after the server answers again reads succeed.
#[test]
fn a_frozen_store_fails_reads_within_one_deadline() {
    let fx = S3Fx::start(true);
    let data = bytes(9, 3 << 20);
    fx.put("cold.bin", &data);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(&["--ufs-timeout", "2s", "--ufs-retries", "0"], dir.path());
    let p = silt.path("data/cold.bin");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), data.len() as u64);
    let proxy = fx.proxy.as_ref().unwrap();
    proxy.inject(S3Op::Get, 0, usize::MAX, FaultAction::Hang);
    proxy.reset_counts();

    // Off the test thread, so a regression that never returns fails instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = p.clone();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        let mut buf = [0u8; 4096];
        let _ = tx.send(f.read_at(&mut buf, 0).map_err(|e| e.raw_os_error()));
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a read against a frozen store did not return");
    let errno = r.expect_err("a read against a frozen store succeeded");
    assert!(
        [Some(libc::ETIMEDOUT), Some(libc::EIO)].contains(&errno),
        "errno {errno:?}"
    );
    let gets = proxy.counts().get;
    assert!(gets >= 1, "no GET reached the server");
    // The kernel (and users) retry at once: no new request reaches the frozen server.
    let f = std::fs::File::open(&p).unwrap();
    let mut buf = [0u8; 4096];
    for _ in 0..3 {
        let e = f.read_at(&mut buf, 0).unwrap_err();
        assert!(
            [Some(libc::ETIMEDOUT), Some(libc::EIO)].contains(&e.raw_os_error()),
            "{e}"
        );
    }
    assert_eq!(
        proxy.counts().get,
        gets,
        "retries reached the frozen server"
    );

    proxy.clear_faults();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match f.read_at(&mut buf, 0) {
            Ok(n) => {
                assert_eq!(&buf[..n], &data[..n]);
                break;
            }
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "never read again: {e}"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    drop(f);
    silt.stop();
}

/// A descriptor opened for reading before its file was replaced (renamed over, or unlinked and
/// created again) reads the file it opened, never the new one at its name: POSIX gives the old
/// bytes; Silt gives them or `ESTALE` where it no longer has them (docs/SEMANTICS.md, "Reads
/// and versions"). The daemon used to follow the name once any commit happened after the open
/// (seen once in the differential test: a read answered the new file's bytes). And one opened
/// while a writer had the file open reads the file's bytes after that writer closed and the file
/// was rewritten in place, not that ended writer's.
fn a_read_descriptor_reads_its_own_file(write_type: &str) {
    let backing = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (b"OLD".repeat(1000), b"NEW".repeat(1000));
    // In the store before Silt starts: never written through it, so in no cache.
    std::fs::write(backing.path().join("v"), &old).unwrap();
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", write_type], dir.path());
    let p = |rel: &str| silt.path(&format!("data/{rel}"));
    std::fs::write(p("x"), &old).unwrap();
    std::fs::write(p("y"), &new).unwrap();
    std::fs::write(p("u"), &old).unwrap();
    let x = std::fs::File::open(p("x")).unwrap();
    let u = std::fs::File::open(p("u")).unwrap();
    std::fs::rename(p("y"), p("x")).unwrap();
    std::fs::remove_file(p("u")).unwrap();
    std::fs::write(p("u"), &new).unwrap();
    // More commits after the opens: the daemon looked again on every commit.
    std::fs::write(p("z"), b"z").unwrap();
    for (name, f) in [("x", &x), ("u", &u)] {
        let mut buf = vec![0u8; old.len()];
        match f.read_at(&mut buf, 0) {
            Ok(n) => assert!(
                buf[..n] == old[..n] && n > 0,
                "{write_type}: {name} opened before it was replaced read other bytes than its own: {:?}",
                String::from_utf8_lossy(&buf[..n.min(12)])
            ),
            Err(e) => assert_eq!(
                e.raw_os_error(),
                Some(libc::ESTALE),
                "{write_type}: {name}: {e}"
            ),
        }
    }
    // Unlinked, its version in no cache, its pages not in the kernel: read(2) cannot answer
    // ENOENT.
    let v = std::fs::File::open(p("v")).unwrap();
    std::fs::remove_file(p("v")).unwrap();
    // SAFETY: advice on an open descriptor (drop its cached pages).
    unsafe { libc::posix_fadvise(v.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = vec![0u8; old.len()];
    match v.read_at(&mut buf, 0) {
        Ok(n) => assert!(
            n > 0 && buf[..n] == old[..n],
            "{write_type}: v read other bytes"
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{write_type}: v: {e}"),
    }
    // The names hold the new files.
    assert_eq!(std::fs::read(p("x")).unwrap(), new);
    assert_eq!(std::fs::read(p("u")).unwrap(), new);
    drop((x, u));

    // Opened while a writer had the file open, then the file rewritten in place (same file,
    // O_TRUNC) after that writer closed: POSIX gives the new bytes, not the first writer's.
    let mut w = std::fs::File::create(p("r")).unwrap();
    w.write_all(b"AAAA").unwrap();
    let r = std::fs::File::open(p("r")).unwrap();
    close(w).unwrap();
    let mut w = std::fs::File::create(p("r")).unwrap();
    w.write_all(b"BBBB").unwrap();
    close(w).unwrap();
    // SAFETY: advice on an open descriptor: the kernel drops its cached pages, so the read
    // below goes to the daemon.
    unsafe { libc::posix_fadvise(r.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = [0u8; 4];
    r.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(
        &buf, b"BBBB",
        "{write_type}: a descriptor read an ended session's bytes"
    );
    silt.stop();
}

#[test]
fn a_read_descriptor_reads_its_own_file_through() {
    a_read_descriptor_reads_its_own_file("through");
}

#[test]
fn a_read_descriptor_reads_its_own_file_back() {
    a_read_descriptor_reads_its_own_file("back");
}

/// A descriptor opened for reading before its file was truncated by path (`truncate(2)`, the
/// file rewritten in place through this mount) is a descriptor of the same file: POSIX gives
/// it the new size, and so did its reads, but an attribute request the kernel sends with the
/// handle (an `lseek` to the end, a read past the cached size) was answered with the size of
/// the version the handle had opened. The kernel keeps one size per inode, so every `stat`
/// then showed the old size (the differential test's seed 43, local directory and `back`: a
/// walk's `stat` disagreed with the bytes it read next). There the upload of the truncated
/// file made the kernel drop the size at a moment of its own; here `silt fs invalidate` does,
/// and returns once the kernel was told, so the `lseek` asks the daemon.
fn a_read_descriptor_sees_a_truncate_by_path(write_type: &str) {
    let backing = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", write_type], dir.path());
    let p = silt.path("data/a");
    let old = b"OLD".repeat(20_000);
    std::fs::write(&p, &old).unwrap();
    let r = std::fs::File::open(&p).unwrap();
    // SAFETY: a NUL-terminated path and a length.
    assert_eq!(unsafe { libc::truncate(cstr(&p).as_ptr(), 1000) }, 0);
    let o = silt.cli(&["fs", "invalidate", "/data/a"]);
    assert!(o.status.success(), "invalidate: {}", stderr(&o));
    // SAFETY: lseek on an open descriptor.
    let end = unsafe { libc::lseek(r.as_raw_fd(), 0, libc::SEEK_END) };
    assert_eq!(
        end, 1000,
        "{write_type}: the end of a descriptor opened before truncate(2) is the old size"
    );
    // The kernel's cached size (fstat asks no one while it is valid).
    assert_eq!(r.metadata().unwrap().len(), 1000, "{write_type}: fstat");
    assert_eq!(
        std::fs::metadata(&p).unwrap().len(),
        1000,
        "{write_type}: stat"
    );
    let mut buf = vec![0u8; 4096];
    let n = r.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], &old[..1000], "{write_type}: read");
    drop(r);
    silt.stop();
}

#[test]
fn a_read_descriptor_sees_a_truncate_by_path_through() {
    a_read_descriptor_sees_a_truncate_by_path("through");
}

#[test]
fn a_read_descriptor_sees_a_truncate_by_path_back() {
    a_read_descriptor_sees_a_truncate_by_path("back");
}

/// A descriptor open for reading, the file written through another descriptor, unlinked, and
/// that writer closed: POSIX keeps the open file whole, with the writer's bytes, until its
/// last descriptor closes. Opened while the writer had the file open (`reader_first` false),
/// its reads answered them, but an attribute request the kernel sent with the handle (a read
/// past the size it held, an `lseek` to the end) was answered with the size of the stored
/// version the handle had opened, so a read past that size came back empty (the differential
/// test's seed 50). Opened before the writer (`reader_first`), it read the stored version it
/// had opened: the old bytes, or nothing past their end (seed 51).
/// With `closed_first`, the writer closes (its bytes committed) before the unlink.
fn an_unlinked_file_keeps_its_writers_bytes(
    write_type: &str,
    reader_first: bool,
    closed_first: bool,
) {
    let backing = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", write_type], dir.path());
    let p = silt.path("data/b");
    std::fs::write(&p, b"OLD".repeat(1000)).unwrap();
    let new = b"NEW".repeat(20_000);
    let early = reader_first.then(|| std::fs::File::open(&p).unwrap());
    let w = rw(&p);
    w.write_all_at(&new, 0).unwrap();
    let r = early.unwrap_or_else(|| std::fs::File::open(&p).unwrap());
    if closed_first {
        close(w).unwrap();
        std::fs::remove_file(&p).unwrap();
    } else {
        std::fs::remove_file(&p).unwrap();
        close(w).unwrap();
    }
    // SAFETY: lseek on an open descriptor.
    let end = unsafe { libc::lseek(r.as_raw_fd(), 0, libc::SEEK_END) };
    assert_eq!(
        end,
        new.len() as i64,
        "{write_type}, reader first {reader_first}, closed first {closed_first}: the end of an unlinked file after its writer closed"
    );
    // SAFETY: advice on an open descriptor: the kernel drops its cached pages, so the read
    // below goes to the daemon.
    unsafe { libc::posix_fadvise(r.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = vec![0u8; 2 * new.len()];
    let (mut got, mut stale) = (0, false);
    loop {
        let n = match r.read_at(&mut buf[got..], got as u64) {
            Ok(n) => n,
            // Committed and then deleted from the store, its pages not kept: ESTALE, the
            // documented deviation (docs/SEMANTICS.md); never other bytes or an early end.
            Err(e) if closed_first && e.raw_os_error() == Some(libc::ESTALE) => {
                stale = true;
                break;
            }
            Err(e) => panic!("{write_type}: read of an unlinked file: {e}"),
        };
        if n == 0 {
            break;
        }
        got += n;
    }
    let want = if stale { &new[..got] } else { &new[..] };
    assert!(
        buf[..got] == *want,
        "{write_type}, reader first {reader_first}, closed first {closed_first}: an unlinked file read {got} bytes, not its writer's {}",
        new.len()
    );
    drop(r);
    silt.stop();
}

#[test]
fn an_unlinked_file_keeps_its_writers_bytes_through() {
    for (reader_first, closed_first) in [(false, false), (true, false), (false, true), (true, true)]
    {
        an_unlinked_file_keeps_its_writers_bytes("through", reader_first, closed_first);
    }
}

#[test]
fn an_unlinked_file_keeps_its_writers_bytes_back() {
    for (reader_first, closed_first) in [(false, false), (true, false), (false, true), (true, true)]
    {
        an_unlinked_file_keeps_its_writers_bytes("back", reader_first, closed_first);
    }
}

/// A file opened for writing and neither read nor written yet (its bytes not loaded by Silt),
/// then unlinked: its descriptor still reads its bytes (POSIX); it read the file as empty,
/// loading it from a name that no longer held it. And a read-only descriptor of an unlinked
/// file whose name is a directory now reads its bytes or `ESTALE` (the documented deviation),
/// never `EISDIR`: the store was asked for the old version at that name and answered "is a
/// directory" (the differential test's seed 96).
#[test]
fn an_unlinked_file_reads_its_bytes_not_what_its_name_holds_now() {
    let backing = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let old = b"OLD".repeat(5000);
    // In the store before Silt starts: in no cache.
    std::fs::write(backing.path().join("w"), &old).unwrap();
    std::fs::write(backing.path().join("r"), &old).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", "through"], dir.path());
    let (pw, pr) = (silt.path("data/w"), silt.path("data/r"));

    let w = rw(&pw);
    std::fs::remove_file(&pw).unwrap();
    let mut buf = vec![0u8; 2 * old.len()];
    let n = w.read_at(&mut buf, 0).unwrap();
    assert!(
        buf[..n] == old[..],
        "an unlinked file open for writing read {n} bytes, not its {}",
        old.len()
    );
    close(w).unwrap();

    let r = std::fs::File::open(&pr).unwrap();
    std::fs::remove_file(&pr).unwrap();
    std::fs::create_dir(&pr).unwrap();
    match r.read_at(&mut buf, 0) {
        Ok(n) => assert!(buf[..n] == old[..], "read {n} other bytes"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}"),
    }
    drop(r);
    silt.stop();
}

/// A descriptor of a file renamed since its open (over another file or not) reads the file at
/// its new name: its version was asked of the store at the old path, which no longer held it,
/// and the read answered `ESTALE` for a file that still has a name (the differential test's
/// seed 134).
#[test]
fn a_read_descriptor_follows_its_file_through_a_rename() {
    let backing = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    let (b, a) = (bytes(134, 300_000), bytes(135, 1000));
    // In the store before Silt starts: in no cache.
    std::fs::write(backing.path().join("b"), &b).unwrap();
    std::fs::write(backing.path().join("a"), &a).unwrap();
    std::fs::write(backing.path().join("c"), &b).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::up_data(&uri, Vec::new(), &["--write-type", "through"], dir.path());
    for (from, to) in [("b", "a"), ("c", "d")] {
        let r = std::fs::File::open(silt.path(&format!("data/{from}"))).unwrap();
        std::fs::rename(
            silt.path(&format!("data/{from}")),
            silt.path(&format!("data/{to}")),
        )
        .unwrap();
        let mut buf = vec![0u8; b.len() + 1];
        let got = pread_to_end(&r, &mut buf)
            .unwrap_or_else(|e| panic!("{from} renamed to {to}: read: {e}"));
        assert!(
            buf[..got] == b[..],
            "{from} renamed to {to}: read {got} other bytes"
        );
    }
    silt.stop();
}

/// An unlink of a file open for writing whose bytes are not loaded yet loads them first, so
/// its descriptors keep reading them. Against a store whose reads fail, and then one whose
/// reads hang, that unlink fails with an error (once the store's deadline has passed, for the
/// hang): it neither hangs nor loses anything (the name, the store's object and the
/// descriptor's bytes are all still there). Once the store answers, the unlink succeeds and
/// the descriptor still reads the file's bytes.
#[test]
fn an_unlink_that_must_load_a_file_from_a_frozen_store_fails_and_loses_nothing() {
    let fx = S3Fx::start(true);
    let data = bytes(77, (3 << 20) + 11);
    fx.put("big", &data);
    let dir = tempfile::tempdir().unwrap();
    let silt = fx.up(
        &[
            "--write-type",
            "through",
            "--ufs-timeout",
            "2s",
            "--ufs-retries",
            "0",
        ],
        dir.path(),
    );
    let p = silt.path("data/big");
    let w = rw(&p);
    let proxy = fx.proxy.as_ref().unwrap();
    let kept = |what: &str| {
        assert!(p.exists(), "{what}: the failed unlink took the name");
        let meta = fx.rt.block_on(fx.store.stat("big")).unwrap();
        assert_eq!(
            meta.size,
            data.len() as u64,
            "{what}: the failed unlink deleted the store's object"
        );
    };
    proxy.inject(S3Op::Get, 0, usize::MAX, FaultAction::internal_error());
    let e = std::fs::remove_file(&p).expect_err("unlinked with the file's bytes unreadable");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    proxy.clear_faults();
    kept("reads failing");

    proxy.inject(S3Op::Get, 0, usize::MAX, FaultAction::Hang);
    let (tx, rx) = std::sync::mpsc::channel();
    let gone = p.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::remove_file(&gone));
    });
    let unlinked = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("an unlink that must read a frozen store never returned");
    let e = unlinked.expect_err("unlinked without the bytes its descriptor must keep reading");
    assert!(
        matches!(e.raw_os_error(), Some(libc::ETIMEDOUT) | Some(libc::EIO)),
        "{e}"
    );
    proxy.clear_faults();
    kept("reads hanging");
    // The store counts as stalled for one deadline after the hang: ETIMEDOUT at once, then
    // a probe.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while let Err(e) = std::fs::remove_file(&p) {
        assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
        assert!(
            std::time::Instant::now() < deadline,
            "the store never recovered: {e}"
        );
    }
    let mut got = vec![0u8; data.len() + 1];
    let n = pread_to_end(&w, &mut got).unwrap();
    assert!(
        got[..n] == data[..],
        "the unlinked file's descriptor read {n} other bytes"
    );
    close(w).unwrap();
    let e = fx.rt.block_on(fx.store.stat("big")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    silt.stop();
}

/// An open file's bytes outlive its name however the name went, also for pages Silt never
/// cached: a file renamed (through Silt) and then opened and unlinked (its pages were cached
/// under the old name), a file written behind Silt's back and opened but never read before
/// its unlink, a file open while it is renamed away, and one open while another file is
/// renamed over it. Each read goes to the daemon (the kernel's pages dropped), on `file://`
/// and S3. Before the store lost a version open here, Silt read it whole into the cache.
#[test]
fn an_open_file_keeps_its_bytes_after_a_rename_or_an_unlink_of_pages_never_read() {
    let backing = tempfile::tempdir().unwrap();
    let local = format!("file://{}", backing.path().display());
    let fx = S3Fx::start(false);
    // Three pages and a bit, so that reads need pages never asked for.
    let data: Vec<u8> = (0..(3 << 20) + 4097u32).map(|i| (i % 251) as u8).collect();
    let other = b"the file renamed over it".to_vec();
    for on_s3 in [false, true] {
        // Written behind Silt's back before it starts: nothing of them cached.
        for name in ["never-read", "moving", "target"] {
            if on_s3 {
                fx.put(name, &data);
            } else {
                std::fs::write(backing.path().join(name), &data).unwrap();
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let silt = if on_s3 {
            fx.up(&["--write-type", "through"], dir.path())
        } else {
            Silt::up_data(&local, Vec::new(), &["--write-type", "through"], dir.path())
        };
        let what = if on_s3 { "s3" } else { "file" };
        let read_all = |f: &std::fs::File, len: usize, case: &str| -> Vec<u8> {
            // SAFETY: advice on an open descriptor.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            let mut buf = vec![0u8; len];
            f.read_exact_at(&mut buf, 0)
                .unwrap_or_else(|e| panic!("{what} {case}: pread: {e}"));
            buf
        };
        let p = |n: &str| silt.path(&format!("data/{n}"));

        // Renamed through Silt, then opened and unlinked.
        std::fs::write(p("g"), &data).unwrap();
        assert_eq!(std::fs::read(p("g")).unwrap(), data);
        std::fs::rename(p("g"), p("g2")).unwrap();
        let f = std::fs::File::open(p("g2")).unwrap();
        std::fs::remove_file(p("g2")).unwrap();
        assert!(
            read_all(&f, data.len(), "renamed, opened, unlinked") == data,
            "{what}"
        );
        drop(f);

        // Opened, never read, unlinked.
        let f = std::fs::File::open(p("never-read")).unwrap();
        std::fs::remove_file(p("never-read")).unwrap();
        assert!(
            read_all(&f, data.len(), "never read, unlinked") == data,
            "{what}"
        );
        drop(f);

        // Open while renamed away.
        let f = std::fs::File::open(p("moving")).unwrap();
        std::fs::rename(p("moving"), p("moved")).unwrap();
        assert!(
            read_all(&f, data.len(), "renamed while open") == data,
            "{what}"
        );
        drop(f);
        assert_eq!(std::fs::read(p("moved")).unwrap(), data, "{what}");

        // Open while another file is renamed over it.
        std::fs::write(p("newer"), &other).unwrap();
        let f = std::fs::File::open(p("target")).unwrap();
        std::fs::rename(p("newer"), p("target")).unwrap();
        assert!(
            read_all(&f, data.len(), "renamed over while open") == data,
            "{what}"
        );
        drop(f);
        assert_eq!(std::fs::read(p("target")).unwrap(), other, "{what}");
        silt.stop();
    }
}

/// A file unlinked while open keeps its bytes for the descriptors and mappings that have it
/// (POSIX; how temporary files and log rotation work): an `O_RDONLY` descriptor read `ESTALE`
/// once the kernel's pages were dropped (its cached pages went with the name) and `fstat`
/// answered `ENOENT` (the kernel sends it without a handle). On a local store and on S3,
/// with `O_RDONLY`, `O_RDWR` and a shared read mapping.
#[test]
fn an_open_file_keeps_its_bytes_after_its_unlink() {
    let backing = tempfile::tempdir().unwrap();
    let local = format!("file://{}", backing.path().display());
    let fx = S3Fx::start(false);
    for on_s3 in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let extra = ["--write-type", "through"];
        let silt = if on_s3 {
            fx.up(&extra, dir.path())
        } else {
            Silt::up_data(&local, Vec::new(), &extra, dir.path())
        };
        let what = if on_s3 { "s3" } else { "file" };
        let data = b"hello, unlinked world".repeat(500);
        for how in ["rdonly", "rdwr", "mmap"] {
            let p = silt.path(&format!("data/{how}"));
            std::fs::write(&p, &data).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), data, "{what} {how}");
            let f = OpenOptions::new()
                .read(true)
                .write(how == "rdwr")
                .open(&p)
                .unwrap();
            let map = (how == "mmap").then(|| {
                // SAFETY: a fresh shared read-only mapping of an open file, unmapped below.
                let m = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        data.len(),
                        libc::PROT_READ,
                        libc::MAP_SHARED,
                        f.as_raw_fd(),
                        0,
                    )
                };
                assert_ne!(m, libc::MAP_FAILED, "{what}: mmap");
                m
            });
            std::fs::remove_file(&p).unwrap();
            assert!(!p.exists(), "{what} {how}");
            // The kernel's pages dropped: the reads below go to the daemon.
            // SAFETY: advice on an open descriptor.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            let mut buf = vec![0u8; data.len()];
            match map {
                Some(m) => {
                    // SAFETY: the mapping is `data.len()` bytes long and readable.
                    let mapped = unsafe { std::slice::from_raw_parts(m as *const u8, data.len()) };
                    buf.copy_from_slice(mapped);
                    // SAFETY: unmaps the mapping made above, not used after.
                    unsafe { libc::munmap(m, data.len()) };
                }
                None => f
                    .read_exact_at(&mut buf, 0)
                    .unwrap_or_else(|e| panic!("{what} {how}: pread: {e}")),
            }
            assert!(buf == data, "{what} {how}: other bytes");
            let md = f
                .metadata()
                .unwrap_or_else(|e| panic!("{what} {how}: fstat: {e}"));
            assert_eq!(md.len(), data.len() as u64, "{what} {how}");
            {
                use std::os::unix::fs::MetadataExt;
                assert_eq!(md.nlink(), 0, "{what} {how}: an unlinked file has no name");
            }
            drop(f);
        }
        silt.stop();
    }
}
