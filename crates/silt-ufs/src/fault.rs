//! A fault-injecting wrapper around any store, for tests of retry, timeout and error paths.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use silt_common::{Error, ErrorKind, Result};

use crate::layer::{Layer, Layered};
use crate::DynStore;

/// One kind of [`UnderStore`] call (`create_dir`, `rename` and `copy` count as writes,
/// `remove_dir` as a delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultOp {
    Stat,
    List,
    Read,
    Write,
    Delete,
}

impl FaultOp {
    const ALL: [FaultOp; 5] = [
        FaultOp::Stat,
        FaultOp::List,
        FaultOp::Read,
        FaultOp::Write,
        FaultOp::Delete,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            FaultOp::Stat => "stat",
            FaultOp::List => "list",
            FaultOp::Read => "read",
            FaultOp::Write => "write",
            FaultOp::Delete => "delete",
        }
    }
}

/// Which paths a [`Fault::FailReads`] applies to.
pub type PathPredicate = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A fault to inject into a [`FaultStore`]. Faults stack: every active one applies, latency
/// first, then failures, in the order they were injected.
#[derive(Clone)]
pub enum Fault {
    /// Fail the next `count` calls of `op` with an error of `kind`; then the fault is spent.
    FailNext {
        op: FaultOp,
        count: u64,
        kind: ErrorKind,
    },
    /// Delay every call of `op` (every call when `None`) by `delay` (tokio time, so tests
    /// with a paused clock advance instantly) before it runs or fails.
    Latency {
        op: Option<FaultOp>,
        delay: Duration,
    },
    /// Fail every read whose path satisfies `matches` with an error of `kind`, until cleared.
    FailReads {
        matches: PathPredicate,
        kind: ErrorKind,
    },
}

impl Fault {
    /// [`Fault::FailNext`].
    pub fn fail_next(op: FaultOp, count: u64, kind: ErrorKind) -> Fault {
        Fault::FailNext { op, count, kind }
    }

    /// [`Fault::Latency`] for one kind of call.
    pub fn latency(op: FaultOp, delay: Duration) -> Fault {
        Fault::Latency {
            op: Some(op),
            delay,
        }
    }

    /// [`Fault::Latency`] for every call.
    pub fn latency_all(delay: Duration) -> Fault {
        Fault::Latency { op: None, delay }
    }

    /// [`Fault::FailReads`].
    pub fn fail_reads(
        matches: impl Fn(&str) -> bool + Send + Sync + 'static,
        kind: ErrorKind,
    ) -> Fault {
        Fault::FailReads {
            matches: Arc::new(matches),
            kind,
        }
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::FailNext { op, count, kind } => f
                .debug_struct("FailNext")
                .field("op", op)
                .field("count", count)
                .field("kind", kind)
                .finish(),
            Fault::Latency { op, delay } => f
                .debug_struct("Latency")
                .field("op", op)
                .field("delay", delay)
                .finish(),
            Fault::FailReads { kind, .. } => f
                .debug_struct("FailReads")
                .field("kind", kind)
                .finish_non_exhaustive(),
        }
    }
}

/// Wraps a store and injects [`Fault`]s into its calls, counting the calls of each kind
/// (injected failures included).
///
/// ```ignore
/// let store = FaultStore::new(inner);
/// store.inject(Fault::fail_next(FaultOp::Read, 2, ErrorKind::Unavailable));
/// assert!(store.read("a", 0..1, &meta).await.is_err());
/// assert_eq!(store.calls(FaultOp::Read), 1);
/// ```
/// The faults of a [`FaultStore`] and its call counts (the [`Layer`] it is made of).
pub struct Faults {
    inner: DynStore,
    faults: Mutex<Vec<Fault>>,
    calls: [AtomicU64; 5],
}

/// A store in front of `inner` that injects [`Fault`]s and counts calls: a [`Layer`], so it
/// forwards every trait method.
pub type FaultStore = Layered<Faults>;

impl Layered<Faults> {
    pub fn new(inner: DynStore) -> FaultStore {
        Layered::from_layer(Faults {
            inner,
            faults: Mutex::new(Vec::new()),
            calls: Default::default(),
        })
    }
}

impl Faults {
    /// Adds a fault.
    pub fn inject(&self, fault: Fault) {
        self.faults.lock().push(fault);
    }

