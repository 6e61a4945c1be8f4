//! The client's read path against the in-memory store: single-flight, parallel fetches on a
//! miss, prefetch only for sequential readers, versions never mixed, memory-only cache.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use silt_cache::{PageStore, PageStoreConfig};
use silt_client::{Client, ClientOptions, MountPoint, Namespace};
use silt_common::config::Config;
use silt_common::{metrics, ErrorKind, Result};
use silt_reader::{PageReader, PageReaderOptions};
use silt_ufs::{Capabilities, DynStore, MemStore, ObjectMeta, UnderStore};

const PS: u64 = 64 << 10;

/// Wraps a store: counts reads, the most reads in flight at once, and delays each read so that
/// concurrent callers overlap (the delay is what makes them overlap; nothing asserts on time).
struct Probe {
    inner: DynStore,
    reads: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    delay: Duration,
}

#[async_trait]
impl UnderStore for Probe {
    fn uri(&self) -> &str {
        self.inner.uri()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.inner.stat(path).await
    }
    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.inner.list(dir, recursive).await
    }
    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let r = self.inner.read(path, range, expected).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        r
    }
    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        self.inner.write(path, data).await
    }
    async fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(path).await
    }
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

fn setup(mem: Arc<MemStore>) -> (Client, Arc<Probe>) {
    setup_with(mem, 64 << 20, vec![], Duration::from_millis(20))
}

