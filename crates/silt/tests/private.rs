//! The cache is private: Silt's local state is owner-only whatever the umask, and a cache file
//! altered on disk is never served.

mod common;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// `silt up` over `file://{store}` at `dir/mnt` with state in `dir/state`, started with
/// umask 000 so any file created without an explicit mode would be world-writable.
fn up_umask_000(store: &Path, extra: &[&str], dir: &Path) -> Silt {
    let (mp, state) = (dir.join("mnt"), dir.join("state"));
    std::fs::create_dir_all(&mp).unwrap();
    let mut cmd = Command::new(SILT);
    cmd.args(["up", "--mountpoint"])
        .arg(&mp)
        .arg("--state-dir")
        .arg(&state)
        .arg("--mount")
        .arg(format!("/data=file://{}", store.display()))
        .args(extra);
    // SAFETY: umask(2) is async-signal-safe and cannot fail.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    Silt::spawn(cmd, Some(&mp), &state).unwrap_or_else(|e| panic!("{e}"))
}

/// Every entry under `root` (itself included) that group or others may read, write or
/// search, with its mode.
fn not_owner_only(root: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut todo: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue; // removed while we walked
        };
        if meta.file_type().is_symlink() {
            bad.push(format!("{} (a symlink)", p.display()));
            continue;
        }
        if meta.mode() & 0o077 != 0 {
            bad.push(format!("{} {:o}", p.display(), meta.mode() & 0o7777));
        }
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                todo.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    bad
}

/// Number of regular files under `root`.
fn files_under(root: &Path) -> usize {
    let mut n = 0;
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn state_is_owner_only_under_umask_000() {
    let store = tempfile::tempdir().unwrap();
    let data = bytes(1, 3 << 20);
    std::fs::write(store.path().join("a.bin"), &data).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // An older version left the state dir 0755: it is tightened at start-up.
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Write-back with a long delay and a small write memory: the written file stays in the
    // write-ahead log and spills.
    let silt = up_umask_000(
        store.path(),
        &[
            "--write-type",
            "back",
            "--upload-delay",
            "1h",
            "--write-memory",
            "1MiB",
            "--write-file-memory",
            "1MiB",
        ],
        dir.path(),
    );
    assert!(std::fs::read(silt.path("data/a.bin")).unwrap() == data);
    let written = bytes(2, 5 << 20);
    {
        let mut f = std::fs::File::create(silt.path("data/w.bin")).unwrap();
        for c in written.chunks(256 << 10) {
            f.write_all(c).unwrap();
        }
        f.sync_all().unwrap();
    }
    assert!(std::fs::read(silt.path("data/w.bin")).unwrap() == written);
    // Populated: the disk tier holds the read file, the log the written one.
    assert!(files_under(&state.join("cache")) >= 1, "disk tier empty");
    assert!(
        files_under(&state.join("wal")) >= 1,
        "write-ahead log empty"
    );
    let bad = not_owner_only(&state);
    assert!(
        bad.is_empty(),
        "not owner-only while running:\n{}",
        bad.join("\n")
    );
    silt.stop();
    // What a clean shutdown writes (metadata snapshot, clean markers) is private too.
    let bad = not_owner_only(&state);
    assert!(
        bad.is_empty(),
        "not owner-only after stop:\n{}",
        bad.join("\n")
    );
}
