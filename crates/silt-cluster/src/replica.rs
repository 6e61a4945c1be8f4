//! Cache-only files replicated to workers (`cache_only_replicas = N > 0`).
//!
//! A cluster client's cache-only file is kept by N workers instead of the writing process:
//! the ones ranked first for the file's namespace path by rendezvous hashing over the live
//! members ([`path_key`], the placement code of page groups). [`Replicas`] is the client
//! side (`silt_resident::ResidentRemote`), [`ResidentTable`] the worker side: the
//! files in a `silt_resident::Resident` table, their bytes in a memory-first
//! `silt_cache::Arena` that spills to disk (never evicted, like the writing client's).
//!
//! - **put**: sent to the first N workers in parallel; a worker that fails on the link is
//!   replaced by the next in rank, so a dead worker still in the view (a static list, or
//!   before its lease expires) does not fail writes while N others live. The first answer
//!   that is an error fails the put, as does running out of workers before N acknowledged.
//!   Not atomic: the workers that acknowledged before a failure keep the new version.
//! - **read**: the workers in rank order (suspects last); a worker that lacks the version or
//!   fails is skipped, like `Router::fetch` fails over for pages.
//! - **stat**: asks workers in rank order, N at a time, until N of them answered; the newest
//!   version found wins.
//! - **list** and **delete**: every member of the view (a file may sit beyond its first N
//!   after failovers); workers that do not answer are skipped (their copies are unreachable,
//!   and a delete they missed comes back with them).

use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use silt_cache::{Arena, WriteBuffer};
use silt_common::clock::Clock;
use silt_common::io::ReadAt;
use silt_common::{Error, ErrorKind, Result};
use silt_resident::{RemoteMeta, Residence, Resident, ResidentData, ResidentFile, ResidentRemote};
use silt_ufs::{EntryKind, ObjectMeta};

use crate::membership::Member;
use crate::router::Router;
use crate::rpc::{CallError, WireResident, MAX_RANGE};

/// Seed of [`path_key`], so path keys and page-group keys are unrelated.
const PATH_SEED: u64 = 0x5117_cac0_0000_0001;

/// The placement key of the replicated file at namespace path `path`.
pub fn path_key(path: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(path.as_bytes(), PATH_SEED)
}

/// Newest first: by modification time, then tag (tags grow with the writer's clock).
fn newer(a: &RemoteMeta, b: &RemoteMeta) -> bool {
    (a.mtime, &a.tag) > (b.mtime, &b.tag)
}

// ---- worker side -------------------------------------------------------------------------

/// The replicated cache-only files a worker keeps.
pub struct ResidentTable {
    arena: Arena,
    files: Resident,
    clock: Clock,
    pub(crate) bytes_served: AtomicU64,
}

impl ResidentTable {
    pub fn new(arena: Arena) -> ResidentTable {
        ResidentTable {
            arena,
            files: Resident::new(Clock::system()),
            clock: Clock::system(),
            bytes_served: AtomicU64::new(0),
        }
    }

    /// A buffer for a file arriving at `path`.
    pub(crate) fn buffer(&self, path: &str) -> WriteBuffer {
        self.arena.buffer(path)
    }

    pub(crate) fn insert(&self, path: String, w: WireResident, buf: WriteBuffer) {
        let (_, m) = w.into_meta();
        let file = ResidentFile {
            meta: ObjectMeta {
                path: path.clone(),
                kind: EntryKind::File,
                size: m.size,
                mtime: m.mtime,
                etag: Some(m.tag),
                version: None,
                mode: None,
                posix: Default::default(),
            },
            data: ResidentData::Buffer(buf),
            residence: Residence::CacheOnly {
                expires: m.expires_in.map(|d| self.clock.now() + d),
            },
            // Replicas keep bytes, not S3 headers (docs/SEMANTICS.md).
            headers: None,
        };
        self.files.insert(path, file);
    }

