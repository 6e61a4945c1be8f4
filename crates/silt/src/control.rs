//! The local control socket (`STATE_DIR/control.sock`) and the CLI commands that use it.
//!
//! Requests are one JSON frame `{"v": 1, "op": ..., "path": ...}`; responses are JSON and
//! raw data frames closed by an `End` or `Error` frame (framing in `silt-proto`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use silt_client::{CacheUsage, ChangeKind, FileState, PolicyInfo, SyncReport};
use silt_common::size::format_size;
use silt_common::sync::SyncPolicy;
use silt_common::{metrics, Error};
use silt_proto::{
    decode_json, decode_request, read_frame, write_error, write_frame, write_json, ErrorBody,
    FrameKind, Versioned,
};
use tokio::net::{UnixListener, UnixStream};

use crate::daemon::Daemon;

pub mod answer;

pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("control.sock")
}

pub async fn bind(path: &Path) -> Result<UnixListener> {
    // We hold the state dir's lock, so a socket file left here is from a dead process.
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding control socket {}", path.display()))?;
    // The socket can stop the mount and read any file in it: only the owner may connect.
    silt_common::private::restrict(path)
        .with_context(|| format!("restricting control socket {}", path.display()))?;
    Ok(listener)
}

/// A request on the control socket, decoded once, whole (`silt_proto::decode_request`). On
/// the wire: `{"v": 1, "op": "<name>", ...its fields}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Request {
    /// `silt report`: the daemon's state, counters and (in a cluster) its workers.
    Report,
    Stat {
        path: String,
    },
    Ls {
        path: String,
    },
    /// The file's bytes as `Data` frames.
    Cat {
        path: String,
    },
    Sync {
        path: String,
        /// The whole tree below `path`.
        #[serde(default)]
        recursive: bool,
    },
    Invalidate {
        path: String,
    },
    SyncPolicy {
        path: String,
        /// The policy to set (absent: show the current one).
        #[serde(default)]
        policy: Option<String>,
    },
    Pin {
        path: String,
    },
    Unpin {
        path: String,
    },
    Free {
        path: String,
    },
    Persist {
        path: String,
    },
    PersistState {
        path: String,
    },
    /// New ceilings in bytes (absent: unchanged), then the memory in use.
    Memory {
        #[serde(default)]
        write_memory: Option<u64>,
        #[serde(default)]
        cache_memory: Option<u64>,
    },
    /// Progress as JSON frames; more paths after `path`, a bound on fetches in flight.
    Load {
        path: String,
        #[serde(default)]
        paths: Vec<String>,
        #[serde(default)]
        concurrency: Option<usize>,
    },
    Down,
}

pub async fn serve(listener: UnixListener, daemon: Arc<Daemon>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let d = daemon.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(stream, &d).await {
                tracing::debug!("control connection ended: {e}");
            }
        });
    }
}

