//! The write arena: memory-first buffers for bytes written through Silt (files being written,
//! cache-only files such as shuffle output) that spill to disk under memory pressure.
//!
//! A [`WriteBuffer`] is a sparse sequence of chunks of `chunk_size` bytes; chunk `i` covers
//! `[i * chunk_size, (i + 1) * chunk_size)` and is either in memory or spilled to one of the
//! arena's spill tiers, where it lives at offset `i * chunk_size` of an anonymous file
//! (`tempfile_in`, so a crash leaves nothing behind) that the buffer holds per tier. A spilled
//! chunk is read and written in place; it never comes back to memory. An absent chunk reads
//! as zeros.
//!
//! Invariants:
//! - memory held by all buffers together never exceeds the ceiling: every memory chunk is
//!   counted as a whole `chunk_size`, reserved in the accounting before it is allocated and
//!   freed before the accounting gives it back (so `memory_peak` never passes the highest
//!   ceiling set; lowering the ceiling spills down to it before
//!   [`Arena::set_memory_ceiling`] returns);
//! - every acknowledged byte reads back until the last clone of its buffer drops: a failed
//!   write leaves the bytes of earlier writes untouched, and a spill copies a chunk to disk
//!   before the memory copy goes;
//! - nothing waits for room: when neither memory nor a spill tier can take a chunk the write
//!   fails at once with [`ErrorKind::NoSpace`] (`ENOSPC`);
//! - bytes of a chunk at or past the buffer's length are zero (new chunks start zeroed, a
//!   shrink zeroes the tail it cuts off, freed disk slots are punched or zeroed before reuse),
//!   so growing a buffer exposes zeros.
//!
//! Placement of a new chunk (see [`Arena`] for the limits): memory if the arena ceiling, the
//! buffer's per-file limit and its job's quota all have room. If the per-file limit or the job
//! quota is full, the new chunk goes straight to disk and the buffer keeps its older chunks in
//! memory (no churn of rewriting what is already resident). If only the ceiling is full, memory
//! chunks of buffers of strictly lower priority jobs are spilled to make room — lowest priority
//! first, oldest buffer first, lowest chunk index first — and the freed memory passes to the
//! writer under the same lock, so no other writer can take it in between; with no such victim
//! (or every candidate busy) the new chunk goes to disk. Disk means the first spill tier whose
//! quota has room.
//!
//! Locking: each buffer has its own `RwLock`, held for the whole of one operation on it
//! (including its disk I/O); the arena's accounting sits behind one `Mutex` that is only taken
//! for arithmetic, never across I/O. Order: buffer, then arena. A writer spilling another
//! buffer's chunk only `try_write`s the victim and skips it when busy, so two buffers never wait
//! on each other; [`Arena::set_memory_ceiling`] holds no buffer of its own and may wait for its
//! victims. Victims are found through per-job lists of the buffers that hold memory (weak
//! references, oldest first), so the search costs O(jobs + a few candidates).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use silt_common::config::{is_at_or_under, DiskTierSpec};
use silt_common::io::ReadAt;
use silt_common::metrics;
use silt_common::write::{JobSpec, DEFAULT_PRIORITY};
use silt_common::{Error, ErrorKind, Result};
use tracing::warn;

use crate::disk::punch_hole;

/// Largest buffer length: spill files are addressed with `off_t`.
const MAX_LEN: u64 = i64::MAX as u64;
/// Default largest file: S3's largest object (5 TiB).
pub const DEFAULT_MAX_FILE_SIZE: u64 = 5 << 40;
/// Largest chunk: one chunk is one allocation.
const MAX_CHUNK: u64 = 1 << 30;
/// Victim candidates examined per allocation that needs room.
const VICTIM_BATCH: usize = 16;

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Configuration of an [`Arena`].
#[derive(Debug, Clone)]
pub struct ArenaConfig {
    /// Allocation unit in bytes (Silt passes its page size).
    pub chunk_size: u64,
    /// All buffers together never hold more memory than this.
    pub memory_ceiling: u64,
    /// Memory one buffer may hold at priority 1; each priority level above adds half of it.
    pub file_memory: u64,
    /// Spill directories with their quotas, fastest first (created if missing).
    pub spill: Vec<DiskTierSpec>,
    /// Per-prefix memory quotas and priorities; the longest prefix containing a path wins.
    pub jobs: Vec<JobSpec>,
}

/// Usage of an [`Arena`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    pub memory_ceiling: u64,
    pub memory_used: u64,
    /// Highest `memory_used` since the arena opened.
    pub memory_peak: u64,
    /// Bytes of chunks on spill tiers now.
    pub spilled: u64,
    /// Sum of the spill tiers' quotas.
    pub spill_capacity: u64,
    /// Live buffers.
    pub buffers: u64,
    /// The configured jobs in configuration order, then the default job (prefix `""`,
    /// priority [`DEFAULT_PRIORITY`], `memory_quota` `u64::MAX`: no quota).
    pub jobs: Vec<JobStats>,
}

