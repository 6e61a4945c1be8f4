//! `silt-bench shuffle`: benchmark B5 (shuffle) and the write-throughput comparison of B5.
//!
//! Modes (each prints one JSON object on stdout):
//!
//! * `dir --dir DIR`: the shuffle on a directory with plain file I/O, one OS thread per writer
//!   and per reader (a tmpfs, or Silt's mount): `writers` writers each write `partitions` files
//!   `DIR/wWWW/pPPP` of `part_size` bytes, one `write` per file; then `readers` readers read
//!   partition columns (reader `r`: partitions `r`, `r + readers`, ... of every writer), each
//!   file whole, and check every byte.
//! * `client --write-type cache-only`: the same shuffle in-process through `silt_client`, set
//!   up as `silt up` sets up its client (page store with a memory tier and a disk tier, a
//!   worker, the write arena spilling into the disk tier's `spill` directory), over the store
//!   `--store` mounted at `/data`: writer and reader tasks on a 4-thread runtime (the daemon's
//!   size), `create` + `write_at` + `commit`, then `open` + `read`. Cache-only files never reach
//!   the store. The directories are made first (`mkdir`, as the dir mode does), so creating
//!   a file asks the store nothing. Also reports the arena's memory peak, the bytes spilled,
//!   the process's peak RSS and the time spent in `create`, `write_at` and `commit`.
//! * `client --write-type through|back`: `files` files of `file_size` bytes written through
//!   `silt_client` to the store, `concurrency` at a time: `through` is done when every commit
//!   (the upload) returned; `back` is acknowledged when every commit returned (each file in
//!   the write-ahead log, fsynced) and done when `persist` of the directory returned (every
//!   file uploaded). Objects are checked (size) and deleted afterwards, untimed.
//! * `direct`: the same files uploaded with `UnderStore::write_from` (multipart in 8 MiB parts,
//!   as Silt uploads), `concurrency` at a time, from memory: the baseline of `through` and
//!   `back`.
//!
//! Data: every file is a distinct window of one random pool (file `i` starts `16 * i` bytes
//! in), so nothing is generated while timed and every byte depends on its file and offset.
//! The store's endpoint and keys come from `SILT_S3_*` / `AWS_*`, as for `silt`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use serde::Serialize;
use silt_cache::{PageStore, PageStoreConfig};
use silt_client::{Client, ClientOptions, FileState, MountPoint, Namespace, WriteSetup};
use silt_common::config::Config;
use silt_common::write::WriteType;
use silt_reader::{PageReader, PageReaderOptions};
use silt_ufs::{DynStore, S3Options};

/// Where the client mounts the store.
const MOUNT: &str = "/data";
/// Bytes between the starts of two files' windows of the pattern pool.
const STRIDE: usize = 16;

/// The shuffle's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub writers: usize,
    pub partitions: usize,
    pub part_size: usize,
    pub readers: usize,
    /// Bytes per `write_at`/`read` call in client mode (dir mode writes and reads a file whole).
    pub io_chunk: usize,
}

impl Shape {
    pub fn total_bytes(&self) -> u64 {
        (self.writers * self.partitions * self.part_size) as u64
    }

    /// The index of writer `w`'s partition `p` (its window of the pool).
    pub fn index(&self, w: usize, p: usize) -> usize {
        w * self.partitions + p
    }

    /// `(writer, partition)` of every file reader `r` reads, in order: partitions `r`,
    /// `r + readers`, ... of every writer.
    pub fn reader_files(&self, r: usize) -> Vec<(usize, usize)> {
        (r..self.partitions)
            .step_by(self.readers.max(1))
            .flat_map(|p| (0..self.writers).map(move |w| (w, p)))
            .collect()
    }

    /// Relative path of writer `w`'s partition `p`.
    pub fn rel(w: usize, p: usize) -> String {
        format!("w{w:03}/p{p:03}")
    }
}

/// Files of one size, each a distinct window of one random pool.
pub struct Pattern {
    pool: Bytes,
    size: usize,
}

