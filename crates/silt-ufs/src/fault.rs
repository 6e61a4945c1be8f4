//! A fault-injecting wrapper around any store, for tests of retry, timeout and error paths.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use silt_common::{Error, ErrorKind, Result};

use crate::{Capabilities, DynStore, ObjectMeta, UnderStore};

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
pub struct FaultStore {
    inner: DynStore,
    faults: Mutex<Vec<Fault>>,
    calls: [AtomicU64; 5],
}

impl FaultStore {
    pub fn new(inner: DynStore) -> FaultStore {
        FaultStore {
            inner,
            faults: Mutex::new(Vec::new()),
            calls: Default::default(),
        }
    }

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

#[async_trait]
impl UnderStore for FaultStore {
    fn uri(&self) -> &str {
        self.inner.uri()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.before(FaultOp::Stat, path).await?;
        self.inner.stat(path).await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.before(FaultOp::List, dir).await?;
        self.inner.list(dir, recursive).await
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        self.before(FaultOp::List, dir).await?;
        self.inner.list_tree(dir, max).await
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        self.before(FaultOp::Read, path).await?;
        self.inner.read(path, range, expected).await
    }

    /// Never the inner store's file: a reader of it would meet none of the faults.
    async fn local_file(&self, _path: &str, _expected: &ObjectMeta) -> Option<std::fs::File> {
        None
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, path).await?;
        self.inner.write(path, data).await
    }

    async fn write_from(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
    ) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, path).await?;
        self.inner.write_from(path, src, len).await
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.before(FaultOp::Delete, path).await?;
        self.inner.delete(path).await
    }

    // Directory operations and renames count as the request kind they make: a write (marker,
    // copy) or a delete.

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, path).await?;
        self.inner.create_dir(path).await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        self.before(FaultOp::Delete, path).await?;
        self.inner.remove_dir(path).await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, from).await?;
        self.inner.rename(from, to).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, from).await?;
        self.inner.copy(from, to).await
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        attrs: &crate::SetAttrs,
    ) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, path).await?;
        self.inner.write_from_attrs(path, src, len, attrs).await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, path).await?;
        self.inner.symlink(path, target).await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        self.before(FaultOp::Read, path).await?;
        self.inner.read_link(path).await
    }

    async fn set_attrs(&self, path: &str, attrs: &crate::SetAttrs) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, path).await?;
        self.inner.set_attrs(path, attrs).await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: crate::SpecialKind,
        rdev: u32,
        attrs: &crate::SetAttrs,
    ) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, path).await?;
        self.inner.mknod(path, kind, rdev, attrs).await
    }

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.before(FaultOp::Write, to).await?;
        self.inner.hard_link(from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;

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
