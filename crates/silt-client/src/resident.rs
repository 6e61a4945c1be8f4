//! The store layer that answers for resident files (`silt_resident`: `cache-only` files,
//! `back` files before their upload, directories made under `cache-only`) in front of a
//! mount's store.
//!
//! Each mount's store is wrapped in a [`ResidentStore`]: a store layer that answers for the
//! resident files first and for everything else asks the real store. So stats, listings,
//! sweeps and reads see one namespace, and no other part of the client has to know where a
//! file's bytes are.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use silt_common::{Error, ErrorKind, Result};
use silt_ufs::{DynStore, EntryKind, Headers, Layer, ObjectMeta};

pub use silt_resident::*;

use crate::persist::Persister;

/// A mount's store with the resident files in front of it.
pub struct ResidentStore {
    base: DynStore,
    /// The mount's namespace path.
    mount: String,
    resident: Arc<Resident>,
    /// Uploads of `back` files (a renamed one is logged again under its new name).
    back: Option<Arc<Persister>>,
}

impl ResidentStore {
    pub fn new(
        base: DynStore,
        mount: String,
        resident: Arc<Resident>,
        back: Option<Arc<Persister>>,
    ) -> Self {
        ResidentStore {
            base,
            mount,
            resident,
            back,
        }
    }

    /// Moves directory `from` (rel) to `to` holding files kept here: the directory moves in
    /// the store, then each file kept here moves under the new name (a `back` file is logged
    /// again). Uploads of the old names are held off from the start, so none can land in the
    /// old directory afterwards. A failure after the store's rename leaves the files not yet
    /// moved at their old names (still kept here, uploaded there).
    async fn rename_dir_with_residents(
        &self,
        from: &str,
        to: &str,
        from_ns: &str,
        below: Vec<(String, Arc<ResidentFile>)>,
    ) -> Result<ObjectMeta> {
        let mut holds = Vec::with_capacity(below.len());
        if let Some(p) = &self.back {
            for (path, _) in &below {
                holds.push(p.hold(path).await);
            }
        }
        let meta = self.base.rename(from, to).await?;
        for (path, f) in below {
            let to_rel = format!("{to}{}", &path[from_ns.len()..]);
            self.rename_resident(f, &path, &to_rel).await?;
        }
        Ok(meta)
    }

