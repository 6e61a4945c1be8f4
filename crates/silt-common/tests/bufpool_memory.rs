//! Page buffers freed beyond the pool's idle bound go back to the kernel. A process of its
//! own (this test binary has one test), so its resident memory is this test's alone.

use silt_common::bufpool::{mapped_buffers, BufferPool};

const MIB: usize = 1 << 20;

/// Anonymous resident memory of this process, bytes (`RssAnon` of /proc/self/status).
fn rss_anon() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
    let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn buffers_freed_beyond_the_idle_bound_leave_the_process() {
    let pool = BufferPool::new(MIB, 2);
    let base = rss_anon();
    // Rounds of a cache's life: 64 pages filled, every eighth kept (a page still cached), the
    // rest evicted. Freed heap memory between live allocations would stay resident; freed
    // buffers must not.
    let mut kept = Vec::new();
    for round in 0..4u8 {
        let mut pages: Vec<_> = (0..64)
            .map(|i| {
                let mut b = pool.take();
                b.as_mut_slice().fill(round ^ i);
                b.freeze(MIB)
            })
            .collect();
        let grown = rss_anon().saturating_sub(base);
        assert!(
            grown >= 60 * MIB,
            "the filled pages are resident ({grown} bytes)"
        );
        for (i, page) in pages.drain(..).enumerate() {
            if i % 8 == 0 {
                kept.push(page);
            }
        }
        // Live: the kept pages and at most two idle buffers; slack for the test's own vectors
        // and the allocator's bookkeeping.
        let live = (kept.len() + 2) * MIB;
        let resident = rss_anon().saturating_sub(base);
        assert!(
            resident <= live + 4 * MIB,
            "round {round}: {resident} bytes resident for {live} bytes of live buffers"
        );
        assert!(kept
            .iter()
            .enumerate()
            .all(|(i, p)| p.len() == MIB && p[0] == (i / 8) as u8 ^ ((i % 8) * 8) as u8));
    }
    drop(kept);
    assert!(
        rss_anon().saturating_sub(base) <= 3 * MIB,
        "all but the idle buffers are freed"
    );
    assert_eq!(
        mapped_buffers(),
        pool.idle(),
        "only the idle buffers stay mapped"
    );
}
