//! Measures the heap the page store's index spends per cached disk page and per cached
//! object, with a counting global allocator (so this lives alone in its own test binary).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use bytes::Bytes;
use silt_cache::{PageStore, PageStoreConfig};
use silt_common::config::DiskTierSpec;
use silt_common::{ObjectId, PageKey};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const PS: u64 = 4096;

/// Heap bytes the store holds after caching `objects` objects of `pages` pages each.
fn index_bytes(objects: u64, pages: u64) -> f64 {
    let dir = tempfile::TempDir::new().unwrap();
    let store = PageStore::open(PageStoreConfig {
        page_size: PS,
        memory_capacity: 0,
        disk_tiers: vec![DiskTierSpec {
            dir: dir.path().to_path_buf(),
            quota: u64::MAX / 2,
        }],
        high_watermark: 0.95,
        low_watermark: 0.85,
        eviction_policy: "lru".into(),
        disk_direct_io: true,
    })
    .unwrap();
    let data = Bytes::from(vec![7u8; PS as usize]);
    let before = LIVE.load(Ordering::Relaxed);
    for o in 0..objects {
        for i in 0..pages {
            let key = PageKey::new(ObjectId(u128::from(o) << 64 | 0xabc), i);
            store.put(key, data.clone(), pages * PS).unwrap();
        }
    }
    let after = LIVE.load(Ordering::Relaxed);
    assert_eq!(store.stats().tiers[1].pages, objects * pages);
    (after - before) as f64
}

#[test]
fn index_memory_per_page_and_per_object() {
    let n = 20_000;
    let per_page_big = index_bytes(100, n / 100) / n as f64;
    let per_object_single = index_bytes(n / 4, 1) / (n / 4) as f64;
    eprintln!(
        "page store index: {per_page_big:.1} bytes/page (objects of 200 pages), \
         {per_object_single:.1} bytes per one-page object"
    );
    assert!(per_page_big < 80.0, "{per_page_big} bytes per page");
    assert!(
        per_object_single < 200.0,
        "{per_object_single} bytes per object"
    );
}
