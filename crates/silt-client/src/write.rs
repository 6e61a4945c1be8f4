//! Files written through Silt.
//!
//! While a file is open for writing its bytes live in a memory-first write buffer
//! (`silt_cache::Arena`: memory up to the file's, its job's and the arena's limits, spilled to
//! disk beyond them, `ENOSPC` when no tier has room). `commit` (on close or fsync) makes the
//! file what the write type promises:
//! - `through`: the store gets the whole object (in parts where it has multipart uploads), the
//!   version it reports is recorded and the bytes are cached as written;
//! - `store-only`: the same, nothing cached;
//! - `cache-only`: the buffer itself becomes the file (no copy), resident in Silt until
//!   `cache_only_ttl` ends or it is removed; the store never sees it (in a cluster with
//!   `cache_only_replicas`, it is sent to that many workers instead: see `with_resident_remote`);
//! - `back`: the bytes go to the write-ahead log and are fsynced; the file is then resident
//!   (read from the log) until the background upload (`persist.rs`) has put it in the store.
//!
//! Writes may land anywhere in the buffer: a file opened without truncation is first copied
//! into it, so a write into the middle of an existing object is a rewrite of the whole object
//! on close.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use silt_cache::{Arena, ArenaConfig, WriteBuffer};
use silt_common::config::DiskTierSpec;
use silt_common::write::{WriteRules, WriteType};
use silt_common::{Error, ErrorKind, PageKey, Result};
use silt_ufs::{DynStore, Headers, ObjectMeta};

use crate::meta::Lookup;
use crate::namespace::{parent_and_name, Resolved};
use crate::persist::Persister;
use crate::resident::{
    is_resident, RemoteMeta, Residence, Resident, ResidentData, ResidentFile, ResidentRemote,
    ResidentStore,
};
use crate::session::{FileWriter, OpenOptions, SessionTable, Target};
use crate::{Client, Entry};

/// `NameTooLong` for a path within the mount longer than its store takes
/// ([`silt_ufs::Capabilities::max_path_bytes`]: 1,024 bytes, S3's key limit; 4,096, PATH_MAX, on
/// a local directory). A mount's own prefix makes the full key longer; the store refuses that.
pub(crate) fn check_key_len(path: &str, rel: &str, store: &DynStore) -> Result<()> {
    let max = store.capabilities().max_path_bytes();
    if rel.len() > max {
        return Err(Error::new(
            ErrorKind::NameTooLong,
            format!(
                "{path}: the store path would be {} bytes; this store allows {max}",
                rel.len()
            ),
        ));
    }
    Ok(())
}

/// How a client writes: the types per prefix and where written bytes are kept.
pub struct WriteSetup {
    pub rules: WriteRules,
    pub arena: Arena,
    /// Life of a cache-only file (`None`: until removed).
    pub cache_only_ttl: Option<Duration>,
    /// The write-ahead log of `back` writes (`None`: `back` is refused).
    pub wal_dir: Option<PathBuf>,
    /// How long a `back` file waits before its upload starts.
    pub upload_delay: Duration,
}

impl WriteSetup {
    /// `rules` with an arena of `memory` bytes spilling into `spill_dir`, no log.
    pub fn simple(
        rules: impl Into<WriteRules>,
        page_size: u64,
        memory: u64,
        spill_dir: PathBuf,
    ) -> Result<WriteSetup> {
        Ok(WriteSetup {
            rules: rules.into(),
            arena: Arena::open(ArenaConfig {
                chunk_size: page_size,
                memory_ceiling: memory,
                file_memory: memory,
                spill: vec![DiskTierSpec {
                    dir: spill_dir,
                    quota: u64::MAX / 2,
                }],
                jobs: Vec::new(),
            })?,
            cache_only_ttl: None,
            wal_dir: None,
            upload_delay: Duration::ZERO,
        })
    }

