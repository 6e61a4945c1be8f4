//! The write types through the real binary and a real FUSE mount over a real S3 server
//! (versitygw): `back` loses nothing acknowledged when the process is SIGKILLed before its
//! uploads, `cache-only` never reaches the store and spills past its memory within budget,
//! and a full Silt answers ENOSPC.

use std::io::Write;
use std::path::{Path, PathBuf};

use silt_testkit::S3Server;

mod common;
use common::*;

/// The object `key` of bucket `bkt` as versitygw's posix backend keeps it.
fn in_store(s3: &S3Server, key: &str) -> Option<Vec<u8>> {
    std::fs::read(s3.root().join("bkt").join(key)).ok()
}

fn s3() -> S3Server {
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    s3
}

fn up(s3: &S3Server, extra: &[&str], dir: &Path) -> Silt {
    Silt::up_data(&s3.uri("bkt", ""), s3_args(s3), extra, dir)
}

/// Writes `data` at `path` in pieces and closes it; the close is the acknowledgement.
fn write(path: &Path, data: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(path.parent().unwrap())?;
    let mut f = std::fs::File::create(path)?;
    for chunk in data.chunks(128 << 10) {
        f.write_all(chunk)?;
    }
    f.sync_all()?;
    drop(f);
    Ok(())
}