    /// Moves a resident file to `to` (rel): a cache-only file keeps its bytes under the new
    /// name; a `back` file is logged again under it (durable before the rename returns) and
    /// the old record is dropped.
    async fn rename_resident(
        &self,
        f: Arc<ResidentFile>,
        from_ns: &str,
        to: &str,
    ) -> Result<ObjectMeta> {
        let to_ns = self.ns(to);
        let mut meta = self.resident.new_meta(to, f.meta.size);
        meta.mtime = f.meta.mtime;
        let moved = match f.residence {
            Residence::CacheOnly { expires } => ResidentFile {
                meta: meta.clone(),
                data: f.data.clone(),
                residence: Residence::CacheOnly { expires },
                headers: f.headers.clone(),
            },
            Residence::Back { seq } => {
                let Some(p) = self.back.clone() else {
                    return Err(Error::internal("a back file without a write-ahead log"));
                };
                let (data, len, path) = (f.data.clone(), f.meta.size, to_ns.clone());
                let headers = f.headers.clone();
                let logger = p.clone();
                let (rec, file) = tokio::task::spawn_blocking(move || {
                    logger.wal().append(&path, &data, len, headers.as_deref())
                })
                .await
                .map_err(|e| Error::internal(format!("write-ahead log task: {e}")))??;
                let file = Arc::new(file);
                p.enqueue(rec.clone(), self.base.clone(), to.to_string(), file.clone());
                p.cancel(seq);
                ResidentFile {
                    meta: meta.clone(),
                    data: ResidentData::Log(file),
                    residence: Residence::Back { seq: rec.seq },
                    headers: f.headers.clone(),
                }
            }
        };
        if let Some(Residence::Back { seq }) =
            self.resident.insert(to_ns, moved).map(|o| o.residence)
        {
            if let Some(p) = &self.back {
                p.cancel(seq);
            }
        }
        self.resident.remove_if(from_ns, |g| Arc::ptr_eq(g, &f));
        // The store may hold the old name too (an object the resident file shadowed, or an
        // upload of it that was in flight): after a rename nothing is left there.
        let _hold = match &self.back {
            Some(p) => Some(p.hold(from_ns).await),
            None => None,
        };
        match self.base.delete(&self.rel_of(from_ns)).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e.context(from_ns)),
            _ => Ok(meta),
        }
    }

    /// A store rename onto `to`: whatever Silt held at `to` is replaced, so it goes (a
    /// pending upload of it would otherwise overwrite the renamed file later).
    async fn drop_resident_target(&self, to: &str) {
        let to_ns = self.ns(to);
        if let Some(old) = self.resident.remove(&to_ns) {
            if let (Residence::Back { seq }, Some(p)) = (old.residence, &self.back) {
                p.cancel(seq);
            }
        }
        if let Some(r) = self.resident.remote() {
            if let Err(e) = r.delete(&to_ns).await {
                tracing::warn!(path = %to_ns, error = %e, "could not delete replicas of a renamed-over file");
            }
        }
    }

    pub fn base(&self) -> &DynStore {
        &self.base
    }

    fn ns(&self, rel: &str) -> String {
        crate::ns_path(&self.mount, rel.trim_matches('/'))
    }

    fn rel_of(&self, ns: &str) -> String {
        ns[self.mount.len()..].trim_start_matches('/').to_string()
    }

    /// Resident files below `dir` (rel) with their namespace paths: this process's, and
    /// those the workers keep (their pointers refreshed; the pointers alone if no worker
    /// answers).
    async fn resident_files(&self, dir: &str) -> Vec<(String, ObjectMeta)> {
        let ns_dir = self.ns(dir);
        let below = self.resident.below(&ns_dir);
        let remote = match self.resident.remote() {
            Some(r) => match r.list(&ns_dir).await {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(dir = %ns_dir, "listing replicated cache-only files: {e}");
                    None
                }
            },
            None => None,
        };
        let mut out: Vec<(String, ObjectMeta)> = below
            .into_iter()
            .filter(|(_, f)| remote.is_none() || !f.is_remote())
            .map(|(p, f)| (p, f.meta.clone()))
            .collect();
        for (path, rm) in remote.unwrap_or_default() {
            if out.iter().any(|(p, _)| *p == path) {
                continue;
            }
            let rel = self.rel_of(&path);
            if let Some(meta) = self.resident.note_remote(&path, &rel, &rm) {
                out.push((path, meta));
            }
        }
        out
    }

    /// Whether a resident file (here or on the workers) lies below `dir` (rel).
    async fn any_below(&self, dir: &str) -> bool {
        !self.resident.below(&self.ns(dir)).is_empty()
            || (self.resident.remote().is_some() && !self.resident_files(dir).await.is_empty())
    }

    /// Before a rename of something kept here to `to` (rel), which no store is asked about: a
    /// file among the parents of `to` refuses (`NotADirectory`), and with `keep` the missing
    /// ones are made as directories kept here (as a store's rename makes them).
    async fn target_parents(&self, from_ns: &str, to: &str, keep: bool) -> Result<()> {
        let mut missing = Vec::new();
        let mut at = to.trim_matches('/');
        while let Some((parent, _)) = at.rsplit_once('/') {
            match self.stat(parent).await {
                Ok(m) if m.kind == EntryKind::Dir => break,
                Ok(_) => {
                    return Err(Error::new(
                        ErrorKind::NotADirectory,
                        format!("rename {from_ns}: {} is a file", self.ns(parent)),
                    ))
                }
                Err(e) if e.kind() == ErrorKind::NotFound => missing.push(self.ns(parent)),
                Err(e) => return Err(e),
            }
            at = parent;
        }
        if keep {
            for d in missing {
                self.resident.add_dir(&d);
            }
        }
        Ok(())
    }

    /// `NotADirectory` if a file kept here (not in the store yet, so the store's rename would
    /// make a directory of its name) is an ancestor of `to` (rel).
    fn no_resident_file_above(&self, to: &str) -> Result<()> {
        let mut at = to.trim_matches('/');
        while let Some((parent, _)) = at.rsplit_once('/') {
            if self
                .resident
                .get(&self.ns(parent))
                .is_some_and(|f| !f.is_remote())
            {
                return Err(Error::new(
                    ErrorKind::NotADirectory,
                    format!("rename to {}: {} is a file", self.ns(to), self.ns(parent)),
                ));
            }
            at = parent;
        }
        Ok(())
    }

    /// `NotADirectory` if `dir` (rel) is a file kept here, as a store answers a listing of
    /// one of its files (a NotFound would have the client record the file gone).
    fn not_a_resident_file(&self, dir: &str) -> Result<()> {
        match self.resident.get(&self.ns(dir)) {
            Some(f) if !f.is_remote() => Err(Error::new(
                ErrorKind::NotADirectory,
                format!("list {}: not a directory", self.ns(dir)),
            )),
            _ => Ok(()),
        }
    }

    /// The replicated file at `path` (rel) if the workers have one (its pointer refreshed,
    /// or dropped when they have none). Not knowing (no worker answers) counts as none.
    async fn remote_stat(&self, path: &str) -> Option<ObjectMeta> {
        let r = self.resident.remote()?;
        let ns = self.ns(path);
        match r.stat(&ns).await {
            Ok(Some(rm)) => self.resident.note_remote(&ns, path, &rm),
            Ok(None) => {
                self.resident.remove_if(&ns, |f| f.is_remote());
                None
            }
            Err(e) => {
                silt_common::warn_limited!(
                    "asking for a replicated cache-only file",
                    path = %ns,
                    error = %e
                );
                None
            }
        }
    }

    /// Resident entries below `dir` (rel): every file when `recursive`, else the direct
    /// children (files, and the directories files lie in).
    async fn resident_entries(&self, dir: &str, recursive: bool) -> Vec<ObjectMeta> {
        let ns_dir = self.ns(dir);
        let prefix = dir_prefix(&ns_dir);
        let mut out: Vec<ObjectMeta> = Vec::new();
        let dirs = self.resident.dirs_below(&ns_dir).into_iter();
        let files = self.resident_files(dir).await.into_iter();
        for (path, meta) in dirs
            .map(|d| {
                let meta = self.resident.dir_meta(&d, &self.rel_of(&d));
                (d, meta)
            })
            .chain(files)
        {
            let rest = &path[prefix.len()..];
            match rest.split_once('/') {
                None if meta.kind == EntryKind::Dir && out.iter().any(|m| m.path == meta.path) => {}
                None => out.push(meta),
                Some((sub, _)) => {
                    if recursive {
                        out.push(meta);
                    } else {
                        let rel = self.rel_of(&format!("{prefix}{sub}"));
                        if !out.iter().any(|m| m.path == rel) {
                            out.push(ObjectMeta::dir(&rel));
                        }
                    }
                }
            }
        }
        out
    }

    /// `base` entries of `dir` merged with the resident ones `extra` (a resident file replaces
    /// a store object at its path). `base` failing with NotFound counts as empty if resident
    /// entries exist or `dir` is kept here. `extra` must be taken before `base` is asked: a file uploaded meanwhile is then
    /// in one or the other (in both, the resident version wins and is found gone later),
    /// never in neither.
    fn merge(
        &self,
        dir: &str,
        extra: Vec<ObjectMeta>,
        base: Result<Vec<ObjectMeta>>,
    ) -> Result<Vec<ObjectMeta>> {
        let mut base = match base {
            Ok(v) => v,
            Err(e)
                if e.kind() == ErrorKind::NotFound
                    && (!extra.is_empty() || self.resident.has_dir(&self.ns(dir))) =>
            {
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        if extra.is_empty() {
            return Ok(base);
        }
        base.retain(|m| !extra.iter().any(|x| x.path == m.path.trim_end_matches('/')));
        base.extend(extra);
        Ok(base)
    }
}

/// Every call the resident files change is answered here; the rest (writes, deletes, new
/// directories) go on to the store unchanged ([`Layer`]'s defaults).
#[async_trait]
impl Layer for ResidentStore {
    fn inner(&self) -> &DynStore {
        &self.base
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        if let Some(f) = self.resident.get(&self.ns(path)) {
            // A pointer to workers' copy is asked again: another client may have changed it.
            if !f.is_remote() {
                return Ok(f.meta.clone());
            }
        }
        if let Some(meta) = self.remote_stat(path).await {
            return Ok(meta);
        }
        let ns = self.ns(path);
        if self.resident.has_dir(&ns) {
            return Ok(self.resident.dir_meta(&ns, path.trim_matches('/')));
        }
        // Taken first, for the reason `merge` gives.
        let below =
            !self.resident.below(&ns).is_empty() || !self.resident.dirs_below(&ns).is_empty();
        match self.base.stat(path).await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if !below && !self.any_below(path).await {
                    Err(e)
                } else {
                    Ok(ObjectMeta::dir(path.trim_matches('/')))
                }
            }
            r => r,
        }
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.not_a_resident_file(dir)?;
        let extra = self.resident_entries(dir, recursive).await;
        let base = self.base.list(dir, recursive).await;
        self.merge(dir, extra, base)
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        self.not_a_resident_file(dir)?;
        let extra = self.resident_entries(dir, true).await;
        match self.base.list_tree(dir, max).await {
            Ok(None) => Ok(None),
            Ok(Some(v)) => self.merge(dir, extra, Ok(v)).map(Some),
            Err(e) => self.merge(dir, extra, Err(e)).map(Some),
        }
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        if !is_resident(expected) {
            return self.base.read(path, range, expected).await;
        }
        match self.resident.get(&self.ns(path)) {
            Some(f) if f.meta.etag == expected.etag && !f.is_remote() => read_resident(&f, range),
            _ if self.resident.remote().is_some() => {
                let (Some(r), Some(tag)) = (self.resident.remote(), expected.etag.as_deref())
                else {
                    return Err(Error::internal("a resident version without a tag"));
                };
                let end = range.end.min(expected.size);
                if range.start >= end {
                    return Ok(Bytes::new());
                }
                r.read(&self.ns(path), tag, range.start..end).await
            }
            _ => Err(Error::new(
                ErrorKind::ContentChanged,
                format!("{path}: the version Silt held was replaced or persisted"),
            )),
        }
    }

    /// A store's version is read as the store delivers it (a local file's straight into the
    /// pieces); a resident one through `read`.
    async fn read_pieces(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        if !is_resident(expected) {
            return self.base.read_pieces(path, range, expected, piece).await;
        }
        let bytes = self.read(path, range, expected).await?;
        Ok(silt_ufs::pieces(std::iter::once(bytes), piece))
    }

    /// A resident version's headers are the ones it was written with.
    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        if !is_resident(expected) {
            return self.base.headers(path, expected).await;
        }
        match self.resident.get(&self.ns(path)) {
            Some(f) if f.meta.etag == expected.etag => {
                Ok(f.headers.as_deref().cloned().unwrap_or_default())
            }
            _ => Err(Error::new(
                ErrorKind::ContentChanged,
                format!("{path}: the version Silt held was replaced or persisted"),
            )),
        }
    }

    /// A resident version is no file of the store's.
    async fn local_file(&self, path: &str, expected: &ObjectMeta) -> Option<std::fs::File> {
        if is_resident(expected) {
            return None;
        }
        self.base.local_file(path, expected).await
    }

    /// A link cannot take the name of a file held only in Silt (`AlreadyExists`).
    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        if self.resident.get(&self.ns(path)).is_some() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("symlink {}: a file is there", self.ns(path)),
            ));
        }
        self.base.symlink(path, target).await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: silt_ufs::SpecialKind,
        rdev: u32,
        attrs: &silt_ufs::SetAttrs,
    ) -> Result<ObjectMeta> {
        if self.resident.get(&self.ns(path)).is_some() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("mknod {}: a file is there", self.ns(path)),
            ));
        }
        self.base.mknod(path, kind, rdev, attrs).await
    }

    /// A file held only in Silt has no store file to give a second name.
    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        if self.resident.get(&self.ns(to)).is_some() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("link {}: a file is there", self.ns(to)),
            ));
        }
        if self.resident.get(&self.ns(from)).is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("link {}: a file kept only in Silt", self.ns(from)),
            ));
        }
        self.base.hard_link(from, to).await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        if self.resident.get(&self.ns(path)).is_some() {
            return Err(Error::invalid(format!(
                "readlink {}: not a symbolic link",
                self.ns(path)
            )));
        }
        self.base.read_link(path).await
    }

    /// Files held only in Silt keep no attributes of their own (`Unsupported`).
    async fn set_attrs(&self, path: &str, attrs: &silt_ufs::SetAttrs) -> Result<ObjectMeta> {
        if let Some(f) = self.resident.get(&self.ns(path)) {
            if !f.is_remote() {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{}: a file kept only in Silt keeps no attributes",
                        self.ns(path)
                    ),
                ));
            }
        }
        self.base.set_attrs(path, attrs).await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        let ns = self.ns(path);
        if self.any_below(path).await || !self.resident.dirs_below(&ns).is_empty() {
            return Err(Error::new(
                ErrorKind::NotEmpty,
                format!("{ns}: holds files kept in Silt"),
            ));
        }
        if !self.resident.has_dir(&ns) {
            return self.base.remove_dir(path).await;
        }
        // Kept here: the store has no such directory (or an empty one of the same name).
        match self.base.remove_dir(path).await {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        self.resident.remove_dir(&ns);
        Ok(())
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from_ns = self.ns(from);
        let replicated = self.resident.remote().is_some()
            && (self.remote_stat(from).await.is_some() || self.any_below(from).await);
        if replicated {
            // Its replicas are chosen by its path: a new name means other workers.
            return Err(Error::new(
                ErrorKind::CrossDevice,
                format!("{from_ns}: files kept on workers are moved by copying"),
            ));
        }
        if let Some(f) = self.resident.get(&from_ns) {
            // A `back` file's parents come with its upload; on an object store they are its
            // objects, not directories kept here (see `Client::commit` for `back`).
            let keep = matches!(f.residence, Residence::CacheOnly { .. })
                || self.base.capabilities().rename_dirs;
            self.target_parents(&from_ns, to, keep).await?;
            return self.rename_resident(f, &from_ns, to).await;
        }
        let below = self.resident.below(&from_ns);
        if self.resident.has_dir(&from_ns)
            && matches!(self.base.stat(from).await, Err(e) if e.kind() == ErrorKind::NotFound)
        {
            // A directory kept here: it and everything below it move here, the store untouched.
            self.target_parents(&from_ns, to, true).await?;
            let to_ns = self.ns(to);
            self.resident.rename_dirs(&from_ns, &to_ns);
            for (path, f) in below {
                let to_rel = format!("{}{}", to.trim_matches('/'), &path[from_ns.len()..]);
                self.rename_resident(f, &path, &to_rel).await?;
            }
            return Ok(ObjectMeta::dir(to.trim_matches('/')));
        }
        if !below.is_empty() {
            self.no_resident_file_above(to)?;
            return self
                .rename_dir_with_residents(from, to, &from_ns, below)
                .await;
        }
        self.no_resident_file_above(to)?;
        let _hold = match &self.back {
            Some(p) => Some(p.hold(&self.ns(to)).await),
            None => None,
        };
        let meta = self.base.rename(from, to).await?;
        self.drop_resident_target(to).await;
        Ok(meta)
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        match self.resident.get(&self.ns(from)) {
            Some(f) if !f.is_remote() => self.base.write_from(to, &f.data, f.meta.size).await,
            _ => match (self.resident.remote(), self.remote_stat(from).await) {
                (Some(r), Some(meta)) => {
                    let tag = meta.etag.clone().unwrap_or_default();
                    let data = r.read(&self.ns(from), &tag, 0..meta.size).await?;
                    self.base.write(to, data).await
                }
                _ => self.base.copy(from, to).await,
            },
        }
    }
}
