//! Differential test of the write path through real FUSE mounts: one seeded random sequence
//! of system calls (open with every flag mix, write, pwrite past the end, read, pread,
//! ftruncate, truncate, fsync, close over several open descriptors at once; rename of files
//! and of directories, also non-empty and onto existing names; unlink, mkdir, rmdir) is
//! applied to a Silt mount and to a plain local directory, and every answer is compared:
//! return values, errnos, bytes read. After every step the whole tree (names, kinds, sizes,
//! contents read afresh) must be the same on both sides; whenever no descriptor is open, the
//! store itself (the local directory behind `file://`, or the bucket read straight from the
//! S3 server) must hold exactly that tree too; at the end a fresh Silt over the same store
//! must show it again.
//!
//! The local directory is the reference: the comparison follows what POSIX requires of one
//! process. The only answers treated as equal are those POSIX itself leaves open (`EEXIST` or
//! `ENOTEMPTY` for a non-empty directory as a rename target or rmdir), and one deviation
//! docs/SEMANTICS.md states: a read through a descriptor whose file was unlinked or renamed
//! over since its open may fail with `ESTALE` (never answer other bytes). Times, modes and
//! directory sizes are not compared (see docs/SEMANTICS.md).
//!
//! `SILT_DIFF_SEED` replays one seed, `SILT_DIFF_OPS` sets the number of operations.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_common::ErrorKind;
use silt_ufs::EntryKind;

/// Names the operations draw from: a file name may also become a directory and the other way
/// round, and paths below a missing or non-directory parent are drawn too. Some end in white
/// space, which is part of a name (`a ` is not `a`).
const FILES: &[&str] = &[
    "a", "b", "a ", "d/a", "d/b", "d/b\n", "d/x/a", "d/x/b", "e/a", "e/z/a",
];
const DIRS: &[&str] = &["d", "d/x", "d/y", "d/y\t", "e", "e/z", "a/q"];

const OPEN_FLAGS: &[(i32, &str)] = &[
    (libc::O_RDONLY, "RDONLY"),
    (libc::O_WRONLY | libc::O_CREAT, "WRONLY|CREAT"),
    (libc::O_RDWR | libc::O_CREAT, "RDWR|CREAT"),
    (libc::O_RDWR, "RDWR"),
    (
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        "WRONLY|CREAT|TRUNC",
    ),
    (
        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        "WRONLY|CREAT|APPEND",
    ),
    (libc::O_RDWR | libc::O_APPEND, "RDWR|APPEND"),
    (
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        "WRONLY|CREAT|EXCL",
    ),
];

/// Largest offset a write or truncate reaches: a few MiB, so holes span several pages and
/// chunks but the test stays quick.
const MAX_OFFSET: u64 = 5 << 20;

#[derive(Debug, Clone)]
enum Op {
    Open {
        path: &'static str,
        flags: usize,
    },
    Write {
        fd: usize,
        len: usize,
        seed: u64,
    },
    Pwrite {
        fd: usize,
        off: u64,
        len: usize,
        seed: u64,
    },
    Read {
        fd: usize,
        len: usize,
    },
    Pread {
        fd: usize,
        off: u64,
        len: usize,
    },
    Ftruncate {
        fd: usize,
        len: u64,
    },
    Truncate {
        path: &'static str,
        len: u64,
    },
    Fsync {
        fd: usize,
    },
    Close {
        fd: usize,
    },
    Rename {
        from: &'static str,
        to: &'static str,
    },
    Unlink {
        path: &'static str,
    },
    Mkdir {
        path: &'static str,
    },
    Rmdir {
        path: &'static str,
    },
}

/// One side's answer to an operation.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Done(i64),
    Data(Vec<u8>),
    Errno(i32),
}

/// The paths an operation names.
fn op_paths(op: &Op) -> Vec<&'static str> {
    match op {
        Op::Open { path, .. }
        | Op::Truncate { path, .. }
        | Op::Unlink { path }
        | Op::Mkdir { path }
        | Op::Rmdir { path } => vec![path],
        Op::Rename { from, to } => vec![from, to],
        _ => Vec::new(),
    }
}