/// Usage of one job of an [`Arena`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStats {
    pub prefix: String,
    pub priority: u8,
    pub memory_quota: u64,
    pub memory_used: u64,
    pub spilled: u64,
}

/// Memory-first write buffers with per-job quotas and priorities, spilling to disk tiers.
///
/// Limits on a new memory chunk: the arena's `memory_ceiling`; the buffer's per-file limit,
/// `file_memory + (priority - 1) * file_memory / 2`; its job's `memory_quota`. A buffer belongs
/// to the job with the longest prefix containing its path, else to the default job (priority
/// [`DEFAULT_PRIORITY`], no job quota). Cheap to clone; clones share the arena.
#[derive(Clone)]
pub struct Arena {
    shared: Arc<Shared>,
}

struct Shared {
    chunk: u64,
    chunk_len: usize,
    file_memory: u64,
    tiers: Vec<DiskTierSpec>,
    /// Configured jobs, then the default job.
    jobs: Vec<JobInfo>,
    /// Job indices, lowest priority first: the order victims are looked for in.
    by_priority: Vec<usize>,
    /// Largest length a buffer may reach (`max_file_size`).
    max_len: std::sync::atomic::AtomicU64,
    /// Asked to free room on a spill tier's file system when a write there finds it full.
    reclaim: std::sync::OnceLock<Reclaim>,
    state: Mutex<State>,
}

/// Frees about `bytes` on the file system holding the directory given (cached pages giving
/// way to written data); whether it freed anything. Called with no arena lock held but the
/// writing buffer's: it must not write to the arena.
pub type Reclaim = Arc<dyn Fn(&std::path::Path, u64) -> bool + Send + Sync>;

struct JobInfo {
    prefix: String,
    priority: u8,
    quota: Option<u64>,
}

/// The arena's accounting; see the module documentation for the lock order.
struct State {
    ceiling: u64,
    memory_used: u64,
    memory_peak: u64,
    tier_used: Vec<u64>,
    buffers: u64,
    next_id: u64,
    jobs: Vec<JobUsage>,
}

#[derive(Default)]
struct JobUsage {
    memory: u64,
    spilled: u64,
    /// Buffers of the job holding memory chunks, oldest (lowest id) first: spill victims.
    resident: BTreeMap<u64, Weak<BufInner>>,
}

/// Which limits keep a new chunk out of memory.
#[derive(Clone, Copy, Default)]
struct Blocked {
    ceiling: bool,
    file: bool,
    job: bool,
}

impl Blocked {
    fn fits(self) -> bool {
        !(self.ceiling || self.file || self.job)
    }
}

impl State {
    fn memory_fit(&self, sh: &Shared, job: usize, own: u64, limit: u64) -> Blocked {
        let cs = sh.chunk;
        Blocked {
            ceiling: self.memory_used.saturating_add(cs) > self.ceiling,
            file: own.saturating_add(cs) > limit,
            job: sh.jobs[job]
                .quota
                .is_some_and(|q| self.jobs[job].memory.saturating_add(cs) > q),
        }
    }

    /// Counts one memory chunk for `buf`, which holds `own` bytes of memory so far.
    fn take_memory(&mut self, sh: &Shared, buf: &BufInner, own: u64) {
        self.memory_used += sh.chunk;
        self.memory_peak = self.memory_peak.max(self.memory_used);
        let job = &mut self.jobs[buf.job];
        job.memory += sh.chunk;
        if own == 0 {
            job.resident.insert(buf.id, buf.me.clone());
        }
    }

    fn release_memory(&mut self, job: usize, id: u64, bytes: u64, now_empty: bool) {
        self.memory_used = self.memory_used.saturating_sub(bytes);
        let job = &mut self.jobs[job];
        job.memory = job.memory.saturating_sub(bytes);
        if now_empty {
            job.resident.remove(&id);
        }
    }

    /// Reserves one chunk on the first spill tier with room.
    fn take_disk(&mut self, sh: &Shared, job: usize) -> Option<usize> {
        let t = (0..sh.tiers.len())
            .find(|&t| self.tier_used[t].saturating_add(sh.chunk) <= sh.tiers[t].quota)?;
        self.tier_used[t] += sh.chunk;
        self.jobs[job].spilled += sh.chunk;
        Some(t)
    }

    fn give_disk(&mut self, job: usize, tier: usize, bytes: u64) {
        self.tier_used[tier] = self.tier_used[tier].saturating_sub(bytes);
        let job = &mut self.jobs[job];
        job.spilled = job.spilled.saturating_sub(bytes);
    }