async fn handle(mut s: UnixStream, d: &Daemon) -> silt_common::Result<()> {
    let Some((kind, payload)) = read_frame(&mut s).await? else {
        return Ok(());
    };
    let req: Request = match decode_request(kind, &payload) {
        Ok(r) => r,
        Err(e) => return write_error(&mut s, &e).await,
    };
    let result = match req {
        Request::Report => {
            let mut r = daemon_report(d);
            if let Some(router) = &d.cluster {
                r.cluster = Some(cluster_report(router).await);
            }
            write_json(&mut s, &r).await
        }
        Request::Stat { path } => match d.client.stat(&path).await {
            Ok(e) => {
                let mut v = answer::Entry::new(&e);
                v.sync = d.client.policy_info(&path).ok();
                v.cache = d.node().cache_usage(&path).await.ok();
                write_json(&mut s, &v).await
            }
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Sync { path, recursive } => {
            let r = d.client.sync(&path, recursive).await;
            return answer_after_kernel(&mut s, d, r).await;
        }
        Request::Pin { path } => match d.node().pin(&path).await {
            Ok(u) => write_json(&mut s, &u).await,
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Unpin { path } => match d.node().unpin(&path).await {
            Ok(n) => write_json(&mut s, &answer::Unpinned { unpinned: n }).await,
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Free { path } => {
            // Answered once the kernel dropped its pages too: the next read is a cold one.
            let r = d.node().free(&path).await;
            return answer_after_kernel(&mut s, d, r).await;
        }
        Request::Invalidate { path } => {
            let r = d.client.invalidate(&path).await;
            return answer_after_kernel(&mut s, d, r).await;
        }
        Request::SyncPolicy { path, policy } => {
            let info = match policy.as_deref() {
                Some(p) => SyncPolicy::parse(p)
                    .and_then(|policy| d.client.set_sync_policy(&path, policy))
                    .inspect(|_| d.sync_rules_changed()),
                None => d.client.policy_info(&path),
            };
            return answer_after_kernel(&mut s, d, info).await;
        }
        Request::Ls { path } => match d.client.list(&path).await {
            Ok(list) => {
                let entries: Vec<answer::Entry> = list.iter().map(answer::Entry::new).collect();
                write_json(&mut s, &entries).await
            }
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Cat { path } => return cat(&mut s, d, &path).await,
        Request::Persist { path } => {
            let r = d.client.persist(&path).await.map(path_states);
            return answer_after_kernel(&mut s, d, r).await;
        }
        Request::PersistState { path } => match d.client.persist_status(&path) {
            Ok(v) => write_json(&mut s, &path_states(v)).await,
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Memory {
            write_memory,
            cache_memory,
        } => {
            if let Some(b) = cache_memory {
                d.client.set_cache_memory(b);
            }
            if let Some(b) = write_memory {
                if !d.client.set_write_memory(b) {
                    return write_error(
                        &mut s,
                        &Error::new(
                            silt_common::ErrorKind::ReadOnly,
                            "this Silt does not write (write_type read-only, no write_rules)",
                        ),
                    )
                    .await;
                }
            }
            write_json(&mut s, &daemon_memory(d)).await
        }
        Request::Load {
            path,
            paths: more,
            concurrency,
        } => {
            let mut paths = vec![path];
            paths.extend(more);
            let concurrency = concurrency
                .filter(|n| (1..=1024).contains(n))
                .unwrap_or(d.config.fetch_concurrency);
            return load_stream(&mut s, d, paths, concurrency).await;
        }
        Request::Down => {
            d.shutdown.notify_one();
            Ok(())
        }
    };
    result?;
    write_frame(&mut s, FrameKind::End, &[]).await
}

/// Answers a command that may have changed what the kernel caches: its result once the kernel
/// has been told every change learned so far (so a command that returns leaves no stale
/// kernel cache behind), or its error.
async fn answer_after_kernel<T: Serialize>(
    s: &mut UnixStream,
    d: &Daemon,
    result: silt_common::Result<T>,
) -> silt_common::Result<()> {
    match result {
        Ok(v) => {
            let fuse = d.fuse.clone();
            let _ = tokio::task::spawn_blocking(move || fuse.wait_for_invalidations()).await;
            write_json(s, &v).await?;
            write_frame(s, FrameKind::End, &[]).await
        }
        Err(e) => write_error(s, &e).await,
    }
}

async fn cat(s: &mut UnixStream, d: &Daemon, path: &str) -> silt_common::Result<()> {
    let file = match d.client.open(path).await {
        Ok(f) => f,
        Err(e) => return write_error(s, &e).await,
    };
    const CHUNK: u64 = 4 << 20;
    let mut off = 0;
    while off < file.size() {
        match d.client.read(&file, off, CHUNK).await {
            Ok(b) if b.is_empty() => break,
            Ok(b) => {
                off += b.len() as u64;
                write_frame(s, FrameKind::Data, &b).await?;
            }
            Err(e) => return write_error(s, &e).await,
        }
    }
    write_frame(s, FrameKind::End, &[]).await
}

async fn load_stream(
    s: &mut UnixStream,
    d: &Daemon,
    paths: Vec<String>,
    concurrency: usize,
) -> silt_common::Result<()> {
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<answer::LoadEvent>();
    let client = d.client.clone();
    let cluster = d.cluster.clone();
    let record = d.loads.start(&paths);
    let shown = record.clone();
    let job = tokio::spawn(async move {
        let mut last = Instant::now() - Duration::from_secs(1);
        let progress = |p: &silt_client::LoadProgress| {
            shown.progress(p.files_total, p.bytes_total, p.bytes_done, p.bytes_cached);
            // At most ten progress frames a second.
            if last.elapsed() >= Duration::from_millis(100) || p.pages_done == p.pages_total {
                last = Instant::now();
                let _ = tx.send(answer::LoadEvent::Progress(*p));
            }
        };
        // Every path in one job: pages of all of them in flight together.
        let r = match &cluster {
            Some(router) => {
                crate::cluster::load(&client, router, &paths, concurrency, progress).await
            }
            None => client.load_paths(&paths, concurrency, progress).await,
        };
        // Here, not by the caller: the load goes on when its caller goes away.
        shown.finish(r.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        r
    });
    while let Some(v) = rx.recv().await {
        write_json(s, &v).await?;
    }
    match job.await {
        Ok(Ok(p)) => {
            let secs = started.elapsed().as_secs_f64();
            let done = answer::LoadDone {
                files: p.files_total,
                bytes_total: p.bytes_total,
                bytes_loaded: p.bytes_done,
                bytes_already_cached: p.bytes_cached,
                seconds: secs,
                throughput_bytes_per_sec: if secs > 0.0 {
                    p.bytes_done as f64 / secs
                } else {
                    0.0
                },
            };
            write_json(s, &answer::LoadEvent::Done(done)).await?;
            write_frame(s, FrameKind::End, &[]).await
        }
        Ok(Err(e)) => write_error(s, &e).await,
        Err(e) => {
            record.finish(Err(format!("load task failed: {e}")));
            write_error(s, &Error::internal(format!("load task failed: {e}"))).await
        }
    }
}

fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Every worker of the view: identity, liveness, capacity, usage, hit ratio.
async fn cluster_report(router: &silt_cluster::Router) -> answer::ClusterReport {
    let workers = router
        .worker_stats()
        .await
        .into_iter()
        .map(|(m, r)| match r {
            Ok(st) => answer::WorkerReport {
                id: m.id,
                addr: m.addr,
                live: true,
                capacity: st.capacity,
                error: None,
                stats: Some(answer::WorkerCounters {
                    used: st.used,
                    hit_ratio: st.hit_ratio,
                    page_hits: st.page_hits,
                    page_misses: st.page_misses,
                    reads_served: st.reads_served,
                    bytes_served: st.bytes_served,
                    files_leased: st.files_leased,
                    ufs_read_bytes: st.ufs_read_bytes,
                }),
            },
            Err(e) => answer::WorkerReport {
                id: m.id,
                addr: m.addr,
                live: false,
                capacity: m.capacity,
                error: Some(e.to_string()),
                stats: None,
            },
        })
        .collect();
    answer::ClusterReport {
        membership: router.membership().describe(),
        workers,
    }
}

fn path_states(states: Vec<(String, silt_client::FileState)>) -> Vec<answer::PathState> {
    states
        .into_iter()
        .map(|(path, state)| answer::PathState { path, state })
        .collect()
}

/// Memory of the read cache and of written data, with their ceilings.
fn daemon_memory(d: &Daemon) -> answer::Memory {
    let stats = d.client.cache_stats();
    let cache = stats.tiers.first();
    answer::Memory {
        cache: answer::CacheMemory {
            capacity: cache.map_or(0, |t| t.capacity),
            used: cache.map_or(0, |t| t.used),
        },
        peak_rss_bytes: peak_rss_bytes(),
        write: d.client.write_stats().map(|w| answer::WriteMemory {
            ceiling: w.arena.memory_ceiling,
            used: w.arena.memory_used,
            peak: w.arena.memory_peak,
            spilled: w.arena.spilled,
            buffers: w.arena.buffers,
            cache_only_files: w.cache_only_files,
            cache_only_bytes: w.cache_only_bytes,
            pending_upload_files: w.pending_files,
            pending_upload_bytes: w.pending_bytes,
            jobs: w
                .arena
                .jobs
                .iter()
                .map(|j| answer::JobMemory {
                    prefix: j.prefix.clone(),
                    priority: j.priority,
                    memory_quota: j.memory_quota,
                    memory_used: j.memory_used,
                    spilled: j.spilled,
                })
                .collect(),
        }),
    }
}

fn daemon_report(d: &Daemon) -> answer::Report {
    let stats = d.client.cache_stats();
    let meta_sizes = d.client.metadata_sizes();
    let rules = d.client.sync_rules();
    let hits = metrics::PAGE_HITS.get();
    let misses = metrics::PAGE_MISSES.get();
    let tiers = stats
        .tiers
        .iter()
        .map(|t| answer::TierReport {
            name: t.name.clone(),
            dir: t.dir.as_ref().map(|p| p.display().to_string()),
            capacity: t.capacity,
            used: t.used,
            pages: t.pages,
        })
        .collect();
    let recent = d
        .fuse
        .recent_opens
        .lock()
        .iter()
        .map(|o| answer::OpenReport {
            path: o.path.clone(),
            mode: o.mode.to_string(),
            reason: o.reason.to_string(),
        })
        .collect();
    answer::Report {
        role: d.role.to_string(),
        mountpoint: d.config.mountpoint.display().to_string(),
        state_dir: d.config.state_dir.display().to_string(),
        mounts: d
            .mounts()
            .iter()
            .map(|m| answer::MountReport {
                path: m.path.to_string(),
                uri: silt_ufs::redact_uri(&m.uri),
            })
            .collect(),
        page_size: d.client.page_size(),
        tiers,
        page_hits: hits,
        page_misses: misses,
        evictions: stats.evictions,
        admissions_refused: stats.admissions_refused,
        pinned: answer::PinnedReport {
            objects: stats.pinned_objects,
            bytes: stats.pinned_bytes,
        },
        hit_ratio: if hits + misses > 0 {
            hits as f64 / (hits + misses) as f64
        } else {
            0.0
        },
        bytes_by_source: answer::BytesBySource {
            memory: metrics::READ_BYTES_MEMORY.get(),
            disk: metrics::READ_BYTES_DISK.get(),
            under_store: metrics::READ_BYTES_UFS.get(),
        },
        metadata: answer::MetadataReport {
            stats: meta_sizes.0 as u64,
            listings: meta_sizes.1 as u64,
            negative: meta_sizes.2 as u64,
            default_policy: rules.default_policy().to_string(),
            rules: rules
                .rules()
                .map(|r| answer::RuleReport {
                    prefix: r.prefix.to_string(),
                    policy: r.policy.to_string(),
                })
                .collect(),
        },
        passthrough: answer::PassthroughReport {
            configured: format!("{:?}", d.config.passthrough).to_lowercase(),
            kernel_supported: d.fuse.kernel_passthrough.load(Ordering::Relaxed),
            enabled: d.fuse.passthrough_enabled.load(Ordering::Relaxed),
        },
        opens: answer::OpensReport {
            passthrough: metrics::FUSE_OPENS_PASSTHROUGH.get(),
            daemon: metrics::FUSE_OPENS_DAEMON.get(),
            recent,
        },
        peak_rss_bytes: peak_rss_bytes(),
        memory: daemon_memory(d),
        metrics: metrics::all()
            .iter()
            .map(|m| (m.name.to_string(), m.counter.get()))
            .collect(),
        cluster: None,
    }
}

// ---- client side -------------------------------------------------------------------------

fn client_rt() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting runtime")
}

async fn connect(state_dir: &Path, req: Request) -> Result<UnixStream> {
    let sock = socket_path(state_dir);
    let mut s = UnixStream::connect(&sock).await.map_err(|e| {
        anyhow!(
            "no running silt at {} ({e}); start one with `silt up` or pass --state-dir",
            sock.display()
        )
    })?;
    write_json(&mut s, &Versioned::new(&req)).await?;
    Ok(s)
}

/// Reads frames until End, passing JSON answers (as `T`) and data frames to the callbacks.
async fn drain<T: serde::de::DeserializeOwned>(
    s: &mut UnixStream,
    mut on_json: impl FnMut(T) -> Result<()>,
    mut on_data: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    loop {
        match read_frame(s).await? {
            None => bail!("silt closed the connection mid-response"),
            Some((FrameKind::End, _)) => return Ok(()),
            Some((FrameKind::Error, p)) => {
                let body: ErrorBody = decode_json(&p)?;
                return Err(body.into_error().into());
            }
            Some((FrameKind::Json, p)) => on_json(decode_json(&p)?)?,
            Some((FrameKind::Data, p)) => on_data(&p)?,
        }
    }
}

/// The one JSON answer to `req`, as the type that answers it.
fn one_answer<T: serde::de::DeserializeOwned>(state_dir: &Path, req: Request) -> Result<T> {
    client_rt()?.block_on(async {
        let mut s = connect(state_dir, req).await?;
        let mut out = None;
        drain(
            &mut s,
            |v| {
                out = Some(v);
                Ok(())
            },
            |_| Ok(()),
        )
        .await?;
        out.context("silt answered nothing")
    })
}

fn fmt_entry_line(e: &answer::Entry) -> String {
    let kind = if e.kind == "dir" { "d" } else { "-" };
    format!("{kind} {:>12}  {}", e.size, e.name)
}

pub fn fs_command(state_dir: &Path, op: &str, path: &str) -> Result<ExitCode> {
    let path_s = path.to_string();
    match op {
        "ls" => {
            let entries: Vec<answer::Entry> = one_answer(state_dir, Request::Ls { path: path_s })?;
            for e in &entries {
                println!("{}", fmt_entry_line(e));
            }
        }
        "stat" => {
            let e: answer::Entry = one_answer(state_dir, Request::Stat { path: path_s })?;
            println!("{}", serde_json::to_string_pretty(&e)?);
        }
        "cat" => {
            client_rt()?.block_on(async {
                let mut s = connect(state_dir, Request::Cat { path: path_s }).await?;
                let stdout = std::io::stdout();
                let mut out = stdout.lock();
                drain(
                    &mut s,
                    |_: serde::de::IgnoredAny| Ok(()),
                    |d| out.write_all(d).context("writing to stdout"),
                )
                .await?;
                out.flush()?;
                Ok::<_, anyhow::Error>(())
            })?;
        }
        "pin" => {
            let u: CacheUsage = one_answer(state_dir, Request::Pin { path: path_s })?;
            println!(
                "pinned {path}: {} files, {} bytes pinned, {} bytes cached",
                u.files, u.pinned_bytes, u.cached_bytes
            );
        }
        "unpin" => {
            let u: answer::Unpinned = one_answer(state_dir, Request::Unpin { path: path_s })?;
            println!("unpinned {path}: {} files", u.unpinned);
        }
        "free" => {
            let u: CacheUsage = one_answer(state_dir, Request::Free { path: path_s })?;
            println!(
                "freed {path}: {} files, {} cached bytes dropped",
                u.files, u.cached_bytes
            );
        }
        other => bail!("unknown fs command {other}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// A change's name, as `silt fs sync` prints it: its name on the wire.
fn change_name(k: ChangeKind) -> String {
    match serde_json::to_value(k) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{k:?}"),
    }
}

/// What `silt fs sync` and `silt fs invalidate` print: counts, then the changed paths.
fn print_sync_report(verb: &str, path: &str, r: &SyncReport) {
    if verb == "invalidated" {
        println!(
            "invalidated {path}: {} entries dropped, cached pages of {} versions dropped",
            r.invalidated, r.objects_dropped
        );
    } else {
        println!(
            "synced {path}: {} checked, {} added, {} removed, {} content changed, {} metadata changed; cached pages of {} versions dropped",
            r.checked,
            r.added,
            r.removed,
            r.content_changed,
            r.metadata_changed,
            r.objects_dropped
        );
    }
    for (p, k) in &r.changes {
        if verb != "invalidated" || *k != ChangeKind::Invalidated {
            println!("  {:<12} {p}", change_name(*k));
        }
    }
}

fn print_states(states: &[answer::PathState]) -> bool {
    let mut failed = false;
    for s in states {
        let path = &s.path;
        match &s.state {
            FileState::Failed { reason, attempts } => {
                failed = true;
                println!("{path}: failed after {attempts} attempts: {reason}");
            }
            FileState::Pending { bytes } => println!("{path}: pending ({})", format_size(*bytes)),
            FileState::Uploading { bytes } => {
                println!("{path}: uploading ({})", format_size(*bytes))
            }
            FileState::Unknown => {
                println!("{path}: not a pending back file (in the store, or not written back)")
            }
            FileState::Persisted => println!("{path}: persisted"),
        }
    }
    failed
}

/// `silt fs persist PATH`: uploads the `back` files at or below PATH now and waits; exits 1 if
/// one failed.
pub fn persist(state_dir: &Path, path: &str) -> Result<ExitCode> {
    let states: Vec<answer::PathState> = one_answer(
        state_dir,
        Request::Persist {
            path: path.to_string(),
        },
    )?;
    Ok(if print_states(&states) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `silt fs state PATH`: where the `back` files at or below PATH stand.
pub fn persist_state(state_dir: &Path, path: &str) -> Result<ExitCode> {
    let states: Vec<answer::PathState> = one_answer(
        state_dir,
        Request::PersistState {
            path: path.to_string(),
        },
    )?;
    print_states(&states);
    Ok(ExitCode::SUCCESS)
}

/// `silt memory [--write SIZE] [--cache SIZE]`: shows (and sets) the memory ceilings.
pub fn memory(state_dir: &Path, write: Option<u64>, cache: Option<u64>) -> Result<ExitCode> {
    let m: answer::Memory = one_answer(
        state_dir,
        Request::Memory {
            write_memory: write,
            cache_memory: cache,
        },
    )?;
    println!(
        "read cache: {} used of {}",
        format_size(m.cache.used),
        format_size(m.cache.capacity)
    );
    if let Some(w) = &m.write {
        println!(
            "written data: {} in memory of {} (peak {}), {} spilled to disk; {} cache-only files ({}), {} files waiting for upload ({})",
            format_size(w.used),
            format_size(w.ceiling),
            format_size(w.peak),
            format_size(w.spilled),
            w.cache_only_files,
            format_size(w.cache_only_bytes),
            w.pending_upload_files,
            format_size(w.pending_upload_bytes),
        );
        for j in &w.jobs {
            // The default job has no quota (u64::MAX): "16777216.00 TiB" said nothing.
            let quota = match j.memory_quota {
                u64::MAX => "no quota".to_string(),
                q => format!("of {}", format_size(q)),
            };
            println!(
                "  job {} (priority {}): {} in memory {quota}, {} spilled",
                // The jobs without a `--write-jobs` prefix of their own share the default one.
                match j.prefix.as_str() {
                    "" => "(default: every other path)",
                    p => p,
                },
                j.priority,
                format_size(j.memory_used),
                format_size(j.spilled)
            );
        }
    } else {
        println!("written data: none (this Silt does not write)");
    }
    println!(
        "process peak RSS: {}",
        format_size(m.peak_rss_bytes.unwrap_or(0))
    );
    Ok(ExitCode::SUCCESS)
}

/// `silt fs sync PATH [--recursive]`: revalidates now and reports what changed.
pub fn sync(state_dir: &Path, path: &str, recursive: bool) -> Result<ExitCode> {
    let r: SyncReport = one_answer(
        state_dir,
        Request::Sync {
            path: path.to_string(),
            recursive,
        },
    )?;
    print_sync_report("synced", path, &r);
    Ok(ExitCode::SUCCESS)
}

/// `silt fs invalidate PATH`: drops metadata and cached data, and reports what was dropped.
pub fn invalidate(state_dir: &Path, path: &str) -> Result<ExitCode> {
    let r: SyncReport = one_answer(
        state_dir,
        Request::Invalidate {
            path: path.to_string(),
        },
    )?;
    print_sync_report("invalidated", path, &r);
    Ok(ExitCode::SUCCESS)
}

/// `silt fs sync-policy PATH [POLICY]`: shows, or sets, the sync policy of a prefix.
pub fn sync_policy(state_dir: &Path, path: &str, policy: Option<&str>) -> Result<ExitCode> {
    if let Some(p) = policy {
        // Checked here too, so a typo gets its message without a running silt.
        SyncPolicy::parse(p)?;
    }
    let info: PolicyInfo = one_answer(
        state_dir,
        Request::SyncPolicy {
            path: path.to_string(),
            policy: policy.map(str::to_string),
        },
    )?;
    let checked = match info.checked_secs_ago {
        Some(s) => format!("; the store last answered {s:.1}s ago"),
        None => "; nothing cached".into(),
    };
    println!("{path}: {} (rule {}){checked}", info.policy, info.rule);
    Ok(ExitCode::SUCCESS)
}

pub fn load(state_dir: &Path, paths: &[String], concurrency: Option<usize>) -> Result<ExitCode> {
    let (first, rest) = paths.split_first().context("no path to load")?;
    let req = Request::Load {
        path: first.clone(),
        paths: rest.to_vec(),
        concurrency,
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut done = None;
    client_rt()?.block_on(async {
        let mut s = connect(state_dir, req).await?;
        drain(
            &mut s,
            |ev: answer::LoadEvent| {
                match ev {
                    answer::LoadEvent::Progress(p) => {
                        bar.set_length(p.bytes_total);
                        bar.set_position(p.bytes_cached + p.bytes_done);
                        bar.set_message(format!("{} files", p.files_total));
                    }
                    answer::LoadEvent::Done(d) => done = Some(d),
                }
                Ok(())
            },
            |_| Ok(()),
        )
        .await
    })?;
    bar.finish_and_clear();
    let done = done.context("silt ended the load without its summary")?;
    println!(
        "loaded {} files: {} fetched, {} already cached, in {:.2}s ({}/s)",
        done.files,
        format_size(done.bytes_loaded),
        format_size(done.bytes_already_cached),
        done.seconds,
        format_size(done.throughput_bytes_per_sec as u64)
    );
    Ok(ExitCode::SUCCESS)
}

pub fn report(state_dir: &Path, as_json: bool) -> Result<ExitCode> {
    let v: answer::Report = one_answer(state_dir, Request::Report)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let sz = format_size;
    println!(
        "Silt {} at {} (state {}), page size {}",
        v.role,
        v.mountpoint,
        v.state_dir,
        sz(v.page_size)
    );
    println!("Mounts:");
    for m in &v.mounts {
        println!("  {} -> {}", m.path, m.uri);
    }
    println!("Tiers:");
    for t in &v.tiers {
        let pct = if t.capacity > 0 {
            t.used as f64 * 100.0 / t.capacity as f64
        } else {
            0.0
        };
        println!(
            "  {:<8} {:<32} capacity {:>11}  used {:>11} ({pct:.1}%)  pages {}",
            t.name,
            t.dir.as_deref().unwrap_or("-"),
            sz(t.capacity),
            sz(t.used),
            t.pages
        );
    }
    println!(
        "Hit ratio: {:.3} (page hits {}, misses {})",
        v.hit_ratio, v.page_hits, v.page_misses
    );
    let b = &v.bytes_by_source;
    println!(
        "Bytes served: memory {}, disk {}, under-store {}",
        sz(b.memory),
        sz(b.disk),
        sz(b.under_store)
    );
    let m = &v.metadata;
    println!(
        "Metadata: {} stats, {} listings, {} negative entries cached; sync policy {}{}",
        m.stats,
        m.listings,
        m.negative,
        m.default_policy,
        m.rules
            .iter()
            .map(|r| format!(", {}={}", r.prefix, r.policy))
            .collect::<String>()
    );
    let p = &v.passthrough;
    println!(
        "Passthrough: configured {}, kernel supports {}, enabled {}",
        p.configured, p.kernel_supported, p.enabled
    );
    println!(
        "Opens: passthrough {}, daemon {}",
        v.opens.passthrough, v.opens.daemon
    );
    let recent = &v.opens.recent;
    if !recent.is_empty() {
        println!(
            "Recent opens (last {} of {}; --json shows more):",
            recent.len().min(5),
            recent.len()
        );
    }
    for o in recent.iter().rev().take(5).rev() {
        println!("  {:<12} {}  ({})", o.mode, o.path, o.reason);
    }
    if let Some(rss) = v.peak_rss_bytes {
        println!("Peak memory (RSS): {}", format_size(rss));
    }
    if let Some(c) = &v.cluster {
        println!("Cluster: {}", c.membership);
        for w in &c.workers {
            match &w.stats {
                Some(st) if w.live => println!(
                    "  {:<20} {:<22} live  capacity {:>11}  used {:>11}  hit ratio {:.3}  served {}",
                    w.id,
                    w.addr,
                    sz(w.capacity),
                    sz(st.used),
                    st.hit_ratio,
                    sz(st.bytes_served)
                ),
                _ => println!(
                    "  {:<20} {:<22} DOWN  {}",
                    w.id,
                    w.addr,
                    w.error.as_deref().unwrap_or("")
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn down(state_dir: &Path) -> Result<ExitCode> {
    client_rt()?.block_on(async {
        let mut s = connect(state_dir, Request::Down).await?;
        drain(&mut s, |_: serde::de::IgnoredAny| Ok(()), |_| Ok(())).await
    })?;
    Ok(ExitCode::SUCCESS)
}
