//! Telling the kernel what Silt learned: its caches of changed paths are dropped from a
//! thread of their own (a request handler that learned of a change must not wait on the
//! kernel locks its own request holds), in order, and a caller can wait until everything
//! learned before it has reached the kernel.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fuser::INodeNo;
use parking_lot::Mutex;
use silt_client::fs::inodes::Inodes;
use silt_client::{Change, ChangeKind};

/// Work for the invalidation thread.
pub(crate) enum Inval {
    /// Changes Silt learned; counted, so callers can wait for them (`InvalQueue::wait`).
    Changes(Vec<Change>),
    /// A directory whose readdir cache must be dropped; not waited for.
    Reread(String),
}

/// Longest an open or a control command waits for queued kernel invalidations; past it the
/// reply goes out anyway (logged), so a stuck kernel never hangs the mount.
const INVAL_WAIT: Duration = Duration::from_secs(5);

/// Changes waiting to be told to the kernel, in order, with counts of batches queued and told,
/// so a caller can wait until everything learned before it has reached the kernel.
///
/// A batch is counted before it is sent. So when a caller reads `queued` after sending its own
/// batch, every batch ahead of its own in the (FIFO) channel is counted too, and `told` can
/// reach that count only once its own batch has been told.
pub(crate) struct InvalQueue {
    tx: std::sync::mpsc::Sender<Inval>,
    queued: AtomicU64,
    told: AtomicU64,
    lock: Mutex<()>,
    cond: parking_lot::Condvar,
}

impl InvalQueue {
    pub(crate) fn new(tx: std::sync::mpsc::Sender<Inval>) -> Self {
        InvalQueue {
            tx,
            queued: AtomicU64::new(0),
            told: AtomicU64::new(0),
            lock: Mutex::new(()),
            cond: parking_lot::Condvar::new(),
        }
    }

    pub(crate) fn push(&self, changes: Vec<Change>) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(Inval::Changes(changes)).is_err() {
            // Unmounted: nothing will tell it, nobody must wait for it.
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Has the kernel read directory `path` again, without anyone waiting for it (nothing
    /// Silt learned depends on it: see `forget`).
    pub(crate) fn push_reread(&self, path: String) {
        let _ = self.tx.send(Inval::Reread(path));
    }

    pub(crate) fn mark_told(&self) {
        self.told.fetch_add(1, Ordering::SeqCst);
        let _g = self.lock.lock();
        self.cond.notify_all();
    }

    /// Waits until every batch queued before this call has been told to the kernel. Without
    /// pending batches (nearly always, on every open) it takes no lock.
    pub(crate) fn wait(&self) {
        let target = self.queued.load(Ordering::SeqCst);
        if self.told.load(Ordering::SeqCst) >= target {
            return;
        }
        let deadline = std::time::Instant::now() + INVAL_WAIT;
        let mut g = self.lock.lock();
        while self.told.load(Ordering::SeqCst) < target {
            if self.cond.wait_until(&mut g, deadline).timed_out() {
                tracing::warn!("kernel cache invalidations are slow: replying without them");
                return;
            }
        }
    }
}

/// Tells the kernel to forget what it caches about changed paths: attributes and pages of a
/// changed inode (attributes only for a metadata change), and the directory entry of a path
/// that appeared, disappeared or was invalidated, with its parent's readdir cache (once per
/// parent and batch); for a policy change, everything it was given under the prefix. Paths
/// the kernel was never given are skipped; errors (the kernel already dropped the inode) are
/// expected and ignored.
pub(crate) fn invalidate_kernel(
    notifier: &fuser::Notifier,
    inodes: &Mutex<Inodes>,
    changes: &[Change],
) {
    let mut parents = HashSet::new();
    for c in changes {
        if c.kind == ChangeKind::Policy {
            let known = inodes.lock().under(&c.path);
            for path in known {
                invalidate_path(
                    notifier,
                    inodes,
                    &path,
                    ChangeKind::Invalidated,
                    &mut parents,
                );
            }
        } else {
            invalidate_path(notifier, inodes, &c.path, c.kind, &mut parents);
        }
    }
    for parent in parents {
        let _ = notifier.inval_inode(INodeNo(parent), 0, 0);
    }
}

/// Invalidates `path` itself and its entry in its parent; adds the parent to `parents` when
/// the parent's listing changed.
fn invalidate_path(
    notifier: &fuser::Notifier,
    inodes: &Mutex<Inodes>,
    path: &str,
    kind: ChangeKind,
    parents: &mut HashSet<u64>,
) {
    let parent_and_name = silt_client::namespace::parent_and_name(path);
    let (ino, parent) = {
        let t = inodes.lock();
        (t.ino(path), parent_and_name.and_then(|(d, _)| t.ino(d)))
    };
    if let Some(ino) = ino {
        // Offset -1: attributes only; (0, 0): attributes and every cached page.
        let offset = if kind == ChangeKind::Metadata { -1 } else { 0 };
        let _ = notifier.inval_inode(INodeNo(ino), offset, 0);
    }
    // The names stay for changes of a file's attributes or bytes (and bytes freed).
    if !matches!(
        kind,
        ChangeKind::Metadata | ChangeKind::Content | ChangeKind::Freed
    ) {
        if let (Some(parent), Some((_, name))) = (parent, parent_and_name) {
            let _ = notifier.inval_entry(INodeNo(parent), OsStr::new(name));
            parents.insert(parent);
        }
    }
}
