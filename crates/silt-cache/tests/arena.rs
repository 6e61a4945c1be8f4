//! The write arena: memory-first buffers, spilling, priorities, quotas, `ENOSPC`, and many
//! concurrent buffers under one small ceiling.

use std::path::Path;

use silt_cache::{Arena, ArenaConfig, ArenaStats, JobStats, WriteBuffer};
use silt_common::config::DiskTierSpec;
use silt_common::io::ReadAt;
use silt_common::write::JobSpec;
use silt_common::ErrorKind;

const CS: u64 = 4096;

fn tier(dir: &Path, chunks: u64) -> DiskTierSpec {
    DiskTierSpec {
        dir: dir.to_path_buf(),
        quota: chunks * CS,
    }
}

fn job(prefix: &str, quota_chunks: u64, priority: u8) -> JobSpec {
    JobSpec {
        prefix: prefix.to_string(),
        memory_quota: quota_chunks * CS,
        priority,
    }
}

fn arena(
    ceiling_chunks: u64,
    file_chunks: u64,
    spill: Vec<DiskTierSpec>,
    jobs: Vec<JobSpec>,
) -> Arena {
    Arena::open(ArenaConfig {
        chunk_size: CS,
        memory_ceiling: ceiling_chunks * CS,
        file_memory: file_chunks * CS,
        spill,
        jobs,
    })
    .unwrap()
}

/// Deterministic bytes (xorshift64*), different per seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

fn job_stats<'a>(s: &'a ArenaStats, prefix: &str) -> &'a JobStats {
    s.jobs.iter().find(|j| j.prefix == prefix).unwrap()
}

fn read_all(b: &WriteBuffer) -> Vec<u8> {
    b.read_at(0, b.len() as usize).unwrap().to_vec()
}

#[test]
fn arena_and_buffers_are_send_and_sync() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Arena>();
    check::<WriteBuffer>();
}

#[test]
fn open_rejects_bad_configuration() {
    let bad_chunk = Arena::open(ArenaConfig {
        chunk_size: 0,
        memory_ceiling: CS,
        file_memory: CS,
        spill: vec![],
        jobs: vec![],
    });
    assert_eq!(bad_chunk.unwrap_err().kind(), ErrorKind::InvalidInput);
    let bad_priority = Arena::open(ArenaConfig {
        chunk_size: CS,
        memory_ceiling: CS,
        file_memory: CS,
        spill: vec![],
        jobs: vec![job("/a", 1, 0)],
    });
    assert_eq!(bad_priority.unwrap_err().kind(), ErrorKind::InvalidInput);
    // Spill directories are created.
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    arena(1, 1, vec![tier(&nested, 1)], vec![]);
    assert!(nested.is_dir());
}

