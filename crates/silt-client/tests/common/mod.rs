//! Set-up shared by the client tests over one store: an in-memory page store and worker, the
//! store mounted at `/d`, and the client options the tests start from.

// Each test crate uses only part of this.
#![allow(dead_code)]

use std::sync::Arc;

use silt_cache::{PageStore, PageStoreConfig};
use silt_client::{ClientOptions, MountPoint, Namespace};
use silt_common::config::Config;
use silt_common::sync::SyncRules;
use silt_reader::{PageReader, PageReaderOptions};
use silt_ufs::DynStore;

/// A worker over an in-memory page store of `memory` bytes in pages of `page_size`: 4 fetches
/// at a time, 1 MiB of fetch buffers, requests of at most two pages.
pub fn worker(page_size: u64, memory: u64) -> Arc<PageReader> {
    let pages = Arc::new(PageStore::open(PageStoreConfig::in_memory(page_size, memory)).unwrap());
    Arc::new(PageReader::new(
        pages,
        &PageReaderOptions {
            fetch_concurrency: 4,
            buffer_memory: 1 << 20,
            request_size: 2 * page_size,
        },
        tokio::runtime::Handle::current(),
    ))
}

/// A namespace with `store` mounted at `/d` and nothing else.
pub fn at_d(store: DynStore) -> Namespace {
    Namespace::new(vec![MountPoint {
        path: "/d".into(),
        store,
    }])
    .unwrap()
}

/// The default configuration's client options with `sync`, read-ahead of at most 8 pages of
/// 4 KiB and 4 fetches at a time (metadata ages from the system clock: tests that move time
/// set a manual one).
pub fn options(sync: SyncRules) -> ClientOptions {
    ClientOptions {
        sync,
        prefetch_max: 8 * 4096,
        fetch_concurrency: 4,
        ..ClientOptions::from_config(&Config::default())
    }
}

/// The seeds a model test runs: `SILT_MODEL_SEED` runs one, else a fixed few.
pub fn model_seeds() -> Vec<u64> {
    match std::env::var("SILT_MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("SILT_MODEL_SEED: a number")],
        Err(_) => vec![1, 2, 3],
    }
}

/// Operations per model run: `SILT_MODEL_OPS`, else 1500.
pub fn model_ops() -> usize {
    std::env::var("SILT_MODEL_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500)
}