    /// Version `tag` of the file at `path`.
    pub(crate) fn get(&self, path: &str, tag: &str) -> Result<Arc<ResidentFile>> {
        match self.files.get(path) {
            Some(f) if f.meta.etag.as_deref() == Some(tag) => Ok(f),
            Some(_) => Err(Error::new(
                ErrorKind::ContentChanged,
                format!("{path}: this worker holds another version"),
            )),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("{path}: not kept by this worker"),
            )),
        }
    }

    fn wire(&self, path: &str, f: &ResidentFile) -> WireResident {
        let now = self.clock.now();
        let expires_in = match f.residence {
            Residence::CacheOnly { expires: Some(at) } => Some(at.saturating_duration_since(now)),
            _ => None,
        };
        let meta = RemoteMeta {
            size: f.meta.size,
            tag: f.meta.etag.clone().unwrap_or_default(),
            mtime: f.meta.mtime,
            expires_in,
        };
        WireResident::from_meta(path, &meta)
    }

    pub(crate) fn stat(&self, path: &str) -> Option<WireResident> {
        self.files.get(path).map(|f| self.wire(path, &f))
    }

    pub(crate) fn list(&self, dir: &str) -> Vec<WireResident> {
        self.files
            .below(dir)
            .iter()
            .map(|(p, f)| self.wire(p, f))
            .collect()
    }

    pub(crate) fn delete(&self, path: &str) -> bool {
        self.files.remove(path).is_some()
    }

    /// (files, bytes) kept now.
    pub fn usage(&self) -> (u64, u64) {
        let (c, cb, _, _) = self.files.usage();
        (c, cb)
    }

    /// Drops expired files every `every` (their memory and spill space go back).
    pub async fn sweep_forever(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let n = self.files.sweep();
            if n > 0 {
                tracing::debug!(files = n, "expired cache-only files dropped");
            }
        }
    }
}

// ---- client side -------------------------------------------------------------------------

/// The workers of a cluster as the keepers of cache-only files, `n` replicas each.
pub struct Replicas {
    router: Arc<Router>,
    n: usize,
}

impl Replicas {
    pub fn new(router: Arc<Router>, n: usize) -> Replicas {
        Replicas {
            router,
            n: n.max(1),
        }
    }

    /// Every member, in rank order for `path` (recent failures last).
    fn ranked(&self, path: &str) -> Vec<Member> {
        self.router.ranked(path_key(path), usize::MAX)
    }

    /// A put's deadline: ten calls' worth, plus one per 16 MiB.
    fn put_deadline(&self, size: u64) -> Duration {
        self.router.timeout() * (10 + u32::try_from(size >> 24).unwrap_or(u32::MAX / 2))
    }

    async fn read_range(&self, path: &str, tag: &str, range: Range<u64>) -> Result<Bytes> {
        let (mut answered, mut last) = (false, None);
        for m in self.ranked(path) {
            let client = self.router.client(&m);
            let call = client.resident_get(path, tag, range.clone());
            match self.router.attempt(&m, self.router.timeout(), call).await {
                Ok(b) => return Ok(b),
                Err(CallError::Worker(e)) => {
                    answered = true;
                    last = Some(e);
                }
                Err(CallError::Link(e)) => {
                    self.router.mark_failed(&m, &e);
                    last = Some(e);
                }
            }
        }
        let why = last.map(|e| format!(" (last: {e})")).unwrap_or_default();
        Err(if answered {
            Error::new(
                ErrorKind::ContentChanged,
                format!("{path}: no worker holds the version read any more{why}"),
            )
        } else {
            Error::new(
                ErrorKind::Unavailable,
                format!("{path}: no worker keeping it answered{why}"),
            )
        })
    }
}