    /// Up to [`VICTIM_BATCH`] buffers holding memory whose job's priority is below `below`,
    /// lowest priority first, oldest first. The caller must drop them after releasing the
    /// arena lock (dropping the last reference runs the buffer's `Drop`, which takes it).
    fn victims(&self, sh: &Shared, below: u8) -> Vec<Arc<BufInner>> {
        let mut out = Vec::new();
        for &j in &sh.by_priority {
            if sh.jobs[j].priority >= below {
                break;
            }
            if self.jobs[j].memory == 0 {
                continue;
            }
            for w in self.jobs[j].resident.values() {
                if let Some(b) = w.upgrade() {
                    out.push(b);
                    if out.len() >= VICTIM_BATCH {
                        return out;
                    }
                }
            }
        }
        out
    }

    fn no_space(&self, sh: &Shared, blocked: Blocked, buf: &BufInner) -> Error {
        let mut memory = Vec::new();
        if blocked.ceiling {
            memory.push(format!(
                "memory ceiling ({} of {} bytes in use)",
                self.memory_used, self.ceiling
            ));
        }
        if blocked.file {
            memory.push(format!("per-file memory limit of {} bytes", buf.limit));
        }
        if blocked.job {
            let job = &sh.jobs[buf.job];
            memory.push(format!(
                "memory quota of job {} ({} bytes)",
                job.prefix,
                job.quota.unwrap_or(u64::MAX)
            ));
        }
        let disk = if sh.tiers.is_empty() {
            "no spill tier is configured".to_string()
        } else {
            let tiers: Vec<String> = sh
                .tiers
                .iter()
                .zip(&self.tier_used)
                .map(|(t, used)| format!("{}: {used} of {} bytes", t.dir.display(), t.quota))
                .collect();
            format!("every spill tier is full ({})", tiers.join(", "))
        };
        Error::new(
            ErrorKind::NoSpace,
            format!(
                "no room for a {}-byte chunk of {}: {} reached and {disk}",
                sh.chunk,
                buf.path,
                memory.join(", ")
            ),
        )
    }
}

impl Arena {
    /// Validates the configuration and creates the spill directories.
    pub fn open(cfg: ArenaConfig) -> Result<Arena> {
        if cfg.chunk_size == 0 || cfg.chunk_size > MAX_CHUNK {
            return Err(Error::invalid(format!(
                "write arena: chunk_size must be 1 byte to 1 GiB, got {}",
                cfg.chunk_size
            )));
        }
        let chunk_len = usize::try_from(cfg.chunk_size)
            .map_err(|_| Error::invalid("write arena: chunk_size does not fit in memory"))?;
        let mut jobs = Vec::with_capacity(cfg.jobs.len() + 1);
        for j in &cfg.jobs {
            if !(1..=9).contains(&j.priority) {
                return Err(Error::invalid(format!(
                    "write job {}: priority must be 1 (lowest) to 9, got {}",
                    j.prefix, j.priority
                )));
            }
            jobs.push(JobInfo {
                prefix: j.prefix.clone(),
                priority: j.priority,
                quota: Some(j.memory_quota),
            });
        }
        jobs.push(JobInfo {
            prefix: String::new(),
            priority: DEFAULT_PRIORITY,
            quota: None,
        });
        for t in &cfg.spill {
            silt_common::private::create_dir(&t.dir).map_err(|e| {
                io_error(e, format!("creating spill directory {}", t.dir.display()))
            })?;
            // Fails now rather than at the first spill if the directory is unusable.
            tempfile::tempfile_in(&t.dir).map_err(|e| {
                io_error(
                    e,
                    format!("creating a file in spill directory {}", t.dir.display()),
                )
            })?;
        }
        let mut by_priority: Vec<usize> = (0..jobs.len()).collect();
        by_priority.sort_by_key(|&j| jobs[j].priority);
        let state = State {
            ceiling: cfg.memory_ceiling,
            memory_used: 0,
            memory_peak: 0,
            tier_used: vec![0; cfg.spill.len()],
            buffers: 0,
            next_id: 0,
            jobs: jobs.iter().map(|_| JobUsage::default()).collect(),
        };
        Ok(Arena {
            shared: Arc::new(Shared {
                chunk: cfg.chunk_size,
                chunk_len,
                file_memory: cfg.file_memory,
                tiers: cfg.spill,
                jobs,
                by_priority,
                max_len: std::sync::atomic::AtomicU64::new(DEFAULT_MAX_FILE_SIZE),
                reclaim: std::sync::OnceLock::new(),
                state: Mutex::new(state),
            }),
        })
    }

    /// What frees room when a spill file's file system is full (once; later calls are
    /// ignored): the page store's disk tiers there, so written data wins over cached pages.
    pub fn set_reclaim(&self, reclaim: Reclaim) {
        let _ = self.shared.reclaim.set(reclaim);
    }

    /// Sets the largest length a buffer may reach (at most `i64::MAX`): a write or truncate
    /// past it fails with [`ErrorKind::FileTooLarge`] (`EFBIG`), before anything changes.
    pub fn set_max_file_size(&self, bytes: u64) {
        self.shared
            .max_len
            .store(bytes.min(MAX_LEN), std::sync::atomic::Ordering::Relaxed);
    }

