//! Benchmark baseline: read objects straight from an under-store, with no cache, using the
//! best simple strategy at a given concurrency. Used by `bench/run`.
//!
//!     direct_read URI large CONCURRENCY RANGE_SIZE KEY...   # each key by parallel ranged GETs
//!     direct_read URI small CONCURRENCY KEY...              # whole objects, CONCURRENCY at once
//!     direct_read URI list PREFIX                          # one recursive (paginated) listing
//!                                                          # (the store opened unchecked)
//!
//! Credentials and endpoint come from SILT_S3_* / AWS_* like the product. Prints JSON.

use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt};
use silt_common::config::Config;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 || (args[2] != "list" && args.len() < 5) {
        anyhow::bail!(
            "usage: direct_read URI large|small CONCURRENCY [RANGE_SIZE] KEY... | direct_read URI list PREFIX"
        );
    }
    let mut cfg = Config::default();
    cfg.apply_env()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let mode = args[2].as_str();
    let uri = silt_ufs::StoreUri::parse(&args[1])?;
    let opened = silt_ufs::S3Store::open(&uri, &silt_ufs::S3Options::from_config(&cfg))?;
    // `list` skips the opening check (a one-key listing of the prefix), so that the timed
    // listing is the first request: through a cache (the S3 gateway) it is the one that
    // loads the metadata, which the check would otherwise load before the clock starts.
    if mode != "list" {
        rt.block_on(opened.verify())?;
    }
    let store: silt_ufs::DynStore = Arc::new(opened);
    if mode == "list" {
        let started = Instant::now();
        let entries = rt.block_on(store.list(&args[3], true))?;
        let secs = started.elapsed().as_secs_f64();
        let files = entries
            .iter()
            .filter(|m| m.kind == silt_ufs::EntryKind::File)
            .count();
        println!(
            "{{\"entries\": {}, \"files\": {files}, \"seconds\": {secs}}}",
            entries.len()
        );
        return Ok(());
    }
    let conc: usize = args[3].parse()?;
    let (range, keys) = match mode {
        "large" => (silt_common::size::parse_size(&args[4])?, &args[5..]),
        "small" => (0, &args[4..]),
        _ => anyhow::bail!("mode must be large or small"),
    };
    let started = Instant::now();
    let bytes: u64 = rt.block_on(async {
        let mut total = 0u64;
        if mode == "large" {
            for key in keys {
                let meta = store.stat(key).await?;
                let ranges: Vec<_> = (0..meta.size.div_ceil(range))
                    .map(|i| i * range..((i + 1) * range).min(meta.size))
                    .collect();
                let mut s = stream::iter(ranges)
                    .map(|r| store.read(key, r, &meta))
                    .buffer_unordered(conc);
                while let Some(b) = s.next().await {
                    total += b?.len() as u64;
                }
            }
        } else {
            let mut s = stream::iter(keys.iter())
                .map(|k| {
                    let store = store.clone();
                    async move {
                        let meta = store.stat(k).await?;
                        store.read(k, 0..meta.size, &meta).await
                    }
                })
                .buffer_unordered(conc);
            while let Some(b) = s.next().await {
                total += b?.len() as u64;
            }
        }
        Ok::<_, anyhow::Error>(total)
    })?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{{\"bytes\": {bytes}, \"files\": {}, \"seconds\": {secs}}}",
        keys.len()
    );
    Ok(())
}
