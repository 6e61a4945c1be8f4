//! Cluster-wide operations of a client or worker process.

use futures::stream::{self, StreamExt};
use silt_client::{Client, LoadProgress};
use silt_cluster::router::split;
use silt_cluster::Router;
use silt_common::Result;

/// Preloads every file at or below each of `paths` (one job) by asking each placement group's owner to cache it,
/// `concurrency` groups at a time over all owners (never one job per file, never through
/// this process). Progress counts groups in `pages_*` and bytes in `bytes_*`; owners skip
/// what they already hold, so a rerun is cheap.
pub async fn load(
    client: &Client,
    router: &Router,
    paths: &[String],
    concurrency: usize,
    mut progress: impl FnMut(&LoadProgress),
) -> Result<LoadProgress> {
    let files = client.walk_paths(paths).await?;
    let mut p = LoadProgress {
        files_total: files.len() as u64,
        bytes_total: files.iter().map(|f| f.size).sum(),
        ..Default::default()
    };
    let mut work = Vec::new();
    for f in &files {
        let Some(obj) = f.object.clone() else {
            continue;
        };
        for part in split(0..f.size, router.group_size()) {
            work.push((obj.clone(), part));
        }
    }
    p.pages_total = work.len() as u64;
    progress(&p);
    let mut results = stream::iter(work)
        .map(|(obj, part)| async move {
            router
                .load(&obj, part)
                .await
                .map_err(|e| e.context(&obj.meta.path))
        })
        .buffer_unordered(concurrency.max(1));
    while let Some(r) = results.next().await {
        p.bytes_done += r?;
        p.pages_done += 1;
        progress(&p);
    }
    Ok(p)
}