    pub fn max_file_size(&self) -> u64 {
        self.shared
            .max_len
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A new empty buffer for the file at `path` (a normalised namespace path).
    pub fn buffer(&self, path: &str) -> WriteBuffer {
        let sh = &self.shared;
        let job = sh.jobs[..sh.jobs.len() - 1]
            .iter()
            .enumerate()
            .filter(|(_, j)| is_at_or_under(path, &j.prefix))
            // Longest prefix wins; among equal ones the first configured.
            .min_by_key(|(i, j)| (std::cmp::Reverse(j.prefix.len()), *i))
            .map_or(sh.jobs.len() - 1, |(i, _)| i);
        let priority = sh.jobs[job].priority;
        let limit = sh.file_memory.saturating_add(
            u64::from(priority.saturating_sub(1)).saturating_mul(sh.file_memory / 2),
        );
        let id = {
            let mut s = sh.state.lock();
            s.buffers += 1;
            s.next_id += 1;
            s.next_id
        };
        let inner = Arc::new_cyclic(|me| BufInner {
            shared: sh.clone(),
            me: me.clone(),
            id,
            job,
            priority,
            limit,
            path: path.to_string(),
            state: RwLock::new(BufState {
                len: 0,
                chunks: BTreeMap::new(),
                in_memory: BTreeSet::new(),
                disk_chunks: 0,
                files: (0..sh.tiers.len()).map(|_| None).collect(),
                stale: HashSet::new(),
            }),
        });
        WriteBuffer { inner }
    }

    /// Sets the memory ceiling. When usage is above it, memory chunks are spilled (lowest
    /// priority first, oldest buffer first) until usage is at or below it before returning;
    /// `memory_peak` stays the highest usage seen (a lowered ceiling does not rewrite it). If the spill tiers are full the
    /// memory stays (no byte is dropped) and a warning is logged; usage then falls as buffers
    /// drop, and a later call tries again.
    pub fn set_memory_ceiling(&self, bytes: u64) {
        let sh = &*self.shared;
        sh.state.lock().ceiling = bytes;
        let over = || {
            let s = sh.state.lock();
            s.memory_used > s.ceiling
        };
        'rounds: while over() {
            let victims = sh.state.lock().victims(sh, u8::MAX);
            let mut progressed = false;
            for v in &victims {
                // Blocking is safe: this thread holds no other buffer.
                let mut vs = v.state.write();
                while over() {
                    match v.spill_one(&mut vs, |_| ()) {
                        Ok(Some(())) => progressed = true,
                        Ok(None) => break,
                        Err(e) => {
                            warn!(
                                "write arena: cannot spill down to the memory ceiling of {bytes} bytes: {e}"
                            );
                            break 'rounds;
                        }
                    }
                }
            }
            // Victims holding no memory any more, or only buffers being dropped (whose memory
            // goes back as they finish): nothing more to do here.
            if !progressed {
                break;
            }
        }
    }

