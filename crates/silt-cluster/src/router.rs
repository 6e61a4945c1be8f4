//! Client routing: page groups go straight to their owner; a dead or slow owner costs one
//! timeout, then the next candidate is tried, then the under-store.
//!
//! The router is the `Fetcher` of a cluster client's near cache (`silt_reader::PageReader`), so
//! everything above it (single-flight per page, coalescing, read-ahead, bounded buffers) is
//! the same code as on a single node.
//!
//! Failure handling:
//! - Every call to a worker is bounded by `timeout` (connect included). A refused or broken
//!   connection fails at once; a cut link fails at the deadline.
//! - A worker that failed is *suspect* for `retry_after`: it is tried after every other
//!   candidate, so a dead worker costs one timeout per client, not one per read, until the
//!   membership drops it (etcd lease expiry) and placement moves its share.
//! - Answers that are about the object, not the worker (not found, changed, permission), are
//!   returned as they are; asking another worker would get the same answer.
//! - After `candidates` workers, the client reads the range from the under-store itself, so a
//!   reader sees latency, never an error, while any path to the data works.
//!
//! Wrong bytes are impossible by construction: requests carry the object's content
//! fingerprint (workers fetch with `If-Match`, and page ids include it), and a response must
//! have exactly the length asked for.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use silt_common::{metrics, Error, ErrorKind, ObjectId, Result};
use silt_reader::{BackingSource, Fetcher, LeasedCopy, ObjectRef};

use crate::membership::{Member, Membership};
use crate::placement;
use crate::rpc::{answer, Answer, CallError, Endpoint, Lease, PageRange, Request, WorkerClient};

#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// Deadline of one call to one worker.
    pub timeout: Duration,
    /// How long a failed worker is tried last.
    pub retry_after: Duration,
    /// Bytes of a file placed together (`placement_group`).
    pub group_size: u64,
    /// Workers tried before the under-store (at least 1).
    pub candidates: usize,
    /// This process's host id (`local_host_id()`): same-host workers are reached over their
    /// Unix socket.
    pub host_id: String,
    /// Whether same-host workers are reached over their Unix socket (`cluster_unix_socket`).
    pub unix_socket: bool,
    /// The cluster's secret, proven on every connection to a worker.
    pub key: crate::auth::ClusterKey,
}

/// Identifies this host *and network namespace*: processes that share both can use each
/// other's Unix sockets and see the same local files.
///
/// The kernel's boot id is part of it: a container has no `/etc/machine-id` of its own, and a
/// network namespace's number is only unique within one kernel, so without it pods on two
/// nodes could take each other for the same host (and try each other's socket paths).
pub fn local_host_id() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let machine = read("/etc/machine-id");
    let boot = read("/proc/sys/kernel/random/boot_id");
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!("{machine}/{boot}/{netns}")
}

/// Which error kinds are answers about the object rather than failures of a worker.
fn is_final(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::NotFound
            | ErrorKind::ContentChanged
            | ErrorKind::PermissionDenied
            | ErrorKind::InvalidInput
            | ErrorKind::IsADirectory
            | ErrorKind::NotADirectory
    )
}

pub struct Router {
    membership: Arc<dyn Membership>,
    opts: RouterOptions,
    /// Clients by worker id, with the member record they were made for (a worker that comes
    /// back at another address gets a new client).
    clients: Mutex<HashMap<String, (Member, Arc<WorkerClient>)>>,
    suspect: Mutex<HashMap<String, Instant>>,
}

impl Router {
    pub fn new(membership: Arc<dyn Membership>, mut opts: RouterOptions) -> Router {
        opts.candidates = opts.candidates.max(1);
        opts.group_size = opts.group_size.max(1);
        Router {
            membership,
            opts,
            clients: Mutex::new(HashMap::new()),
            suspect: Mutex::new(HashMap::new()),
        }
    }

    pub fn membership(&self) -> &Arc<dyn Membership> {
        &self.membership
    }

    /// Members of the current view that failed a call lately (tried last until
    /// `retry_after` has passed).
    pub fn suspect_count(&self) -> usize {
        let now = Instant::now();
        let view = self.membership.view();
        self.suspect
            .lock()
            .iter()
            .filter(|(id, until)| **until > now && view.get(id).is_some())
            .count()
    }

