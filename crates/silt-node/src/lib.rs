//! A configured Silt client, built from a [`Config`]: a single node (this process is its own
//! worker: page store with disk tiers, fetching from the stores) or a cluster client (a
//! memory-only near cache, page fetches routed to the workers), with the write setup, the
//! background uploads and the metadata snapshot. Every front end starts from it (the FUSE
//! daemon, the Python SDK, the S3 gateway, the CSI controller): one client, one set of rules.
//! The SDK and the gateway, which may share a host's cache, choose how with one function,
//! [`connect::connect`] (cluster client, attached to the state directory's owner, or a single
//! node).

pub mod connect;
pub mod local;
pub mod logging;
pub mod owner;

pub use logging::{init_logging, set_log_worker_id};

use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use silt_cache::{PageStore, PageStoreConfig};
use silt_client::{Client, ClientOptions, MountPoint, Namespace, WriteSetup};
use silt_cluster::rpc::{Change, Endpoint, WorkerClient};
use silt_cluster::{
    auth::cluster_key, local_host_id, ClusterKey, EtcdMembership, Member, Membership, Replicas,
    Router, RouterOptions, StaticMembership,
};
use silt_common::config::{parse_mount_table, Config, DiskTierSpec, MountSpec};
use silt_common::write::WriteRules;
use silt_common::{Error, Result};
use silt_reader::{Fetcher, PageReader, PageReaderOptions};
use silt_ufs::S3Options;
use tracing::{info, warn};

/// The metadata cache saved at a clean shutdown and periodically, read (and removed) at the
/// next start.
pub const METADATA_SNAPSHOT: &str = "metadata-snapshot";
/// How often (at most) a running client saves its metadata cache, when it changed, for a
/// crash restart.
const METADATA_SNAPSHOT_EVERY: Duration = Duration::from_secs(5);

/// How a process's client reaches its cache, chosen once when it connects (`Node::build`,
/// `Node::attach`) and used by every front end: the daemon, the Python SDK, the gateway and
/// the CSI plugin's controller. Its words ([`Role::word`]) are the one vocabulary of flags,
/// reports, logs and Python's `mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// This process owns the cache: page store with disk tiers, fetching from the stores
    /// (`silt up`, `silt mount URI`, a gateway or Python client that owns its state directory).
    Single,
    /// A client of the single node that owns the state directory on this host, over its Unix
    /// socket: it shares that cache and tells the owner of every change it makes.
    Attached,
    /// A client of a cluster's workers (etcd or a static list), with a memory-only near cache.
    Cluster,
}