#[test]
fn small_writes_stay_in_memory_gaps_read_zeros_and_set_len_works() {
    let a = arena(16, 16, vec![], vec![]);
    let b = a.buffer("/f");
    assert!(b.is_empty());
    b.write_at(0, b"hello").unwrap();
    assert_eq!(&b.read_at(0, 5).unwrap()[..], b"hello");
    assert_eq!(&ReadAt::read_at(&b, 1, 3).unwrap()[..], b"ell");
    assert_eq!((b.memory_bytes(), b.spilled_bytes()), (CS, 0));

    // A gap: only the chunks written hold memory, the rest reads as zeros.
    let far = 3 * CS + 10;
    b.write_at(far, b"xyz").unwrap();
    assert_eq!(b.len(), far + 3);
    assert_eq!(b.memory_bytes(), 2 * CS);
    let all = read_all(&b);
    assert_eq!(&all[..5], b"hello");
    assert!(all[5..far as usize].iter().all(|&x| x == 0));
    assert_eq!(&all[far as usize..], b"xyz");
    // Overwrite across a chunk boundary.
    b.write_at(CS - 2, b"abcd").unwrap();
    assert_eq!(&b.read_at(CS - 2, 4).unwrap()[..], b"abcd");
    // Chunks 0, 1 and 3.
    assert_eq!(b.memory_bytes(), 3 * CS);
    assert_eq!(a.stats().memory_used, 3 * CS);

    // Reads past the end fail.
    assert_eq!(
        b.read_at(far, 4).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(b.read_at(far + 3, 0).unwrap().len(), 0);

    // Shrink: chunks past the end go, the cut tail reads zeros after growing again.
    b.set_len(3).unwrap();
    assert_eq!(b.len(), 3);
    assert_eq!(&read_all(&b)[..], b"hel");
    assert_eq!(b.memory_bytes(), CS);
    assert_eq!(a.stats().memory_used, CS);
    b.set_len(2 * CS).unwrap();
    let grown = read_all(&b);
    assert_eq!(&grown[..3], b"hel");
    assert!(grown[3..].iter().all(|&x| x == 0));
    assert_eq!(b.memory_bytes(), CS);
    b.write_at(CS + 1, b"!").unwrap();
    assert_eq!(b.read_at(CS, 3).unwrap()[..], [0, b'!', 0]);
    b.set_len(0).unwrap();
    assert!(b.is_empty());
    assert_eq!(a.stats().memory_used, 0);
    // An empty write changes nothing.
    b.write_at(100, b"").unwrap();
    assert!(b.is_empty());
}

#[test]
fn spilled_bytes_read_back_and_memory_stays_under_the_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let a = arena(4, 100, vec![tier(dir.path(), 100)], vec![]);
    let bufs: Vec<WriteBuffer> = (0..3).map(|i| a.buffer(&format!("/f{i}"))).collect();
    let sizes = [7 * CS as usize, 7 * CS as usize, 6 * CS as usize];
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(i as u64 + 1, sizes[i])).collect();
    // Interleaved writes of odd sizes, crossing chunk boundaries.
    let mut pos = [0usize; 3];
    while (0..3).any(|i| pos[i] < sizes[i]) {
        for i in 0..3 {
            let n = (1500 + 777 * i).min(sizes[i] - pos[i]);
            if n > 0 {
                bufs[i]
                    .write_at(pos[i] as u64, &data[i][pos[i]..pos[i] + n])
                    .unwrap();
                pos[i] += n;
            }
            let s = a.stats();
            assert!(s.memory_used <= s.memory_ceiling);
        }
    }
    let s = a.stats();
    assert!(s.memory_peak <= 4 * CS, "{s:?}");
    assert!(s.spilled > 0);
    assert_eq!(s.memory_used + s.spilled, 20 * CS);
    for i in 0..3 {
        assert_eq!(read_all(&bufs[i]), data[i], "buffer {i}");
        // Sub-ranges across memory and disk chunks.
        for off in (0..sizes[i] - 5000).step_by(3001) {
            assert_eq!(
                &bufs[i].read_at(off as u64, 5000).unwrap()[..],
                &data[i][off..off + 5000]
            );
        }
    }
    // Overwrites land in place, wherever the chunk lives.
    let patch = pattern(99, 3 * CS as usize);
    bufs[0].write_at(CS / 2, &patch).unwrap();
    let mut expect = data[0].clone();
    expect[CS as usize / 2..CS as usize / 2 + patch.len()].copy_from_slice(&patch);
    assert_eq!(read_all(&bufs[0]), expect);
    // Shrinking a spilled chunk zeroes its tail too.
    let b = &bufs[2];
    assert!(b.spilled_bytes() > 0);
    b.set_len(CS + 100).unwrap();
    b.set_len(3 * CS).unwrap();
    let back = read_all(b);
    assert_eq!(&back[..CS as usize + 100], &data[2][..CS as usize + 100]);
    assert!(back[CS as usize + 100..].iter().all(|&x| x == 0));
}