    /// Deadline of one call to one worker.
    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }

    pub fn group_size(&self) -> u64 {
        self.opts.group_size
    }

    /// The workers to try for group `group` of `object`, in order: placement rank, with
    /// workers that failed recently moved to the end.
    pub fn candidates(&self, object: ObjectId, group: u64) -> Vec<Member> {
        self.ranked(placement::key(object, group), self.opts.candidates)
    }

    /// The first `n` members of the view for placement key `key` in rendezvous order, with
    /// workers that failed recently moved to the end.
    pub(crate) fn ranked(&self, key: u64, n: usize) -> Vec<Member> {
        let view = self.membership.view();
        let mut c: Vec<Member> = placement::candidates(&view, key, n)
            .into_iter()
            .cloned()
            .collect();
        let mut suspect = self.suspect.lock();
        if !suspect.is_empty() {
            let now = Instant::now();
            suspect.retain(|_, until| *until > now);
            // Stable: keeps placement order among the healthy and among the suspects.
            c.sort_by_key(|m| suspect.contains_key(&m.id));
        }
        c
    }

    pub(crate) fn client(&self, m: &Member) -> Arc<WorkerClient> {
        let mut clients = self.clients.lock();
        if let Some((known, c)) = clients.get(&m.id) {
            if known == m {
                return c.clone();
            }
        }
        let endpoint = match &m.uds {
            Some(path)
                if self.opts.unix_socket
                    && m.host == self.opts.host_id
                    && std::path::Path::new(path).exists() =>
            {
                Endpoint::Unix(PathBuf::from(path))
            }
            _ => Endpoint::Tcp(m.addr.clone()),
        };
        let c = Arc::new(WorkerClient::new(endpoint, self.opts.key.clone()));
        clients.insert(m.id.clone(), (m.clone(), c.clone()));
        c
    }

    pub(crate) fn mark_failed(&self, m: &Member, e: &Error) {
        silt_common::warn_limited!(
            per: m.id,
            "worker failed; trying the next candidate",
            worker = %m.id,
            addr = %m.addr,
            error = %e
        );
        metrics::FAILOVERS.inc();
        self.suspect
            .lock()
            .insert(m.id.clone(), Instant::now() + self.opts.retry_after);
        if let Some((_, c)) = self.clients.lock().get(&m.id) {
            c.reset();
        }
    }

    /// One call to one worker, bounded by `deadline`; running out of time is a link failure.
    pub(crate) async fn attempt<T>(
        &self,
        m: &Member,
        deadline: Duration,
        call: impl std::future::Future<Output = std::result::Result<T, CallError>>,
    ) -> std::result::Result<T, CallError> {
        match tokio::time::timeout(deadline, call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Link(Error::new(
                ErrorKind::Timeout,
                format!(
                    "worker {} ({}) did not answer within {deadline:?}",
                    m.id, m.addr
                ),
            ))),
        }
    }

    /// Bytes `range` of one placement group of `obj`.
    async fn fetch_group(&self, obj: &ObjectRef, range: Range<u64>) -> Result<Bytes> {
        let group = range.start / self.opts.group_size;
        for m in self.candidates(obj.id, group) {
            let client = self.client(&m);
            metrics::REMOTE_READS.inc();
            match self
                .attempt(&m, self.opts.timeout, client.read(obj, range.clone()))
                .await
            {
                Ok(b) => return Ok(b),
                Err(CallError::Worker(e)) if is_final(e.kind()) => return Err(e),
                // The worker is alive but its store failed it: another worker would ask the
                // same store, so read it once ourselves; the worker stays trusted.
                Err(CallError::Worker(e)) => {
                    tracing::debug!(worker = %m.id, error = %e, "worker's store failed; reading it directly");
                    break;
                }
                Err(CallError::Link(e)) => self.mark_failed(&m, &e),
            }
        }
        metrics::FAILOVER_UFS_READS.inc();
        obj.store.read(&obj.meta.path, range, &obj.meta).await
    }

    /// Asks the owner of `range` of `obj`, bytes of one placement group (see [`split`]), to
    /// cache it (preload), trying the next candidates like reads. Returns the bytes the owner
    /// now holds for it. A load waits for the owner's store fetch, so its deadline is ten
    /// times a read's.
    pub async fn load(&self, obj: &ObjectRef, range: Range<u64>) -> Result<u64> {
        let answer::Held { bytes } = self.ask_owner(Request::load, obj, range, 10).await?;
        Ok(bytes)
    }

    /// Pins `range` of `obj` (one placement group) on its owner and loads it there, trying
    /// the next candidates like reads; the bytes the owner holds. Refused by an owner whose
    /// disk tiers cannot hold its pins.
    pub async fn pin(&self, obj: &ObjectRef, range: Range<u64>) -> Result<u64> {
        let answer::Held { bytes } = self.ask_owner(Request::pin, obj, range, 10).await?;
        Ok(bytes)
    }

    /// Unpins `obj` on every candidate of each of its groups (a pin lands on the first that
    /// answered, which may have changed since); whether any held a pin. Best effort: a
    /// worker that does not answer keeps its pin until it restarts.
    pub async fn unpin(&self, obj: &ObjectRef) -> bool {
        self.tell_all_candidates(Request::unpin, obj)
            .await
            .iter()
            .any(|a: &answer::Unpinned| a.unpinned > 0)
    }

    /// Drops `obj`'s pages (and pins) on every candidate of each of its groups (`silt fs
    /// free`). Best effort, like `unpin`.
    pub async fn free(&self, obj: &ObjectRef) {
        self.tell_all_candidates::<answer::Forgot>(Request::forget, obj)
            .await;
    }

    /// `make(obj)` asked of every candidate of each of `obj`'s groups; the answers of those
    /// that answered.
    async fn tell_all_candidates<A: Answer>(
        &self,
        make: fn(&ObjectRef) -> Request,
        obj: &ObjectRef,
    ) -> Vec<A> {
        let req = make(obj);
        let op = req.name();
        let mut members: HashMap<String, Member> = HashMap::new();
        for range in split(0..obj.size().max(1), self.opts.group_size) {
            for m in self.candidates(obj.id, range.start / self.opts.group_size) {
                members.entry(m.id.clone()).or_insert(m);
            }
        }
        let req = &req;
        let calls = members.into_values().map(|m| async move {
            let client = self.client(&m);
            let call = client.ask::<A>(req);
            match self.attempt(&m, self.opts.timeout, call).await {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::debug!(worker = %m.id, error = %e.into_error(), op, "not passed on");
                    None
                }
            }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Asks the first candidate of `range`'s group that answers to do `op` on it, with
    /// `deadline_reads` times a read's deadline.
    async fn ask_owner<A: Answer>(
        &self,
        make: fn(&ObjectRef, Range<u64>) -> Request,
        obj: &ObjectRef,
        range: Range<u64>,
        deadline_reads: u32,
    ) -> Result<A> {
        let req = make(obj, range.clone());
        let op = req.name();
        let group = range.start / self.opts.group_size;
        debug_assert!(
            range.is_empty() || (range.end - 1) / self.opts.group_size == group,
            "{op} of {range:?} spans placement groups"
        );
        let mut last = None;
        for m in self.candidates(obj.id, group) {
            let client = self.client(&m);
            let call = client.ask::<A>(&req);
            match self
                .attempt(&m, self.opts.timeout * deadline_reads, call)
                .await
            {
                Ok(v) => return Ok(v),
                Err(CallError::Worker(e)) => return Err(e),
                Err(CallError::Link(e)) => {
                    self.mark_failed(&m, &e);
                    last = Some(e);
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "{}: no worker could {op} bytes {range:?}{}",
                obj.meta.path,
                last.map(|e| format!(" (last: {e})")).unwrap_or_default()
            ),
        ))
    }

    /// Asks the owners of `obj`'s placement groups to start fetching what they do not hold,
    /// for a read coming soon: no bytes come back, each owner's admission decides as for a
    /// read, and it is not counted as a read there. Returns the pages they started. A hint:
    /// a group no worker answers for is skipped (logged).
    pub async fn prefetch(&self, obj: &ObjectRef) -> u64 {
        let mut started = 0;
        for range in split(0..obj.size(), self.opts.group_size) {
            match self.ask_owner(Request::prefetch, obj, range, 1).await {
                Ok(answer::Prefetched { pages }) => started += pages,
                Err(e) => tracing::debug!(path = %obj.meta.path, error = %e, "prefetch skipped"),
            }
        }
        started
    }

    /// How many pages of each object (id, size) the cluster holds, asking each placement
    /// group's first candidate, one batched call per worker, all workers at once. A worker
    /// that does not answer counts as holding nothing: this is a hint for ordering reads
    /// (`CacheAwareSampler`), never a promise.
    pub async fn cached_pages(&self, objects: &[(ObjectId, u64)], page_size: u64) -> Vec<u64> {
        self.cache_state(objects, page_size)
            .await
            .into_iter()
            .map(|(pages, _)| pages)
            .collect()
    }

    /// For each object (id, size): the pages the cluster holds (as `cached_pages`) and the
    /// bytes of it pinned on their owners (`silt fs pin`).
    pub async fn cache_state(
        &self,
        objects: &[(ObjectId, u64)],
        page_size: u64,
    ) -> Vec<(u64, u64)> {
        let page_size = page_size.max(1);
        // Per worker: (object's index, its pages).
        type Asked = Vec<(usize, PageRange)>;
        let mut asks: HashMap<String, (Member, Asked)> = HashMap::new();
        for (i, &(id, size)) in objects.iter().enumerate() {
            for range in split(0..size, self.opts.group_size) {
                let group = range.start / self.opts.group_size;
                let Some(owner) = self.candidates(id, group).into_iter().next() else {
                    continue;
                };
                let ask = PageRange {
                    object: id.to_hex(),
                    first: range.start / page_size,
                    last: (range.end - 1) / page_size,
                };
                asks.entry(owner.id.clone())
                    .or_insert_with(|| (owner, Vec::new()))
                    .1
                    .push((i, ask));
            }
        }
        let calls = asks.into_values().map(|(m, asked)| async move {
            let client = self.client(&m);
            let ranges = asked.iter().map(|(_, r)| r.clone()).collect();
            let r = self
                .attempt(&m, self.opts.timeout, client.cache_state(ranges))
                .await;
            match r {
                Ok(states) => asked
                    .into_iter()
                    .zip(states)
                    .map(|((i, _), (pages, pinned))| (i, pages, pinned))
                    .collect(),
                Err(e) => {
                    tracing::debug!(worker = %m.id, error = %e.into_error(), "no residency answer");
                    Vec::new()
                }
            }
        });
        let mut out = vec![(0u64, 0u64); objects.len()];
        for answer in futures::future::join_all(calls).await {
            for (i, pages, pinned) in answer {
                out[i].0 += pages;
                out[i].1 += pinned;
            }
        }
        out
    }

    /// Tells every worker of the view that namespace directory `dir` changed in the store
    /// (an attached client's write: the single node it attached to revalidates the
    /// directory). Best effort: a worker that does not answer revalidates when its sync
    /// policy says.
    pub async fn notify_changed(&self, dir: &str, change: crate::rpc::Change) {
        let view = self.membership.view();
        let calls = view.members.iter().map(|m| async move {
            let client = self.client(m);
            if let Err(e) = self
                .attempt(m, self.opts.timeout, client.changed(dir, change))
                .await
            {
                tracing::debug!(worker = %m.id, error = %e.into_error(), "change not passed on");
            }
        });
        futures::future::join_all(calls).await;
    }

    /// `stats` of every member of the current view (an error for those that do not answer).
    pub async fn worker_stats(&self) -> Vec<(Member, Result<answer::Stats>)> {
        let view = self.membership.view();
        let calls = view.members.iter().map(|m| async move {
            let client = self.client(m);
            let r = self
                .attempt(m, self.opts.timeout, client.stats())
                .await
                .map_err(CallError::into_error);
            (m.clone(), r)
        });
        futures::future::join_all(calls).await
    }
}

/// `range` cut at multiples of `group`.
pub fn split(range: Range<u64>, group: u64) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut start = range.start;
    while start < range.end {
        let end = ((start / group + 1) * group).min(range.end);
        out.push(start..end);
        start = end;
    }
    out
}