    /// Where written data spills: a `spill` directory in each disk tier of `cfg`, within the
    /// tier's quota.
    pub fn tier_spill_dirs(cfg: &silt_common::config::Config) -> Result<Vec<DiskTierSpec>> {
        Ok(cfg
            .disk_tiers()?
            .into_iter()
            .map(|t| DiskTierSpec {
                dir: t.dir.join("spill"),
                quota: t.quota,
            })
            .collect())
    }

    /// The write part of Silt's configuration; spill space in `spill` (the disk tiers' quota
    /// dirs), the log in `wal_dir`.
    pub fn from_config(
        cfg: &silt_common::config::Config,
        spill: Vec<DiskTierSpec>,
        wal_dir: PathBuf,
    ) -> Result<WriteSetup> {
        let arena = Arena::open(ArenaConfig {
            chunk_size: cfg.page_size,
            memory_ceiling: cfg.write_memory,
            file_memory: cfg.write_file_memory,
            spill,
            jobs: cfg.write_jobs.clone(),
        })?;
        if cfg.max_file_size > 0 {
            arena.set_max_file_size(cfg.max_file_size);
        }
        Ok(WriteSetup {
            rules: WriteRules::new(cfg.write_type, cfg.write_rules.clone()),
            arena,
            cache_only_ttl: (!cfg.cache_only_ttl.is_zero()).then_some(cfg.cache_only_ttl),
            wal_dir: Some(wal_dir),
            upload_delay: cfg.upload_delay,
        })
    }
}

/// The client's write state.
pub(crate) struct Writes {
    pub rules: WriteRules,
    pub arena: Option<Arena>,
    pub resident: Arc<Resident>,
    pub cache_only_ttl: Option<Duration>,
    pub back: Option<Arc<Persister>>,
    /// Uploads of `through`/`store-only` commits in flight at once (each holds one part,
    /// 8 MiB, in memory): with 1,000 writers closing together, the rest wait here.
    pub uploads: Arc<tokio::sync::Semaphore>,
    /// Files open for writing (`session.rs`).
    pub sessions: Arc<SessionTable>,
}

impl Writes {
    pub fn read_only(clock: crate::Clock) -> Self {
        Writes {
            rules: WriteRules::new(WriteType::ReadOnly, Vec::new()),
            arena: None,
            resident: Arc::new(Resident::new(clock)),
            cache_only_ttl: None,
            back: None,
            uploads: Arc::new(tokio::sync::Semaphore::new(1)),
            sessions: Arc::default(),
        }
    }
}

impl Client {
    /// Sets how this client writes (see [`WriteSetup`]): wraps every mount's store so files
    /// resident in Silt are seen, and recovers the write-ahead log (records acknowledged before
    /// a crash become resident again and are queued for upload).
    pub fn with_write_setup(mut self, setup: WriteSetup) -> Result<Self> {
        let back = match &setup.wal_dir {
            Some(dir) => Some(Persister::open(
                dir,
                setup.upload_delay,
                self.opts.clock.clone(),
            )?),
            None => None,
        };
        let resident = self.writes.resident.clone();
        // Called once per client: a second call would stack a second overlay.
        self.ns.map_stores(|m| {
            Arc::new(silt_ufs::Layered::from_layer(ResidentStore::new(
                m.store.clone(),
                m.path.clone(),
                resident.clone(),
                back.clone(),
            )))
        });
        self.writes = Writes {
            rules: setup.rules,
            arena: Some(setup.arena),
            resident,
            cache_only_ttl: setup.cache_only_ttl,
            back,
            uploads: Arc::new(tokio::sync::Semaphore::new(
                self.opts.fetch_concurrency.max(1),
            )),
            sessions: self.writes.sessions.clone(),
        };
        if let Some(p) = self.writes.back.clone() {
            for (rec, file) in p.take_recovered() {
                self.adopt_logged(&p, rec, Arc::new(file));
            }
        }
        Ok(self)
    }

    /// Keeps cache-only files on `remote` (the workers of a cluster) instead of in this
    /// process: a commit sends the file to its replicas and keeps only a pointer to them.
    pub fn with_resident_remote(self, remote: Arc<dyn ResidentRemote>) -> Self {
        self.writes.resident.set_remote(remote);
        self
    }