fn any_path(rng: &mut StdRng) -> &'static str {
    if rng.gen_bool(0.6) {
        FILES[rng.gen_range(0..FILES.len())]
    } else {
        DIRS[rng.gen_range(0..DIRS.len())]
    }
}

fn offset(rng: &mut StdRng) -> u64 {
    match rng.gen_range(0..4) {
        0 => 0,
        1 => rng.gen_range(0..8192),
        2 => rng.gen_range(0..(1 << 20)),
        _ => rng.gen_range(0..MAX_OFFSET),
    }
}

fn length(rng: &mut StdRng) -> usize {
    if rng.gen_bool(0.1) {
        rng.gen_range(1..(300 << 10))
    } else {
        rng.gen_range(1..9000)
    }
}

/// A random operation; `open` is the number of descriptors open now.
fn random_op(rng: &mut StdRng, open: usize) -> Op {
    let fd = |rng: &mut StdRng| rng.gen_range(0..open.max(1));
    loop {
        let kind = rng.gen_range(0..100);
        let needs_fd = (20..75).contains(&kind);
        if needs_fd && open == 0 {
            continue;
        }
        // Many descriptors make every sequence long; close more often when there are.
        if open >= 6 && kind < 20 {
            continue;
        }
        return match kind {
            0..=19 => Op::Open {
                path: if rng.gen_bool(0.9) {
                    FILES[rng.gen_range(0..FILES.len())]
                } else {
                    any_path(rng)
                },
                flags: rng.gen_range(0..OPEN_FLAGS.len()),
            },
            20..=32 => Op::Write {
                fd: fd(rng),
                len: length(rng),
                seed: rng.r#gen(),
            },
            33..=42 => Op::Pwrite {
                fd: fd(rng),
                off: offset(rng),
                len: length(rng),
                seed: rng.r#gen(),
            },
            43..=47 => Op::Read {
                fd: fd(rng),
                len: length(rng),
            },
            48..=54 => Op::Pread {
                fd: fd(rng),
                off: offset(rng),
                len: length(rng),
            },
            55..=59 => Op::Ftruncate {
                fd: fd(rng),
                len: offset(rng),
            },
            60..=62 => Op::Fsync { fd: fd(rng) },
            63..=74 => Op::Close { fd: fd(rng) },
            75..=77 => Op::Truncate {
                path: FILES[rng.gen_range(0..FILES.len())],
                len: offset(rng),
            },
            78..=85 => Op::Rename {
                from: any_path(rng),
                to: any_path(rng),
            },
            86..=89 => Op::Unlink {
                path: any_path(rng),
            },
            90..=95 => Op::Mkdir {
                path: if rng.gen_bool(0.85) {
                    DIRS[rng.gen_range(0..DIRS.len())]
                } else {
                    any_path(rng)
                },
            },
            _ => Op::Rmdir {
                path: any_path(rng),
            },
        };
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn answer(rc: i64) -> Answer {
    if rc < 0 {
        Answer::Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Answer::Done(rc)
    }
}

/// Applies `op` to the tree at `root` with this side's descriptors `fds` (index → fd; a
/// successful open appends, a close removes).
fn apply(op: &Op, root: &Path, fds: &mut Vec<i32>) -> Answer {
    let p = |rel: &str| cstr(&root.join(rel));
    // SAFETY (every call below): valid C strings and buffers of the lengths passed; the
    // descriptors are this side's own, open until the `Close` that removes them.
    unsafe {
        match *op {
            Op::Open { path, flags } => {
                let fd = libc::open(
                    p(path).as_ptr(),
                    OPEN_FLAGS[flags].0 | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return answer(-1);
                }
                fds.push(fd);
                Answer::Done(0)
            }
            Op::Write { fd, len, seed } => {
                let data = bytes(seed, len);
                answer(libc::write(fds[fd], data.as_ptr().cast(), len) as i64)
            }
            Op::Pwrite { fd, off, len, seed } => {
                let data = bytes(seed, len);
                answer(libc::pwrite(fds[fd], data.as_ptr().cast(), len, off as i64) as i64)
            }
            Op::Read { fd, len } => {
                let mut buf = vec![0u8; len];
                let n = libc::read(fds[fd], buf.as_mut_ptr().cast(), len);
                read_answer(n, buf)
            }
            Op::Pread { fd, off, len } => {
                let mut buf = vec![0u8; len];
                let n = libc::pread(fds[fd], buf.as_mut_ptr().cast(), len, off as i64);
                read_answer(n, buf)
            }
            Op::Ftruncate { fd, len } => answer(libc::ftruncate(fds[fd], len as i64) as i64),
            Op::Truncate { path, len } => {
                answer(libc::truncate(p(path).as_ptr(), len as i64) as i64)
            }
            Op::Fsync { fd } => answer(libc::fsync(fds[fd]) as i64),
            Op::Close { fd } => answer(libc::close(fds.remove(fd)) as i64),
            Op::Rename { from, to } => {
                answer(libc::rename(p(from).as_ptr(), p(to).as_ptr()) as i64)
            }
            Op::Unlink { path } => answer(libc::unlink(p(path).as_ptr()) as i64),
            Op::Mkdir { path } => answer(libc::mkdir(p(path).as_ptr(), 0o755) as i64),
            Op::Rmdir { path } => answer(libc::rmdir(p(path).as_ptr()) as i64),
        }
    }
}

fn read_answer(n: isize, mut buf: Vec<u8>) -> Answer {
    if n < 0 {
        return answer(-1);
    }
    buf.truncate(n as usize);
    Answer::Data(buf)
}

/// Answers POSIX leaves open between two values, made one.
fn normalised(op: &Op, a: Answer) -> Answer {
    if !matches!(op, Op::Rename { .. } | Op::Rmdir { .. }) {
        return a;
    }
    match a {
        Answer::Errno(libc::EEXIST) | Answer::Errno(libc::ENOTEMPTY) => {
            Answer::Errno(libc::ENOTEMPTY)
        }
        other => other,
    }
}

/// A tree: relative path → `None` for a directory, the bytes for a file.
type Tree = BTreeMap<String, Option<Vec<u8>>>;

fn local_tree(root: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, out: &mut Tree) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let meta =
                std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("stat {rel}: {e}"));
            if meta.is_dir() {
                out.insert(rel, None);
                walk(root, &path, out);
            } else {
                let data = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {rel}: {e}"));
                assert_eq!(
                    data.len() as u64,
                    meta.len(),
                    "{rel}: stat size and bytes read differ"
                );
                out.insert(rel, Some(data));
            }
        }
    }
    let mut out = Tree::new();
    walk(root, root, &mut out);
    out
}

