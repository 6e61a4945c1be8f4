//! The worker's page store: fixed-size pages of object versions, cached in a memory tier and
//! any number of disk tiers, with LRU eviction between watermarks, crash-safe recovery of
//! the disk tiers and checksum verification of every disk read. No network here.
//!
//! Page `i` of an object of `object_size` bytes covers
//! `[i * page_size, min((i + 1) * page_size, object_size))`. Pages are keyed by the object's
//! content fingerprint ([`ObjectId`]), so a changed object never reuses old pages.
//!
//! Module map: `store` (the [`PageStore`] and its memory tier), `disk` (disk tier files, the
//! journal and recovery; its module documentation describes the on-disk format), `policy`
//! ([`EvictionPolicy`], [`LruPolicy`]), `singleflight` ([`SingleFlight`]) and `arena` (the
//! [`Arena`] of memory-first [`WriteBuffer`]s for written data, spilling to disk).

mod arena;
mod disk;
mod policy;
mod singleflight;
mod store;

pub use arena::{Arena, ArenaConfig, ArenaStats, JobStats, WriteBuffer};
pub use policy::{new_policy, EvictionPolicy, Handle, LruPolicy, PolicyKey};
pub use singleflight::SingleFlight;
pub use store::{
    CompleteFile, PageStore, PageStoreConfig, PageStoreStats, PinGuard, Source, TierStats,
};

pub use silt_common::{ObjectId, PageKey};

/// Length of page `index` of an object of `object_size` bytes, or `None` if the object has
/// no such page.
pub fn page_len(index: u64, object_size: u64, page_size: u64) -> Option<u64> {
    let start = index.checked_mul(page_size)?;
    (start < object_size).then(|| (object_size - start).min(page_size))
}

/// Number of pages of an object of `object_size` bytes.
pub fn page_count(object_size: u64, page_size: u64) -> u64 {
    if page_size == 0 {
        return 0;
    }
    object_size.div_ceil(page_size)
}