    pub fn stats(&self) -> ArenaStats {
        let sh = &*self.shared;
        let s = sh.state.lock();
        ArenaStats {
            memory_ceiling: s.ceiling,
            memory_used: s.memory_used,
            memory_peak: s.memory_peak,
            spilled: s.tier_used.iter().sum(),
            spill_capacity: sh.tiers.iter().fold(0u64, |a, t| a.saturating_add(t.quota)),
            buffers: s.buffers,
            jobs: sh
                .jobs
                .iter()
                .zip(&s.jobs)
                .map(|(info, usage)| JobStats {
                    prefix: info.prefix.clone(),
                    priority: info.priority,
                    memory_quota: info.quota.unwrap_or(u64::MAX),
                    memory_used: usage.memory,
                    spilled: usage.spilled,
                })
                .collect(),
        }
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("chunk_size", &self.shared.chunk)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Bytes of one file being written: memory first, spilled to disk under pressure. Clones
/// share the same bytes; when the last clone drops, its memory and disk space go back to the
/// arena.
#[derive(Clone)]
pub struct WriteBuffer {
    inner: Arc<BufInner>,
}

struct BufInner {
    shared: Arc<Shared>,
    /// This buffer, for the arena's victim lists.
    me: Weak<BufInner>,
    id: u64,
    job: usize,
    priority: u8,
    /// Per-file memory limit.
    limit: u64,
    path: String,
    state: RwLock<BufState>,
}

struct BufState {
    len: u64,
    chunks: BTreeMap<u64, Chunk>,
    /// Indices of the memory chunks, in spill order.
    in_memory: BTreeSet<u64>,
    disk_chunks: u64,
    /// One anonymous spill file per tier, created on first use.
    files: Vec<Option<File>>,
    /// Disk slots freed without a hole punch: they may hold old bytes, so are zeroed before
    /// they are used again.
    stale: HashSet<(usize, u64)>,
}

enum Chunk {
    /// Always `chunk_size` bytes.
    Mem(Box<[u8]>),
    /// On this spill tier, at `index * chunk_size` of the buffer's file there.
    Disk(usize),
}

enum Place {
    Mem,
    Disk(usize),
}

impl WriteBuffer {
    /// Writes `data` at `offset`; a gap before `offset` reads as zeros. Fails with
    /// [`ErrorKind::NoSpace`] when a chunk it needs fits neither in memory nor on any spill
    /// tier; a failed write leaves the bytes of earlier writes intact (what it wrote itself
    /// into chunks that already existed may have changed).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let b = &*self.inner;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= b.max_len())
            .ok_or_else(|| b.too_large(format!("writing {} bytes at {offset}", data.len())))?;
        let cs = b.shared.chunk;
        let mut st = b.state.write();
        // Every chunk is placed before any byte is copied, so running out of room changes no
        // byte of the buffer.
        let mut fresh = Vec::new();
        for idx in offset / cs..=(end - 1) / cs {
            if st.chunks.contains_key(&idx) {
                continue;
            }
            match b.place(&mut st, idx) {
                Ok(Place::Mem) => {
                    st.chunks.insert(
                        idx,
                        Chunk::Mem(vec![0u8; b.shared.chunk_len].into_boxed_slice()),
                    );
                    st.in_memory.insert(idx);
                }
                Ok(Place::Disk(t)) => {
                    st.chunks.insert(idx, Chunk::Disk(t));
                    st.disk_chunks += 1;
                }
                Err(e) => {
                    b.free_chunks(&mut st, &fresh);
                    return Err(e);
                }
            }
            fresh.push(idx);
        }
        if let Err(e) = b.copy_in(&mut st, offset, data) {
            b.free_chunks(&mut st, &fresh);
            return Err(e.context(format!(
                "writing {} bytes at {offset} of {}",
                data.len(),
                b.path
            )));
        }
        st.len = st.len.max(end);
        Ok(())
    }

    /// Exactly `len` bytes at `offset`; an error if `offset + len` is past [`Self::len`].
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        let b = &*self.inner;
        let st = b.state.read();
        let end = offset.checked_add(len as u64).filter(|&e| e <= st.len);
        if end.is_none() {
            return Err(Error::invalid(format!(
                "reading {len} bytes at {offset} of {} ({} bytes)",
                b.path, st.len
            )));
        }
        let cs = b.shared.chunk;
        let mut out = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let pos = offset + done as u64;
            let idx = pos / cs;
            let within = (pos % cs) as usize;
            let n = (len - done).min(b.shared.chunk_len - within);
            let dst = &mut out[done..done + n];
            match st.chunks.get(&idx) {
                None => {}
                Some(Chunk::Mem(m)) => dst.copy_from_slice(&m[within..within + n]),
                Some(Chunk::Disk(t)) => {
                    let f = st.files.get(*t).and_then(Option::as_ref).ok_or_else(|| {
                        Error::internal(format!("{}: spilled chunk {idx} has no file", b.path))
                    })?;
                    read_padded(f, dst, pos).map_err(|e| {
                        io_error(
                            e,
                            format!("reading {n} spilled bytes at {pos} of {}", b.path),
                        )
                    })?;
                }
            }
            done += n;
        }
        Ok(Bytes::from(out))
    }

    pub fn len(&self) -> u64 {
        self.inner.state.read().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Truncates or extends. Shrinking frees the chunks wholly past the new end and zeroes
    /// the cut-off tail of the last one; growing adds a gap of zeros.
    pub fn set_len(&self, len: u64) -> Result<()> {
        let b = &*self.inner;
        if len > b.max_len() {
            return Err(b.too_large(format!("truncating to {len} bytes")));
        }
        let cs = b.shared.chunk;
        let mut st = b.state.write();
        if len >= st.len {
            st.len = len;
            return Ok(());
        }
        let within = len % cs;
        if within != 0 {
            let idx = len / cs;
            // Bytes past the old length are zero already.
            let upto = st.len.saturating_sub(idx * cs).min(cs);
            let st = &mut *st;
            match st.chunks.get_mut(&idx) {
                None => {}
                Some(Chunk::Mem(m)) => m[within as usize..upto as usize].fill(0),
                Some(Chunk::Disk(t)) => {
                    let f = st.files.get(*t).and_then(Option::as_ref).ok_or_else(|| {
                        Error::internal(format!("{}: spilled chunk {idx} has no file", b.path))
                    })?;
                    zero_range(f, idx * cs + within, upto - within).map_err(|e| {
                        io_error(e, format!("truncating {} to {len} bytes", b.path))
                    })?;
                }
            }
        }
        let gone = st.chunks.split_off(&len.div_ceil(cs));
        b.release(&mut st, gone);
        st.len = len;
        Ok(())
    }

    /// Memory held now (whole chunks).
    pub fn memory_bytes(&self) -> u64 {
        self.inner.state.read().in_memory.len() as u64 * self.inner.shared.chunk
    }

    /// Bytes on spill tiers now (whole chunks).
    pub fn spilled_bytes(&self) -> u64 {
        self.inner.state.read().disk_chunks * self.inner.shared.chunk
    }
}