    /// Removes every fault.
    pub fn clear(&self) {
        self.faults.lock().clear();
    }

    /// Calls of `op` so far, including those that failed by injection.
    pub fn calls(&self, op: FaultOp) -> u64 {
        self.calls[op.index()].load(Ordering::Relaxed)
    }

    /// Calls of every kind so far.
    pub fn total_calls(&self) -> u64 {
        FaultOp::ALL.iter().map(|op| self.calls(*op)).sum()
    }

    pub fn reset_calls(&self) {
        for c in &self.calls {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &DynStore {
        &self.inner
    }
}

#[async_trait]
impl Layer for Faults {
    fn inner(&self) -> &DynStore {
        &self.inner
    }

    /// Never the inner store's file: a reader of it would meet none of the faults.
    fn has_local_files(&self) -> bool {
        false
    }

    /// Counts the call, sleeps for matching latencies, then returns the injected failure, if
    /// any. Spent `FailNext` faults are removed.
    async fn before(&self, op: FaultOp, path: &str) -> Result<()> {
        self.calls[op.index()].fetch_add(1, Ordering::Relaxed);
        let (delay, failure) = {
            let mut faults = self.faults.lock();
            let delay: Duration = faults
                .iter()
                .filter_map(|f| match f {
                    Fault::Latency { op: o, delay } if o.is_none_or(|o| o == op) => Some(*delay),
                    _ => None,
                })
                .sum();
            let mut failure = None;
            for f in faults.iter_mut() {
                match f {
                    Fault::FailNext { op: o, count, kind } if *o == op && *count > 0 => {
                        *count -= 1;
                        failure = Some(*kind);
                        break;
                    }
                    Fault::FailReads { matches, kind } if op == FaultOp::Read && matches(path) => {
                        failure = Some(*kind);
                        break;
                    }
                    _ => {}
                }
            }
            faults.retain(|f| !matches!(f, Fault::FailNext { count: 0, .. }));
            (delay, failure)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match failure {
            Some(kind) => Err(Error::new(
                kind,
                format!(
                    "injected fault: {} {}/{path}: {kind}",
                    op.name(),
                    self.inner.uri()
                ),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemStore, UnderStore};

    #[tokio::test]
    async fn faults_apply_in_order_and_are_counted() {
        let mem = Arc::new(MemStore::new("mem://f"));
        let meta = mem.put("dir/a.bad", "bad").unwrap();
        let good = mem.put("dir/b.good", "good").unwrap();
        let store = FaultStore::new(mem.clone());

        store.inject(Fault::fail_next(FaultOp::Stat, 2, ErrorKind::Unavailable));
        for _ in 0..2 {
            let e = store.stat("dir").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unavailable);
            assert!(e.is_retryable());
            assert!(e.to_string().contains("injected"), "{e}");
        }
        store.stat("dir").await.unwrap();
        assert_eq!(store.calls(FaultOp::Stat), 3);
        assert_eq!(
            mem.requests(),
            1,
            "failed calls never reach the inner store"
        );

        store.inject(Fault::fail_reads(
            |p| p.ends_with(".bad"),
            ErrorKind::Corrupted,
        ));
        let e = store.read("dir/a.bad", 0..3, &meta).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupted);
        assert_eq!(store.read("dir/b.good", 0..4, &good).await.unwrap(), "good");
        assert!(
            store.read("dir/a.bad", 0..3, &meta).await.is_err(),
            "until cleared"
        );

        store.inject(Fault::latency(FaultOp::List, Duration::from_millis(50)));
        store.inject(Fault::latency(FaultOp::List, Duration::from_millis(50)));
        let t = tokio::time::Instant::now();
        store.list("dir", false).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "latencies add up"
        );
        store.inject(Fault::latency(FaultOp::Write, Duration::from_secs(3600)));
        store.stat("dir").await.unwrap(); // would hang if latency leaked to other ops

        store.clear();
        assert_eq!(store.read("dir/a.bad", 0..3, &meta).await.unwrap(), "bad");
        assert_eq!(store.calls(FaultOp::Read), 4);
        assert_eq!(store.total_calls(), 4 + 4 + 1);
        let dbg = format!("{:?}", Fault::fail_reads(|_| true, ErrorKind::Timeout));
        assert!(dbg.contains("Timeout"), "{dbg}");
    }
}