impl Router {
    /// The member that owns every placement group of `obj` first, if one does: only such a
    /// file is whole on one worker (a cluster of one, as an attached client's, owns them all).
    fn sole_owner(&self, obj: &ObjectRef) -> Option<Member> {
        if obj.size() == 0 {
            return None;
        }
        let owner = self.candidates(obj.id, 0).into_iter().next()?;
        // One view for every group; a view of one member (an attached client's) owns all.
        let view = self.membership.view();
        if view.members.len() > 1 {
            let groups = obj.size().div_ceil(self.opts.group_size);
            let shared = (1..groups).any(|g| {
                placement::candidates(&view, placement::key(obj.id, g), 1)
                    .first()
                    .is_none_or(|m| m.id != owner.id)
            });
            if shared {
                return None;
            }
        }
        Some(owner)
    }

    /// Asks the sole owner of `obj` for a local file (`what` names it in logs); `None` when
    /// there is none, it is not on this host, or it failed (then it is tried last from now on).
    async fn ask_sole_owner<T, F, Fut>(&self, obj: &ObjectRef, what: &str, ask: F) -> Option<T>
    where
        F: FnOnce(Arc<WorkerClient>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Option<T>, CallError>>,
    {
        let owner = self.sole_owner(obj)?;
        // `None` at once unless the owner is reached over its Unix socket.
        let answer = self
            .attempt(&owner, self.opts.timeout, ask(self.client(&owner)))
            .await;
        self.settle(&owner, what, answer)
    }

    /// What the sole owner's answer `answer` gave, `None` if it failed: a link failure marks
    /// it (tried last from now on, so the next call does not wait for it again).
    fn settle<T>(
        &self,
        owner: &Member,
        what: &str,
        answer: std::result::Result<Option<T>, CallError>,
    ) -> Option<T> {
        match answer {
            Ok(found) => found,
            Err(CallError::Link(e)) => {
                self.mark_failed(owner, &e);
                None
            }
            Err(CallError::Worker(e)) => {
                tracing::debug!(worker = %owner.id, error = %e, "no {what}");
                None
            }
        }
    }

    /// The object's own cache file on its same-host sole owner, pinned there while the
    /// lease lives; for readers that check pages themselves (no copy, unlike `hold`).
    pub async fn lease(&self, obj: &ObjectRef) -> Option<Lease> {
        self.ask_sole_owner(obj, "file lease", |c| async move { c.lease(obj).await })
            .await
    }

    /// Bytes `offset..offset + buf.len()` of `obj` into `buf`, from its sole owner on this
    /// host (an attached client's owner): read from the cache file the owner passes, or
    /// copied from its answer, with no page kept in this process. `false` (`buf` unspecified)
    /// when there is no such owner or it failed: the caller reads the usual way, which retries
    /// and fails over. Cut at placement groups (each one request), read side by side.
    pub async fn read_into(&self, obj: &ObjectRef, offset: u64, buf: &mut [u8]) -> bool {
        let Some(owner) = self.sole_owner(obj) else {
            return false;
        };
        let client = self.client(&owner);
        if !client.same_host() {
            return false;
        }
        let end = offset + buf.len() as u64;
        let mut rest = buf;
        let mut calls = Vec::new();
        for part in split(offset..end, self.opts.group_size) {
            let (head, tail) = rest.split_at_mut((part.end - part.start) as usize);
            rest = tail;
            metrics::REMOTE_READS.inc();
            let call = client.read_into(obj, part.start, head);
            calls.push(self.attempt(&owner, self.opts.timeout, call));
        }
        let read = futures::future::try_join_all(calls).await.map(|_| Some(()));
        self.settle(&owner, "read into a buffer", read).is_some()
    }
}

#[async_trait]
impl BackingSource for Router {
    async fn local_reader(&self, obj: &ObjectRef) -> Option<Box<dyn silt_reader::LocalRead>> {
        let lease = Router::lease(self, obj).await?;
        Some(Box::new(lease))
    }