#[async_trait]
impl ResidentRemote for Replicas {
    async fn put(&self, path: &str, meta: &RemoteMeta, data: &dyn ReadAt) -> Result<()> {
        let mut next = self.ranked(path).into_iter();
        let deadline = self.put_deadline(meta.size);
        let (mut acked, mut last) = (0, None);
        while acked < self.n {
            let batch: Vec<Member> = next.by_ref().take(self.n - acked).collect();
            if batch.is_empty() {
                break;
            }
            let calls = batch.iter().map(|m| async move {
                let client = self.router.client(m);
                let call = client.resident_put(path, meta, data);
                (m, self.router.attempt(m, deadline, call).await)
            });
            for (m, r) in futures::future::join_all(calls).await {
                match r {
                    Ok(()) => acked += 1,
                    Err(CallError::Worker(e)) => {
                        return Err(e.context(format!("worker {} keeping a replica", m.id)))
                    }
                    Err(CallError::Link(e)) => {
                        self.router.mark_failed(m, &e);
                        last = Some(e);
                    }
                }
            }
        }
        if acked < self.n {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {acked} of the {} workers asked to keep it acknowledged{}",
                    self.n,
                    last.map(|e| format!(" (last: {e})")).unwrap_or_default()
                ),
            ));
        }
        Ok(())
    }

    async fn read(&self, path: &str, tag: &str, range: Range<u64>) -> Result<Bytes> {
        if range.end.saturating_sub(range.start) <= MAX_RANGE {
            return self.read_range(path, tag, range).await;
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        let mut at = range.start;
        while at < range.end {
            let end = (at + MAX_RANGE).min(range.end);
            out.extend_from_slice(&self.read_range(path, tag, at..end).await?);
            at = end;
        }
        Ok(out.freeze())
    }

    async fn stat(&self, path: &str) -> Result<Option<RemoteMeta>> {
        let mut next = self.ranked(path).into_iter();
        let (mut answered, mut found, mut last) = (0, None::<RemoteMeta>, None);
        while answered < self.n {
            let batch: Vec<Member> = next.by_ref().take(self.n - answered).collect();
            if batch.is_empty() {
                break;
            }
            let calls = batch.iter().map(|m| async move {
                let client = self.router.client(m);
                let call = client.resident_stat(path);
                (m, self.router.attempt(m, self.router.timeout(), call).await)
            });
            for (m, r) in futures::future::join_all(calls).await {
                match r {
                    Ok(got) => {
                        answered += 1;
                        if let Some(g) = got {
                            if found.as_ref().is_none_or(|f| newer(&g, f)) {
                                found = Some(g);
                            }
                        }
                    }
                    Err(CallError::Worker(e)) => {
                        answered += 1;
                        last = Some(e);
                    }
                    Err(CallError::Link(e)) => {
                        self.router.mark_failed(m, &e);
                        last = Some(e);
                    }
                }
            }
            if found.is_some() {
                break;
            }
        }
        if found.is_none() && answered == 0 {
            if let Some(e) = last {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{path}: no worker answered (last: {e})"),
                ));
            }
        }
        Ok(found)
    }

    async fn list(&self, dir: &str) -> Result<Vec<(String, RemoteMeta)>> {
        let view = self.router.membership().view();
        let calls = view.members.iter().map(|m| async move {
            let client = self.router.client(m);
            let call = client.resident_list(dir);
            (m, self.router.attempt(m, self.router.timeout(), call).await)
        });
        let mut merged: std::collections::BTreeMap<String, RemoteMeta> = Default::default();
        let (mut answered, mut last) = (false, None);
        for (m, r) in futures::future::join_all(calls).await {
            match r {
                Ok(files) => {
                    answered = true;
                    for (p, meta) in files {
                        if merged.get(&p).is_none_or(|old| newer(&meta, old)) {
                            merged.insert(p, meta);
                        }
                    }
                }
                Err(CallError::Worker(e)) => last = Some(e),
                Err(CallError::Link(e)) => {
                    self.router.mark_failed(m, &e);
                    last = Some(e);
                }
            }
        }
        if !answered {
            if let Some(e) = last {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{dir}: no worker listed its cache-only files (last: {e})"),
                ));
            }
        }
        Ok(merged.into_iter().collect())
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let view = self.router.membership().view();
        let calls = view.members.iter().map(|m| async move {
            let client = self.router.client(m);
            let call = client.resident_delete(path);
            (m, self.router.attempt(m, self.router.timeout(), call).await)
        });
        let (mut answered, mut last) = (false, None);
        for (m, r) in futures::future::join_all(calls).await {
            match r {
                Ok(_) => answered = true,
                Err(CallError::Worker(e)) => return Err(e),
                Err(CallError::Link(e)) => {
                    tracing::warn!(worker = %m.id, path, "deleting a cache-only replica: {e}");
                    self.router.mark_failed(m, &e);
                    last = Some(e);
                }
            }
        }
        match (answered, last) {
            (false, Some(e)) => Err(Error::new(
                ErrorKind::Unavailable,
                format!("{path}: no worker answered a delete (last: {e})"),
            )),
            _ => Ok(()),
        }
    }
}
