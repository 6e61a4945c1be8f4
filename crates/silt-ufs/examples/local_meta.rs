//! What a `file://` store's metadata calls cost, through the `UnderStore` API alone (so the
//! same file builds against an older checkout to compare): stats of files four directories
//! deep, listings of a 1,000-entry directory, and small whole-file writes, in a fresh
//! temporary directory. Prints each round's mean; a figure for docs/benchmarks.md, not a test.
//!
//!     cargo run --release -p silt-ufs --example local_meta [ROUNDS]

use std::time::Instant;

use silt_ufs::{open_store, S3Options};

const FILES: usize = 1000;
const STATS: usize = 50_000;
const LISTS: usize = 200;
const WRITES: usize = 2_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().map_err(|e| format!("ROUNDS {n:?}: {e}"))?,
        None => 3,
    };
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("a/b/c/d"))?;
    std::fs::create_dir_all(dir.path().join("w"))?;
    for i in 0..FILES {
        std::fs::write(dir.path().join(format!("a/b/c/d/f{i}")), b"x")?;
    }
    let store = open_store(
        &format!("file://{}", dir.path().display()),
        &S3Options::default(),
    )
    .await?;
    for round in 1..=rounds {
        let t = Instant::now();
        for i in 0..STATS {
            store.stat(&format!("a/b/c/d/f{}", i % FILES)).await?;
        }
        let stat_us = t.elapsed().as_secs_f64() / STATS as f64 * 1e6;
        let t = Instant::now();
        for _ in 0..LISTS {
            let n = store.list("a/b/c/d", false).await?.len();
            if n != FILES {
                return Err(format!("listed {n} entries, not {FILES}").into());
            }
        }
        let list_ms = t.elapsed().as_secs_f64() / LISTS as f64 * 1e3;
        let t = Instant::now();
        for i in 0..WRITES {
            store
                .write(
                    &format!("w/f{}", i % 100),
                    bytes::Bytes::from_static(b"hello"),
                )
                .await?;
        }
        let write_us = t.elapsed().as_secs_f64() / WRITES as f64 * 1e6;
        println!(
            "round {round}: stat {stat_us:.2} us, list of {FILES} {list_ms:.2} ms, write {write_us:.0} us"
        );
    }
    Ok(())
}
