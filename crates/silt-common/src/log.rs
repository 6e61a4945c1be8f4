//! Warnings that can repeat once per page or per request (a full disk, a store or worker that
//! is down, a flood of bad connections) are logged through [`warn_limited!`](crate::warn_limited):
//! the first is logged; further ones from the same call site and key within the repeat
//! interval (`log_repeat_interval`) are only counted; the count comes back as the field
//! `suppressed` on the next line logged for that site and key, or on a line of its own once
//! the interval is over (a background flush) or when the process exits ([`flush`]). So a
//! disk that fills logs a few lines a minute instead of one per page, and no repeat goes
//! uncounted.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[doc(hidden)]
pub use tracing as __tracing;

/// The default of `log_repeat_interval`.
pub const DEFAULT_REPEAT_INTERVAL: Duration = Duration::from_secs(10);

/// Keys tracked at once. A flood of distinct keys (say, one per path) beyond it is counted
/// per call site instead, so the table stays small whatever the input.
const MAX_KEYS: usize = 4096;

/// The key that collects a call site's repeats once [`MAX_KEYS`] are tracked.
const OVERFLOW_KEY: u64 = u64::MAX;

/// One call site of [`warn_limited!`](crate::warn_limited): where it is and what it says
/// (repeated on the line that reports a count of its own).
pub struct Site {
    pub location: &'static str,
    pub message: &'static str,
}

struct Entry {
    site: &'static Site,
    /// When this site and key last logged a line.
    last: Instant,
    /// Repeats since then that were not logged.
    suppressed: u64,
}

/// The bookkeeping behind [`warn_limited!`](crate::warn_limited), with the time passed in by
/// the caller (the process-wide one reads the real clock; tests pass their own).
pub struct RepeatLimiter {
    interval_ms: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: HashMap<(usize, u64), Entry>,
    /// When a full table was last searched for quiet keys (at most once an interval).
    pruned: Option<Instant>,
}

impl RepeatLimiter {
    pub fn new(interval: Duration) -> Self {
        let limiter = RepeatLimiter {
            interval_ms: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        };
        limiter.set_interval(interval);
        limiter
    }

    /// Zero logs every repeat.
    pub fn set_interval(&self, interval: Duration) {
        let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.interval_ms.store(ms, Ordering::Relaxed);
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Relaxed))
    }

    /// Whether the warning of `site` for `key` at `now` is logged: `Some(n)` says yes, `n`
    /// repeats having been suppressed since the last line; `None` says no (it is counted).
    pub fn admit(&self, site: &'static Site, key: u64, now: Instant) -> Option<u64> {
        let interval = self.interval();
        if interval.is_zero() {
            return Some(0);
        }
        let mut state = self.state.lock();
        let State { entries, pruned } = &mut *state;
        let site_id = site as *const Site as usize;
        let mut id = (site_id, key);
        if !entries.contains_key(&id) && entries.len() >= MAX_KEYS {
            if pruned.is_none_or(|p| now.saturating_duration_since(p) >= interval) {
                *pruned = Some(now);
                entries.retain(|_, e| {
                    e.suppressed > 0 || now.saturating_duration_since(e.last) < interval
                });
            }
            if entries.len() >= MAX_KEYS {
                id = (site_id, OVERFLOW_KEY);
            }
        }
        match entries.get_mut(&id) {
            Some(e) if now.saturating_duration_since(e.last) < interval => {
                e.suppressed += 1;
                None
            }
            Some(e) => {
                e.last = now;
                Some(std::mem::take(&mut e.suppressed))
            }
            None => {
                entries.insert(
                    id,
                    Entry {
                        site,
                        last: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }

    /// The counts whose interval is over at `now` and not reported yet (each reported once:
    /// it counts as that key's line); forgets the keys that stayed quiet for an interval.
    pub fn due(&self, now: Instant) -> Vec<(&'static Site, u64)> {
        let interval = self.interval();
        let mut out = Vec::new();
        self.state.lock().entries.retain(|_, e| {
            if now.saturating_duration_since(e.last) < interval {
                return true;
            }
            if e.suppressed == 0 {
                return false;
            }
            out.push((e.site, std::mem::take(&mut e.suppressed)));
            e.last = now;
            true
        });
        out
    }

    /// Every count not reported yet, interval over or not (the process is exiting).
    pub fn drain(&self) -> Vec<(&'static Site, u64)> {
        let mut state = self.state.lock();
        let entries = &mut state.entries;
        let out = entries
            .values_mut()
            .filter(|e| e.suppressed > 0)
            .map(|e| (e.site, std::mem::take(&mut e.suppressed)))
            .collect();
        entries.clear();
        out
    }
}

fn limiter() -> &'static RepeatLimiter {
    static LIMITER: OnceLock<RepeatLimiter> = OnceLock::new();
    LIMITER.get_or_init(|| RepeatLimiter::new(DEFAULT_REPEAT_INTERVAL))
}

/// Sets this process's repeat interval (`log_repeat_interval`; zero: no limit).
pub fn set_repeat_interval(interval: Duration) {
    limiter().set_interval(interval);
}

/// [`RepeatLimiter::admit`] of this process, now; the first repeat held back starts the
/// background flush that reports counts whose interval ended with no further line.
#[doc(hidden)]
pub fn admit(site: &'static Site, key: &impl Hash) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let verdict = limiter().admit(site, h.finish(), Instant::now());
    if verdict.is_none() {
        start_flusher();
    }
    verdict
}

fn start_flusher() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("silt-log-repeats".into())
            .spawn(|| loop {
                // At least a second between looks: an interval of a few milliseconds must not
                // turn this into a busy loop.
                std::thread::sleep(limiter().interval().max(Duration::from_secs(1)));
                report(limiter().due(Instant::now()));
            });
        // Without the thread, counts still come with the next line or at exit.
        drop(spawned);
    });
}