/// What differs between two trees, for a failure message (sizes instead of bytes).
fn tree_diff(want: &Tree, got: &Tree) -> String {
    let show = |v: Option<&Option<Vec<u8>>>| match v {
        None => "absent".to_string(),
        Some(None) => "directory".to_string(),
        Some(Some(b)) => format!("file of {} bytes", b.len()),
    };
    let mut out = String::new();
    for k in want
        .keys()
        .chain(got.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (w, g) = (want.get(k), got.get(k));
        if w != g {
            let same_size = matches!((w, g), (Some(Some(a)), Some(Some(b))) if a.len() == b.len());
            let note = if same_size {
                let at = w
                    .unwrap()
                    .as_ref()
                    .unwrap()
                    .iter()
                    .zip(g.unwrap().as_ref().unwrap())
                    .position(|(a, b)| a != b);
                format!(" (bytes differ from offset {at:?})")
            } else {
                String::new()
            };
            out += &format!("  {k}: local {}, silt {}{note}\n", show(w), show(g));
        }
    }
    out
}

/// The store behind a mount, read without Silt.
enum Store<'a> {
    Dir(PathBuf),
    S3(&'a S3Fx),
}

impl Store<'_> {
    fn tree(&self) -> Tree {
        match self {
            Store::Dir(d) => local_tree(d),
            Store::S3(fx) => fx.rt.block_on(async {
                let list = match fx.store.list("", true).await {
                    Ok(l) => l,
                    Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
                    Err(e) => panic!("listing the bucket: {e}"),
                };
                let mut t = Tree::new();
                for m in list {
                    let path = m.path.trim_matches('/').to_string();
                    // Every parent of a key (object or marker) is a directory, marker or not.
                    let mut parent = Path::new(&path).parent();
                    while let Some(d) = parent.filter(|d| !d.as_os_str().is_empty()) {
                        t.insert(d.to_string_lossy().into_owned(), None);
                        parent = d.parent();
                    }
                    if m.kind == EntryKind::Dir {
                        t.insert(path, None);
                        continue;
                    }
                    let data = fx
                        .store
                        .read(&m.path, 0..m.size, &m)
                        .await
                        .unwrap_or_else(|e| panic!("reading {path}: {e}"));
                    t.insert(path, Some(data.to_vec()));
                }
                t
            }),
        }
    }
}