/// A client over `mem` (through a `Probe` delaying each read by `delay`) with a page store of
/// `memory_capacity` bytes over `disk_tiers`, the default eviction policy.
fn setup_with(
    mem: Arc<MemStore>,
    memory_capacity: u64,
    disk_tiers: Vec<silt_common::config::DiskTierSpec>,
    delay: Duration,
) -> (Client, Arc<Probe>) {
    let probe = Arc::new(Probe {
        inner: mem,
        reads: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        delay,
    });
    let pages = Arc::new(
        PageStore::open(PageStoreConfig {
            disk_tiers,
            ..PageStoreConfig::in_memory(PS, memory_capacity)
        })
        .unwrap(),
    );
    let worker = Arc::new(PageReader::new(
        pages,
        &PageReaderOptions {
            fetch_concurrency: 16,
            buffer_memory: 8 << 20,
            request_size: 4 * PS,
        },
        tokio::runtime::Handle::current(),
    ));
    let ns = Namespace::new(vec![MountPoint {
        path: "/d".into(),
        store: probe.clone(),
    }])
    .unwrap();
    let opts = ClientOptions {
        prefetch_max: 8 * PS,
        fetch_concurrency: 16,
        ..ClientOptions::from_config(&Config::default())
    };
    (
        Client::new(ns, worker, opts, tokio::runtime::Handle::current()),
        probe,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_of_one_page_fetch_once() {
    let mem = Arc::new(MemStore::new("mem://t"));
    let bytes = data(PS as usize * 2);
    mem.put("f", bytes.clone()).unwrap();
    let (client, probe) = setup(mem);
    let file = client.open("/d/f").await.unwrap();
    let reads: Vec<_> = (0..16)
        .map(|i| client.read(&file, PS + i * 100, 1000))
        .collect();
    for (i, r) in futures::future::join_all(reads)
        .await
        .into_iter()
        .enumerate()
    {
        let start = PS as usize + i * 100;
        assert_eq!(&r.unwrap()[..], &bytes[start..start + 1000]);
    }
    assert_eq!(
        probe.reads.load(Ordering::SeqCst),
        1,
        "16 readers of one cold page: one store read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_spanning_pages_fetches_them_in_parallel() {
    let mem = Arc::new(MemStore::new("mem://t"));
    let bytes = data(PS as usize * 12);
    mem.put("f", bytes.clone()).unwrap();
    let (client, probe) = setup(mem);
    let file = client.open("/d/f").await.unwrap();
    // A random-access read (not at offset 0, so no prefetch) covering pages 1..=10: with a
    // request size of 4 pages that is three ranged requests (4 + 4 + 2 pages), in parallel.
    let got = client.read(&file, PS + 10, 10 * PS - 20).await.unwrap();
    assert_eq!(&got[..], &bytes[PS as usize + 10..11 * PS as usize - 10]);
    assert_eq!(probe.reads.load(Ordering::SeqCst), 3);
    assert!(
        probe.max_in_flight.load(Ordering::SeqCst) >= 2,
        "the requests of one miss ran one by one"
    );
    // Served from the cache now: no new store reads.
    let again = client.read(&file, PS + 10, 10 * PS - 20).await.unwrap();
    assert_eq!(again, got);
    assert_eq!(probe.reads.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_sequential_readers_prefetch() {
    let mem = Arc::new(MemStore::new("mem://t"));
    let bytes = data(PS as usize * 64);
    mem.put("f", bytes.clone()).unwrap();
    mem.put("g", bytes.clone()).unwrap();
    let (client, _probe) = setup(mem);
    // Random reads far apart: no prefetch. A prefetch claims its pages synchronously, so any
    // page other than the ones read would now be cached or in flight.
    let file = client.open("/d/f").await.unwrap();
    let read_pages = [40u64, 3, 60, 17, 29];
    for page in read_pages {
        let got = client.read(&file, page * PS + 5, 100).await.unwrap();
        assert_eq!(
            &got[..],
            &bytes[(page * PS + 5) as usize..(page * PS + 105) as usize]
        );
    }
    let store = client.page_reader().page_store();
    for i in (0..64).filter(|i| !read_pages.contains(i)) {
        assert!(
            !store.contains(&silt_common::PageKey::new(file.object().id, i)),
            "page {i} was prefetched"
        );
    }
    assert_eq!(client.page_reader().in_flight(), 0);
    // A sequential reader gets pages ahead of it, and every byte is right.
    let file = client.open("/d/g").await.unwrap();
    let first = client.read(&file, 0, PS / 2).await.unwrap();
    let page1 = silt_common::PageKey::new(file.object().id, 1);
    assert!(
        store.contains(&page1) || client.page_reader().in_flight() > 0,
        "a sequential reader should have the next page fetched ahead"
    );
    let mut off = first.len() as u64;
    let mut out = first.to_vec();
    while off < bytes.len() as u64 {
        let b = client.read(&file, off, PS / 2).await.unwrap();
        off += b.len() as u64;
        out.extend_from_slice(&b);
    }
    assert!(out == bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_file_never_mixes_versions() {
    let mem = Arc::new(MemStore::new("mem://t"));
    let v1 = data(PS as usize * 3);
    mem.put("f", v1.clone()).unwrap();
    let (client, _probe) = setup(mem.clone());
    let file = client.open("/d/f").await.unwrap();
    // Random access at page 2 first, so nothing else is prefetched.
    assert_eq!(
        &client.read(&file, 2 * PS, 10).await.unwrap()[..],
        &v1[2 * PS as usize..2 * PS as usize + 10]
    );
    let v2: Vec<u8> = v1.iter().map(|b| b ^ 0xff).collect();
    mem.put("f", v2).unwrap();
    // Page 2 is cached for the version the file opened: still v1. Page 0 is not: the store has
    // v2 now, so the read fails instead of returning v2 bytes.
    assert_eq!(
        &client.read(&file, 2 * PS, 10).await.unwrap()[..],
        &v1[2 * PS as usize..2 * PS as usize + 10]
    );
    let e = client.read(&file, 0, 10).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_answer_lookups_until_the_ttl() {
    let mem = Arc::new(MemStore::new("mem://t"));
    mem.put("dir/a", data(10)).unwrap();
    mem.put("dir/b", data(20)).unwrap();
    let (client, _probe) = setup(mem.clone());
    let list = client.list("/d/dir").await.unwrap();
    assert_eq!(
        list.iter()
            .map(|e| e.name().to_string())
            .collect::<Vec<_>>(),
        vec!["a", "b"]
    );
    let n = mem.requests();
    // Stat of a listed child and of a missing one: answered by the listing, no store call.
    assert_eq!(client.stat("/d/dir/b").await.unwrap().size, 20);
    assert_eq!(
        client.stat("/d/dir/zzz").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(mem.requests(), n);
    // Synthetic root lists the mount; paths outside every mount are NotFound.
    let root = client.list("/").await.unwrap();
    assert_eq!(root[0].name(), "d");
    assert_eq!(
        client.stat("/nope").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        client.stat("relative").await.unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_in_an_unlisted_directory_share_one_listing() {
    let mem = Arc::new(MemStore::new("mem://t"));
    for i in 0..50 {
        mem.put(&format!("imgs/{i:03}.jpg"), data(100 + i)).unwrap();
    }
    let (client, _probe) = setup(mem.clone());
    let n = mem.requests();
    // 50 concurrent lookups of different files in one directory: one LIST, no HEAD per file.
    let stats: Vec<_> = (0..50)
        .map(|i| {
            let p = format!("/d/imgs/{i:03}.jpg");
            let c = &client;
            async move { c.stat(&p).await }
        })
        .collect();
    for (i, r) in futures::future::join_all(stats)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.unwrap().size, 100 + i as u64);
    }
    assert_eq!(mem.requests() - n, 1, "one listing for all lookups");
    assert_eq!(
        client.stat("/d/imgs/999.jpg").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(mem.requests() - n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_disk_page_is_refetched_not_served() {
    let mem = Arc::new(MemStore::new("mem://t"));
    let bytes = data(PS as usize * 3);
    mem.put("f", bytes.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tier = silt_common::config::DiskTierSpec {
        dir: dir.path().to_path_buf(),
        quota: 64 << 20,
    };
    // No memory tier: every hit is read back from disk and checksummed.
    let (client, probe) = setup_with(mem, 0, vec![tier], Duration::from_millis(20));
    let file = client.open("/d/f").await.unwrap();
    assert_eq!(
        &client.read(&file, PS, PS).await.unwrap()[..],
        &bytes[PS as usize..2 * PS as usize]
    );
    let reads = probe.reads.load(Ordering::SeqCst);
    // Flip a byte of page 1 in its data file behind the store's back.
    let hex = file.object().id.to_hex();
    let path = dir
        .path()
        .join("objects")
        .join(&hex[..2])
        .join(format!("{hex}.data"));
    let mut raw = std::fs::read(&path).unwrap();
    raw[PS as usize + 7] ^= 0xff;
    std::fs::write(&path, raw).unwrap();
    let failures = metrics::CHECKSUM_FAILURES.get();
    assert_eq!(
        &client.read(&file, PS, PS).await.unwrap()[..],
        &bytes[PS as usize..2 * PS as usize]
    );
    assert_eq!(
        metrics::CHECKSUM_FAILURES.get(),
        failures + 1,
        "the bad page was detected"
    );
    assert_eq!(
        probe.reads.load(Ordering::SeqCst),
        reads + 1,
        "and fetched again from the store"
    );
}

/// `cache_ttl`: pages of a file under a TTL prefix are served for at most the TTL from the
/// first open, then fetched again; elsewhere they stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_ttl_refetches_after_the_ttl_only_under_its_prefix() {
    let mem = Arc::new(MemStore::new("mem://ttl"));
    mem.put("tmp/x", data(PS as usize)).unwrap();
    mem.put("keep/y", data(PS as usize)).unwrap();
    let store: DynStore = mem.clone();
    let pages = Arc::new(PageStore::open(PageStoreConfig::in_memory(PS, 1 << 20)).unwrap());
    let worker = Arc::new(PageReader::new(
        pages,
        &PageReaderOptions {
            fetch_concurrency: 4,
            buffer_memory: 1 << 20,
            request_size: PS,
        },
        tokio::runtime::Handle::current(),
    ));
    let ns = Namespace::new(vec![MountPoint {
        path: "/d".into(),
        store,
    }])
    .unwrap();
    let clock = silt_client::Clock::manual();
    let opts = ClientOptions {
        cache_ttl: vec![("/d/tmp".into(), Duration::from_secs(60))],
        clock: clock.clone(),
        ..ClientOptions::from_config(&Config::default())
    };
    let client = Client::new(ns, worker, opts, tokio::runtime::Handle::current());
    let read_all = |path: &'static str| {
        let client = &client;
        async move {
            let f = client.open(path).await.unwrap();
            assert_eq!(client.read(&f, 0, PS).await.unwrap().len(), PS as usize);
        }
    };
    let fetches = || mem.requests();
    read_all("/d/tmp/x").await;
    read_all("/d/keep/y").await;
    let cold = fetches();
    let x_id = client.open("/d/tmp/x").await.unwrap().object().id;
    clock.advance(Duration::from_secs(59));
    read_all("/d/tmp/x").await;
    read_all("/d/keep/y").await;
    assert_eq!(fetches(), cold, "refetched within the TTL");
    clock.advance(Duration::from_secs(2));
    read_all("/d/tmp/x").await;
    read_all("/d/keep/y").await;
    assert_eq!(fetches(), cold + 1, "only the TTL'd file is fetched again");
    // The TTL starts over from that fetch.
    read_all("/d/tmp/x").await;
    assert_eq!(fetches(), cold + 1);
    // Not opened again: the sweep drops its pages once the TTL runs out, and only then.
    let cached = || {
        client
            .page_reader()
            .page_store()
            .contains(&silt_common::PageKey::new(x_id, 0))
    };
    clock.advance(Duration::from_secs(59));
    assert_eq!(client.sweep_expired(), 0);
    assert!(cached());
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        client.sweep_expired(),
        1,
        "the expired version was not swept"
    );
    assert!(!cached(), "a swept version's pages are still cached");
    assert_eq!(client.sweep_expired(), 0);
    read_all("/d/keep/y").await;
    assert_eq!(
        fetches(),
        cold + 1,
        "the prefix without a TTL lost its pages"
    );
}

/// B4's shape through the client (not the page store alone): small files, a small memory tier
/// over a disk tier that holds half of them, read in a new random order every epoch — with
/// every read through `Client::read`, through `read_blocking` (FUSE's path), and with files
/// whole on disk read from the file `pin_local_file` hands out (FUSE passthrough, an SDK
/// lease). The default policy must keep about half resident from epoch 2 on (the ideal is
/// 0.5). Fails when a miss counts as more than one read for admission (it did: 0.13-0.15),
/// or when reads outside the store do not count at all (0.22 by epoch 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_epochs_through_the_client_keep_half_the_dataset_cached() {
    use std::io::Read;
    const FILES: u64 = 400;
    let size = PS / 10;
    for how in ["read", "read_blocking", "local file"] {
        let mem = Arc::new(MemStore::new("mem://epochs"));
        for i in 0..FILES {
            mem.put(&format!("f{i:04}"), data(size as usize)).unwrap();
        }
        let dir = tempfile::TempDir::new().unwrap();
        let tier = silt_common::config::DiskTierSpec {
            dir: dir.path().to_path_buf(),
            quota: FILES / 2 * size,
        };
        let (client, probe) = setup_with(mem, 16 * size, vec![tier], Duration::ZERO);
        let mut order: Vec<u64> = (0..FILES).collect();
        let mut seed = 0x5eed_u64;
        for epoch in 0..4 {
            // Fisher-Yates with a fixed xorshift: the same orders every run.
            for i in (1..order.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                order.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            let before = probe.reads.load(Ordering::SeqCst);
            for &i in &order {
                let f = client.open(&format!("/d/f{i:04}")).await.unwrap();
                let local = (how == "local file").then(|| client.pin_local_file(f.object()));
                let got = match local.and_then(|l| l.file.map(|file| (file, l.guard))) {
                    Some((mut file, _guard)) => {
                        let mut buf = Vec::new();
                        file.read_to_end(&mut buf).unwrap();
                        buf
                    }
                    None if how == "read_blocking" => tokio::task::block_in_place(|| {
                        client.read_blocking(&f, 0, size).unwrap().to_vec()
                    }),
                    None => client.read(&f, 0, size).await.unwrap().to_vec(),
                };
                assert_eq!(got.len() as u64, size);
            }
            let fetched = probe.reads.load(Ordering::SeqCst) - before;
            let hit = 1.0 - fetched as f64 / FILES as f64;
            eprintln!("{how}, epoch {epoch}: hit ratio {hit:.3}");
            if epoch > 0 {
                assert!(hit >= 0.45, "{how}, epoch {epoch}: hit ratio {hit:.3}");
            }
        }
    }
}

/// `Client::fill` (a mount fetching a file whole at open) admits pages as reads do: in a full
/// memory tier of pages read more often, a file fetched once does not displace them. `load`,
/// which the user asks for, is kept regardless and does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_admits_as_reads_do_and_load_regardless() {
    let mem = Arc::new(MemStore::new("mem://t"));
    let pages = 8u64;
    for name in ["hot", "once", "asked"] {
        mem.put(name, data((PS * pages) as usize)).unwrap();
    }
    let (client, _probe) = setup_with(mem, PS * pages, vec![], Duration::ZERO);
    let store = client.page_reader().page_store().clone();
    let hot = client.open("/d/hot").await.unwrap();
    for _ in 0..4 {
        for i in 0..pages {
            client.read(&hot, i * PS, PS).await.unwrap();
        }
    }
    let hot_cached = || {
        (0..pages)
            .filter(|&i| store.contains(&silt_common::PageKey::new(hot.object().id, i)))
            .count() as u64
    };
    // All of it but what the tier's high watermark leaves free.
    let before = hot_cached();
    assert!(
        before >= pages - 2,
        "the hot file fills the memory tier: {before}"
    );

    let once = client.open("/d/once").await.unwrap();
    assert_eq!(
        client.fill(&once).await.unwrap(),
        PS * pages,
        "fill fetched the file"
    );
    assert_eq!(
        hot_cached(),
        before,
        "a fill displaced pages read more often"
    );

    client.load("/d/asked", |_| {}).await.unwrap();
    assert!(
        hot_cached() < before,
        "a load was not kept over the hot pages"
    );
}
