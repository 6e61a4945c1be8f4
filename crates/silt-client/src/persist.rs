//! Background uploads of `back` files: each logged file (`wal.rs`) is uploaded once it is
//! `upload_delay` old, at most `UPLOADS` at a time and never two of one path at once (so the
//! store ends with the newest). A failed upload is retried with backoff (1 s doubling to
//! 1 min) and its reason shown (`silt fs status`); `persist` uploads now and waits.
//!
//! Invariant: a log record is removed only after the store acknowledged its upload, or after
//! a newer write or a delete of its path made it obsolete.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use silt_common::config::is_at_or_under;
use silt_common::{metrics, Error, Result};
use silt_ufs::{DynStore, ObjectMeta};
use tokio::sync::{watch, Notify};

use crate::resident::Residence;
use crate::wal::{LogRecord, Wal};
use crate::Client;
use crate::Clock;

/// Uploads in flight at once.
const UPLOADS: usize = 8;
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Final states remembered for `status` (then forgotten, oldest first).
const REMEMBERED: usize = 100_000;

/// Where a `back` file stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum FileState {
    /// Durable in the log, upload not started (or waiting for a retry).
    Pending {
        bytes: u64,
    },
    Uploading {
        bytes: u64,
    },
    /// In the store; dropped from the log.
    Persisted,
    /// The last attempt failed; retried with backoff.
    Failed {
        reason: String,
        attempts: u32,
    },
    /// Not a `back` file this process knows of.
    Unknown,
}

struct Job {
    rec: LogRecord,
    store: DynStore,
    rel: String,
    file: Arc<File>,
    due: Instant,
    attempts: u32,
    last_error: Option<String>,
}

#[derive(Default)]
struct State {
    queued: BTreeMap<u64, Job>,
    /// Path → (seq, bytes) of its upload in flight.
    in_flight: HashMap<String, (u64, u64)>,
    /// In-flight uploads whose record became obsolete meanwhile.
    cancelled: HashSet<u64>,
    /// Paths whose uploads may not start now (a write to the store of the path is running).
    held: HashMap<String, usize>,
    done: HashMap<String, FileState>,
    done_order: std::collections::VecDeque<String>,
    recovered: Vec<(LogRecord, File)>,
}

pub struct Persister {
    wal: Wal,
    delay: Duration,
    clock: Clock,
    state: Mutex<State>,
    wake: Notify,
    /// Bumped whenever an upload ends (either way); `persist` waits on it.
    ended: watch::Sender<u64>,
}

impl Persister {
    pub fn open(dir: &Path, delay: Duration, clock: Clock) -> Result<Arc<Persister>> {
        let (wal, recovered) = Wal::open(dir)?;
        if !recovered.is_empty() {
            tracing::info!(
                files = recovered.len(),
                "write-ahead log: acknowledged files not yet uploaded are queued again"
            );
        }
        Ok(Arc::new(Persister {
            wal,
            delay,
            clock,
            state: Mutex::new(State {
                recovered,
                ..State::default()
            }),
            wake: Notify::new(),
            ended: watch::channel(0).0,
        }))
    }

    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    /// The records recovered at open (newest per path only), once.
    pub fn take_recovered(&self) -> Vec<(LogRecord, File)> {
        let recs = std::mem::take(&mut self.state.lock().recovered);
        let mut newest: HashMap<String, u64> = HashMap::new();
        for (r, _) in &recs {
            newest.insert(r.path.clone(), r.seq);
        }
        recs.into_iter()
            .filter(|(r, _)| {
                let keep = newest.get(&r.path) == Some(&r.seq);
                if !keep {
                    self.wal.remove(r.seq);
                }
                keep
            })
            .collect()
    }

    /// Queues the upload of a logged file.
    pub fn enqueue(&self, rec: LogRecord, store: DynStore, rel: String, file: Arc<File>) {
        let due = self.clock.now() + self.delay;
        let mut st = self.state.lock();
        st.done.remove(&rec.path);
        st.queued.insert(
            rec.seq,
            Job {
                rec,
                store,
                rel,
                file,
                due,
                attempts: 0,
                last_error: None,
            },
        );
        drop(st);
        self.wake.notify_one();
    }

    /// Record `seq` is obsolete (its path was written again or removed): not uploaded if not
    /// started; if in flight, its record goes once it ends.
    pub fn cancel(&self, seq: u64) {
        let mut st = self.state.lock();
        if st.queued.remove(&seq).is_some() {
            drop(st);
            self.wal.remove(seq);
            // A `persist` waiting for it has its answer.
            self.ended.send_modify(|n| *n += 1);
            return;
        }
        if st.in_flight.values().any(|&(s, _)| s == seq) {
            st.cancelled.insert(seq);
        }
    }