#[test]
fn lower_priority_jobs_spill_first() {
    let dir = tempfile::tempdir().unwrap();
    let a = arena(
        8,
        16,
        vec![tier(dir.path(), 100)],
        vec![job("/lo", 100, 1), job("/hi", 100, 9)],
    );
    let lo = a.buffer("/lo/part-0");
    let lo_data = pattern(1, 8 * CS as usize);
    lo.write_at(0, &lo_data).unwrap();
    let s = a.stats();
    assert_eq!(job_stats(&s, "/lo").memory_used, 8 * CS);
    assert_eq!(s.memory_used, 8 * CS);

    let hi = a.buffer("/hi/part-0");
    let hi_data = pattern(2, 4 * CS as usize);
    hi.write_at(0, &hi_data).unwrap();
    let s = a.stats();
    let (l, h) = (job_stats(&s, "/lo"), job_stats(&s, "/hi"));
    assert_eq!((h.memory_used, h.spilled), (4 * CS, 0), "{s:?}");
    assert_eq!((l.memory_used, l.spilled), (4 * CS, 4 * CS), "{s:?}");
    assert_eq!((l.priority, h.priority), (1, 9));
    assert!(s.memory_peak <= s.memory_ceiling);

    // The low job finds no one below it: its new chunks go to disk, /hi keeps its memory.
    lo.write_at(8 * CS, &lo_data[..2 * CS as usize]).unwrap();
    let s = a.stats();
    assert_eq!(job_stats(&s, "/hi").memory_used, 4 * CS);
    assert_eq!(job_stats(&s, "/lo").spilled, 6 * CS);

    // A default-priority (5) buffer takes memory from /lo, not from /hi.
    let mid = a.buffer("/other/x");
    mid.write_at(0, &hi_data[..2 * CS as usize]).unwrap();
    let s = a.stats();
    assert_eq!(mid.memory_bytes(), 2 * CS);
    assert_eq!(job_stats(&s, "/hi").memory_used, 4 * CS);
    assert_eq!(job_stats(&s, "/lo").memory_used, 2 * CS);
    assert_eq!(job_stats(&s, "").memory_used, 2 * CS);

    assert_eq!(&read_all(&lo)[..8 * CS as usize], &lo_data[..]);
    assert_eq!(
        &read_all(&lo)[8 * CS as usize..],
        &lo_data[..2 * CS as usize]
    );
    assert_eq!(read_all(&hi), hi_data);
}

#[test]
fn job_quota_and_per_file_limit_are_respected() {
    let dir = tempfile::tempdir().unwrap();
    let a = arena(
        100,
        2,
        vec![tier(dir.path(), 1000)],
        vec![
            job("/q", 3, 1),
            job("/r", 1000, 3),
            job("/r/deeper", 1000, 9),
        ],
    );
    let qa = a.buffer("/q/a");
    let qb = a.buffer("/q/b");
    let qa_data = pattern(3, 5 * CS as usize);
    let qb_data = pattern(4, 5 * CS as usize);
    for c in 0..5 {
        let r = c * CS as usize..(c + 1) * CS as usize;
        qa.write_at(r.start as u64, &qa_data[r.clone()]).unwrap();
        qb.write_at(r.start as u64, &qb_data[r]).unwrap();
        let s = a.stats();
        // Priority 1: the per-file limit is file_memory itself.
        assert!(qa.memory_bytes() <= 2 * CS && qb.memory_bytes() <= 2 * CS);
        assert!(job_stats(&s, "/q").memory_used <= 3 * CS, "{s:?}");
    }
    assert_eq!(qa.memory_bytes(), 2 * CS);
    assert_eq!(qb.memory_bytes(), CS);
    assert_eq!(job_stats(&a.stats(), "/q").spilled, 7 * CS);
    assert_eq!(read_all(&qa), qa_data);
    assert_eq!(read_all(&qb), qb_data);

    // Priority 3: file_memory + 2 * file_memory / 2 = 4 chunks.
    let r = a.buffer("/r/file");
    let r_data = pattern(5, 10 * CS as usize);
    r.write_at(0, &r_data).unwrap();
    assert_eq!((r.memory_bytes(), r.spilled_bytes()), (4 * CS, 6 * CS));
    assert_eq!(read_all(&r), r_data);
    // The longest prefix wins: priority 9 gives 2 + 8 * 1 = 10 chunks.
    let deep = a.buffer("/r/deeper/file");
    deep.write_at(0, &pattern(6, 12 * CS as usize)).unwrap();
    assert_eq!(deep.memory_bytes(), 10 * CS);
    // A path that only shares a string prefix is not under the job.
    let not_r = a.buffer("/rr/file");
    not_r.write_at(0, b"x").unwrap();
    assert_eq!(job_stats(&a.stats(), "").memory_used, CS);
}

