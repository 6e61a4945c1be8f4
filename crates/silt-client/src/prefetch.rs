//! Sequential-read detection and the read-ahead window.
//!
//! Each open file remembers where the last read ended. A read that starts near there is
//! sequential: the window (bytes fetched ahead of the reader) starts at two pages and doubles
//! on every sequential read up to `prefetch_max`, so a streaming reader soon has enough
//! requests in flight to hide the store's latency, while a random reader (which resets the
//! window to zero) never pays for bytes it will not read. "Near" allows a few pages of slack
//! because the kernel issues read-ahead requests in parallel and FUSE threads may serve them
//! slightly out of order.

/// Pages of slack within which a read still counts as sequential.
const SLACK_PAGES: u64 = 4;

#[derive(Debug, Default)]
pub struct SeqState {
    /// Where the furthest read so far ended.
    next: u64,
    /// Current read-ahead window in bytes (0 = random access).
    window: u64,
    /// Prefetch has been issued up to this byte offset.
    prefetched_to: u64,
    /// Whether any read has happened yet.
    started: bool,
}

impl SeqState {
    /// Records a read of `[offset, end)` and returns the byte range to prefetch now, if any,
    /// clamped to `size`. Prefetch is issued in batches of at least `batch` bytes (or the
    /// whole window, if smaller, or up to the end of the file): one large ranged request costs
    /// the store far less than many page-sized ones.
    pub fn observe(
        &mut self,
        offset: u64,
        end: u64,
        size: u64,
        page_size: u64,
        max_window: u64,
        batch: u64,
    ) -> Option<std::ops::Range<u64>> {
        if self.started && end <= self.next {
            // A re-read of bytes already passed (or a late read-ahead request): nothing new
            // to predict.
            return None;
        }
        let slack = SLACK_PAGES * page_size;
        let sequential = if self.started {
            offset + slack >= self.next && offset <= self.next + slack
        } else {
            offset == 0
        };
        self.started = true;
        if sequential {
            // The ceiling is at least the floor: a `prefetch_max` under two pages means two pages.
            let floor = 2 * page_size;
            self.window = (self.window * 2).clamp(floor, max_window.max(floor));
            self.next = self.next.max(end);
        } else {
            self.window = 0;
            self.next = end;
            self.prefetched_to = 0;
            return None;
        }
        let target = (self.next + self.window).min(size);
        let from = self.prefetched_to.max(self.next);
        if target > from && (target - from >= batch.min(self.window) || target == size) {
            self.prefetched_to = target;
            Some(from..target)
        } else {
            None
        }
    }

    #[cfg(test)]
    pub fn window(&self) -> u64 {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const PS: u64 = 1 << 20;

    #[test]
    fn window_grows_while_sequential_and_caps() {
        let mut s = SeqState::default();
        let size = 1 << 40;
        let max = 16 * PS;
        let mut windows = vec![];
        let mut off = 0;
        for _ in 0..8 {
            let r = s
                .observe(off, off + PS, size, PS, max, PS)
                .expect("prefetch");
            assert!(r.start >= off + PS, "prefetch starts after the read");
            windows.push(s.window() / PS);
            off += PS;
        }
        assert_eq!(windows, vec![2, 4, 8, 16, 16, 16, 16, 16]);
    }

    #[test]
    fn random_reads_reset_and_never_prefetch_twice() {
        let mut s = SeqState::default();
        let size = 1 << 40;
        let r1 = s.observe(0, PS, size, PS, 64 * PS, PS).unwrap();
        assert_eq!(r1, PS..3 * PS);
        // A jump far away resets the window: no prefetch for random access.
        assert_eq!(s.observe(500 * PS, 501 * PS, size, PS, 64 * PS, PS), None);
        assert_eq!(s.window(), 0);
        // Sequential again from there: the window restarts at two pages.
        let r = s
            .observe(501 * PS, 502 * PS, size, PS, 64 * PS, PS)
            .unwrap();
        assert_eq!(r, 502 * PS..504 * PS);
        // The next read prefetches only what was not issued before.
        let r = s
            .observe(502 * PS, 503 * PS, size, PS, 64 * PS, PS)
            .unwrap();
        assert_eq!(r, 504 * PS..507 * PS);
    }

    #[test]
    fn rereads_do_not_prefetch() {
        let mut s = SeqState::default();
        let size = 1 << 40;
        assert!(s.observe(0, 4 * PS, size, PS, 64 * PS, PS).is_some());
        assert_eq!(s.observe(PS, 3 * PS, size, PS, 64 * PS, PS), None);
        assert_eq!(s.observe(0, 4 * PS, size, PS, 64 * PS, PS), None);
        // Moving on from where it was is still sequential.
        assert!(s.observe(4 * PS, 5 * PS, size, PS, 64 * PS, PS).is_some());
    }

    #[test]
    fn steady_state_prefetch_comes_in_batches() {
        let mut s = SeqState::default();
        let size = 1 << 40;
        let mut issued = vec![];
        let mut off = 0;
        for _ in 0..40 {
            if let Some(r) = s.observe(off, off + PS, size, PS, 16 * PS, 8 * PS) {
                issued.push((r.end - r.start) / PS);
            }
            off += PS;
        }
        // The first window, then only batches of at least 8 pages (not one page per read).
        assert_eq!(issued[0], 2);
        assert!(issued[1..].iter().all(|&n| n >= 8), "{issued:?}");
        assert!(issued.len() >= 4, "{issued:?}");
        // Near the end of the file the remainder is issued even if small.
        let mut t = SeqState::default();
        let r = t.observe(0, PS, 3 * PS + 5, PS, 16 * PS, 8 * PS).unwrap();
        assert_eq!(r, PS..3 * PS);
        assert_eq!(
            t.observe(PS, 2 * PS, 3 * PS + 5, PS, 16 * PS, 8 * PS),
            Some(3 * PS..3 * PS + 5)
        );
    }

    #[test]
    fn clamps_to_file_size() {
        let mut s = SeqState::default();
        let r = s.observe(0, PS / 2, PS + 10, PS, 64 * PS, PS).unwrap();
        assert_eq!(r, PS / 2..PS + 10);
        assert_eq!(s.observe(PS / 2, PS + 10, PS + 10, PS, 64 * PS, PS), None);
        let mut small = SeqState::default();
        assert_eq!(small.observe(0, 100, 100, PS, 64 * PS, PS), None);
    }
}