/// Runs `ops` random operations with `seed` on the mount at `mnt` (backed by `store`) and on a
/// fresh local directory; returns the local directory with the final tree. Whenever no
/// descriptor is open, `quiet(step)` runs before the store is compared (to wait for `back`
/// uploads, or to restart the daemon). `keeps`: the store holds what the mount shows; if
/// not (`cache-only`), the store must hold nothing.
fn differential(
    seed: u64,
    ops: usize,
    mnt: &Path,
    store: &Store,
    keeps: bool,
    quiet: &mut dyn FnMut(usize),
) -> tempfile::TempDir {
    let local = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut mfds, mut lfds) = (Vec::new(), Vec::new());
    // The path each descriptor was opened with (by index, as `lfds`), for failure messages.
    let mut fd_paths: Vec<&str> = Vec::new();
    let mut history: Vec<String> = Vec::new();
    let fail = |history: &[String], what: String| -> ! {
        let tail = history.len().saturating_sub(60);
        panic!(
            "differential test, seed {seed} (SILT_DIFF_SEED={seed} replays it), step {}: {what}\nlast operations:\n{}",
            history.len(),
            history[tail..].join("\n")
        )
    };
    for step in 0..ops {
        let mut op = random_op(&mut rng, lfds.len());
        // S3 stores cannot hold names that begin or end with white space (docs/SEMANTICS.md).
        while matches!(store, Store::S3(_)) && op_paths(&op).iter().any(|p| p.trim() != *p) {
            op = random_op(&mut rng, lfds.len());
        }
        let want = normalised(&op, apply(&op, local.path(), &mut lfds));
        if step % 2 == 0 {
            drop_kernel_pages(&op, &mfds);
        }
        let got = normalised(&op, apply(&op, mnt, &mut mfds));
        history.push(format!("{step}: {op:?} -> {}", short(&want)));
        if replaced_read_estale(&op, &want, &got, &lfds, &mfds) {
            history.push(format!(
                "{step}: silt answered ESTALE: the file was replaced since its open"
            ));
            continue;
        }
        if want != got {
            let on = match &op {
                Op::Read { fd, .. } | Op::Pread { fd, .. } => {
                    format!(" (descriptor {fd}: {})", fd_paths[*fd])
                }
                _ => String::new(),
            };
            fail(
                &history,
                format!(
                    "local answered {}, silt answered {}{on}{}",
                    short(&want),
                    short(&got),
                    data_diff(&want, &got)
                ),
            );
        }
        match (&op, &want) {
            (Op::Open { path, .. }, Answer::Done(_)) => fd_paths.push(path),
            (Op::Close { fd }, _) => {
                fd_paths.remove(*fd);
            }
            _ => {}
        }
        let lt = local_tree(local.path());
        // A walk of the mount that fails (a read disagreeing with its stat, say) fails with
        // the operations that led there.
        let mt = match std::panic::catch_unwind(|| local_tree(mnt)) {
            Ok(t) => t,
            Err(e) => {
                let what = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                fail(
                    &history,
                    format!("walking the mount after the operation: {what}"),
                )
            }
        };
        if lt != mt {
            fail(
                &history,
                format!("trees differ after the operation:\n{}", tree_diff(&lt, &mt)),
            );
        }
        if lfds.is_empty() {
            quiet(step);
            let st = store.tree();
            let lt = if keeps { lt } else { Tree::new() };
            if st != lt {
                fail(
                    &history,
                    format!(
                        "the store differs from the tree (no descriptor open):\n{}",
                        tree_diff(&lt, &st)
                    ),
                );
            }
        }
    }
    // Close whatever is still open; every close must succeed on both sides.
    while !lfds.is_empty() {
        let op = Op::Close { fd: 0 };
        let want = apply(&op, local.path(), &mut lfds);
        let got = apply(&op, mnt, &mut mfds);
        history.push(format!("end: {op:?} -> {}", short(&want)));
        if want != got {
            fail(
                &history,
                format!(
                    "local answered {}, silt answered {}",
                    short(&want),
                    short(&got)
                ),
            );
        }
    }
    quiet(ops);
    let (lt, mt, st) = (local_tree(local.path()), local_tree(mnt), store.tree());
    if lt != mt {
        fail(
            &history,
            format!("trees differ at the end:\n{}", tree_diff(&lt, &mt)),
        );
    }
    let want_st = if keeps { lt.clone() } else { Tree::new() };
    if want_st != st {
        fail(
            &history,
            format!(
                "the store differs at the end:\n{}",
                tree_diff(&want_st, &st)
            ),
        );
    }
    println!("differential test, seed {seed}: {ops} operations, every answer and tree equal");
    local
}