#[test]
fn lowering_the_ceiling_spills_before_returning() {
    let dir = tempfile::tempdir().unwrap();
    let a = arena(
        32,
        16,
        vec![tier(dir.path(), 100)],
        vec![job("/lo", 100, 2)],
    );
    let bufs = [a.buffer("/lo/x"), a.buffer("/a"), a.buffer("/b")];
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(10 + i, 8 * CS as usize)).collect();
    for (b, d) in bufs.iter().zip(&data) {
        b.write_at(0, d).unwrap();
    }
    assert_eq!(a.stats().memory_used, 24 * CS);
    assert_eq!(a.stats().spilled, 0);

    a.set_memory_ceiling(4 * CS);
    let s = a.stats();
    assert!(s.memory_used <= 4 * CS, "{s:?}");
    // The peak is the highest usage seen, not the new ceiling (`silt memory` showed that).
    assert_eq!(s.memory_peak, 24 * CS, "{s:?}");
    assert_eq!(s.memory_ceiling, 4 * CS);
    // Lowest priority first, then the oldest buffer.
    assert_eq!(job_stats(&s, "/lo").memory_used, 0);
    assert_eq!(bufs[1].memory_bytes(), 0);
    assert_eq!(bufs[2].memory_bytes(), 4 * CS);
    for (b, d) in bufs.iter().zip(&data) {
        assert_eq!(&read_all(b), d);
    }
    // New writes respect the new ceiling.
    let c = a.buffer("/c");
    c.write_at(0, &data[0]).unwrap();
    assert!(a.stats().memory_used <= 4 * CS);
    assert_eq!(c.memory_bytes(), 0);

    // Raising it lets memory be used again.
    a.set_memory_ceiling(64 * CS);
    let d = a.buffer("/d");
    d.write_at(0, &data[1]).unwrap();
    assert_eq!(d.memory_bytes(), 8 * CS);
    assert_eq!(read_all(&c), data[0]);
    assert_eq!(read_all(&d), data[1]);
}

#[test]
fn no_space_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let a = arena(2, 100, vec![tier(dir.path(), 2)], vec![]);
    let b = a.buffer("/full");
    let data = pattern(7, 5 * CS as usize);
    for c in 0..4 {
        let r = c * CS as usize..(c + 1) * CS as usize;
        b.write_at(r.start as u64, &data[r]).unwrap();
    }
    let err = b.write_at(4 * CS, &data[4 * CS as usize..]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace);
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.to_string().contains("spill tier"), "{err}");
    assert!(err.to_string().contains("memory ceiling"), "{err}");
    assert_eq!(b.len(), 4 * CS);
    assert_eq!(read_all(&b), &data[..4 * CS as usize]);
    // Overwriting bytes already placed needs no room.
    b.write_at(10, b"still fine").unwrap();
    assert_eq!(&b.read_at(10, 10).unwrap()[..], b"still fine");

    // A write that cannot be placed as a whole changes nothing.
    let dir2 = tempfile::tempdir().unwrap();
    let a2 = arena(2, 100, vec![tier(dir2.path(), 2)], vec![]);
    let b2 = a2.buffer("/big");
    b2.write_at(0, b"kept").unwrap();
    let err = b2.write_at(0, &data).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace);
    assert_eq!(&read_all(&b2)[..], b"kept");
    let s = a2.stats();
    assert_eq!((s.memory_used, s.spilled), (CS, 0));

    // No spill tier at all.
    let a3 = arena(1, 100, vec![], vec![]);
    let b3 = a3.buffer("/m");
    b3.write_at(0, &data[..CS as usize]).unwrap();
    let err = b3.write_at(CS, b"x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace);
    assert!(err.to_string().contains("no spill tier"), "{err}");
}

