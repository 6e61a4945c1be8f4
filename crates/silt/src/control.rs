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
use serde_json::{json, Value};
use silt_common::size::format_size;
use silt_common::sync::SyncPolicy;
use silt_common::{metrics, Error};
use silt_proto::{
    decode_json, decode_request, read_frame, write_error, write_frame, write_json, ErrorBody,
    FrameKind, Versioned,
};
use tokio::net::{UnixListener, UnixStream};

use crate::daemon::Daemon;

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
            let mut v = report_json(d);
            if let Some(router) = &d.cluster {
                v["cluster"] = cluster_json(router).await;
            }
            write_json(&mut s, &v).await
        }
        Request::Stat { path } => match d.client.stat(&path).await {
            Ok(e) => {
                let mut v = entry_json(&e);
                if let Ok(info) = d.client.policy_info(&path) {
                    v["sync"] = json!(info);
                }
                if let Ok(usage) = d.node().cache_usage(&path).await {
                    v["cache"] = json!(usage);
                }
                write_json(&mut s, &v).await
            }
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Sync { path, recursive } => {
            let r = d.client.sync(&path, recursive).await;
            return answer_after_kernel(&mut s, d, r).await;
        }
        Request::Pin { path } => match d.node().pin(&path).await {
            Ok(u) => write_json(&mut s, &json!(u)).await,
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Unpin { path } => match d.node().unpin(&path).await {
            Ok(n) => write_json(&mut s, &json!({"unpinned": n})).await,
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
                Some(p) => {
                    SyncPolicy::parse(p).and_then(|policy| d.client.set_sync_policy(&path, policy))
                }
                None => d.client.policy_info(&path),
            };
            return answer_after_kernel(&mut s, d, info).await;
        }
        Request::Ls { path } => match d.client.list(&path).await {
            Ok(list) => write_json(&mut s, &list.iter().map(entry_json).collect::<Vec<_>>()).await,
            Err(e) => return write_error(&mut s, &e).await,
        },
        Request::Cat { path } => return cat(&mut s, d, &path).await,
        Request::Persist { path } => {
            let r = d.client.persist(&path).await.map(states_json);
            return answer_after_kernel(&mut s, d, r).await;
        }
        Request::PersistState { path } => match d.client.persist_status(&path) {
            Ok(v) => write_json(&mut s, &states_json(v)).await,
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
            write_json(&mut s, &memory_json(d)).await
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
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
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
                let _ = tx.send(json!({"progress": {
                        "files_total": p.files_total, "bytes_total": p.bytes_total,
                        "pages_done": p.pages_done, "pages_total": p.pages_total,
                        "bytes_done": p.bytes_done, "bytes_cached": p.bytes_cached}}));
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
            write_json(s, &json!({"done": {
                "files": p.files_total, "bytes_total": p.bytes_total, "bytes_loaded": p.bytes_done,
                "bytes_already_cached": p.bytes_cached, "seconds": secs,
                "throughput_bytes_per_sec": if secs > 0.0 { p.bytes_done as f64 / secs } else { 0.0 }}}))
            .await?;
            write_frame(s, FrameKind::End, &[]).await
        }
        Ok(Err(e)) => write_error(s, &e).await,
        Err(e) => {
            record.finish(Err(format!("load task failed: {e}")));
            write_error(s, &Error::internal(format!("load task failed: {e}"))).await
        }
    }
}

fn entry_json(e: &silt_client::Entry) -> Value {
    let mtime = e
        .mtime
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    let obj = e.object.as_ref();
    json!({
        "path": e.path,
        "name": e.name(),
        "type": match e.kind {
            silt_ufs::EntryKind::Dir => "dir",
            silt_ufs::EntryKind::File => "file",
            silt_ufs::EntryKind::Symlink => "symlink",
            silt_ufs::EntryKind::Special(_) => "special",
        },
        "size": e.size,
        "mtime": mtime,
        "mode": e.mode.map(|m| format!("{:o}", m & 0o7777)),
        "store": obj.map(|o| o.store.uri().to_string()),
        "etag": obj.and_then(|o| o.meta.etag.clone()),
        "fingerprint": obj.filter(|_| !e.is_dir()).map(|o| o.meta.content_fingerprint()),
    })
}

fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Every worker of the view: identity, liveness, capacity, usage, hit ratio.
async fn cluster_json(router: &silt_cluster::Router) -> Value {
    let workers: Vec<Value> = router
        .worker_stats()
        .await
        .into_iter()
        .map(|(m, r)| match r {
            Ok(st) => json!({"id": m.id, "addr": m.addr, "live": true,
                "capacity": st.capacity, "used": st.used, "hit_ratio": st.hit_ratio,
                "page_hits": st.page_hits, "page_misses": st.page_misses,
                "reads_served": st.reads_served, "bytes_served": st.bytes_served,
                "files_lent": st.files_lent,
                "ufs_read_bytes": st.ufs_read_bytes}),
            Err(e) => json!({"id": m.id, "addr": m.addr, "live": false, "error": e.to_string(),
                "capacity": m.capacity}),
        })
        .collect();
    json!({"membership": router.membership().describe(), "workers": workers})
}

fn states_json(states: Vec<(String, silt_client::FileState)>) -> Value {
    Value::Array(
        states
            .into_iter()
            .map(|(p, st)| {
                let mut v = json!(st);
                v["path"] = json!(p);
                v
            })
            .collect(),
    )
}

/// Memory of the read cache and of written data, with their ceilings.
fn memory_json(d: &Daemon) -> Value {
    let stats = d.client.cache_stats();
    let cache = stats.tiers.first();
    let mut v = json!({
        "cache": {"capacity": cache.map_or(0, |t| t.capacity), "used": cache.map_or(0, |t| t.used)},
        "peak_rss_bytes": peak_rss_bytes(),
    });
    if let Some(w) = d.client.write_stats() {
        v["write"] = json!({
            "ceiling": w.arena.memory_ceiling,
            "used": w.arena.memory_used,
            "peak": w.arena.memory_peak,
            "spilled": w.arena.spilled,
            "buffers": w.arena.buffers,
            "cache_only_files": w.cache_only_files,
            "cache_only_bytes": w.cache_only_bytes,
            "pending_upload_files": w.pending_files,
            "pending_upload_bytes": w.pending_bytes,
            "jobs": w.arena.jobs.iter().map(|j| json!({
                "prefix": j.prefix, "priority": j.priority, "memory_quota": j.memory_quota,
                "memory_used": j.memory_used, "spilled": j.spilled,
            })).collect::<Vec<_>>(),
        });
    }
    v
}

