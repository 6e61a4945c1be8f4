//! Benchmark B7 (issue 44): a client's metadata at scale, in process, over a synthetic store
//! (`silt_ufs::SyntheticStore`: `dirs × files_per_dir` files described, none stored), so this
//! machine can walk namespaces far larger than any store here holds.
//!
//! One run: the store's own listing of every directory (the baseline of the walk), then a
//! client set up as `silt up` sets up its own (single node, the store mounted at `/data`)
//! walks `/data` as `find` does (each directory listed, each entry stat'ed), then stats a
//! seeded sample of files again (answered from what the walk cached). Printed as one JSON
//! object: entries, seconds of each part, the process's RSS before and after the walk and the
//! bytes of RSS per cached entry, the sample's stat latencies (p50, p99), and the restart as
//! it is today: the metadata snapshot's size per entry, the seconds to save it and to read it
//! back whole into a new client.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use serde_json::json;
use silt_client::Client;
use silt_common::config::Config;
use silt_ufs::{SyntheticStore, UnderStore};

/// What one B7 run walks and samples.
#[derive(Clone, Debug)]
pub struct MetaSpec {
    pub dirs: u64,
    pub files_per_dir: u64,
    pub seed: u64,
    /// Files stat'ed again after the walk, for the latency figures.
    pub samples: usize,
    /// The client's state directory (its disk tier and snapshot; nothing is read from it).
    pub state_dir: std::path::PathBuf,
}

/// Resident set size of this process, in bytes (`VmRSS`).
fn rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("no VmRSS in /proc/self/status")?;
    Ok(kib * 1024)
}

/// The single-node client `silt up` builds, over `store` at `/data`, with a small memory tier
/// and no disk tier worth the name (B7 measures metadata, not pages).
fn client_over(store: silt_ufs::DynStore, state_dir: &std::path::Path) -> Result<Client> {
    let mut cfg = Config::default();
    std::fs::create_dir_all(state_dir)?;
    let state = std::path::absolute(state_dir)?.display().to_string();
    for (k, v) in [
        ("state_dir", state.clone()),
        ("memory_capacity", "16MiB".into()),
        ("disk_tiers", format!("{state}/cache:64MiB")),
    ] {
        cfg.set(k, &v).with_context(|| format!("option {k}={v}"))?;
    }
    crate::shuffle::single_node_client(&cfg, store)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One B7 run (module docs).
pub async fn run(spec: &MetaSpec) -> Result<serde_json::Value> {
    let store = Arc::new(SyntheticStore::new(
        spec.dirs,
        spec.files_per_dir,
        spec.seed,
    ));
    let entries = store.entries();

    // The store's own listing: every directory once, nothing kept.
    let t = Instant::now();
    let mut listed = store.list("", false).await?.len() as u64;
    for d in 0..spec.dirs {
        listed += store.list(&format!("d{d:07}"), false).await?.len() as u64;
    }
    let store_list_s = t.elapsed().as_secs_f64();
    ensure!(
        listed == entries,
        "the store listed {listed} entries, expected {entries}"
    );

    let client = client_over(store.clone(), &spec.state_dir)?;
    let rss_before = rss()?;
    let t = Instant::now();
    let mut walked = 0u64;
    let top = client.list("/data").await?;
    for dir in top.iter() {
        client.stat(&dir.path).await?;
        walked += 1;
        for e in client.list(&dir.path).await?.iter() {
            client.stat(&e.path).await?;
            walked += 1;
        }
    }
    let walk_s = t.elapsed().as_secs_f64();
    let rss_after = rss()?;
    ensure!(
        walked == entries,
        "the walk met {walked} entries, expected {entries}"
    );

    // Stats of a seeded sample of files, answered from what the walk cached.
    let mut x = spec.seed ^ 0x5EED;
    let mut lat = Vec::with_capacity(spec.samples);
    for _ in 0..spec.samples {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let d = (x >> 33) % spec.dirs.max(1);
        let f = (x >> 13) % spec.files_per_dir.max(1);
        let path = format!("/data/{}", SyntheticStore::file_path(d, f));
        let t = Instant::now();
        client.stat(&path).await?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let grown = rss_after.saturating_sub(rss_before);

    // The restart as it is: the whole cache saved to the snapshot at a clean stop, and read
    // back whole by the next client before it serves.
    let snapshot = spec.state_dir.join("b7-metadata.snapshot");
    let t = Instant::now();
    let saved = client.save_metadata(&snapshot)?;
    let save_s = t.elapsed().as_secs_f64();
    let snapshot_bytes = std::fs::metadata(&snapshot)?.len();
    drop(client);
    let next = client_over(store.clone(), &spec.state_dir)?;
    let t = Instant::now();
    let restored = next.restore_metadata(&snapshot)?;
    let restore_s = t.elapsed().as_secs_f64();
    Ok(json!({
        "entries": entries,
        "dirs": spec.dirs,
        "files_per_dir": spec.files_per_dir,
        "store_list_seconds": store_list_s,
        "walk_seconds": walk_s,
        "walk_over_store_list": walk_s / store_list_s.max(1e-9),
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
        "rss_bytes_per_entry": grown as f64 / entries.max(1) as f64,
        "stat_samples": lat.len(),
        "stat_p50_us": percentile(&lat, 0.5),
        "stat_p99_us": percentile(&lat, 0.99),
        "snapshot_records": saved,
        "snapshot_bytes_per_entry": snapshot_bytes as f64 / entries.max(1) as f64,
        "snapshot_save_seconds": save_s,
        "snapshot_restored_records": restored,
        "snapshot_restore_seconds": restore_s,
    }))
}