impl ReadAt for WriteBuffer {
    fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        WriteBuffer::read_at(self, offset, len)
    }

    /// No chunk of the range was ever written (or all were truncated away).
    fn is_hole(&self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let cs = self.inner.shared.chunk;
        let last = offset.saturating_add(len - 1) / cs;
        self.inner
            .state
            .read()
            .chunks
            .range(offset / cs..=last)
            .next()
            .is_none()
    }

    /// The start of the next chunk ever written (or `end`).
    fn hole_end(&self, offset: u64, end: u64) -> u64 {
        let cs = self.inner.shared.chunk;
        let next = self
            .inner
            .state
            .read()
            .chunks
            .range(offset / cs..)
            .next()
            .map(|(i, _)| *i);
        match next {
            None => end.max(offset),
            Some(i) => i.saturating_mul(cs).clamp(offset, end.max(offset)),
        }
    }
}

impl fmt::Debug for WriteBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteBuffer")
            .field("path", &self.inner.path)
            .field("priority", &self.inner.priority)
            .finish_non_exhaustive()
    }
}

impl BufInner {
    fn max_len(&self) -> u64 {
        self.shared
            .max_len
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn too_large(&self, what: String) -> Error {
        Error::new(
            ErrorKind::FileTooLarge,
            format!(
                "{}: {what}: past the largest file size, {} bytes (max_file_size)",
                self.path,
                self.max_len()
            ),
        )
    }

    /// Finds room for new chunk `idx` of this buffer (whose lock the caller holds) and
    /// reserves it; for disk, the slot is ready to be written.
    fn place(&self, st: &mut BufState, idx: u64) -> Result<Place> {
        let sh = &*self.shared;
        let own = st.in_memory.len() as u64 * sh.chunk;
        let (blocked, victims) = {
            let mut s = sh.state.lock();
            let blocked = s.memory_fit(sh, self.job, own, self.limit);
            if blocked.fits() {
                s.take_memory(sh, self, own);
                return Ok(Place::Mem);
            }
            let victims = if blocked.file || blocked.job {
                Vec::new()
            } else {
                s.victims(sh, self.priority)
            };
            (blocked, victims)
        };
        for v in &victims {
            // Never wait on another buffer while holding this one.
            let Some(mut vs) = v.state.try_write() else {
                continue;
            };
            let took = v.spill_one(&mut vs, |s| {
                let fit = s.memory_fit(sh, self.job, own, self.limit);
                if fit.fits() {
                    s.take_memory(sh, self, own);
                }
                fit.fits()
            });
            match took {
                Ok(Some(true)) => return Ok(Place::Mem),
                // Memory went back but is not ours to take (the ceiling or a quota moved).
                Ok(Some(false)) => break,
                Ok(None) => {}
                // Spill tiers full: this chunk cannot go to disk either.
                Err(e) if e.kind() == ErrorKind::NoSpace => break,
                Err(e) => {
                    silt_common::warn_limited!(
                        "write arena: spilling part of a file failed",
                        path = %v.path,
                        error = %e
                    )
                }
            }
        }
        // Dropped with no arena lock held: the last reference runs the buffer's `Drop`.
        drop(victims);
        let tier = {
            let mut s = sh.state.lock();
            match s.take_disk(sh, self.job) {
                Some(t) => t,
                None => {
                    metrics::WRITE_NOSPACE.inc();
                    return Err(s.no_space(sh, blocked, self));
                }
            }
        };
        if let Err(e) = self.prepare_disk_slot(st, tier, idx) {
            sh.state.lock().give_disk(self.job, tier, sh.chunk);
            return Err(e);
        }
        metrics::WRITE_SPILLED_BYTES.add(sh.chunk);
        Ok(Place::Disk(tier))
    }

    /// Makes disk slot `idx` of `tier` read as zeros.
    fn prepare_disk_slot(&self, st: &mut BufState, tier: usize, idx: u64) -> Result<()> {
        let f = self.spill_file(&mut st.files, tier)?;
        if st.stale.contains(&(tier, idx)) {
            let cs = self.shared.chunk;
            zero_range(f, idx * cs, cs)
                .map_err(|e| io_error(e, format!("clearing a spill slot of {}", self.path)))?;
            st.stale.remove(&(tier, idx));
        }
        Ok(())
    }

    fn spill_file<'a>(&self, files: &'a mut [Option<File>], tier: usize) -> Result<&'a File> {
        let slot = files
            .get_mut(tier)
            .ok_or_else(|| Error::internal(format!("no spill tier {tier}")))?;
        if slot.is_none() {
            let dir = &self.shared.tiers[tier].dir;
            let f = tempfile::tempfile_in(dir)
                .map_err(|e| io_error(e, format!("creating a spill file in {}", dir.display())))?;
            *slot = Some(f);
        }
        slot.as_ref()
            .ok_or_else(|| Error::internal("spill file vanished"))
    }

    /// Moves this buffer's lowest memory chunk to disk (the caller holds this buffer's lock),
    /// then releases its memory and runs `then` under the same arena lock. `None` when the
    /// buffer holds no memory; `NoSpace` when no spill tier has room.
    fn spill_one<R>(
        &self,
        st: &mut BufState,
        then: impl FnOnce(&mut State) -> R,
    ) -> Result<Option<R>> {
        let sh = &*self.shared;
        let cs = sh.chunk;
        let Some(&idx) = st.in_memory.first() else {
            return Ok(None);
        };
        let tier = sh
            .state
            .lock()
            .take_disk(sh, self.job)
            .ok_or_else(|| Error::new(ErrorKind::NoSpace, "every spill tier is full"))?;
        if let Err(e) = self.write_out(st, idx, tier) {
            sh.state.lock().give_disk(self.job, tier, cs);
            return Err(e);
        }
        let old = st.chunks.insert(idx, Chunk::Disk(tier));
        st.in_memory.remove(&idx);
        st.disk_chunks += 1;
        // Free the memory before the accounting says it is free.
        drop(old);
        metrics::WRITE_SPILLED_BYTES.add(cs);
        let mut s = sh.state.lock();
        s.release_memory(self.job, self.id, cs, st.in_memory.is_empty());
        Ok(Some(then(&mut s)))
    }

    /// Copies memory chunk `idx` to its slot on `tier`.
    fn write_out(&self, st: &mut BufState, idx: u64, tier: usize) -> Result<()> {
        let cs = self.shared.chunk;
        let start = idx * cs;
        // Past the length the chunk is zero, and so is a slot that is not stale.
        let stale = st.stale.contains(&(tier, idx));
        let n = if stale {
            self.shared.chunk_len
        } else {
            st.len.saturating_sub(start).min(cs) as usize
        };
        let f = self.spill_file(&mut st.files, tier)?;
        let Some(Chunk::Mem(m)) = st.chunks.get(&idx) else {
            return Err(Error::internal(format!(
                "{}: chunk {idx} is not in memory",
                self.path
            )));
        };
        self.shared
            .write_spill(f, tier, &m[..n], start)
            .map_err(|e| io_error(e, format!("spilling {n} bytes of {}", self.path)))?;
        st.stale.remove(&(tier, idx));
        Ok(())
    }

    /// Copies `data` into the chunks at `offset`, which all exist.
    fn copy_in(&self, st: &mut BufState, offset: u64, data: &[u8]) -> Result<()> {
        let cs = self.shared.chunk;
        let mut done = 0;
        while done < data.len() {
            let pos = offset + done as u64;
            let idx = pos / cs;
            let within = (pos % cs) as usize;
            let n = (data.len() - done).min(self.shared.chunk_len - within);
            let src = &data[done..done + n];
            match st.chunks.get_mut(&idx) {
                Some(Chunk::Mem(m)) => m[within..within + n].copy_from_slice(src),
                Some(Chunk::Disk(t)) => {
                    let t = *t;
                    let f = st.files.get(t).and_then(Option::as_ref).ok_or_else(|| {
                        Error::internal(format!("spilled chunk {idx} has no file"))
                    })?;
                    self.shared
                        .write_spill(f, t, src, pos)
                        .map_err(|e| io_error(e, "writing to a spill file"))?;
                }
                None => return Err(Error::internal(format!("chunk {idx} was not placed"))),
            }
            done += n;
        }
        Ok(())
    }

    fn free_chunks(&self, st: &mut BufState, idxs: &[u64]) {
        let gone = idxs
            .iter()
            .filter_map(|i| st.chunks.remove(i).map(|c| (*i, c)))
            .collect();
        self.release(st, gone);
    }

    /// Gives removed chunks back: memory freed, disk slots punched (or marked stale).
    fn release(&self, st: &mut BufState, gone: BTreeMap<u64, Chunk>) {
        if gone.is_empty() {
            return;
        }
        let cs = self.shared.chunk;
        let mut memory = 0;
        let mut disk = vec![0u64; self.shared.tiers.len()];
        for (idx, chunk) in gone {
            match chunk {
                Chunk::Mem(m) => {
                    st.in_memory.remove(&idx);
                    memory += cs;
                    drop(m);
                }
                Chunk::Disk(t) => {
                    st.disk_chunks = st.disk_chunks.saturating_sub(1);
                    disk[t] += cs;
                    let punched = st.files[t]
                        .as_ref()
                        .is_some_and(|f| punch_hole(f, idx * cs, cs).is_ok());
                    if !punched {
                        st.stale.insert((t, idx));
                    }
                }
            }
        }
        let mut s = self.shared.state.lock();
        s.release_memory(self.job, self.id, memory, st.in_memory.is_empty());
        for (t, bytes) in disk.into_iter().enumerate() {
            if bytes > 0 {
                s.give_disk(self.job, t, bytes);
            }
        }
    }
}