/// Before every other read, the kernel's cached pages of the mount-side file are dropped, so
/// the daemon answers it: otherwise the page cache filled by the tree comparisons answers most
/// reads, and a daemon that reads the wrong file goes unseen (a read through a descriptor of a
/// file renamed over did, until the kernel happened to drop those pages).
fn drop_kernel_pages(op: &Op, mfds: &[i32]) {
    if let Op::Read { fd, .. } | Op::Pread { fd, .. } = *op {
        if let Some(&fd) = mfds.get(fd) {
            // SAFETY: advice on this side's open descriptor; nothing is read or written.
            unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// The one deviation docs/SEMANTICS.md ("Reads and versions") allows a read: `ESTALE` from a
/// descriptor whose file was unlinked or renamed over since it was opened (the local side's
/// file has no name left), where Silt no longer has that version's bytes. A `read` moved the
/// local offset: Silt's is moved alike, so later reads compare the same bytes.
fn replaced_read_estale(op: &Op, want: &Answer, got: &Answer, lfds: &[i32], mfds: &[i32]) -> bool {
    let (Op::Read { fd, .. } | Op::Pread { fd, .. }) = *op else {
        return false;
    };
    let (Answer::Data(read), Answer::Errno(libc::ESTALE)) = (want, got) else {
        return false;
    };
    // SAFETY: a zeroed stat filled by fstat of this side's open descriptor.
    let nlink = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(lfds[fd], &mut st) != 0 {
            return false;
        }
        st.st_nlink
    };
    if nlink != 0 {
        return false;
    }
    if matches!(op, Op::Read { .. }) {
        // SAFETY: lseek on this side's open descriptor.
        unsafe { libc::lseek(mfds[fd], read.len() as i64, libc::SEEK_CUR) };
    }
    true
}

/// Where two read answers of the same length first differ, and how.
fn data_diff(want: &Answer, got: &Answer) -> String {
    let (Answer::Data(w), Answer::Data(g)) = (want, got) else {
        return String::new();
    };
    let Some(first) = w.iter().zip(g.iter()).position(|(a, b)| a != b) else {
        return String::new();
    };
    let differing: Vec<usize> = (0..w.len().min(g.len()))
        .filter(|&i| w[i] != g[i])
        .collect();
    let last = differing.last().copied().unwrap_or(first);
    let zeros = differing.iter().all(|&i| g[i] == 0);
    let show = |d: &[u8]| format!("{:02x?}", &d[first..(first + 8).min(d.len())]);
    format!(
        "; {} bytes differ, from byte {first} to {last} of the answer; local {} silt {}{}",
        differing.len(),
        show(w),
        show(g),
        if zeros { " (silt's are all zero)" } else { "" }
    )
}

fn short(a: &Answer) -> String {
    match a {
        Answer::Done(v) => format!("{v}"),
        Answer::Data(d) => format!("{} bytes", d.len()),
        Answer::Errno(e) => format!("errno {e} ({})", std::io::Error::from_raw_os_error(*e)),
    }
}

/// The seeds to run (`SILT_DIFF_SEED` for one) and the operations per seed
/// (`SILT_DIFF_OPS`).
fn seeds_and_ops() -> (Vec<u64>, usize) {
    let seeds = match std::env::var("SILT_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![1, 2, 3],
    };
    let ops = std::env::var("SILT_DIFF_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    (seeds, ops)
}

/// Runs every seed on a fresh Silt with `write_type` over a local directory (`s3: false`) or
/// the S3 server; for `back`, waits for the uploads before each comparison with the store.
fn run(s3: bool, write_type: &str) {
    let (seeds, ops) = seeds_and_ops();
    for seed in seeds {
        let backing = tempfile::tempdir().unwrap();
        let uri = format!("file://{}", backing.path().display());
        let fx = s3.then(|| S3Fx::start(false));
        let up = |extra: &[&str], dir: &Path| match &fx {
            Some(fx) => fx.up(extra, dir),
            None => Silt::up_data(&uri, Vec::new(), extra, dir),
        };
        let store = match &fx {
            Some(fx) => Store::S3(fx),
            None => Store::Dir(backing.path().into()),
        };
        let dir = tempfile::tempdir().unwrap();
        let silt = up(&["--write-type", write_type], dir.path());
        let mut quiet = |_step: usize| {
            if write_type == "back" {
                let o = silt.cli(&["fs", "persist", "/data"]);
                assert!(o.status.success(), "persist: {}", stderr(&o));
            }
        };
        let keeps = write_type != "cache-only";
        let local = differential(seed, ops, &silt.path("data"), &store, keeps, &mut quiet);
        silt.stop();
        // A fresh Silt over the same store shows the same tree (none of a cache-only one).
        let dir2 = tempfile::tempdir().unwrap();
        let again = up(&[], dir2.path());
        let lt = if keeps {
            local_tree(local.path())
        } else {
            Tree::new()
        };
        let mt = local_tree(&again.path("data"));
        assert!(
            lt == mt,
            "seed {seed}: a fresh mount differs:\n{}",
            tree_diff(&lt, &mt)
        );
        again.stop();
    }
}

#[test]
fn differential_local_directory_through() {
    run(false, "through");
}

#[test]
fn differential_local_directory_back() {
    run(false, "back");
}

#[test]
fn differential_s3_through() {
    run(true, "through");
}

#[test]
fn differential_s3_back() {
    run(true, "back");
}

#[test]
fn differential_local_directory_store_only() {
    run(false, "store-only");
}

#[test]
fn differential_local_directory_cache_only() {
    run(false, "cache-only");
}

#[test]
fn differential_s3_store_only() {
    run(true, "store-only");
}

#[test]
fn differential_s3_cache_only() {
    run(true, "cache-only");
}