fn report_json(d: &Daemon) -> Value {
    let stats = d.client.cache_stats();
    let meta_sizes = d.client.metadata_sizes();
    let rules = d.client.sync_rules();
    let hits = metrics::PAGE_HITS.get();
    let misses = metrics::PAGE_MISSES.get();
    let tiers: Vec<Value> = stats
        .tiers
        .iter()
        .map(|t| json!({"name": t.name, "dir": t.dir.as_ref().map(|p| p.display().to_string()), "capacity": t.capacity, "used": t.used, "pages": t.pages}))
        .collect();
    let opens: Vec<Value> = d
        .fuse
        .recent_opens
        .lock()
        .iter()
        .map(|o| json!(o))
        .collect();
    let all: serde_json::Map<String, Value> = metrics::all()
        .iter()
        .map(|m| (m.name.to_string(), json!(m.counter.get())))
        .collect();
    json!({
        "role": d.role,
        "mountpoint": d.config.mountpoint.display().to_string(),
        "state_dir": d.config.state_dir.display().to_string(),
        "mounts": d.mounts().iter().map(|m| json!({"path": m.path, "uri": silt_ufs::redact_uri(&m.uri)})).collect::<Vec<_>>(),
        "page_size": d.client.page_size(),
        "tiers": tiers,
        "page_hits": hits,
        "page_misses": misses,
        "evictions": stats.evictions,
        "admissions_refused": stats.admissions_refused,
        "pinned": {"objects": stats.pinned_objects, "bytes": stats.pinned_bytes},
        "hit_ratio": if hits + misses > 0 { hits as f64 / (hits + misses) as f64 } else { 0.0 },
        "bytes_by_source": {
            "memory": metrics::READ_BYTES_MEMORY.get(),
            "disk": metrics::READ_BYTES_DISK.get(),
            "under_store": metrics::READ_BYTES_UFS.get(),
        },
        "metadata": {
            "stats": meta_sizes.0,
            "listings": meta_sizes.1,
            "negative": meta_sizes.2,
            "default_policy": rules.default_policy().to_string(),
            "rules": rules.rules().map(|r| json!({"prefix": r.prefix, "policy": r.policy.to_string()})).collect::<Vec<_>>(),
        },
        "passthrough": {
            "configured": format!("{:?}", d.config.passthrough).to_lowercase(),
            "kernel_supported": d.fuse.kernel_passthrough.load(Ordering::Relaxed),
            "enabled": d.fuse.passthrough_enabled.load(Ordering::Relaxed),
        },
        "opens": {
            "passthrough": metrics::FUSE_OPENS_PASSTHROUGH.get(),
            "daemon": metrics::FUSE_OPENS_DAEMON.get(),
            "recent": opens,
        },
        "peak_rss_bytes": peak_rss_bytes(),
        "memory": memory_json(d),
        "metrics": all,
    })
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

/// Reads frames until End, passing JSON and data frames to the callbacks.
async fn drain(
    s: &mut UnixStream,
    mut on_json: impl FnMut(Value) -> Result<()>,
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

fn one_json(state_dir: &Path, req: Request) -> Result<Value> {
    client_rt()?.block_on(async {
        let mut s = connect(state_dir, req).await?;
        let mut out = Value::Null;
        drain(
            &mut s,
            |v| {
                out = v;
                Ok(())
            },
            |_| Ok(()),
        )
        .await?;
        Ok(out)
    })
}

fn fmt_entry_line(v: &Value) -> String {
    let kind = if v["type"] == "dir" { "d" } else { "-" };
    format!(
        "{kind} {:>12}  {}",
        v["size"].as_u64().unwrap_or(0),
        v["name"].as_str().unwrap_or("")
    )
}

pub fn fs_command(state_dir: &Path, op: &str, path: &str) -> Result<ExitCode> {
    let path_s = path.to_string();
    match op {
        "ls" => {
            let v = one_json(state_dir, Request::Ls { path: path_s })?;
            for e in v.as_array().into_iter().flatten() {
                println!("{}", fmt_entry_line(e));
            }
        }
        "stat" => {
            let v = one_json(state_dir, Request::Stat { path: path_s })?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        "cat" => {
            client_rt()?.block_on(async {
                let mut s = connect(state_dir, Request::Cat { path: path_s }).await?;
                let stdout = std::io::stdout();
                let mut out = stdout.lock();
                drain(
                    &mut s,
                    |_| Ok(()),
                    |d| out.write_all(d).context("writing to stdout"),
                )
                .await?;
                out.flush()?;
                Ok::<_, anyhow::Error>(())
            })?;
        }
        "pin" => {
            let v = one_json(state_dir, Request::Pin { path: path_s })?;
            println!(
                "pinned {path}: {} files, {} bytes pinned, {} bytes cached",
                v["files"], v["pinned_bytes"], v["cached_bytes"]
            );
        }
        "unpin" => {
            let v = one_json(state_dir, Request::Unpin { path: path_s })?;
            println!("unpinned {path}: {} files", v["unpinned"]);
        }
        "free" => {
            let v = one_json(state_dir, Request::Free { path: path_s })?;
            println!(
                "freed {path}: {} files, {} cached bytes dropped",
                v["files"], v["cached_bytes"]
            );
        }
        other => bail!("unknown fs command {other}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// What `silt fs sync` and `silt fs invalidate` print: counts, then the changed paths.
fn print_sync_report(verb: &str, path: &str, v: &Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    if verb == "invalidated" {
        println!(
            "invalidated {path}: {} entries dropped, cached pages of {} versions dropped",
            n("invalidated"),
            n("objects_dropped")
        );
    } else {
        println!(
            "synced {path}: {} checked, {} added, {} removed, {} content changed, {} metadata changed; cached pages of {} versions dropped",
            n("checked"),
            n("added"),
            n("removed"),
            n("content_changed"),
            n("metadata_changed"),
            n("objects_dropped")
        );
    }
    for c in v["changes"].as_array().into_iter().flatten() {
        if let (Some(p), Some(k)) = (c[0].as_str(), c[1].as_str()) {
            if verb != "invalidated" || k != "invalidated" {
                println!("  {k:<12} {p}");
            }
        }
    }
}

fn print_states(v: &Value) -> bool {
    let mut failed = false;
    for s in v.as_array().into_iter().flatten() {
        let path = s["path"].as_str().unwrap_or("?");
        let state = s["state"].as_str().unwrap_or("?");
        match state {
            "failed" => {
                failed = true;
                println!(
                    "{path}: failed after {} attempts: {}",
                    s["attempts"].as_u64().unwrap_or(0),
                    s["reason"].as_str().unwrap_or("?")
                );
            }
            "pending" | "uploading" => {
                println!(
                    "{path}: {state} ({})",
                    format_size(s["bytes"].as_u64().unwrap_or(0))
                )
            }
            "unknown" => {
                println!("{path}: not a pending back file (in the store, or not written back)")
            }
            _ => println!("{path}: {state}"),
        }
    }
    failed
}

/// `silt fs persist PATH`: uploads the `back` files at or below PATH now and waits; exits 1 if
/// one failed.
pub fn persist(state_dir: &Path, path: &str) -> Result<ExitCode> {
    let v = one_json(
        state_dir,
        Request::Persist {
            path: path.to_string(),
        },
    )?;
    Ok(if print_states(&v) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `silt fs state PATH`: where the `back` files at or below PATH stand.
pub fn persist_state(state_dir: &Path, path: &str) -> Result<ExitCode> {
    let v = one_json(
        state_dir,
        Request::PersistState {
            path: path.to_string(),
        },
    )?;
    print_states(&v);
    Ok(ExitCode::SUCCESS)
}

/// `silt memory [--write SIZE] [--cache SIZE]`: shows (and sets) the memory ceilings.
pub fn memory(state_dir: &Path, write: Option<u64>, cache: Option<u64>) -> Result<ExitCode> {
    let v = one_json(
        state_dir,
        Request::Memory {
            write_memory: write,
            cache_memory: cache,
        },
    )?;
    let n = |v: &Value| format_size(v.as_u64().unwrap_or(0));
    println!(
        "read cache: {} used of {}",
        n(&v["cache"]["used"]),
        n(&v["cache"]["capacity"])
    );
    let w = &v["write"];
    if w.is_object() {
        println!(
            "written data: {} in memory of {} (peak {}), {} spilled to disk; {} cache-only files ({}), {} files waiting for upload ({})",
            n(&w["used"]),
            n(&w["ceiling"]),
            n(&w["peak"]),
            n(&w["spilled"]),
            w["cache_only_files"].as_u64().unwrap_or(0),
            n(&w["cache_only_bytes"]),
            w["pending_upload_files"].as_u64().unwrap_or(0),
            n(&w["pending_upload_bytes"]),
        );
        for j in w["jobs"].as_array().into_iter().flatten() {
            // The default job has no quota (u64::MAX): "16777216.00 TiB" said nothing.
            let quota = match j["memory_quota"].as_u64() {
                Some(u64::MAX) | None => "no quota".to_string(),
                Some(q) => format!("of {}", format_size(q)),
            };
            println!(
                "  job {} (priority {}): {} in memory {quota}, {} spilled",
                // The jobs without a `--write-jobs` prefix of their own share the default one.
                match j["prefix"].as_str() {
                    Some("") => "(default: every other path)",
                    Some(p) => p,
                    None => "?",
                },
                j["priority"].as_u64().unwrap_or(0),
                n(&j["memory_used"]),
                n(&j["spilled"])
            );
        }
    } else {
        println!("written data: none (this Silt does not write)");
    }
    println!("process peak RSS: {}", n(&v["peak_rss_bytes"]));
    Ok(ExitCode::SUCCESS)
}

/// `silt fs sync PATH [--recursive]`: revalidates now and reports what changed.
pub fn sync(state_dir: &Path, path: &str, recursive: bool) -> Result<ExitCode> {
    let v = one_json(
        state_dir,
        Request::Sync {
            path: path.to_string(),
            recursive,
        },
    )?;
    print_sync_report("synced", path, &v);
    Ok(ExitCode::SUCCESS)
}

/// `silt fs invalidate PATH`: drops metadata and cached data, and reports what was dropped.
pub fn invalidate(state_dir: &Path, path: &str) -> Result<ExitCode> {
    let v = one_json(
        state_dir,
        Request::Invalidate {
            path: path.to_string(),
        },
    )?;
    print_sync_report("invalidated", path, &v);
    Ok(ExitCode::SUCCESS)
}

/// `silt fs sync-policy PATH [POLICY]`: shows, or sets, the sync policy of a prefix.
pub fn sync_policy(state_dir: &Path, path: &str, policy: Option<&str>) -> Result<ExitCode> {
    if let Some(p) = policy {
        // Checked here too, so a typo gets its message without a running silt.
        SyncPolicy::parse(p)?;
    }
    let v = one_json(
        state_dir,
        Request::SyncPolicy {
            path: path.to_string(),
            policy: policy.map(str::to_string),
        },
    )?;
    let checked = match v["checked_secs_ago"].as_f64() {
        Some(s) => format!("; the store last answered {s:.1}s ago"),
        None => "; nothing cached".into(),
    };
    println!(
        "{path}: {} (rule {}){checked}",
        v["policy"].as_str().unwrap_or("?"),
        v["rule"].as_str().unwrap_or("?")
    );
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
    let mut done = Value::Null;
    client_rt()?.block_on(async {
        let mut s = connect(state_dir, req).await?;
        drain(
            &mut s,
            |v| {
                if let Some(p) = v.get("progress") {
                    let total = p["bytes_total"].as_u64().unwrap_or(0);
                    let cached = p["bytes_cached"].as_u64().unwrap_or(0);
                    bar.set_length(total);
                    bar.set_position(cached + p["bytes_done"].as_u64().unwrap_or(0));
                    bar.set_message(format!("{} files", p["files_total"]));
                } else if let Some(d) = v.get("done") {
                    done = d.clone();
                }
                Ok(())
            },
            |_| Ok(()),
        )
        .await
    })?;
    bar.finish_and_clear();
    let secs = done["seconds"].as_f64().unwrap_or(0.0);
    let loaded = done["bytes_loaded"].as_u64().unwrap_or(0);
    println!(
        "loaded {} files: {} fetched, {} already cached, in {:.2}s ({}/s)",
        done["files"],
        format_size(loaded),
        format_size(done["bytes_already_cached"].as_u64().unwrap_or(0)),
        secs,
        format_size(done["throughput_bytes_per_sec"].as_f64().unwrap_or(0.0) as u64)
    );
    Ok(ExitCode::SUCCESS)
}

pub fn report(state_dir: &Path, as_json: bool) -> Result<ExitCode> {
    let v = one_json(state_dir, Request::Report)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let sz = |x: &Value| format_size(x.as_u64().unwrap_or(0));
    println!(
        "Silt {} at {} (state {}), page size {}",
        v["role"].as_str().unwrap_or("?"),
        v["mountpoint"].as_str().unwrap_or("?"),
        v["state_dir"].as_str().unwrap_or("?"),
        sz(&v["page_size"])
    );
    println!("Mounts:");
    for m in v["mounts"].as_array().into_iter().flatten() {
        println!(
            "  {} -> {}",
            m["path"].as_str().unwrap_or(""),
            m["uri"].as_str().unwrap_or("")
        );
    }
    println!("Tiers:");
    for t in v["tiers"].as_array().into_iter().flatten() {
        let cap = t["capacity"].as_u64().unwrap_or(0);
        let used = t["used"].as_u64().unwrap_or(0);
        let pct = if cap > 0 {
            used as f64 * 100.0 / cap as f64
        } else {
            0.0
        };
        println!(
            "  {:<8} {:<32} capacity {:>11}  used {:>11} ({pct:.1}%)  pages {}",
            t["name"].as_str().unwrap_or(""),
            t["dir"].as_str().unwrap_or("-"),
            sz(&t["capacity"]),
            sz(&t["used"]),
            t["pages"]
        );
    }
    println!(
        "Hit ratio: {:.3} (page hits {}, misses {})",
        v["hit_ratio"].as_f64().unwrap_or(0.0),
        v["page_hits"],
        v["page_misses"]
    );
    let b = &v["bytes_by_source"];
    println!(
        "Bytes served: memory {}, disk {}, under-store {}",
        sz(&b["memory"]),
        sz(&b["disk"]),
        sz(&b["under_store"])
    );
    let m = &v["metadata"];
    if m.is_object() {
        println!(
            "Metadata: {} stats, {} listings, {} negative entries cached; sync policy {}{}",
            m["stats"],
            m["listings"],
            m["negative"],
            m["default_policy"].as_str().unwrap_or("?"),
            m["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| format!(
                    ", {}={}",
                    r["prefix"].as_str().unwrap_or("?"),
                    r["policy"].as_str().unwrap_or("?")
                ))
                .collect::<String>()
        );
    }
    let p = &v["passthrough"];
    println!(
        "Passthrough: configured {}, kernel supports {}, enabled {}",
        p["configured"].as_str().unwrap_or("?"),
        p["kernel_supported"],
        p["enabled"]
    );
    println!(
        "Opens: passthrough {}, daemon {}",
        v["opens"]["passthrough"], v["opens"]["daemon"]
    );
    let recent = v["opens"]["recent"].as_array().cloned().unwrap_or_default();
    if !recent.is_empty() {
        println!(
            "Recent opens (last {} of {}; --json shows more):",
            recent.len().min(5),
            recent.len()
        );
    }
    for o in recent.iter().rev().take(5).rev() {
        println!(
            "  {:<12} {}  ({})",
            o["mode"].as_str().unwrap_or(""),
            o["path"].as_str().unwrap_or(""),
            o["reason"].as_str().unwrap_or("")
        );
    }
    if let Some(rss) = v["peak_rss_bytes"].as_u64() {
        println!("Peak memory (RSS): {}", format_size(rss));
    }
    if let Some(c) = v.get("cluster") {
        println!("Cluster: {}", c["membership"].as_str().unwrap_or("?"));
        for w in c["workers"].as_array().into_iter().flatten() {
            if w["live"] == true {
                println!(
                    "  {:<20} {:<22} live  capacity {:>11}  used {:>11}  hit ratio {:.3}  served {}",
                    w["id"].as_str().unwrap_or(""),
                    w["addr"].as_str().unwrap_or(""),
                    sz(&w["capacity"]),
                    sz(&w["used"]),
                    w["hit_ratio"].as_f64().unwrap_or(0.0),
                    sz(&w["bytes_served"])
                );
            } else {
                println!(
                    "  {:<20} {:<22} DOWN  {}",
                    w["id"].as_str().unwrap_or(""),
                    w["addr"].as_str().unwrap_or(""),
                    w["error"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn down(state_dir: &Path) -> Result<ExitCode> {
    client_rt()?.block_on(async {
        let mut s = connect(state_dir, Request::Down).await?;
        drain(&mut s, |_| Ok(()), |_| Ok(())).await
    })?;
    Ok(ExitCode::SUCCESS)
}