#[test]
fn dropping_buffers_gives_memory_and_disk_back() {
    let dir = tempfile::tempdir().unwrap();
    let a = arena(3, 100, vec![tier(dir.path(), 100)], vec![job("/j", 2, 4)]);
    let x = a.buffer("/j/x");
    let y = a.buffer("/y");
    let xd = pattern(8, 5 * CS as usize);
    x.write_at(0, &xd).unwrap();
    y.write_at(0, &pattern(9, 5 * CS as usize)).unwrap();
    let s = a.stats();
    assert_eq!(s.buffers, 2);
    assert!(s.memory_used > 0 && s.spilled > 0, "{s:?}");
    assert_eq!(s.spill_capacity, 100 * CS);

    // A clone keeps the bytes alive.
    let x2 = x.clone();
    drop(x);
    assert_eq!(a.stats(), s);
    assert_eq!(read_all(&x2), xd);
    drop(x2);
    drop(y);
    let s = a.stats();
    assert_eq!((s.memory_used, s.spilled, s.buffers), (0, 0, 0), "{s:?}");
    assert!(s.jobs.iter().all(|j| j.memory_used == 0 && j.spilled == 0));
    // Anonymous spill files leave nothing behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // The room is usable again.
    let z = a.buffer("/z");
    z.write_at(0, &xd).unwrap();
    assert_eq!(a.stats().memory_used, 3 * CS);
}

#[test]
fn a_thousand_concurrent_buffers_stay_under_the_ceiling() {
    const BUFFERS: usize = 1000;
    const THREADS: usize = 8;
    const PIECE: usize = 2500;
    const PIECES: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let a = arena(
        64,
        2,
        vec![tier(dir.path(), 1 << 20)],
        vec![job("/j1", 16, 1), job("/j5", 32, 5), job("/j9", 64, 9)],
    );
    let prefixes = ["/j1", "/j5", "/j9", "/other"];
    let bufs: Vec<WriteBuffer> = (0..BUFFERS)
        .map(|i| a.buffer(&format!("{}/f{i}", prefixes[i % prefixes.len()])))
        .collect();
    let data: Vec<Vec<u8>> = (0..BUFFERS)
        .map(|i| pattern(1000 + i as u64, PIECE * PIECES))
        .collect();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (bufs, data) = (&bufs, &data);
            s.spawn(move || {
                let mine: Vec<usize> = (t..BUFFERS).step_by(THREADS).collect();
                // Every buffer of this thread is open and growing at once.
                for p in 0..PIECES {
                    for &i in &mine {
                        let r = p * PIECE..(p + 1) * PIECE;
                        bufs[i].write_at(r.start as u64, &data[i][r]).unwrap();
                    }
                    // Readers run alongside the writers of other threads.
                    let i = mine[p % mine.len()];
                    let upto = (p + 1) * PIECE;
                    assert_eq!(&bufs[i].read_at(0, upto).unwrap()[..], &data[i][..upto]);
                }
                for &i in &mine {
                    assert_eq!(read_all(&bufs[i]), data[i], "buffer {i}");
                }
            });
        }
    });
    let s = a.stats();
    assert!(s.memory_peak <= s.memory_ceiling, "{s:?}");
    assert!(s.spilled > 0);
    let total: u64 = bufs
        .iter()
        .map(|b| b.memory_bytes() + b.spilled_bytes())
        .sum();
    assert_eq!(total, s.memory_used + s.spilled);
    for (prefix, quota) in [("/j1", 16), ("/j5", 32), ("/j9", 64)] {
        assert!(job_stats(&s, prefix).memory_used <= quota * CS);
    }
    drop(bufs);
    let s = a.stats();
    assert_eq!((s.memory_used, s.spilled, s.buffers), (0, 0, 0));
}