impl Pattern {
    /// `count` files of `size` bytes, from a pool seeded with `seed`.
    pub fn new(size: usize, count: usize, seed: u64) -> Pattern {
        let len = size + count * STRIDE;
        let mut v = Vec::with_capacity(len + 8);
        let mut x = seed | 1;
        while v.len() < len {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        v.truncate(len);
        Pattern {
            pool: Bytes::from(v),
            size,
        }
    }

    /// File `i`'s bytes (no copy).
    pub fn file(&self, i: usize) -> Bytes {
        self.pool.slice(i * STRIDE..i * STRIDE + self.size)
    }
}

/// What a shuffle measured.
#[derive(Debug, Default, Serialize)]
pub struct ShuffleResult {
    pub mode: String,
    pub write_type: Option<String>,
    pub writers: usize,
    pub partitions: usize,
    pub part_size: usize,
    pub readers: usize,
    /// Bytes read back (= bytes written).
    pub bytes: u64,
    pub write_s: f64,
    pub read_s: f64,
    /// 2 × bytes ÷ (write_s + read_s) ÷ 10⁹: every byte moved twice, over the whole shuffle.
    pub gbps: f64,
    pub write_gbps: f64,
    pub read_gbps: f64,
    /// Client mode: the arena's ceiling, its peak, the bytes it held on disk after the writes
    /// and the most it held at once on disk (sampled after the writes and after the reads).
    pub memory_ceiling: Option<u64>,
    pub memory_peak: Option<u64>,
    pub spilled: Option<u64>,
    /// Peak resident set of this process (VmHWM).
    pub peak_rss: Option<u64>,
    /// Requests sent to the under-store during the shuffle (client mode).
    pub store_requests: Option<u64>,
    /// Bytes in the memory tier (the read cache) at the end (client mode).
    pub read_cache_used: Option<u64>,
    /// Client mode: where the writers' time went.
    pub write_phases: Option<PhaseSeconds>,
}

impl ShuffleResult {
    fn new(mode: &str, shape: &Shape, bytes: u64, write_s: f64, read_s: f64) -> ShuffleResult {
        ShuffleResult {
            mode: mode.to_string(),
            writers: shape.writers,
            partitions: shape.partitions,
            part_size: shape.part_size,
            readers: shape.readers,
            bytes,
            write_s,
            read_s,
            gbps: 2.0 * bytes as f64 / (write_s + read_s) / 1e9,
            write_gbps: bytes as f64 / write_s / 1e9,
            read_gbps: bytes as f64 / read_s / 1e9,
            ..ShuffleResult::default()
        }
    }
}

/// What an upload run measured.
#[derive(Debug, Serialize)]
pub struct UploadResult {
    pub mode: String,
    pub write_type: Option<String>,
    pub files: usize,
    pub file_size: usize,
    pub concurrency: usize,
    pub bytes: u64,
    /// Until every write was acknowledged (`back`: logged; otherwise uploaded).
    pub ack_s: f64,
    /// Until every file was in the store.
    pub persist_s: f64,
    /// bytes ÷ persist_s ÷ 10⁹.
    pub gbps: f64,
    /// bytes ÷ ack_s ÷ 10⁹.
    pub ack_gbps: f64,
    pub store_requests: u64,
    /// Store requests answered with an error (a "not found" for a new name counts: creating a
    /// file asks whether it exists) and failed upload attempts of `back` files (each retried
    /// after a backoff of 1 s, doubling).
    pub store_errors: u64,
    pub persist_failures: u64,
    pub peak_rss: Option<u64>,
    /// Client mode: where the writers' time went (until acknowledged).
    pub write_phases: Option<PhaseSeconds>,
}

/// The shuffle on a directory with plain file I/O (module docs).
pub fn shuffle_dir(root: &Path, shape: &Shape, seed: u64) -> Result<ShuffleResult> {
    let pat = Pattern::new(shape.part_size, shape.writers * shape.partitions, seed);
    let t = Instant::now();
    write_dir(root, shape, &pat)?;
    let write_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let bytes = read_dir(root, shape, &pat)?;
    let read_s = t.elapsed().as_secs_f64();
    let mut r = ShuffleResult::new("dir", shape, bytes, write_s, read_s);
    r.peak_rss = peak_rss();
    Ok(r)
}

/// The writers of the dir shuffle: a thread each, one `write` per file.
fn write_dir(root: &Path, shape: &Shape, pat: &Pattern) -> Result<()> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..shape.writers)
            .map(|w| {
                s.spawn(move || -> Result<()> {
                    let dir = root.join(format!("w{w:03}"));
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    for p in 0..shape.partitions {
                        let path = root.join(Shape::rel(w, p));
                        std::fs::write(&path, pat.file(shape.index(w, p)))
                            .with_context(|| format!("writing {}", path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        let mut first = Ok(());
        for h in handles {
            let r = h
                .join()
                .map_err(|_| anyhow::anyhow!("a writer panicked"))
                .and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

/// The readers of the dir shuffle: a thread each, every file read whole and checked; the
/// bytes read.
fn read_dir(root: &Path, shape: &Shape, pat: &Pattern) -> Result<u64> {
    let bytes = std::thread::scope(|s| -> Result<u64> {
        let handles: Vec<_> = (0..shape.readers)
            .map(|r| {
                s.spawn(move || -> Result<u64> {
                    let mut n = 0u64;
                    for (w, p) in shape.reader_files(r) {
                        let path = root.join(Shape::rel(w, p));
                        let got = std::fs::read(&path)
                            .with_context(|| format!("reading {}", path.display()))?;
                        ensure!(
                            got[..] == pat.file(shape.index(w, p))[..],
                            "{} read back other bytes ({} bytes, expected {})",
                            path.display(),
                            got.len(),
                            shape.part_size
                        );
                        n += got.len() as u64;
                    }
                    Ok(n)
                })
            })
            .collect();
        let mut total = 0;
        let mut first = Ok(());
        for h in handles {
            match h
                .join()
                .map_err(|_| anyhow::anyhow!("a reader panicked"))
                .and_then(|r| r)
            {
                Ok(n) => total += n,
                Err(e) if first.is_ok() => first = Err(e),
                Err(_) => {}
            }
        }
        first.map(|()| total)
    })?;
    ensure!(
        bytes == shape.total_bytes(),
        "read {bytes} bytes, wrote {}",
        shape.total_bytes()
    );
    Ok(bytes)
}

/// How the in-process client is set up (as `silt up` would be with these options).
#[derive(Clone, Debug)]
pub struct ClientSpec {
    /// The store mounted at `/data`, e.g. `s3://bench/b5`.
    pub store: String,
    /// State directory: the disk tier (`STATE/cache`), its spill directory and the log.
    pub state_dir: PathBuf,
    pub write_type: WriteType,
    pub write_memory: u64,
    pub memory_capacity: u64,
    pub disk_quota: u64,
}

impl ClientSpec {
    /// Silt's configuration for this client: defaults, `SILT_*` from the environment (the
    /// store's endpoint and keys), then this spec's options.
    pub fn config(&self) -> Result<Config> {
        let mut cfg = Config::default();
        cfg.apply_env()?;
        let state = std::path::absolute(&self.state_dir)?.display().to_string();
        let set: [(&str, String); 6] = [
            ("state_dir", state.clone()),
            ("memory_capacity", self.memory_capacity.to_string()),
            ("disk_tiers", format!("{state}/cache:{}", self.disk_quota)),
            ("write_type", self.write_type.to_string()),
            ("write_memory", self.write_memory.to_string()),
            ("upload_delay", "0s".into()),
        ];
        for (k, v) in set {
            cfg.set(k, &v).with_context(|| format!("option {k}={v}"))?;
        }
        Ok(cfg)
    }
}

/// The client `silt up` builds for `cfg` (single node; see crates/silt/src/daemon.rs), with the
/// store of `spec` mounted at `/data`; its background task (uploads, TTL sweep) spawned.
pub async fn build_client(spec: &ClientSpec) -> Result<Arc<Client>> {
    let cfg = spec.config()?;
    std::fs::create_dir_all(&cfg.state_dir)?;
    let store = silt_ufs::open_store(&spec.store, &S3Options::from_config(&cfg))
        .await
        .with_context(|| format!("opening {}", spec.store))?;
    // As the daemon's write_setup: spill into each disk tier's `spill` directory.
    let spill = WriteSetup::tier_spill_dirs(&cfg)?;
    let setup = WriteSetup::from_config(&cfg, spill, cfg.state_dir.join("wal"))?;
    let client = Arc::new(single_node_client(&cfg, store)?.with_write_setup(setup)?);
    tokio::spawn(client.clone().run_background());
    Ok(client)
}

/// The single-node client `silt up` builds for `cfg` (its page store and reader), `store`
/// mounted at `/data`; no write setup. On the current runtime.
pub fn single_node_client(cfg: &Config, store: silt_ufs::DynStore) -> Result<Client> {
    let ns = Namespace::new(vec![MountPoint {
        path: MOUNT.into(),
        store,
    }])?;
    let pages = Arc::new(PageStore::open(PageStoreConfig::from_config(cfg)?)?);
    let rt = tokio::runtime::Handle::current();
    let worker = Arc::new(PageReader::new(
        pages,
        &PageReaderOptions::from_config(cfg),
        rt.clone(),
    ));
    Ok(Client::new(ns, worker, ClientOptions::from_config(cfg), rt))
}

fn store_requests() -> u64 {
    silt_common::metrics::UFS_REQUESTS.get()
}

/// (failed store requests, failed `back` upload attempts) so far.
fn failures() -> (u64, u64) {
    use silt_common::metrics::{UFS_ERRORS, WRITE_PERSIST_FAILURES};
    (UFS_ERRORS.get(), WRITE_PERSIST_FAILURES.get())
}

/// The shuffle through the client library under `/data/PREFIX` (module docs).
pub async fn shuffle_client(
    client: Arc<Client>,
    prefix: &str,
    shape: &Shape,
    seed: u64,
) -> Result<ShuffleResult> {
    let pat = Arc::new(Pattern::new(
        shape.part_size,
        shape.writers * shape.partitions,
        seed,
    ));
    let base = format!("{MOUNT}/{}", prefix.trim_matches('/'));
    let phases = Arc::new(Phases::default());
    let req0 = store_requests();
    let shape = *shape;
    let t = Instant::now();
    // As the dir mode (and a job writing through the mount) does: the directories first. A
    // directory Silt made is known empty, so creating files in it asks the store nothing.
    let t_dir = Instant::now();
    mkdir_p(&client, &base).await?;
    Phases::add(&phases.create, t_dir);
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..shape.writers {
        let (c, pat, base, ph) = (client.clone(), pat.clone(), base.clone(), phases.clone());
        tasks.spawn(async move {
            let t_dir = Instant::now();
            mkdir_p(&c, &format!("{base}/w{w:03}")).await?;
            Phases::add(&ph.create, t_dir);
            for p in 0..shape.partitions {
                let path = format!("{base}/{}", Shape::rel(w, p));
                let data = pat.file(shape.index(w, p));
                write_file(&c, &path, &data, shape.io_chunk, &ph).await?;
            }
            anyhow::Ok(0u64)
        });
    }
    join_tasks(&mut tasks).await?;
    let write_s = t.elapsed().as_secs_f64();
    let after_writes = client.write_stats().context("the client does not write")?;
    let t = Instant::now();
    for r in 0..shape.readers {
        let (c, pat, base) = (client.clone(), pat.clone(), base.clone());
        tasks.spawn(async move {
            let mut n = 0;
            for (w, p) in shape.reader_files(r) {
                let path = format!("{base}/{}", Shape::rel(w, p));
                let want = pat.file(shape.index(w, p));
                n += read_and_check(&c, &path, &want, shape.io_chunk).await?;
            }
            anyhow::Ok(n)
        });
    }
    let bytes = join_tasks(&mut tasks).await?;
    let read_s = t.elapsed().as_secs_f64();
    ensure!(
        bytes == shape.total_bytes(),
        "read {bytes} bytes, wrote {}",
        shape.total_bytes()
    );
    let end = client.write_stats().context("the client does not write")?;
    let mut r = ShuffleResult::new("client", &shape, bytes, write_s, read_s);
    r.write_type = Some(WriteType::CacheOnly.to_string());
    r.memory_ceiling = Some(end.arena.memory_ceiling);
    r.memory_peak = Some(end.arena.memory_peak.max(after_writes.arena.memory_peak));
    r.spilled = Some(after_writes.arena.spilled.max(end.arena.spilled));
    r.peak_rss = peak_rss();
    r.store_requests = Some(store_requests() - req0);
    r.read_cache_used = client.cache_stats().tiers.first().map(|t| t.used);
    r.write_phases = Some(phases.seconds());
    Ok(r)
}

async fn join_tasks(tasks: &mut tokio::task::JoinSet<Result<u64>>) -> Result<u64> {
    let mut total = 0;
    let mut first_err = None;
    while let Some(r) = tasks.join_next().await {
        match r.context("a task panicked").and_then(|r| r) {
            Ok(n) => total += n,
            Err(e) => {
                if first_err.is_none() {
                    first_err = Some(e);
                    tasks.abort_all();
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// Time spent in each call of the client's write path, summed over all tasks (nanoseconds).
#[derive(Default)]
struct Phases {
    create: AtomicU64,
    write: AtomicU64,
    commit: AtomicU64,
}

/// Seconds spent in `create`, `write_at` and `commit`, summed over the tasks (so with many
/// tasks in flight they add up to more than the elapsed time): where a write's time goes.
#[derive(Debug, Default, Serialize)]
pub struct PhaseSeconds {
    pub create: f64,
    pub write_at: f64,
    pub commit: f64,
}

impl Phases {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn seconds(&self) -> PhaseSeconds {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        PhaseSeconds {
            create: s(&self.create),
            write_at: s(&self.write),
            commit: s(&self.commit),
        }
    }
}

/// `path` and its missing parents as directories (`mkdir -p`).
async fn mkdir_p(c: &Client, path: &str) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = path.trim_end_matches('/').to_string();
    while p.len() > MOUNT.len() {
        match c.stat(&p).await {
            Ok(e) if e.is_dir() => break,
            Ok(_) => bail!("{p}: not a directory"),
            Err(e) if e.kind() == silt_common::ErrorKind::NotFound => missing.push(p.clone()),
            Err(e) => return Err(e).with_context(|| format!("stat {p}")),
        }
        p = match p.rsplit_once('/') {
            Some((parent, _)) => parent.to_string(),
            None => break,
        };
    }
    for d in missing.iter().rev() {
        match c.mkdir(d).await {
            Ok(_) => {}
            Err(e) if e.kind() == silt_common::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("mkdir {d}")),
        }
    }
    Ok(())
}

/// create + write_at in `chunk`-byte pieces + commit.
async fn write_file(
    c: &Client,
    path: &str,
    data: &[u8],
    chunk: usize,
    phases: &Phases,
) -> Result<()> {
    let t = Instant::now();
    let w = c
        .create(path, true)
        .await
        .with_context(|| format!("create {path}"))?;
    Phases::add(&phases.create, t);
    let t = Instant::now();
    for (i, piece) in data.chunks(chunk.max(1)).enumerate() {
        c.write_at(&w, (i * chunk) as u64, piece)
            .with_context(|| format!("write {path}"))?;
    }
    Phases::add(&phases.write, t);
    let t = Instant::now();
    c.commit(&w)
        .await
        .with_context(|| format!("commit {path}"))?;
    Phases::add(&phases.commit, t);
    Ok(())
}

/// open + read in `chunk`-byte pieces, checked against `want`; the bytes read.
async fn read_and_check(c: &Client, path: &str, want: &[u8], chunk: usize) -> Result<u64> {
    let f = c.open(path).await.with_context(|| format!("open {path}"))?;
    ensure!(
        f.size() == want.len() as u64,
        "{path}: size {} after writing {}",
        f.size(),
        want.len()
    );
    let mut off = 0usize;
    while off < want.len() {
        let n = chunk.max(1).min(want.len() - off);
        let got = c
            .read(&f, off as u64, n as u64)
            .await
            .with_context(|| format!("read {path}"))?;
        ensure!(!got.is_empty(), "{path}: end of file at {off}");
        ensure!(
            got[..] == want[off..off + got.len()],
            "{path}: other bytes read back at {off}"
        );
        off += got.len();
    }
    Ok(off as u64)
}

/// The shape of an upload run.
#[derive(Clone, Copy, Debug)]
pub struct Uploads {
    pub files: usize,
    pub file_size: usize,
    pub concurrency: usize,
    pub io_chunk: usize,
}

/// `through` or `back` writes of `u.files` files through the client under `/data/PREFIX`.
pub async fn upload_client(
    client: Arc<Client>,
    store: &DynStore,
    prefix: &str,
    write_type: WriteType,
    u: &Uploads,
    seed: u64,
) -> Result<UploadResult> {
    ensure!(
        matches!(write_type, WriteType::Through | WriteType::Back),
        "uploads are timed for through and back writes, not {write_type}"
    );
    let pat = Arc::new(Pattern::new(u.file_size, u.files, seed));
    let prefix = prefix.trim_matches('/').to_string();
    let dir = format!("{MOUNT}/{prefix}");
    let phases = Arc::new(Phases::default());
    let req0 = store_requests();
    let fail0 = failures();
    let u = *u;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..u.concurrency.max(1) {
        let (c, pat, dir, ph) = (client.clone(), pat.clone(), dir.clone(), phases.clone());
        tasks.spawn(async move {
            for i in (k..u.files).step_by(u.concurrency.max(1)) {
                let path = format!("{dir}/f{i:04}");
                write_file(&c, &path, &pat.file(i), u.io_chunk, &ph).await?;
            }
            anyhow::Ok(0u64)
        });
    }
    join_tasks(&mut tasks).await?;
    let ack_s = t.elapsed().as_secs_f64();
    if write_type == WriteType::Back {
        let states = client.persist(&dir).await?;
        let bad: Vec<_> = states
            .iter()
            .filter(|(_, s)| *s != FileState::Persisted)
            .collect();
        ensure!(bad.is_empty(), "not persisted: {bad:?}");
        ensure!(
            states.len() == u.files,
            "persist reported {} files, {} were written",
            states.len(),
            u.files
        );
    }
    let persist_s = t.elapsed().as_secs_f64();
    let requests = store_requests() - req0;
    let fails = since(fail0);
    check_and_delete(store, &prefix, &u).await?;
    let mut r = upload_result(
        "client",
        Some(write_type),
        &u,
        ack_s,
        persist_s,
        requests,
        fails,
    );
    r.write_phases = Some(phases.seconds());
    Ok(r)
}

/// A `ReadAt` over bytes in memory.
struct Mem(Bytes);

impl silt_common::io::ReadAt for Mem {
    fn read_at(&self, offset: u64, len: usize) -> silt_common::Result<Bytes> {
        let start = offset as usize;
        if start + len > self.0.len() {
            return Err(silt_common::Error::invalid(format!(
                "{len} bytes at {offset} of {}",
                self.0.len()
            )));
        }
        Ok(self.0.slice(start..start + len))
    }
}

/// The same files uploaded straight to the store with `write_from` (module docs).
pub async fn upload_direct(
    store: &DynStore,
    prefix: &str,
    u: &Uploads,
    seed: u64,
) -> Result<UploadResult> {
    let pat = Arc::new(Pattern::new(u.file_size, u.files, seed));
    let prefix = prefix.trim_matches('/').to_string();
    let req0 = store_requests();
    let fail0 = failures();
    let u = *u;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..u.concurrency.max(1) {
        let (store, pat, prefix) = (store.clone(), pat.clone(), prefix.clone());
        tasks.spawn(async move {
            for i in (k..u.files).step_by(u.concurrency.max(1)) {
                let rel = format!("{prefix}/f{i:04}");
                store
                    .write_from(&rel, &Mem(pat.file(i)), u.file_size as u64)
                    .await
                    .with_context(|| format!("upload {rel}"))?;
            }
            anyhow::Ok(0u64)
        });
    }
    join_tasks(&mut tasks).await?;
    let secs = t.elapsed().as_secs_f64();
    let requests = store_requests() - req0;
    let fails = since(fail0);
    check_and_delete(store, &prefix, &u).await?;
    Ok(upload_result(
        "direct", None, &u, secs, secs, requests, fails,
    ))
}

fn upload_result(
    mode: &str,
    write_type: Option<WriteType>,
    u: &Uploads,
    ack_s: f64,
    persist_s: f64,
    store_requests: u64,
    (store_errors, persist_failures): (u64, u64),
) -> UploadResult {
    let bytes = (u.files * u.file_size) as u64;
    UploadResult {
        mode: mode.into(),
        write_type: write_type.map(|t| t.to_string()),
        files: u.files,
        file_size: u.file_size,
        concurrency: u.concurrency,
        bytes,
        ack_s,
        persist_s,
        gbps: bytes as f64 / persist_s / 1e9,
        ack_gbps: bytes as f64 / ack_s / 1e9,
        store_requests,
        store_errors,
        persist_failures,
        peak_rss: peak_rss(),
        write_phases: None,
    }
}

fn since((errors, persist): (u64, u64)) -> (u64, u64) {
    let (e, p) = failures();
    (e - errors, p - persist)
}

/// Every uploaded object has its size; then all are deleted (untimed).
async fn check_and_delete(store: &DynStore, prefix: &str, u: &Uploads) -> Result<()> {
    for i in 0..u.files {
        let rel = format!("{prefix}/f{i:04}");
        let meta = store
            .stat(&rel)
            .await
            .with_context(|| format!("stat {rel}"))?;
        ensure!(
            meta.size == u.file_size as u64,
            "{rel}: {} bytes in the store, {} written",
            meta.size,
            u.file_size
        );
    }
    for i in 0..u.files {
        store.delete(&format!("{prefix}/f{i:04}")).await?;
    }
    Ok(())
}

/// Peak resident set size of this process (VmHWM), if /proc says.
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Parses a write type for the client mode.
pub fn parse_write_type(s: &str) -> Result<WriteType> {
    match s {
        "cache-only" => Ok(WriteType::CacheOnly),
        "through" => Ok(WriteType::Through),
        "back" => Ok(WriteType::Back),
        _ => bail!("--write-type: cache-only, through or back, not {s:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_cover_every_file_once() {
        let shape = Shape {
            writers: 3,
            partitions: 5,
            part_size: 10,
            readers: 2,
            io_chunk: 4,
        };
        let mut all: Vec<_> = (0..shape.readers)
            .flat_map(|r| shape.reader_files(r))
            .collect();
        assert_eq!(
            shape.reader_files(1),
            [(0, 1), (1, 1), (2, 1), (0, 3), (1, 3), (2, 3)]
        );
        all.sort();
        let want: Vec<_> = (0..3).flat_map(|w| (0..5).map(move |p| (w, p))).collect();
        assert_eq!(all, want);
        // More readers than partitions: the extra readers read nothing.
        let wide = Shape {
            readers: 8,
            ..shape
        };
        assert!(wide.reader_files(6).is_empty());
        assert_eq!(wide.reader_files(4).len(), 3);
    }

    #[test]
    fn pattern_files_are_distinct_windows_of_their_size() {
        let p = Pattern::new(100, 4, 7);
        let files: Vec<_> = (0..4).map(|i| p.file(i)).collect();
        assert!(files.iter().all(|f| f.len() == 100));
        for i in 0..4 {
            for j in i + 1..4 {
                assert_ne!(files[i], files[j], "files {i} and {j}");
            }
        }
        assert_eq!(files[1][..84], files[0][16..], "a window 16 bytes on");
        assert_eq!(
            Pattern::new(100, 4, 7).file(3),
            files[3],
            "the same seed, the same bytes"
        );
        assert_ne!(Pattern::new(100, 4, 8).file(3), files[3]);
    }

    #[test]
    fn dir_shuffle_writes_and_checks_every_byte() {
        let root = std::env::temp_dir().join(format!("silt-bench-shuffle-{}", std::process::id()));
        let shape = Shape {
            writers: 3,
            partitions: 4,
            part_size: 1000,
            readers: 2,
            io_chunk: 300,
        };
        let r = shuffle_dir(&root, &shape, 1).unwrap();
        assert_eq!(r.bytes, 12_000);
        assert!(r.gbps > 0.0 && r.write_s > 0.0 && r.read_s > 0.0);
        let pat = Pattern::new(1000, 12, 1);
        assert_eq!(read_dir(&root, &shape, &pat).unwrap(), 12_000);
        // One changed byte is found.
        let mut bad = pat.file(11).to_vec();
        bad[500] ^= 1;
        std::fs::write(root.join("w002/p003"), bad).unwrap();
        let e = read_dir(&root, &shape, &pat).unwrap_err();
        assert!(e.to_string().contains("w002/p003"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn client_write_types() {
        assert_eq!(parse_write_type("back").unwrap(), WriteType::Back);
        assert!(parse_write_type("store-only").is_err());
    }
}