impl Drop for BufInner {
    fn drop(&mut self) {
        let cs = self.shared.chunk;
        let st = self.state.get_mut();
        let memory = st.in_memory.len() as u64 * cs;
        let mut disk = vec![0u64; self.shared.tiers.len()];
        for chunk in st.chunks.values() {
            if let Chunk::Disk(t) = chunk {
                disk[*t] += cs;
            }
        }
        // Free memory and close (so delete) the spill files before the accounting says so.
        st.chunks.clear();
        st.in_memory.clear();
        st.files.clear();
        let mut s = self.shared.state.lock();
        s.release_memory(self.job, self.id, memory, true);
        for (t, bytes) in disk.into_iter().enumerate() {
            s.give_disk(self.job, t, bytes);
        }
        s.buffers = s.buffers.saturating_sub(1);
    }
}

impl Shared {
    /// Writes `data` at `pos` of a spill file on tier `tier`; a full file system (`ENOSPC`,
    /// `EDQUOT`) is first given back room by `reclaim`, then written once more.
    fn write_spill(&self, f: &File, tier: usize, data: &[u8], pos: u64) -> io::Result<()> {
        match f.write_all_at(data, pos) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) => {
                let freed = match (self.reclaim.get(), self.tiers.get(tier)) {
                    (Some(r), Some(t)) => r(&t.dir, self.chunk.max(data.len() as u64) * 4),
                    _ => false,
                };
                if !freed {
                    return Err(e);
                }
                f.write_all_at(data, pos)
            }
            r => r,
        }
    }
}

