//! Sparse files and the largest file size through a real FUSE mount over a local directory:
//! `truncate` and writes past the end make holes (a sparse file in the store, no zeros
//! written), and a size past `--max-file-size` is EFBIG at once.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::*;

const GIB: u64 = 1 << 30;

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("error without errno: {e}")),
    }
}

/// truncate(2) by path.
fn truncate(p: &Path, len: u64) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let len = libc::off_t::try_from(len).unwrap();
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::truncate(c.as_ptr(), len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn truncate_makes_holes_and_past_the_maximum_is_efbig() {
    let local = tempfile::tempdir().unwrap();
    let ld = local.path();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", ld.display());
    let silt = Silt::up(
        &[("/data", &uri)],
        &["--write-type", "through", "--max-file-size", "3GiB"],
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let root = silt.path("data");

    // `truncate -s 2G` then a few bytes in the middle, then close: a 2 GiB sparse file.
    let f = std::fs::File::create(root.join("big")).unwrap();
    f.set_len(2 * GIB).unwrap();
    f.write_all_at(b"middle", GIB).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 2 * GIB);
    drop(f);
    let md = std::fs::metadata(ld.join("big")).unwrap();
    assert_eq!(md.len(), 2 * GIB);
    assert!(
        md.blocks() * 512 < 4 << 20,
        "{} bytes allocated in the store for 6 bytes of data",
        md.blocks() * 512
    );
    let f = std::fs::File::open(root.join("big")).unwrap();
    let mut buf = vec![0xAAu8; 10];
    f.read_exact_at(&mut buf, GIB - 2).unwrap();
    assert_eq!(buf, b"\0\0middle\0\0");
    f.read_exact_at(&mut buf, 2 * GIB - 10).unwrap();
    assert_eq!(buf, [0; 10]);

    // Past --max-file-size: EFBIG at once, by descriptor and by path, for a write too.
    let g = std::fs::File::create(root.join("huge")).unwrap();
    assert_eq!(errno(g.set_len(999_999_999_999_999)), libc::EFBIG);
    assert_eq!(errno(g.set_len(3 * GIB + 1)), libc::EFBIG);
    assert_eq!(errno(g.write_all_at(b"xy", 3 * GIB - 1)), libc::EFBIG);
    g.set_len(3 * GIB).unwrap();
    assert_eq!(g.metadata().unwrap().len(), 3 * GIB);
    drop(g);
    assert_eq!(errno(truncate(&root.join("huge"), 4 * GIB)), libc::EFBIG);
    assert_eq!(std::fs::metadata(ld.join("huge")).unwrap().len(), 3 * GIB);
    silt.stop();
}