#[test]
fn back_loses_nothing_acknowledged_when_killed_before_upload() {
    let s3 = s3();
    let dir = tempfile::tempdir().unwrap();
    let silt = up(
        &s3,
        &["--write-type", "back", "--upload-delay", "1h"],
        dir.path(),
    );
    let files: Vec<(String, Vec<u8>)> = (0..6u64)
        .map(|i| {
            (
                format!("job/part-{i}"),
                bytes(i, 100_000 + i as usize * 1_500_000),
            )
        })
        .collect();
    for (p, d) in &files {
        write(&silt.path(&format!("data/{p}")), d).unwrap();
    }
    // Acknowledged, readable, and not uploaded yet.
    for (p, d) in &files {
        assert!(
            std::fs::read(silt.path(&format!("data/{p}"))).unwrap() == *d,
            "{p}"
        );
        assert!(in_store(&s3, p).is_none(), "{p} uploaded before its delay");
    }
    let o = silt.cli(&["fs", "state", "/data/job"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.matches("pending").count() == files.len(),
        "{out}"
    );

    // SIGKILL: no clean shutdown, no upload.
    silt.kill();
    for (p, _) in &files {
        assert!(
            in_store(&s3, p).is_none(),
            "{p} uploaded by a killed process"
        );
    }

    // Restart on the same state: the log is recovered; the files read back before and after
    // their upload; every acknowledged byte ends in the store.
    let silt = up(&s3, &["--write-type", "back"], dir.path());
    for (p, d) in &files {
        let got = std::fs::read(silt.path(&format!("data/{p}")))
            .unwrap_or_else(|e| panic!("{p} after restart: {e}\n{}", silt.log_text()));
        assert!(got == *d, "{p} after restart");
    }
    let o = silt.cli(&["fs", "persist", "/data/job"]);
    assert!(
        o.status.success(),
        "persist: {} {}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    for (p, d) in &files {
        assert!(
            in_store(&s3, p).as_deref() == Some(&d[..]),
            "{p}: store differs"
        );
        assert!(
            std::fs::read(silt.path(&format!("data/{p}"))).unwrap() == *d,
            "{p} after upload"
        );
    }
    let wal: Vec<PathBuf> = std::fs::read_dir(silt.state_dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(wal.is_empty(), "log not emptied: {wal:?}");
    silt.stop();
}

#[test]
fn cache_only_stays_in_silt_and_spills_within_its_memory() {
    let s3 = s3();
    let dir = tempfile::tempdir().unwrap();
    let silt = up(
        &s3,
        &[
            "--write-type",
            "through",
            "--write-rules",
            "/data/shuffle=cache-only",
            "--write-memory",
            "8MiB",
        ],
        dir.path(),
    );
    let files: Vec<(String, Vec<u8>)> = (0..4u64)
        .map(|i| (format!("shuffle/map-{i}"), bytes(10 + i, 6 << 20)))
        .collect();
    for (p, d) in &files {
        write(&silt.path(&format!("data/{p}")), d).unwrap();
    }
    write(&silt.path("data/result"), b"done").unwrap();
    for (p, d) in &files {
        assert!(
            std::fs::read(silt.path(&format!("data/{p}"))).unwrap() == *d,
            "{p}"
        );
        assert!(
            in_store(&s3, p).is_none(),
            "{p}: a cache-only file reached the store"
        );
    }
    assert_eq!(in_store(&s3, "result").as_deref(), Some(&b"done"[..]));
    let mut names: Vec<String> = std::fs::read_dir(silt.path("data/shuffle"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["map-0", "map-1", "map-2", "map-3"]);

    let r = silt.report();
    let w = &r["memory"]["write"];
    assert!(w["peak"].as_u64().unwrap() <= 8 << 20, "{w}");
    assert!(w["spilled"].as_u64().unwrap() > 0, "{w}");
    assert_eq!(w["cache_only_files"].as_u64().unwrap(), 4, "{w}");

    // The ceiling lowered at run time: memory given back, nothing lost.
    let o = silt.cli(&["memory", "--write", "1MiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = silt.report();
    assert!(
        r["memory"]["write"]["used"].as_u64().unwrap() <= 1 << 20,
        "{}",
        r["memory"]
    );
    assert!(std::fs::read(silt.path("data/shuffle/map-1")).unwrap() == files[1].1);

    std::fs::remove_file(silt.path("data/shuffle/map-0")).unwrap();
    assert!(!silt.path("data/shuffle/map-0").exists());
    silt.stop();
}

#[test]
fn no_room_in_any_tier_is_enospc() {
    let s3 = s3();
    let dir = tempfile::tempdir().unwrap();
    let tier = dir.path().join("tier");
    let tiers = format!("{}:4MiB", tier.display());
    let silt = up(
        &s3,
        &[
            "--write-type",
            "cache-only",
            "--write-memory",
            "2MiB",
            "--disk-tiers",
            &tiers,
        ],
        dir.path(),
    );
    let e = write(&silt.path("data/huge"), &bytes(1, 16 << 20)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    // Smaller files still fit once the failed one is gone.
    let _ = std::fs::remove_file(silt.path("data/huge"));
    write(&silt.path("data/small"), b"fits").unwrap();
    assert_eq!(std::fs::read(silt.path("data/small")).unwrap(), b"fits");
    silt.stop();
}

/// Spark's shuffle directories under `cache-only` (`spark.local.dir` on the mount): it makes
/// `blockmgr-*/NN` once, then writes temporary files in one and renames them into another,
/// or removes them. A directory must stay until its `rmdir`, emptied or not (it vanished
/// with its last file: Spark's next `temp_shuffle_*` in it failed with ENOENT). On a local
/// store and on S3; the store sees none of it.
#[test]
fn cache_only_directories_stay_until_rmdir_as_spark_uses_them() {
    let s3 = s3();
    let backing = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", backing.path().display());
    for on_s3 in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let extra = ["--write-type", "cache-only"];
        let silt = if on_s3 {
            up(&s3, &extra, dir.path())
        } else {
            Silt::up_data(&uri, Vec::new(), &extra, dir.path())
        };
        let b = silt.path("data/b");
        let what = if on_s3 { "s3" } else { "file" };
        std::fs::create_dir_all(b.join("16")).unwrap();
        std::fs::create_dir_all(b.join("30")).unwrap();
        // Its times are its making's, as a new directory's are (not a constant of the mount):
        // not before a local file made just before it, to the second (the kernel stamps that
        // one from a clock that lags, never leads; a directory's nanoseconds are Silt's
        // listing digest, docs/SEMANTICS.md).
        let marker = dir.path().join(format!("before-{what}"));
        std::fs::write(&marker, b"").unwrap();
        let secs = |p: &std::path::Path| {
            let t = std::fs::metadata(p).unwrap().modified().unwrap();
            t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
        };
        let before = secs(&marker);
        std::fs::create_dir(b.join("empty")).unwrap();
        let mtime = secs(&b.join("empty"));
        assert!(
            mtime >= before,
            "{what}: a new directory's mtime {mtime} is before its making {before}"
        );
        std::fs::write(b.join("16/t"), b"a").unwrap();
        std::fs::rename(b.join("16/t"), b.join("30/u")).unwrap();
        assert!(b.join("16").is_dir(), "{what}: emptied by a rename");
        std::fs::write(b.join("16/n"), b"x").unwrap();
        std::fs::remove_file(b.join("16/n")).unwrap();
        assert!(b.join("16").is_dir(), "{what}: emptied by an unlink");
        std::fs::write(b.join("16/n2"), b"y").unwrap();
        assert_eq!(std::fs::read(b.join("30/u")).unwrap(), b"a", "{what}");
        // The parent listed again (a revalidation from the store) keeps them.
        let o = silt.cli(&["fs", "sync", "/data", "--recursive"]);
        assert!(o.status.success(), "{what}: sync: {}", stderr(&o));
        let mut names: Vec<String> = std::fs::read_dir(&b)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["16", "30", "empty"], "{what}");
        // A directory moves with what is in it; rmdir takes an empty one and only that.
        std::fs::rename(b.join("30"), b.join("31")).unwrap();
        assert_eq!(std::fs::read(b.join("31/u")).unwrap(), b"a", "{what}");
        assert!(!b.join("30").exists(), "{what}");
        let full = std::fs::remove_dir(b.join("31")).unwrap_err();
        assert_eq!(full.raw_os_error(), Some(libc::ENOTEMPTY), "{what}");
        std::fs::remove_dir(b.join("empty")).unwrap();
        assert!(!b.join("empty").exists(), "{what}");
        std::fs::remove_file(b.join("31/u")).unwrap();
        std::fs::remove_dir(b.join("31")).unwrap();
        // Nothing of it reached the store.
        if on_s3 {
            assert!(!s3.root().join("bkt/b").exists(), "{what}");
        } else {
            assert!(!backing.path().join("b").exists(), "{what}");
        }
        silt.stop();
    }
}

/// A disk tier on a file system smaller than its quota (the default 10 GiB, the state dir on a
/// 64 MiB tmpfs): reading more than the file system holds evicts rather than filling it (the
/// quota was never reached, so nothing was evicted, and writes past `write_memory` then failed
/// at once with ENOSPC though cached pages held the space), and written data spilling there
/// wins over cached pages.
#[test]
fn a_tier_on_a_small_file_system_evicts_and_written_data_wins() {
    let store = tempfile::tempdir().unwrap();
    let files: Vec<Vec<u8>> = (0..12u64).map(|i| bytes(40 + i, 16 << 20)).collect();
    for (i, d) in files.iter().enumerate() {
        std::fs::write(store.path().join(format!("{i}.bin")), d).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let _tmpfs = Tmpfs::mount(&dir.path().join("state"), "size=64m");
    let uri = format!("file://{}", store.path().display());
    let extra = [
        "--write-type",
        "cache-only",
        "--write-memory",
        "4MiB",
        "--memory-capacity",
        "4MiB",
    ];
    let silt = Silt::up_data(&uri, Vec::new(), &extra, dir.path());
    for (i, d) in files.iter().enumerate() {
        let got = std::fs::read(silt.path(&format!("data/{i}.bin"))).unwrap();
        assert!(got == *d, "{i}.bin");
    }
    let r = silt.report();
    let tiers = r["tiers"].as_array().cloned().unwrap_or_default();
    let disk = tiers
        .iter()
        .find(|t| t["name"] == "disk0")
        .unwrap_or_else(|| panic!("no disk tier in {r}"));
    let capacity = disk["capacity"].as_u64().unwrap();
    assert!(
        capacity < 64 << 20,
        "the tier's capacity is not what its file system holds: {disk}"
    );
    assert!(disk["used"].as_u64().unwrap() > 0, "{disk}");
    // Past the write memory: spilled into the same file system, which cached pages fill.
    let scratch = bytes(99, 40 << 20);
    write(&silt.path("data/scratch"), &scratch).unwrap();
    assert!(std::fs::read(silt.path("data/scratch")).unwrap() == scratch);
    // The cache still serves (what it kept, or refetched).
    assert!(std::fs::read(silt.path("data/0.bin")).unwrap() == files[0]);
    silt.stop();
}