/// `ENOSPC` and `EDQUOT` are [`ErrorKind::NoSpace`].
fn io_error(e: io::Error, context: impl fmt::Display) -> Error {
    let err = if e.raw_os_error() == Some(libc::EDQUOT) {
        Error::new(ErrorKind::NoSpace, e.to_string()).with_source(e)
    } else {
        Error::from(e)
    };
    err.context(context)
}

/// Fills `buf` from `offset`; what lies past the end of the file reads as zeros (`buf` must
/// come zeroed).
fn read_padded(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match FileExt::read_at(f, &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes `[offset, offset + len)` read as zeros: a hole where the file system can punch
/// one, written zeros otherwise.
fn zero_range(f: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 || punch_hole(f, offset, len).is_ok() {
        return Ok(());
    }
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ZEROS.len() as u64) as usize;
        f.write_all_at(&ZEROS[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = 4096;

    fn arena(dir: &std::path::Path, ceiling: u64) -> Arena {
        Arena::open(ArenaConfig {
            chunk_size: CS,
            memory_ceiling: ceiling,
            file_memory: 16 * CS,
            spill: vec![DiskTierSpec {
                dir: dir.to_path_buf(),
                quota: 16 * CS,
            }],
            jobs: vec![],
        })
        .unwrap()
    }

    /// Leaves old bytes in disk slot 0 of `b` and marks it stale, as a failed hole punch would.
    fn dirty_slot(b: &WriteBuffer) {
        let mut st = b.inner.state.write();
        let f = b.inner.spill_file(&mut st.files, 0).unwrap();
        f.write_all_at(&[0xAA; CS as usize], 0).unwrap();
        st.stale.insert((0, 0));
    }

    #[test]
    fn stale_disk_slots_are_zeroed_before_reuse() {
        let dir = tempfile::tempdir().unwrap();
        // A new chunk placed straight on disk.
        let a = arena(dir.path(), 0);
        let b = a.buffer("/x");
        dirty_slot(&b);
        b.write_at(10, b"z").unwrap();
        assert_eq!(b.spilled_bytes(), CS);
        b.set_len(CS).unwrap();
        let back = b.read_at(0, CS as usize).unwrap();
        assert!(back
            .iter()
            .enumerate()
            .all(|(i, &x)| x == if i == 10 { b'z' } else { 0 }));
        assert!(b.inner.state.read().stale.is_empty());

        // A memory chunk spilled onto a stale slot.
        let a = arena(dir.path(), CS);
        let b = a.buffer("/y");
        b.write_at(0, b"abc").unwrap();
        dirty_slot(&b);
        a.set_memory_ceiling(0);
        assert_eq!((b.memory_bytes(), b.spilled_bytes()), (0, CS));
        b.set_len(CS).unwrap();
        let back = b.read_at(0, CS as usize).unwrap();
        assert_eq!(&back[..3], b"abc");
        assert!(back[3..].iter().all(|&x| x == 0));
    }
}
