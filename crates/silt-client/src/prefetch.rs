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
    /// clamped to `size`.
    pub fn observe(
        &mut self,
        offset: u64,
        end: u64,
        size: u64,
        page_size: u64,
        max_window: u64,
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
            self.window = (self.window * 2).clamp(2 * page_size, max_window.max(page_size));
            self.next = self.next.max(end);
        } else {
            self.window = 0;
            self.next = end;
            self.prefetched_to = 0;
            return None;
        }
        let target = (self.next + self.window).min(size);
        let from = self.prefetched_to.max(self.next);
        if target > from {
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
            let r = s.observe(off, off + PS, size, PS, max).expect("prefetch");
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
        let r1 = s.observe(0, PS, size, PS, 64 * PS).unwrap();
        assert_eq!(r1, PS..3 * PS);
        // A jump far away resets the window: no prefetch for random access.
        assert_eq!(s.observe(500 * PS, 501 * PS, size, PS, 64 * PS), None);
        assert_eq!(s.window(), 0);
        // Sequential again from there: the window restarts at two pages.
        let r = s.observe(501 * PS, 502 * PS, size, PS, 64 * PS).unwrap();
        assert_eq!(r, 502 * PS..504 * PS);
        // The next read prefetches only what was not issued before.
        let r = s.observe(502 * PS, 503 * PS, size, PS, 64 * PS).unwrap();
        assert_eq!(r, 504 * PS..507 * PS);
    }

    #[test]
    fn rereads_do_not_prefetch() {
        let mut s = SeqState::default();
        let size = 1 << 40;
        assert!(s.observe(0, 4 * PS, size, PS, 64 * PS).is_some());
        assert_eq!(s.observe(PS, 3 * PS, size, PS, 64 * PS), None);
        assert_eq!(s.observe(0, 4 * PS, size, PS, 64 * PS), None);
        // Moving on from where it was is still sequential.
        assert!(s.observe(4 * PS, 5 * PS, size, PS, 64 * PS).is_some());
    }

    #[test]
    fn clamps_to_file_size() {
        let mut s = SeqState::default();
        let r = s.observe(0, PS / 2, PS + 10, PS, 64 * PS).unwrap();
        assert_eq!(r, PS / 2..PS + 10);
        assert_eq!(s.observe(PS / 2, PS + 10, PS + 10, PS, 64 * PS), None);
        let mut small = SeqState::default();
        assert_eq!(small.observe(0, 100, 100, PS, 64 * PS), None);
    }
}