    /// Writes of `rules` with a buffer arena of 256 MiB spilling into `spool_dir` and no
    /// write-ahead log (tests and tools; `silt` itself uses `with_write_setup`).
    pub fn with_writes(self, rules: impl Into<WriteRules>, spool_dir: PathBuf) -> Result<Self> {
        let ps = self.worker.page_size();
        self.with_write_setup(WriteSetup::simple(rules, ps, 256 << 20, spool_dir)?)
    }

    /// The store path a write to `path` goes to and its write type, after checking that
    /// `path` may be written (`asked`: a per-open choice among the writable types).
    pub(crate) fn writable_target(&self, path: &str, asked: Option<WriteType>) -> Result<Target> {
        let path = Self::normalize(path)?;
        let mut write_type = self.writes.rules.of(&path);
        if !write_type.writable() {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{path}: read-only (write type {write_type})"),
            ));
        }
        if let Some(t) = asked {
            write_type = t;
        }
        if write_type == WriteType::ReadOnly {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{path}: opened read-only"),
            ));
        }
        if write_type == WriteType::Back && self.writes.back.is_none() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{path}: write type back needs a write-ahead log (not configured)"),
            ));
        }
        match self.ns.resolve(&path)? {
            Resolved::Synthetic { .. } => Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{path}: not inside a mount (only mounted stores can be written)"),
            )),
            Resolved::Store { rel, .. } if rel.is_empty() => Err(Error::new(
                ErrorKind::IsADirectory,
                format!("{path}: the root of a mount"),
            )),
            Resolved::Store { mount, rel } => {
                check_key_len(&path, &rel, &mount.store)?;
                let target = Target {
                    rel: rel.to_string(),
                    store: mount.store.clone(),
                    path,
                    write_type,
                };
                Ok(target)
            }
        }
    }

    /// Opens `path` for writing with the write type its prefix has: empty with `truncate` (or
    /// when it does not exist), else with the current bytes loaded (read through the cache).
    /// A file already open for writing here is joined (`session.rs`).
    pub async fn create(&self, path: &str, truncate: bool) -> Result<FileWriter> {
        self.create_with(path, truncate, None).await
    }

    /// `create` with a write type chosen for this open (`None`: the prefix's). A path whose
    /// prefix is read-only stays read-only.
    pub async fn create_with(
        &self,
        path: &str,
        truncate: bool,
        write_type: Option<WriteType>,
    ) -> Result<FileWriter> {
        self.open_write(
            path,
            OpenOptions {
                create: true,
                truncate,
                load_now: true,
                write_type,
                ..Default::default()
            },
        )
        .await
    }

    /// Makes `len` bytes of `buf` what `target`'s write type promises (module docs) and
    /// records the result; the file's entry.
    pub(crate) async fn commit_buffer(
        &self,
        target: &Target,
        buf: &WriteBuffer,
        len: u64,
        attrs: &silt_ufs::SetAttrs,
        headers: Option<&Arc<Headers>>,
    ) -> Result<Entry> {
        let Target {
            path,
            rel,
            store,
            write_type,
        } = target;
        // A file with other names (hard links) is written to the store now under `back` too:
        // the log would hold the new bytes under this name only, and the other names, asked of
        // the store at every stat, would show the old ones until the upload.
        let write_type = match write_type {
            WriteType::Back if self.known_linked(path) => &WriteType::Through,
            t => t,
        };
        // An upload of an older `back` version must not start, or land, after this write.
        let _hold = match (write_type, &self.writes.back) {
            (WriteType::Through | WriteType::StoreOnly, Some(p)) => Some(p.hold(path).await),
            _ => None,
        };
        let meta = match write_type {
            WriteType::Through | WriteType::StoreOnly => {
                let _permit = self
                    .writes
                    .uploads
                    .acquire()
                    .await
                    .map_err(|_| Error::internal("upload permits closed"))?;
                store
                    .write_from_attrs(rel, buf, len, attrs, headers.map(|h| &**h))
                    .await
                    .map_err(|e| e.context(path))?
            }
            WriteType::CacheOnly if self.writes.resident.remote().is_some() => {
                self.commit_remote(path, rel, buf, len).await?
            }
            WriteType::CacheOnly => {
                self.keep_missing_parents(path).await;
                let meta = self.writes.resident.new_meta(rel, len);
                let expires = self
                    .writes
                    .cache_only_ttl
                    .map(|t| self.opts.clock.now() + t);
                let file = ResidentFile {
                    meta: meta.clone(),
                    data: ResidentData::Buffer(buf.clone()),
                    residence: Residence::CacheOnly { expires },
                    headers: headers.cloned(),
                };
                self.replace_resident(path, Some(file));
                meta
            }
            WriteType::Back => {
                // On a store with real directories they stay, whether or not the file is
                // uploaded before it goes (an emptied one vanished on a race with the
                // upload). On an object store a directory is its objects (SEMANTICS.md), and a
                // resident one there would outlive them and refuse the object-by-object rename.
                if store.capabilities().rename_dirs {
                    self.keep_missing_parents(path).await;
                }
                self.commit_back(path, buf, len, headers).await?
            }
            WriteType::ReadOnly => {
                return Err(Error::new(
                    ErrorKind::ReadOnly,
                    format!("{path}: read-only"),
                ))
            }
        };
        if matches!(write_type, WriteType::Through | WriteType::StoreOnly) {
            // The store's version replaces whatever Silt held at this path.
            self.replace_resident(path, None);
        }
        if *write_type != WriteType::CacheOnly {
            if let Some(r) = self.writes.resident.remote() {
                // Workers' copy of an older cache-only version would shadow this one.
                r.delete(path).await.map_err(|e| e.context(path))?;
            }
        }
        silt_common::metrics::WRITE_COMMITS.inc();
        // Stamped once the file is visible (in the store, or resident): a listing that started
        // before then may lack it, and must not win over this record.
        let at = self.opts.clock.now();
        let entry = self.record_written(path, rel, store, at, meta);
        if let (Some(obj), Some(h)) = (&entry.object, headers) {
            // The headers of the version just written, known without asking the store.
            self.headers_cache.put(obj.id, h.clone());
        }
        if *write_type == WriteType::Through && entry.size == len {
            if let Some(obj) = &entry.object {
                self.cache_written(obj.id, buf, len);
            }
        }
        Ok(entry)
    }

    /// Whether `path` is known (cached, however old) as a file with other names.
    fn known_linked(&self, path: &str) -> bool {
        matches!(
            self.meta.stat(path, |_, _| true, |_| false),
            Lookup::Found(e) if e.posix.linked()
        )
    }

    /// Sends a cache-only file to the workers replicating it; only a pointer stays here (the
    /// buffer is not the file, so the writer may go on changing it).
    async fn commit_remote(
        &self,
        path: &str,
        rel: &str,
        buf: &WriteBuffer,
        len: u64,
    ) -> Result<ObjectMeta> {
        let resident = &self.writes.resident;
        let Some(remote) = resident.remote() else {
            return Err(Error::internal("no workers for cache-only files"));
        };
        let meta = resident.new_meta(rel, len);
        let rm = RemoteMeta {
            size: len,
            tag: meta.etag.clone().unwrap_or_default(),
            mtime: meta.mtime,
            expires_in: self.writes.cache_only_ttl,
        };
        remote
            .put(path, &rm, buf)
            .await
            .map_err(|e| e.context(path))?;
        let pointer = resident
            .remote_file(path, rel, &rm)
            .ok_or_else(|| Error::internal("no workers for cache-only files"))?;
        let meta = pointer.meta.clone();
        self.replace_resident(path, Some(pointer));
        Ok(meta)
    }

    /// Logs the file durably and makes it resident until its upload.
    async fn commit_back(
        &self,
        path: &str,
        buf: &WriteBuffer,
        len: u64,
        headers: Option<&Arc<Headers>>,
    ) -> Result<ObjectMeta> {
        let Some(p) = self.writes.back.clone() else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{path}: write type back needs a write-ahead log"),
            ));
        };
        let (buf, path) = (buf.clone(), path.to_string());
        let logger = p.clone();
        let h = headers.cloned();
        // fsync: off the runtime's threads.
        let (rec, file) = tokio::task::spawn_blocking(move || {
            logger.wal().append(&path, &buf, len, h.as_deref())
        })
        .await
        .map_err(|e| Error::internal(format!("write-ahead log task: {e}")))??;
        Ok(self.adopt_logged(&p, rec, Arc::new(file)))
    }

    /// Makes a logged file resident and queues its upload; its metadata.
    fn adopt_logged(
        &self,
        p: &Arc<Persister>,
        rec: crate::wal::LogRecord,
        file: Arc<std::fs::File>,
    ) -> ObjectMeta {
        let Ok(Resolved::Store { mount, rel }) = self.ns.resolve(&rec.path) else {
            tracing::warn!(path = %rec.path, "a logged write outside every mount stays in the log");
            return ObjectMeta::dir("");
        };
        let (store, rel) = (mount.store.clone(), rel.to_string());
        let meta = self.writes.resident.new_meta(&rel, rec.len);
        let file_r = ResidentFile {
            meta: meta.clone(),
            data: ResidentData::Log(file.clone()),
            residence: Residence::Back { seq: rec.seq },
            headers: rec.headers.clone().map(Arc::new),
        };
        self.replace_resident(&rec.path, Some(file_r));
        p.enqueue(rec, store, rel, file);
        meta
    }

    /// Puts `file` (or nothing) at `path` among the resident files; a `back` file it replaces
    /// is no longer uploaded.
    fn replace_resident(&self, path: &str, file: Option<ResidentFile>) {
        let old = match file {
            Some(f) => self.writes.resident.insert(path.to_string(), f),
            None => self.writes.resident.remove(path),
        };
        if let (Some(old), Some(p)) = (old, &self.writes.back) {
            if let Residence::Back { seq } = old.residence {
                p.cancel(seq);
            }
        }
    }

    /// Records a file just written: its entry in the metadata cache, its parents, and the
    /// changes for listeners.
    pub(crate) fn record_written(
        &self,
        path: &str,
        rel: &str,
        store: &DynStore,
        asked: std::time::Instant,
        meta: ObjectMeta,
    ) -> Entry {
        let entry = Entry::from_meta(path.to_string(), store, meta);
        let mut changes = self.meta.put_stat(asked, entry.clone());
        self.note_parents(path, rel, store, asked, &mut changes);
        self.apply(&changes);
        entry
    }

    /// A new object implies its parent directories (object stores have no others): records
    /// each one not known as a directory, so cached listings above show it at once.
    pub(crate) fn note_parents(
        &self,
        path: &str,
        rel: &str,
        store: &DynStore,
        at: std::time::Instant,
        changes: &mut Vec<crate::Change>,
    ) {
        let (mut dir, mut rel_dir) = (path, rel);
        while let (Some((d, _)), Some((r, _))) = (parent_and_name(dir), rel_dir.rsplit_once('/')) {
            let known = matches!(
                self.meta.stat(d, |_, _| true, |_| false),
                Lookup::Found(e) if e.is_dir()
            );
            if known {
                return;
            }
            let e = Entry::from_meta(d.to_string(), store, ObjectMeta::dir(r));
            changes.extend(self.meta.put_stat(at, e));
            (dir, rel_dir) = (d, r);
        }
    }

    /// Puts a freshly written file's pages into the page store, read back from `src` a page at
    /// a time; a full cache only costs the caching.
    pub(crate) fn cache_written(
        &self,
        object: silt_common::ObjectId,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
    ) {
        let store = self.worker.page_store();
        let ps = self.worker.page_size();
        for (index, off) in (0..len).step_by(ps as usize).enumerate() {
            let n = (len - off).min(ps) as usize;
            // A hole's zeros are not worth memory: read, they come from the store.
            if src.is_hole(off, n as u64) {
                continue;
            }
            let page = match src.read_at(off, n) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!("not caching written pages: {e}");
                    return;
                }
            };
            if let Err(e) = store.put(PageKey::new(object, index as u64), page, len) {
                tracing::debug!("not caching written pages: {e}");
                return;
            }
        }
    }

    /// Deletes a file: a resident one from Silt (a pending upload is cancelled), and the
    /// store's object at the path (`remove_file` detaches a session of it first).
    pub(crate) async fn remove_stored(&self, path: &str) -> Result<()> {
        let Target {
            path, rel, store, ..
        } = self.writable_target(path, None)?;
        let e = self.stat(&path).await?;
        if e.is_dir() {
            return Err(Error::new(
                ErrorKind::IsADirectory,
                format!("{path}: is a directory"),
            ));
        }
        let held = e.object.as_ref().is_some_and(|o| is_resident(&o.meta));
        let mut back = false;
        if held {
            if let Some(old) = self.writes.resident.remove(&path) {
                back = matches!(old.residence, Residence::Back { .. });
                if let (Residence::Back { seq }, Some(p)) = (old.residence, &self.writes.back) {
                    p.cancel(seq);
                }
            }
            if let Some(r) = self.writes.resident.remote() {
                r.delete(&path).await.map_err(|e| e.context(&path))?;
            }
        }
        if held && !back {
            // Cache-only: the store never sees it, nor its removal. An object of the store it
            // shadowed shows again once asked for.
            let changes = self.meta.invalidate(&path);
            self.apply(&changes);
            return Ok(());
        }
        // An upload of an older version must not recreate the file after this.
        let _hold = match &self.writes.back {
            Some(p) => Some(p.hold(&path).await),
            None => None,
        };
        self.keep_open_bytes(&store, &rel, false).await;
        // The store may hold an older version under a resident one.
        match store.delete(&rel).await {
            Ok(()) => {}
            Err(e) if held && e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e.context(&path)),
        }
        let changes = self.meta.put_missing(self.opts.clock.now(), &path);
        self.apply(&changes);
        self.forget_emptied_parents(&path).await;
        Ok(())
    }
}

