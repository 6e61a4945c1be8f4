//! `GET /metrics`: the counters and histograms (process-wide atomics) and the gauges, read
//! from this process when scraped.

use std::time::UNIX_EPOCH;

use silt_common::metrics::{self, Exposition};

use crate::Ops;

/// The whole exposition of this process, in Prometheus text format.
pub fn exposition(ops: &Ops) -> String {
    let mut e = Exposition::new();
    e.counters();
    e.histograms();
    let none: &[&str] = &[];

    e.gauge(
        &metrics::INFO,
        [(&[env!("CARGO_PKG_VERSION"), ops.role.as_str()][..], 1.0)],
    );
    let started = ops
        .started
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    e.gauge(&metrics::START_TIME_SECONDS, [(none, started)]);
    for (def, gauge) in &ops.gauges {
        e.gauge(def, [(none, gauge.get() as f64)]);
    }
    if let Some(node) = &ops.node {
        node_gauges(&mut e, node);
    }
    e.finish()
}

/// The gauges of a process with a client: its namespace, tiers, writes, mount and cluster.
fn node_gauges(e: &mut Exposition, node: &silt_node::Node) {
    let client = &node.client;
    let none: &[&str] = &[];
    let mounts = silt_node::client_mounts(client);
    let mount_labels: Vec<[&str; 2]> = mounts
        .iter()
        .map(|m| [m.path.as_str(), m.uri.as_str()])
        .collect();
    e.gauge(
        &metrics::MOUNT_INFO,
        mount_labels.iter().map(|l| (&l[..], 1.0)),
    );

    let stats = client.cache_stats();
    let tiers: Vec<[&str; 1]> = stats.tiers.iter().map(|t| [t.name.as_str()]).collect();
    let per_tier = |f: fn(&silt_cache::TierStats) -> u64| {
        tiers
            .iter()
            .zip(&stats.tiers)
            .map(move |(l, t)| (&l[..], f(t) as f64))
    };
    e.gauge(&metrics::TIER_CAPACITY_BYTES, per_tier(|t| t.capacity));
    e.gauge(&metrics::TIER_USED_BYTES, per_tier(|t| t.used));
    e.gauge(&metrics::TIER_PAGES, per_tier(|t| t.pages));
    e.gauge(&metrics::PINNED_BYTES, [(none, stats.pinned_bytes as f64)]);
    e.gauge(
        &metrics::PAGES_IN_FLIGHT,
        [(none, client.fetches_in_flight() as f64)],
    );

    let w = client.write_stats();
    let write = |f: fn(&silt_client::WriteStats) -> u64| w.as_ref().map(|w| (none, f(w) as f64));
    e.gauge(
        &metrics::WRITE_MEMORY_USED_BYTES,
        write(|w| w.arena.memory_used),
    );
    e.gauge(
        &metrics::WRITE_MEMORY_CEILING_BYTES,
        write(|w| w.arena.memory_ceiling),
    );
    e.gauge(&metrics::WRITE_SPILL_USED_BYTES, write(|w| w.arena.spilled));
    e.gauge(&metrics::PENDING_UPLOAD_FILES, write(|w| w.pending_files));
    e.gauge(&metrics::PENDING_UPLOAD_BYTES, write(|w| w.pending_bytes));

    e.gauge(
        &metrics::FUSE_OPEN_HANDLES,
        [(none, metrics::FUSE_HANDLES.get() as f64)],
    );
    let (members, suspect) = match &node.cluster {
        Some(router) => (
            router.membership().view().members.len(),
            router.suspect_count(),
        ),
        // A single node is its own (only) worker.
        None => (1, 0),
    };
    e.gauge(&metrics::CLUSTER_MEMBERS, [(none, members as f64)]);
    e.gauge(&metrics::CLUSTER_MEMBERS_SUSPECT, [(none, suspect as f64)]);
}