/// Logs every count of suppressed repeats not logged yet; called as the process exits.
pub fn flush() {
    report(limiter().drain());
}

fn report(counts: Vec<(&'static Site, u64)>) {
    for (site, n) in counts {
        tracing::warn!(suppressed = n, site = site.location, "{}", site.message);
    }
}

/// `tracing::warn!` for a warning that can repeat per page or per request: at most one line
/// per `log_repeat_interval` for each call site and key, the repeats in between counted in
/// the field `suppressed` of a later line (see [`crate::log`]). The message is a literal;
/// fields follow it, in `tracing`'s syntax:
///
/// ```ignore
/// warn_limited!(per: tier, "cannot write a cache page", path = %path.display(), error = %e);
/// warn_limited!("gateway: accept failed", error = %e);
/// ```
///
/// `per:` names what tells repeats apart (anything `Hash`; say, the tier or the worker):
/// without it, every warning of the call site is one kind.
#[macro_export]
macro_rules! warn_limited {
    (per: $key:expr, $msg:literal $(, $($field:tt)+)?) => {{
        static SITE: $crate::log::Site = $crate::log::Site {
            location: concat!(file!(), ":", line!()),
            message: $msg,
        };
        match $crate::log::admit(&SITE, &$key) {
            Some(0) => $crate::log::__tracing::warn!($($($field)+,)? $msg),
            Some(suppressed) => $crate::log::__tracing::warn!(suppressed, $($($field)+,)? $msg),
            None => {}
        }
    }};
    ($msg:literal $(, $($field:tt)+)?) => {
        $crate::warn_limited!(per: (), $msg $(, $($field)+)?)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    static DISK: Site = Site {
        location: "disk",
        message: "cannot write a cache page",
    };
    static STORE: Site = Site {
        location: "store",
        message: "request failed",
    };

    const SEC: Duration = Duration::from_secs(1);

    /// The clock is the `now` each call passes: time moves only when the test says so.
    #[test]
    fn one_line_per_interval_with_the_count_of_repeats_on_the_next() {
        let l = RepeatLimiter::new(10 * SEC);
        let t0 = Instant::now();
        assert_eq!(l.admit(&DISK, 1, t0), Some(0));
        for i in 1..=5 {
            assert_eq!(l.admit(&DISK, 1, t0 + i * SEC), None);
        }
        // 9.999 s after the line: still held back.
        assert_eq!(
            l.admit(&DISK, 1, t0 + 10 * SEC - Duration::from_millis(1)),
            None
        );
        assert_eq!(l.admit(&DISK, 1, t0 + 10 * SEC), Some(6));
        // The interval starts again at that line.
        assert_eq!(l.admit(&DISK, 1, t0 + 15 * SEC), None);
        assert_eq!(l.admit(&DISK, 1, t0 + 20 * SEC), Some(1));
        assert_eq!(l.admit(&DISK, 1, t0 + 31 * SEC), Some(0));
    }

    #[test]
    fn sites_and_keys_are_limited_apart() {
        let l = RepeatLimiter::new(10 * SEC);
        let t0 = Instant::now();
        assert_eq!(l.admit(&DISK, 1, t0), Some(0));
        assert_eq!(l.admit(&DISK, 2, t0), Some(0));
        assert_eq!(l.admit(&STORE, 1, t0), Some(0));
        assert_eq!(l.admit(&DISK, 1, t0), None);
        assert_eq!(l.admit(&DISK, 2, t0), None);
        assert_eq!(l.admit(&DISK, 2, t0), None);
        assert_eq!(l.admit(&STORE, 1, t0), None);
        assert_eq!(l.admit(&DISK, 1, t0 + 10 * SEC), Some(1));
        assert_eq!(l.admit(&DISK, 2, t0 + 10 * SEC), Some(2));
        assert_eq!(l.admit(&STORE, 1, t0 + 10 * SEC), Some(1));
    }

    #[test]
    fn counts_are_reported_once_when_their_interval_ends_or_at_exit() {
        let l = RepeatLimiter::new(10 * SEC);
        let t0 = Instant::now();
        l.admit(&DISK, 1, t0);
        l.admit(&DISK, 1, t0 + SEC);
        l.admit(&DISK, 1, t0 + 2 * SEC);
        l.admit(&STORE, 1, t0 + SEC);
        assert!(
            l.due(t0 + 9 * SEC).is_empty(),
            "reported before the interval ended"
        );
        let due = l.due(t0 + 10 * SEC);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].0.location, due[0].1), ("disk", 2));
        // That report was the key's line: a repeat right after it is held back again.
        assert!(l.due(t0 + 11 * SEC).is_empty());
        assert_eq!(l.admit(&DISK, 1, t0 + 12 * SEC), None);
        assert_eq!(l.admit(&STORE, 1, t0 + 12 * SEC), Some(0));
        assert_eq!(l.admit(&STORE, 1, t0 + 13 * SEC), None);
        // At exit every count comes out, whether its interval is over or not.
        let mut left: Vec<_> = l.drain().iter().map(|(s, n)| (s.location, *n)).collect();
        left.sort();
        assert_eq!(left, [("disk", 1), ("store", 1)]);
        assert!(l.drain().is_empty());
    }

    #[test]
    fn quiet_keys_are_forgotten() {
        let l = RepeatLimiter::new(10 * SEC);
        let t0 = Instant::now();
        for k in 0..100 {
            l.admit(&DISK, k, t0);
        }
        assert!(l.due(t0 + 10 * SEC).is_empty());
        assert!(l.state.lock().entries.is_empty());
        assert_eq!(l.admit(&DISK, 7, t0 + 10 * SEC), Some(0));
    }

    #[test]
    fn a_flood_of_keys_is_counted_per_site_past_the_table_size() {
        let l = RepeatLimiter::new(10 * SEC);
        let t0 = Instant::now();
        for k in 0..MAX_KEYS as u64 {
            assert_eq!(l.admit(&DISK, k, t0), Some(0));
        }
        // The table is full of live keys: new keys share one per site.
        assert_eq!(l.admit(&DISK, 1 << 40, t0), Some(0));
        assert_eq!(l.admit(&DISK, 1 << 41, t0), None);
        assert_eq!(l.admit(&STORE, 1 << 42, t0), Some(0));
        assert!(l.state.lock().entries.len() <= MAX_KEYS + 2);
        // Once those keys went quiet, they make room again.
        assert_eq!(l.admit(&DISK, 1 << 43, t0 + 10 * SEC), Some(0));
        assert_eq!(l.admit(&DISK, 1 << 43, t0 + 10 * SEC), None);
        assert!(l.state.lock().entries.len() < 10);
    }

    #[test]
    fn zero_interval_logs_everything() {
        let l = RepeatLimiter::new(Duration::ZERO);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(l.admit(&DISK, 1, t0), Some(0));
        }
        assert!(l.drain().is_empty());
    }
}