    /// Keeps uploads of `path` from starting while the guard lives, then waits for one in
    /// flight: a write of the path to the store, made meanwhile, is then never overtaken by an
    /// older `back` version.
    pub async fn hold(self: &Arc<Self>, path: &str) -> HoldGuard {
        *self.state.lock().held.entry(path.to_string()).or_insert(0) += 1;
        let guard = HoldGuard {
            p: self.clone(),
            path: path.to_string(),
        };
        self.settle(path).await;
        guard
    }

    /// Waits until no upload of `path` is in flight (a write to the store must not be
    /// overtaken by an older upload of the same path).
    pub async fn settle(&self, path: &str) {
        let mut rx = self.ended.subscribe();
        while self.state.lock().in_flight.contains_key(path) {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    pub fn status(&self, path: &str) -> FileState {
        let st = self.state.lock();
        if let Some(&(_, bytes)) = st.in_flight.get(path) {
            return FileState::Uploading { bytes };
        }
        if let Some(j) = st.queued.values().find(|j| j.rec.path == path) {
            return job_state(j);
        }
        st.done.get(path).cloned().unwrap_or(FileState::Unknown)
    }

    /// Paths at or below `path` with a queued or in-flight upload.
    pub fn pending_under(&self, path: &str) -> Vec<String> {
        let st = self.state.lock();
        let mut v: Vec<String> = st
            .queued
            .values()
            .map(|j| j.rec.path.clone())
            .chain(st.in_flight.keys().cloned())
            .filter(|p| is_at_or_under(p, path))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Starts the uploads of `paths` now and waits until each is persisted or its attempt
    /// failed; their states.
    pub async fn persist(&self, paths: &[String]) -> Vec<(String, FileState)> {
        let mut rx = self.ended.subscribe();
        let now = self.clock.now();
        let mut attempts: HashMap<String, u32> = HashMap::new();
        {
            let mut st = self.state.lock();
            for j in st.queued.values_mut() {
                if paths.contains(&j.rec.path) {
                    j.due = now;
                    attempts.insert(j.rec.path.clone(), j.attempts);
                }
            }
        }
        self.wake.notify_one();
        loop {
            let states: Vec<(String, FileState)> = {
                let st = self.state.lock();
                paths
                    .iter()
                    .map(|p| {
                        let queued = st.queued.values().find(|j| &j.rec.path == p);
                        let busy = st.in_flight.contains_key(p);
                        let s = match queued {
                            // Tried since we asked and failed: that is the answer.
                            Some(j)
                                if !busy && j.attempts > attempts.get(p).copied().unwrap_or(0) =>
                            {
                                job_state(j)
                            }
                            Some(_) => FileState::Uploading { bytes: 0 },
                            None if busy => FileState::Uploading { bytes: 0 },
                            None => st.done.get(p).cloned().unwrap_or(FileState::Unknown),
                        };
                        (p.clone(), s)
                    })
                    .collect()
            };
            if states
                .iter()
                .all(|(_, s)| !matches!(s, FileState::Uploading { .. }))
            {
                return states;
            }
            if rx.changed().await.is_err() {
                return states;
            }
        }
    }

    /// Jobs due now that may start (their path has no upload in flight), marked in flight;
    /// and when the next one is due.
    fn take_ready(&self, free: usize) -> (Vec<Job>, Option<Instant>) {
        let now = self.clock.now();
        let mut st = self.state.lock();
        let mut ready = Vec::new();
        let mut next: Option<Instant> = None;
        let seqs: Vec<u64> = st.queued.keys().copied().collect();
        for seq in seqs {
            let Some(j) = st.queued.get(&seq) else {
                continue;
            };
            // A held path waits for its guard (whose drop wakes the loop).
            if st.in_flight.contains_key(&j.rec.path) || st.held.contains_key(&j.rec.path) {
                continue;
            }
            if j.due > now {
                next = Some(next.map_or(j.due, |n| n.min(j.due)));
                continue;
            }
            if ready.len() >= free {
                break;
            }
            if let Some(j) = st.queued.remove(&seq) {
                st.in_flight.insert(j.rec.path.clone(), (seq, j.rec.len));
                ready.push(j);
            }
        }
        (ready, next)
    }

    fn remember(&self, st: &mut State, path: String, s: FileState) {
        if st.done.insert(path.clone(), s).is_none() {
            st.done_order.push_back(path);
            while st.done_order.len() > REMEMBERED {
                if let Some(p) = st.done_order.pop_front() {
                    st.done.remove(&p);
                }
            }
        }
    }
}

/// See [`Persister::hold`].
pub struct HoldGuard {
    p: Arc<Persister>,
    path: String,
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        let mut st = self.p.state.lock();
        if let Some(n) = st.held.get_mut(&self.path) {
            *n -= 1;
            if *n == 0 {
                st.held.remove(&self.path);
            }
        }
        drop(st);
        self.p.wake.notify_one();
    }
}

fn job_state(j: &Job) -> FileState {
    match &j.last_error {
        Some(reason) => FileState::Failed {
            reason: reason.clone(),
            attempts: j.attempts,
        },
        None => FileState::Pending { bytes: j.rec.len },
    }
}

fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(6).saturating_sub(1)).min(MAX_BACKOFF)
}