impl Client {
    /// The directories a new cache-only or `back` file's path makes (a write creates missing
    /// parents) are kept by the resident layer: they last until their `rmdir`, as on a file system,
    /// not only while a file lies below them.
    async fn keep_missing_parents(&self, path: &str) {
        let mut missing = Vec::new();
        let mut dir = path;
        while let Some((parent, _)) = parent_and_name(dir) {
            if parent == "/" || parent.is_empty() {
                break;
            }
            match self.stat(parent).await {
                Err(e) if e.kind() == ErrorKind::NotFound => missing.push(parent.to_string()),
                _ => break,
            }
            dir = parent;
        }
        for d in missing {
            self.writes.resident.add_dir(&d);
        }
    }
}

/// What written data holds now (`silt report`, `silt memory`).
#[derive(Debug, Clone, Default)]
pub struct WriteStats {
    pub arena: silt_cache::ArenaStats,
    pub cache_only_files: u64,
    pub cache_only_bytes: u64,
    /// `back` files not yet uploaded (resident, read from the log).
    pub pending_files: u64,
    pub pending_bytes: u64,
}

impl Client {
    /// `None` for a read-only client.
    pub fn write_stats(&self) -> Option<WriteStats> {
        let arena = self.writes.arena.as_ref()?.stats();
        let (c, cb, b, bb) = self.writes.resident.usage();
        Some(WriteStats {
            arena,
            cache_only_files: c,
            cache_only_bytes: cb,
            pending_files: b,
            pending_bytes: bb,
        })
    }

    /// Sets the ceiling of write memory (lowering it spills down to it before returning);
    /// `false` for a read-only client.
    pub fn set_write_memory(&self, bytes: u64) -> bool {
        match &self.writes.arena {
            Some(a) => {
                a.set_memory_ceiling(bytes);
                true
            }
            None => false,
        }
    }
}