impl Role {
    /// `single`, `attached` or `cluster`.
    pub fn word(self) -> &'static str {
        match self {
            Role::Single => "single",
            Role::Attached => "attached",
            Role::Cluster => "cluster",
        }
    }

    /// The role in words for people: `single node`, `attached client`, `cluster client`.
    pub fn describe(self) -> &'static str {
        match self {
            Role::Single => "single node",
            Role::Attached => "attached client",
            Role::Cluster => "cluster client",
        }
    }

    /// A role from its word; the SDK's earlier words (`embedded`, `attach`) too.
    pub fn parse(word: &str) -> Option<Role> {
        match word {
            "single" | "embedded" => Some(Role::Single),
            "attached" | "attach" => Some(Role::Attached),
            "cluster" => Some(Role::Cluster),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// `cfg` for a client of a cluster whose secret it was not given: the one in `owner_dir`
/// (a member's state directory holds it), if that directory holds one. The gateway and the
/// SDK connect this way.
pub fn with_state_dir_secret(mut cfg: Config, owner_dir: &Path) -> Config {
    if cfg.cluster_secret.is_empty() {
        let file = owner_dir.join(silt_cluster::auth::SECRET_FILE);
        if let Ok((s, _)) = silt_common::secret::read_secret_file(&file) {
            cfg.cluster_secret = s;
        }
    }
    cfg
}

/// The owner an attached client tells of its changes (`Client::set_change_sink`): it
/// revalidates the directory before the call returns, so its mount lists the change at once.
struct OwnerSink(Arc<Router>);

#[async_trait::async_trait]
impl silt_client::ChangeSink for OwnerSink {
    async fn changed_within(&self, dir: &str) {
        self.0.notify_changed(dir, Change::Within).await;
    }

    async fn changed_below(&self, dir: &str) {
        self.0.notify_changed(dir, Change::Below).await;
    }

    async fn freed(&self, path: &str) {
        self.0.notify_changed(path, Change::Freed).await;
    }
}

/// The memory tier of an attached client when `memory_capacity` is left at its default.
pub const ATTACHED_MEMORY: u64 = 16 << 20;

/// A client ready to serve, and what it belongs to.
#[derive(Clone)]
pub struct Node {
    pub client: Arc<Client>,
    /// The cluster this process belongs to (reads, preloads and reports go through it).
    pub cluster: Option<Arc<Router>>,
    /// How it reaches its cache.
    pub role: Role,
}

impl Node {
    /// Builds the client `cfg` describes on runtime `rt`: a cluster client when it names a
    /// cluster (then it must be given the cluster's secret), else a single node (which
    /// generates a cluster secret into its state directory for later). Starts the background
    /// uploads when anything is writable.
    pub fn build(cfg: &Config, rt: &tokio::runtime::Runtime) -> Result<Node> {
        if cfg.is_cluster() {
            let key =
                cluster_key(&cfg.cluster_secret, &cfg.state_dir, false)?.with_tls(cfg.cluster_tls);
            let m = rt.block_on(membership(cfg))?;
            let mounts = rt.block_on(cluster_mounts(cfg, m.as_ref()))?;
            let ns = rt.block_on(open_namespace(cfg, &mounts))?;
            return Self::cluster_client(cfg, rt, m, ns, router_options(cfg, key));
        }
        // A single node serves no worker port; it generates a secret into its state dir at
        // its first start, so the state dir is ready to join a cluster later
        // (docs/SECURITY.md). It uses no key itself, so a bad one is worth a warning, not
        // a refusal to start.
        if let Err(e) = cluster_key(&cfg.cluster_secret, &cfg.state_dir, true) {
            warn!(error = %e, "no usable cluster secret (needed only to join a cluster)");
        }
        let ns = rt.block_on(open_namespace(cfg, &cfg.mounts))?;
        let fetcher: Arc<dyn Fetcher> = Arc::new(silt_reader::StoreFetcher);
        Self::finish(
            cfg,
            rt,
            ns,
            page_store(cfg, true)?,
            fetcher,
            None,
            Role::Single,
        )
    }

    /// A cluster client of the single node that owns `owner_dir` on this host (a `silt up`,
    /// a Python client in mode `single`: see [`local`]): its only worker is the owner, reached over
    /// the owner's Unix socket with the secret in `owner_dir`, so it shares the owner's cache
    /// (same-host reads of whole files straight from the owner's cache files). `cfg` is this
    /// process's own configuration (its write rules, its state dir for spilled writes, the
    /// cluster secret when the owner's state dir holds none); its mounts, if any, must be the
    /// owner's. `Ok(None)` when nothing serves `owner_dir`.
    pub fn attach(
        cfg: &Config,
        owner_dir: &Path,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Option<Node>> {
        let Some(info) = local::AttachInfo::read(owner_dir)? else {
            return Ok(None);
        };
        let mounts = parse_mount_table(&info.mounts)
            .map_err(|e| e.context(format!("{}", owner_dir.join(local::ATTACH_FILE).display())))?;
        if !cfg.mounts.is_empty() && !same_mounts(&cfg.mounts, &mounts) {
            return Err(Error::invalid(format!(
                "the Silt serving {} (pid {}) serves {:?}, not the mounts given ({:?}); give no mounts to use its namespace, or another cache directory",
                owner_dir.display(),
                info.pid,
                info.mounts,
                mount_table_text(&cfg.mounts)
            )));
        }
        // The owner's secret is the one in its state dir, or, when it was given its secret
        // (environment, secret file) and so wrote none there, the one this process was given.
        let generated = owner_dir.join(silt_cluster::auth::SECRET_FILE);
        let key = if cfg.cluster_secret.is_empty() || generated.exists() {
            cluster_key(&Default::default(), owner_dir, false)?
        } else {
            ClusterKey::new(&cfg.cluster_secret)?
        };
        let m: Arc<dyn Membership> = Arc::new(StaticMembership::new(vec![info.member()]));
        // No store is opened here and no credential read: every call of a store goes to the
        // owner's (`owner::OwnerStore`), as every page fetch does.
        let to_owner = Arc::new(WorkerClient::new(
            Endpoint::Unix(info.uds.clone().into()),
            key.clone(),
        ));
        let ns = rt
            .block_on(owner::owner_namespace(
                to_owner,
                &mounts,
                owner::owner_deadline(cfg),
            ))
            .map_err(|e| {
                e.context(format!(
                    "the Silt serving {} (pid {})",
                    owner_dir.display(),
                    info.pid
                ))
            })?;
        let mut opts = router_options(cfg, key);
        // The owner is reached only over its socket.
        opts.unix_socket = true;
        opts.host_id = local_host_id();
        // Its metadata is kept by the owner's sync policy: the owner answers stats and
        // listings from its cache, and this client trusts them no longer than it does.
        let mut cfg = cfg.clone();
        if let Some(p) = &info.sync_policy {
            cfg.set("sync_policy", p)?;
        }
        if let Some(r) = &info.sync_rules {
            cfg.set("sync_rules", r)?;
        }
        // Its data is in the owner's cache on this host: its own memory tier is room for
        // read-ahead and for the pages small reads come back to, not a second cache. At the
        // default 1 GiB a loader process kept a copy of everything it read once, each read
        // landing in fresh pages (a DataLoader epoch with new workers at 0.6 of the mount).
        if cfg.memory_capacity == Config::default().memory_capacity {
            cfg.memory_capacity = ATTACHED_MEMORY;
        }
        let mut node = Self::cluster_client(&cfg, rt, m, ns, opts)?;
        node.role = Role::Attached;
        // Every change this client makes is told to the owner, whichever front end made it.
        if let Some(router) = &node.cluster {
            node.client
                .set_change_sink(Arc::new(OwnerSink(router.clone())));
        }
        Ok(Some(node))
    }

    fn cluster_client(
        cfg: &Config,
        rt: &tokio::runtime::Runtime,
        m: Arc<dyn Membership>,
        ns: Namespace,
        opts: RouterOptions,
    ) -> Result<Node> {
        let router = Arc::new(Router::new(m, opts));
        // The near cache is memory only: the workers' disk tiers hold the data.
        let fetcher: Arc<dyn Fetcher> = router.clone();
        let pages = page_store(cfg, false)?;
        Self::finish(cfg, rt, ns, pages, fetcher, Some(router), Role::Cluster)
    }

    fn finish(
        cfg: &Config,
        rt: &tokio::runtime::Runtime,
        ns: Namespace,
        pages: Arc<PageStore>,
        fetcher: Arc<dyn Fetcher>,
        cluster: Option<Arc<Router>>,
        role: Role,
    ) -> Result<Node> {
        let reclaim_pages = Arc::downgrade(&pages);
        let worker = Arc::new(PageReader::with_fetcher(
            pages,
            &PageReaderOptions::from_config(cfg),
            rt.handle().clone(),
            fetcher,
        ));
        let mut client = Client::new(
            ns,
            worker,
            ClientOptions::from_config(cfg),
            rt.handle().clone(),
        );
        if let Some(router) = &cluster {
            // Files whole on a same-host worker open in passthrough from that worker's cache.
            client = client.with_backing_source(router.clone());
        }
        if WriteRules::new(cfg.write_type, cfg.write_rules.clone()).any_writable() {
            let setup = write_setup(cfg)?;
            // Written data spilling into a full file system wins over cached pages there.
            setup.arena.set_reclaim(Arc::new(move |dir, bytes| {
                reclaim_pages
                    .upgrade()
                    .is_some_and(|p| p.reclaim_near(dir, bytes))
            }));
            client = client.with_write_setup(setup)?;
            match &cluster {
                // Cache-only files are kept by workers, not by this process.
                Some(router) if cfg.cache_only_replicas > 0 => {
                    client = client.with_resident_remote(Arc::new(Replicas::new(
                        router.clone(),
                        cfg.cache_only_replicas,
                    )));
                }
                None if cfg.cache_only_replicas > 0 => {
                    warn!("cache_only_replicas applies to cluster clients; a single node keeps cache-only files itself")
                }
                _ => {}
            }
        }
        let client = Arc::new(client);
        if client.write_rules().any_writable() {
            // Uploads of `back` files (those recovered from the log included) and the TTL sweep.
            rt.spawn(client.clone().run_background());
        }
        Ok(Node {
            client,
            cluster,
            role,
        })
    }

    /// For each path, the fraction of its pages held in cache: this process's own cache, and
    /// for a cluster client also the workers' (one batched question per worker). `None` for a
    /// path that is not a file (missing, a directory). Cheap: metadata from the cache where
    /// it is fresh, no page is read or fetched. A hint for ordering reads, not a promise.
    pub async fn residency(&self, paths: &[String]) -> Vec<Option<f64>> {
        use futures::stream::{self, StreamExt};
        // Owned paths: a closure over borrowed ones makes this future `Send` for no caller
        // that spawns it (the web page's server does).
        let entries: Vec<Option<Arc<silt_reader::ObjectRef>>> = stream::iter(paths.to_vec())
            .map(|p| async move {
                let e = self.client.stat(&p).await.ok()?;
                let dir = e.is_dir();
                e.object.filter(|_| !dir)
            })
            .buffered(64)
            .collect()
            .await;
        let store = self.client.page_reader().page_store();
        let ps = self.client.page_reader().page_size();
        let pages_of = |size: u64| size.div_ceil(ps);
        let local: Vec<u64> = entries
            .iter()
            .map(|o| {
                o.as_ref().map_or(0, |o| {
                    (0..pages_of(o.size()))
                        .filter(|&index| {
                            store.contains(&silt_common::PageKey {
                                object: o.id,
                                index,
                            })
                        })
                        .count() as u64
                })
            })
            .collect();
        let remote = match &self.cluster {
            Some(router) => {
                let asked: Vec<_> = entries
                    .iter()
                    .map(|o| {
                        o.as_ref()
                            .map_or((silt_common::ObjectId(0), 0), |o| (o.id, o.size()))
                    })
                    .collect();
                router.cached_pages(&asked, ps).await
            }
            None => vec![0; entries.len()],
        };
        entries
            .iter()
            .zip(local.iter().zip(remote))
            .map(|(o, (&here, there))| {
                let o = o.as_ref()?;
                let total = pages_of(o.size());
                Some(if total == 0 {
                    1.0
                } else {
                    here.max(there).min(total) as f64 / total as f64
                })
            })
            .collect()
    }

    /// Starts fetching `paths` (files; anything else is skipped) for reads coming soon, from
    /// the cluster's owners or into this node's cache, without waiting and without counting as
    /// reads: each page is admitted as the read will find it (unlike `load`, which keeps what
    /// it loads whatever the cache holds). Returns the pages started.
    pub async fn prefetch(&self, paths: &[String]) -> u64 {
        use futures::stream::{self, StreamExt};
        let client = &self.client;
        let objects: Vec<Arc<silt_reader::ObjectRef>> = stream::iter(paths.to_vec())
            .map(|p| async move {
                let e = client.stat(&p).await.ok()?;
                let dir = e.is_dir();
                e.object.filter(|_| !dir)
            })
            .buffered(64)
            .filter_map(|o| async move { o })
            .collect()
            .await;
        match &self.cluster {
            Some(router) => {
                stream::iter(objects)
                    .map(|o| async move { router.prefetch(&o).await })
                    .buffer_unordered(16)
                    .fold(0, |a, n| async move { a + n })
                    .await
            }
            None => {
                let worker = self.client.page_reader();
                objects
                    .iter()
                    .filter(|o| o.size() > 0)
                    .map(|o| worker.prefetch(o, 0..=worker.page_count(o.size()) - 1))
                    .sum()
            }
        }
    }

    /// How much of the files at or below `path` is cached and pinned: here, and for a
    /// cluster (or attached) client also on the owning workers (one batched question each;
    /// a file counts as cached as far as the better of the two holds it).
    /// The capacity and use, in bytes, of the cache that holds this client's data: its own
    /// disk tiers (the memory tier where it has none), or the owner's or the workers' for an
    /// attached or cluster client (summed over those that answer).
    pub async fn cache_space(&self) -> (u64, u64) {
        fn of<'a>(tiers: impl Iterator<Item = (&'a str, u64, u64)> + Clone) -> (u64, u64) {
            let disk = tiers.clone().filter(|(name, _, _)| *name != "memory");
            let pick: Vec<_> = if disk.clone().next().is_some() {
                disk.collect()
            } else {
                tiers.collect()
            };
            pick.iter()
                .fold((0, 0), |(c, u), (_, cap, used)| (c + cap, u + used))
        }
        let Some(router) = &self.cluster else {
            let stats = self.client.cache_stats();
            return of(stats
                .tiers
                .iter()
                .map(|t| (t.name.as_str(), t.capacity, t.used)));
        };
        router
            .worker_stats()
            .await
            .into_iter()
            .filter_map(|(_, s)| s.ok())
            .map(|s| {
                of(s.tiers
                    .iter()
                    .map(|t| (t.name.as_str(), t.capacity, t.used)))
            })
            .fold((0, 0), |(c, u), (cap, used)| (c + cap, u + used))
    }

    pub async fn cache_usage(&self, path: &str) -> Result<silt_client::CacheUsage> {
        let files = self.client.walk_files(path).await?;
        Ok(self.usage_of(&files).await)
    }

    async fn usage_of(&self, files: &[silt_client::Entry]) -> silt_client::CacheUsage {
        let mut u = self.client.usage_of(files);
        let Some(router) = &self.cluster else {
            return u;
        };
        let ps = self.client.page_reader().page_size();
        let objects: Vec<(silt_common::ObjectId, u64)> = files
            .iter()
            .filter_map(|f| f.object.as_ref().map(|o| (o.id, o.size())))
            .collect();
        let there = router.cache_state(&objects, ps).await;
        let (cached, pinned) = objects.iter().zip(&there).fold(
            (0u64, 0u64),
            |(c, p), (&(_, size), &(pages, pinned))| {
                (c + (pages * ps).min(size), p + pinned.min(size))
            },
        );
        u.cached_bytes = u.cached_bytes.max(cached);
        u.pinned_bytes = u.pinned_bytes.max(pinned);
        u
    }

    /// Pins the files at or below `path` and loads them (`silt fs pin`): in this process's
    /// cache, or for a cluster (or attached) client on the workers owning each placement
    /// group. Refused as a whole when a cache cannot hold its part: what this call pinned is
    /// unpinned again (pins made before it stay).
    pub async fn pin(&self, path: &str) -> Result<silt_client::CacheUsage> {
        use futures::stream::{self, StreamExt};
        let Some(router) = &self.cluster else {
            return self.client.pin(path).await;
        };
        let files = self.client.walk_files(path).await?;
        let objects: Vec<Arc<silt_reader::ObjectRef>> =
            files.iter().filter_map(|f| f.object.clone()).collect();
        let ps = self.client.page_reader().page_size();
        let ids: Vec<_> = objects.iter().map(|o| (o.id, o.size())).collect();
        let before = router.cache_state(&ids, ps).await;
        let work: Vec<_> = objects
            .iter()
            .flat_map(|o| {
                silt_cluster::router::split(0..o.size(), router.group_size())
                    .into_iter()
                    .map(move |r| (o.clone(), r))
            })
            .collect();
        let results: Vec<Result<u64>> =
            stream::iter(work)
                .map(|(o, r)| async move {
                    router.pin(&o, r).await.map_err(|e| e.context(&o.meta.path))
                })
                .buffer_unordered(self.client.options().fetch_concurrency.max(1))
                .collect()
                .await;
        if let Some(e) = results.into_iter().find_map(Result::err) {
            let undo = objects
                .iter()
                .zip(&before)
                .filter(|(_, &(_, pinned))| pinned == 0)
                .map(|(o, _)| router.unpin(o));
            futures::future::join_all(undo).await;
            return Err(e.context(path));
        }
        Ok(self.usage_of(&files).await)
    }

    /// Unpins the files at or below `path` (here, and on the owning workers for a cluster
    /// or attached client); how many were pinned.
    pub async fn unpin(&self, path: &str) -> Result<u64> {
        let Some(router) = &self.cluster else {
            return self.client.unpin(path).await;
        };
        let files = self.client.walk_files(path).await?;
        let here = self.client.unpin(path).await?;
        let asks = files
            .iter()
            .filter_map(|f| f.object.as_ref())
            .map(|o| router.unpin(o));
        let there = futures::future::join_all(asks)
            .await
            .into_iter()
            .filter(|&unpinned| unpinned)
            .count() as u64;
        Ok(here.max(there))
    }

    /// [`Node::free`] of each of `paths`, many at once (a sampler making room for what it
    /// prefetches: one call, not a round trip per file); what was cached before, summed.
    pub async fn free_all(&self, paths: &[String]) -> Result<silt_client::CacheUsage> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        stream::iter(paths)
            .map(|p| self.free(p))
            .buffer_unordered(32)
            .try_fold(
                silt_client::CacheUsage::default(),
                |mut sum, u| async move {
                    sum.add(&u);
                    Ok(sum)
                },
            )
            .await
    }

    /// Drops the cached pages (and pins) of the files at or below `path`, here and on the
    /// workers that hold them; what was cached before.
    pub async fn free(&self, path: &str) -> Result<silt_client::CacheUsage> {
        let Some(router) = &self.cluster else {
            return self.client.free(path).await;
        };
        let files = self.client.walk_files(path).await?;
        let before = self.usage_of(&files).await;
        // Awaited here (the client's own free tells the workers in the background), so what
        // this returns is gone from the workers that answered.
        let store = self.client.page_reader().page_store();
        let asks = files.iter().filter_map(|f| f.object.clone()).map(|obj| {
            store.remove_object(obj.id);
            router.forget(obj)
        });
        futures::future::join_all(asks).await;
        self.client.freed(path, &files).await;
        Ok(before)
    }

    /// With `cache_ttl_rules` set, drops the pages of versions whose TTL ran out
    /// (`Client::sweep_expired`) every quarter of the shortest TTL (at least every second, at
    /// most every minute), so a TTL'd prefix frees its cache space whether or not it is read
    /// again. The thread ends with the client.
    pub fn keep_sweeping_ttl(&self) -> Result<()> {
        let Some(shortest) = self.client.shortest_cache_ttl() else {
            return Ok(());
        };
        let every = (shortest / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let client: Weak<Client> = Arc::downgrade(&self.client);
        std::thread::Builder::new()
            .name("silt-ttl-sweep".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                let Some(client) = client.upgrade() else {
                    return;
                };
                let n = client.sweep_expired();
                if n > 0 {
                    tracing::debug!(versions = n, "cache TTL: pages dropped");
                }
            })
            .map_err(|e| Error::from(e).context("starting the cache TTL sweep"))?;
        Ok(())
    }

    /// Restores the metadata cache from `STATE_DIR/metadata-snapshot` (listings and stats
    /// still fresh from before a restart, see silt_client::snapshot) and keeps saving it as it
    /// changes, so a crash restart is as warm as a clean one. The first save is at once: what
    /// was just restored (restoring removed the file) stays saved if this run crashes early.
    pub fn keep_metadata(&self, state_dir: &Path) -> Result<()> {
        let snapshot = state_dir.join(METADATA_SNAPSHOT);
        match self.client.restore_metadata(&snapshot) {
            Ok(0) => {}
            Ok(n) => info!(
                records = n,
                "metadata cache restored from the last snapshot"
            ),
            Err(e) => {
                warn!(error = %e, "metadata snapshot ignored; starting with an empty metadata cache")
            }
        }
        // Weak: the client (and its page store, whose drop marks a clean shutdown) must not be
        // kept alive by this thread.
        let client: Weak<Client> = Arc::downgrade(&self.client);
        std::thread::Builder::new()
            .name("silt-snapshot".into())
            .spawn(move || {
                let mut since = 0;
                loop {
                    let started = std::time::Instant::now();
                    let Some(client) = client.upgrade() else {
                        return;
                    };
                    if let Err(e) = client.save_metadata_if_changed(&snapshot, &mut since) {
                        warn!(error = %e, "periodic metadata snapshot failed");
                    }
                    drop(client);
                    // A large cache takes a while to save: keep saves under ~2 % of a core.
                    std::thread::sleep(METADATA_SNAPSHOT_EVERY.max(started.elapsed() * 50));
                }
            })
            .map_err(|e| Error::from(e).context("starting the metadata snapshot thread"))?;
        Ok(())
    }
}