#[test]
fn ceiling_changes_while_writers_run_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = arena(
        32,
        8,
        vec![tier(dir.path(), 1 << 20)],
        vec![job("/lo", 1 << 10, 1), job("/hi", 1 << 10, 9)],
    );
    let bufs: Vec<WriteBuffer> = (0..16)
        .map(|i| a.buffer(&format!("{}/f{i}", ["/lo", "/hi"][i % 2])))
        .collect();
    let data: Vec<Vec<u8>> = (0..16).map(|i| pattern(50 + i, 40_000)).collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (bufs, data) = (&bufs, &data);
            s.spawn(move || {
                for off in (0..40_000).step_by(3000) {
                    for i in (t..16).step_by(4) {
                        let end = (off + 3000).min(40_000);
                        bufs[i].write_at(off as u64, &data[i][off..end]).unwrap();
                    }
                }
            });
        }
        for round in 0..20u64 {
            a.set_memory_ceiling((round % 5) * 8 * CS);
            let st = a.stats();
            // Writers only ever add within the ceiling, so the spill holds.
            assert!(st.memory_used <= st.memory_ceiling, "{st:?}");
        }
    });
    for (b, d) in bufs.iter().zip(&data) {
        assert_eq!(&read_all(b), d);
    }
}

/// Growing a buffer makes a hole: nothing is allocated, holes read as zeros and say so, and a
/// write far out allocates only the chunk it touches.
#[test]
fn holes_cost_nothing_and_read_as_zeros() {
    let spill = tempfile::tempdir().unwrap();
    let a = arena(4, 4, vec![tier(spill.path(), 4)], vec![]);
    let b = a.buffer("/f");
    b.write_at(0, b"head").unwrap();
    b.set_len(4 << 40).unwrap();
    assert_eq!(b.len(), 4 << 40);
    assert_eq!(b.memory_bytes(), CS, "only the first chunk is held");
    assert_eq!(b.spilled_bytes(), 0);
    assert!(b.is_hole(CS, (4 << 40) - CS));
    assert!(!b.is_hole(0, CS));
    assert!(b.read_at(3 << 40, 100).unwrap().iter().all(|&x| x == 0));
    b.write_at((2 << 40) + 10, b"far").unwrap();
    assert_eq!(b.memory_bytes(), 2 * CS);
    assert!(!b.is_hole(2 << 40, CS));
    assert_eq!(&b.read_at((2 << 40) + 8, 6).unwrap()[..], b"\0\0far\0");
    // Shrinking into the head and growing again: the cut bytes read as zeros.
    b.set_len(2).unwrap();
    b.set_len(CS * 3).unwrap();
    assert_eq!(&b.read_at(0, 6).unwrap()[..], b"he\0\0\0\0");
    assert_eq!(b.memory_bytes(), CS);
    assert_eq!(a.stats().memory_used, CS);
}

/// Past the largest file size, a write or a truncate is `FileTooLarge` (EFBIG) and changes
/// nothing.
#[test]
fn past_the_max_file_size_is_efbig() {
    let a = arena(4, 4, vec![], vec![]);
    assert_eq!(
        a.max_file_size(),
        5 << 40,
        "the default is S3's largest object"
    );
    let b = a.buffer("/f");
    let e = b.set_len(999_999_999_999_999).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FileTooLarge);
    assert_eq!(e.errno(), libc::EFBIG);
    assert_eq!(b.len(), 0);
    a.set_max_file_size(CS * 2);
    b.write_at(CS * 2 - 3, b"end").unwrap();
    let e = b.write_at(CS * 2 - 3, b"end!").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FileTooLarge);
    assert!(e.to_string().contains("max_file_size"), "{e}");
    assert_eq!(b.len(), CS * 2);
    assert_eq!(&b.read_at(CS * 2 - 3, 3).unwrap()[..], b"end");
    assert_eq!(
        b.set_len(CS * 2 + 1).unwrap_err().kind(),
        ErrorKind::FileTooLarge
    );
}