impl Client {
    /// Background work of a writing client: uploads `back` files and drops expired
    /// cache-only files. Runs until the runtime stops; spawn it once.
    pub async fn run_background(self: Arc<Self>) {
        let Some(p) = self.writes.back.clone() else {
            // Only the TTL sweep.
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                self.writes.resident.sweep();
            }
        };
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut last_sweep = Instant::now();
        loop {
            let free = UPLOADS.saturating_sub(running.load(std::sync::atomic::Ordering::SeqCst));
            let (jobs, next) = p.take_ready(free);
            for job in jobs {
                running.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (client, p, running) = (self.clone(), p.clone(), running.clone());
                tokio::spawn(async move {
                    client.upload(&p, job).await;
                    running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    p.wake.notify_one();
                });
            }
            if last_sweep.elapsed() > Duration::from_secs(30) {
                self.writes.resident.sweep();
                last_sweep = Instant::now();
            }
            // Scheduling, not synchronisation: wake when told or when the next job is due.
            let wait = next
                .map(|n| n.saturating_duration_since(self.opts.clock.now()))
                .unwrap_or(Duration::from_secs(30))
                .min(Duration::from_secs(30));
            tokio::select! {
                _ = p.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn upload(&self, p: &Persister, job: Job) {
        let result = match &job.rec.headers {
            None => {
                job.store
                    .write_from(&job.rel, job.file.as_ref(), job.rec.len)
                    .await
            }
            // A gateway upload's headers go with it.
            Some(h) => {
                job.store
                    .write_from_attrs(
                        &job.rel,
                        job.file.as_ref(),
                        job.rec.len,
                        &silt_ufs::SetAttrs::default(),
                        Some(h),
                    )
                    .await
            }
        };
        let seq = job.rec.seq;
        let path = job.rec.path.clone();
        match result {
            Ok(meta) => {
                let cancelled = p.state.lock().cancelled.remove(&seq);
                if !cancelled {
                    self.persisted(&job, meta);
                }
                p.wal.remove(seq);
                metrics::WRITE_PERSISTED.inc();
                let mut st = p.state.lock();
                st.in_flight.remove(&path);
                p.remember(&mut st, path, FileState::Persisted);
            }
            Err(e) => {
                metrics::WRITE_PERSIST_FAILURES.inc();
                silt_common::warn_limited!(
                    "upload of a back file failed; will retry",
                    path = %path,
                    error = %e
                );
                let mut st = p.state.lock();
                st.in_flight.remove(&path);
                if st.cancelled.remove(&seq) {
                    drop(st);
                    p.wal.remove(seq);
                } else {
                    let attempts = job.attempts + 1;
                    st.queued.insert(
                        seq,
                        Job {
                            due: self.opts.clock.now() + backoff(attempts),
                            attempts,
                            last_error: Some(e.to_string()),
                            ..job
                        },
                    );
                }
            }
        }
        p.ended.send_modify(|n| *n += 1);
    }

    /// The store has the file: it stops being resident, its metadata becomes the store's
    /// version and its pages are cached from the log record.
    fn persisted(&self, job: &Job, meta: ObjectMeta) {
        let seq = job.rec.seq;
        let gone = self
            .writes
            .resident
            .remove_if(&job.rec.path, |f| f.residence == Residence::Back { seq });
        if gone.is_none() {
            return;
        }
        // Stamped after the removal: a listing that started before it still saw the resident
        // version, and must not win over this record.
        let at = self.opts.clock.now();
        let entry = self.record_written(&job.rec.path, &job.rel, &job.store, at, meta);
        if entry.size == job.rec.len {
            if let Some(obj) = &entry.object {
                self.cache_written(obj.id, job.file.as_ref(), job.rec.len);
            }
        }
    }

    /// Uploads the `back` files at or below `path` now and waits for each; their states.
    pub async fn persist(&self, path: &str) -> Result<Vec<(String, FileState)>> {
        let path = Self::normalize(path)?;
        let Some(p) = &self.writes.back else {
            return Err(Error::new(
                silt_common::ErrorKind::Unsupported,
                "no write-ahead log: this client does not write back",
            ));
        };
        let paths = p.pending_under(&path);
        if paths.is_empty() {
            return Ok(vec![(path.clone(), p.status(&path))]);
        }
        Ok(p.persist(&paths).await)
    }

    /// The state of a `back` file, or of each pending one below a directory.
    pub fn persist_status(&self, path: &str) -> Result<Vec<(String, FileState)>> {
        let path = Self::normalize(path)?;
        let Some(p) = &self.writes.back else {
            return Ok(vec![(path, FileState::Unknown)]);
        };
        let pending = p.pending_under(&path);
        if pending.is_empty() || pending == [path.clone()] {
            return Ok(vec![(path.clone(), p.status(&path))]);
        }
        Ok(pending
            .into_iter()
            .map(|q| {
                let s = p.status(&q);
                (q, s)
            })
            .collect())
    }
}