/// The namespace `client` serves, as a mount table.
pub fn client_mounts(client: &Client) -> Vec<MountSpec> {
    client
        .namespace()
        .mounts()
        .iter()
        .map(|m| MountSpec {
            path: m.path.clone(),
            uri: m.store.uri().to_string(),
        })
        .collect()
}

/// The membership the configuration names: etcd, else the static worker list.
pub async fn membership(cfg: &Config) -> Result<Arc<dyn Membership>> {
    if !cfg.etcd.is_empty() {
        let m = EtcdMembership::connect(&cfg.etcd, &cfg.cluster_name, cfg.member_ttl).await?;
        return Ok(m);
    }
    let members = cfg
        .workers
        .iter()
        .map(|(id, addr)| Member::new(id, addr))
        .collect();
    Ok(Arc::new(StaticMembership::new(members)))
}

/// A mount table as `PATH=URI,...` (how it is stored in etcd and shown in reports).
pub fn mount_table_text(mounts: &[MountSpec]) -> String {
    mounts
        .iter()
        .map(|m| format!("{}={}", m.path, m.uri))
        .collect::<Vec<_>>()
        .join(",")
}

/// The cluster's mount table: the one stored in the membership, published from this
/// process's `mounts` if none is stored yet. A process given other mounts than the stored
/// table is refused, so every process serves one namespace.
pub async fn cluster_mounts(cfg: &Config, m: &dyn Membership) -> Result<Vec<MountSpec>> {
    let stored = if cfg.mounts.is_empty() {
        m.mounts().await?.ok_or_else(|| {
            Error::invalid(format!(
                "{} holds no mount table yet: give this process --mount PATH=URI (with \
                 --workers every process needs it; with etcd the first one publishes it)",
                m.describe()
            ))
        })?
    } else {
        m.publish_mounts(&mount_table_text(&cfg.mounts)).await?
    };
    let table =
        parse_mount_table(&stored).map_err(|e| e.context("the cluster's stored mount table"))?;
    if !cfg.mounts.is_empty() && !same_mounts(&cfg.mounts, &table) {
        return Err(Error::invalid(format!(
            "this process was given mounts {:?} but the cluster's mount table ({}) is {stored:?}; drop --mount to use the cluster's",
            mount_table_text(&cfg.mounts),
            m.describe()
        )));
    }
    Ok(table)
}