    /// A file whole on one worker of this host is leased by it (a private copy) for passthrough.
    async fn lease_copy(&self, obj: &ObjectRef) -> Option<LeasedCopy> {
        self.ask_sole_owner(obj, "file lease (a copy)", |c| async move {
            c.lease_copy(obj).await
        })
        .await
    }

    async fn read_into(&self, obj: &ObjectRef, offset: u64, buf: &mut [u8]) -> bool {
        Router::read_into(self, obj, offset, buf).await
    }
}

#[async_trait]
impl Fetcher for Router {
    fn remote(&self) -> bool {
        true
    }

    async fn fetch(&self, obj: &ObjectRef, range: Range<u64>) -> Result<Bytes> {
        let parts = split(range, self.opts.group_size);
        if parts.len() == 1 {
            return self.fetch_group(obj, parts[0].clone()).await;
        }
        let got =
            futures::future::try_join_all(parts.into_iter().map(|r| self.fetch_group(obj, r)))
                .await?;
        let mut out = BytesMut::with_capacity(got.iter().map(Bytes::len).sum());
        for b in got {
            out.extend_from_slice(&b);
        }
        Ok(out.freeze())
    }

    /// Tells every worker in the view to drop the pages of a replaced version. Best effort:
    /// a worker that misses it keeps pages nobody can ask for until they are evicted.
    async fn forget(&self, obj: Arc<ObjectRef>) {
        let view = self.membership.view();
        let obj = obj.as_ref();
        let calls = view.members.iter().map(|m| async move {
            let client = self.client(m);
            let req = Request::forget(obj);
            let call = client.ask::<answer::Forgot>(&req);
            if let Err(e) = self.attempt(m, self.opts.timeout, call).await {
                tracing::debug!(worker = %m.id, "forget: {e}");
            }
        });
        futures::future::join_all(calls).await;
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_cuts_at_group_boundaries() {
        assert_eq!(split(0..10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(split(5..7, 4), vec![5..7]);
        assert_eq!(split(3..3, 4), Vec::<std::ops::Range<u64>>::new());
        assert_eq!(split(4..12, 4), vec![4..8, 8..12]);
    }
}
