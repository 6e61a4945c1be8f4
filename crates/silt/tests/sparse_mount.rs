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

/// Changing an existing sparse file costs what its data costs, not its holes: a 16 GiB file
/// with a few bytes of data, made behind Silt's back, grown to 64 GiB by `truncate`, then
/// given one byte in the middle (`dd seek=... conv=notrunc`), reads none of its holes from
/// the store (no store bytes read at all: the local file's data extents are loaded straight
/// from it) and puts no page of zeros into the disk tier; the store's file stays sparse and
/// holds exactly what was written.
#[test]
fn changing_an_existing_sparse_file_reads_none_of_its_holes() {
    let local = tempfile::tempdir().unwrap();
    let ld = local.path();
    {
        let f = std::fs::File::create(ld.join("sparse")).unwrap();
        f.set_len(16 * GIB).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", 16 * GIB - 4).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", ld.display());
    let silt = Silt::up(&[("/data", &uri)], &["--write-type", "through"], dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let p = silt.path("data/sparse");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 16 * GIB);
    let read_before = silt.metric("silt_ufs_read_bytes_total");

    truncate(&p, 64 * GIB).unwrap();
    {
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"!", 32 * GIB).unwrap();
    }
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 64 * GIB);

    let read = silt.metric("silt_ufs_read_bytes_total") - read_before;
    assert!(
        read < 1 << 20,
        "{read} bytes read from the store to change a sparse file"
    );
    let r = silt.report();
    let disk_used: u64 = r["tiers"]
        .as_array()
        .unwrap_or_else(|| panic!("no tiers in {r}"))
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("disk")))
        .filter_map(|t| t["used"].as_u64())
        .sum();
    assert!(
        disk_used < 16 << 20,
        "{disk_used} bytes of pages in the disk tier"
    );
    let md = std::fs::metadata(ld.join("sparse")).unwrap();
    assert_eq!(md.len(), 64 * GIB);
    assert!(md.blocks() * 512 < 4 << 20, "{} blocks", md.blocks());
    let f = std::fs::File::open(ld.join("sparse")).unwrap();
    let at = |off: u64, n: usize| {
        let mut b = vec![0u8; n];
        f.read_exact_at(&mut b, off).unwrap();
        b
    };
    assert_eq!(at(0, 4), b"head");
    assert_eq!(at(16 * GIB - 4, 4), b"tail");
    assert_eq!(at(32 * GIB - 1, 3), b"\0!\0");
    assert_eq!(at(64 * GIB - 4, 4), [0u8; 4]);
    silt.stop();
}