/// Whether two mount tables hold the same mounts, in any order.
fn same_mounts(a: &[MountSpec], b: &[MountSpec]) -> bool {
    let sorted = |t: &[MountSpec]| {
        let mut t = t.to_vec();
        t.sort_by(|x, y| (&x.path, &x.uri).cmp(&(&y.path, &y.uri)));
        t
    };
    sorted(a) == sorted(b)
}

/// The namespace of `mounts`: each store opened (and checked reachable) with the
/// configuration's credentials.
pub async fn open_namespace(cfg: &Config, mounts: &[MountSpec]) -> Result<Namespace> {
    let s3 = S3Options::from_config(cfg);
    let mut points = Vec::new();
    for m in mounts {
        let store = silt_ufs::open_store_as(&m.path, &m.uri, &s3)
            .await
            // The store's message names its URI (without secrets: `silt_ufs::redact_uri`).
            .map_err(|e| e.context(format!("mount {}", m.path)))?;
        points.push(MountPoint {
            path: m.path.clone(),
            store,
        });
    }
    Namespace::new(points)
}

/// How a cluster client (or a worker routing for replicas) reaches workers.
pub fn router_options(cfg: &Config, key: ClusterKey) -> RouterOptions {
    RouterOptions {
        key,
        timeout: cfg.worker_timeout,
        retry_after: cfg.worker_retry_after,
        group_size: cfg.placement_group,
        candidates: cfg.failover_candidates,
        host_id: local_host_id(),
        unix_socket: cfg.cluster_unix_socket,
    }
}

/// The page store of the configuration; `disk: false` keeps it in memory (a cluster client's
/// near cache: the workers' disk tiers hold the data).
pub fn page_store(cfg: &Config, disk: bool) -> Result<Arc<PageStore>> {
    let mut pc = PageStoreConfig::from_config(cfg)?;
    if !disk {
        pc.disk_tiers.clear();
    }
    Ok(Arc::new(PageStore::open(pc)?))
}

/// Where written data goes: memory first (`write_memory`), spilling into a `spill`
/// directory of each disk tier within its quota (a cluster client, whose near cache has no
/// disk tiers, spills into STATE_DIR/spill); `back` writes are logged in STATE_DIR/wal.
pub fn write_setup(cfg: &Config) -> Result<WriteSetup> {
    let mut spill = WriteSetup::tier_spill_dirs(cfg)?;
    if spill.is_empty() || cfg.is_cluster() {
        spill = vec![DiskTierSpec {
            dir: cfg.state_dir.join("spill"),
            quota: u64::MAX / 2,
        }];
    }
    WriteSetup::from_config(cfg, spill, cfg.state_dir.join("wal"))
}
