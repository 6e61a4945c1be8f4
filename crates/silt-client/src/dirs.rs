//! Directories, symbolic links and renames through the client: `mkdir`, `rmdir`, `symlink`,
//! `readlink` and `rename`.
//!
//! Each operation asks the store (`UnderStore::create_dir`, `remove_dir`, `rename`, `copy`),
//! then records the outcome in the metadata cache at once (so listings and stats show it
//! without a store request) and reports the changes to listeners (the FUSE adapter tells the
//! kernel).
//!
//! - `mkdir`: a real directory on a local store, a zero-byte `dir/` marker object on S3. Under
//!   a `cache-only` prefix (whose files the store never sees) the directory is kept by the
//!   mount's resident layer (`resident.rs`): it lasts until its `rmdir`, emptied or not, and
//!   ends with the process, as the files under it do.
//! - `rmdir`: only an empty directory (`NotEmpty` otherwise, judged by its listing and by the
//!   store).
//! - `rename` of a file: the store's rename (local: `rename(2)`, atomic) or a server-side copy
//!   then a delete (S3: not atomic; a failure between leaves both names). A file at the
//!   destination is replaced.
//! - `rename` of a directory: one `rename(2)` on a local store. On S3 every object below it is
//!   copied, then the originals deleted: not atomic (a reader meanwhile can see both trees,
//!   and a failed copy removes the copies already made and leaves the source whole), and
//!   limited to [`MAX_DIR_RENAME`] entries; a bigger tree is `CrossDevice` (`EXDEV`), so `mv`
//!   falls back to copying it itself. The destination must be missing or an empty directory.
//! - Both paths must be writable (`ReadOnly`), in the same mount (`CrossDevice`), and neither
//!   may be a mount's root (`Busy`). A file held only in Silt (cache-only, or `back` before its
//!   upload) is renamed by the mount's resident layer (`resident.rs`); a directory holding
//!   such files is `CrossDevice`, so `mv` moves its files one by one.

use std::sync::Arc;

use futures::stream::{self, StreamExt};
use silt_common::config::is_at_or_under;
use silt_common::write::WriteType;
use silt_common::{Error, ErrorKind, Result};
use silt_ufs::{DynStore, EntryKind, ObjectMeta};

use crate::namespace::{parent_and_name, Resolved};
use crate::resident::is_resident;
use crate::{Client, Entry};

/// Most entries (files and directories) a directory rename moves object by object.
pub const MAX_DIR_RENAME: usize = 10_000;

/// Store requests of one object-by-object directory rename in flight at once.
const RENAME_CONCURRENCY: usize = 8;

/// A writable namespace path and where it lands.
struct Target {
    path: String,
    rel: String,
    mount: String,
    store: DynStore,
    write_type: WriteType,
}

impl Client {
    /// Checks that `path` may be changed and resolves it. `root`: the error for a mount's root.
    fn dir_target(&self, path: &str, root: ErrorKind) -> Result<Target> {
        let path = Self::normalize(path)?;
        let write_type = self.write_type_of(&path);
        if !write_type.writable() {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{path}: read-only (write type {write_type})"),
            ));
        }
        let resolved = match self.ns.resolve(&path) {
            // Outside every mount, e.g. a new name in a directory above the mounts.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::new(ErrorKind::ReadOnly, e.to_string()))
            }
            r => r?,
        };
        match resolved {
            Resolved::Synthetic { .. } => Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{path}: not inside a mount (only mounted stores can be changed)"),
            )),
            Resolved::Store { rel, .. } if rel.is_empty() => {
                Err(Error::new(root, format!("{path}: the root of a mount")))
            }
            Resolved::Store { mount, rel } => {
                crate::write::check_key_len(&path, &rel, &mount.store)?;
                Ok(Target {
                    rel,
                    mount: mount.path.clone(),
                    store: mount.store.clone(),
                    path,
                    write_type,
                })
            }
        }
    }

    /// `stat`, with "does not exist" as `None`.
    pub(crate) async fn stat_opt(&self, path: &str) -> Result<Option<Entry>> {
        match self.stat(path).await {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `path` may be created: nothing has it, and its parent is an existing directory.
    async fn check_new_entry(&self, path: &str) -> Result<()> {
        if self.stat_opt(path).await?.is_some() {
            return Err(already_exists(path));
        }
        let Some((parent, _)) = parent_and_name(path) else {
            return Ok(());
        };
        match self.stat_opt(parent).await? {
            Some(p) if p.is_dir() => Ok(()),
            Some(_) => Err(Error::new(
                ErrorKind::NotADirectory,
                format!("{path}: {parent} is not a directory"),
            )),
            None => Err(Error::not_found(format!(
                "{path}: no such directory {parent}"
            ))),
        }
    }

    /// Creates the directory `path`; its parent must exist. `AlreadyExists` if anything has
    /// the path.
    pub(crate) async fn mkdir_stored(&self, path: &str) -> Result<Entry> {
        let t = self.dir_target(path, ErrorKind::AlreadyExists)?;
        self.check_new_entry(&t.path).await?;
        let asked = self.opts.clock.now();
        let meta = if t.write_type == WriteType::CacheOnly {
            self.writes.resident.add_dir(&t.path);
            // With the time it was made: the store has none to give.
            self.writes.resident.dir_meta(&t.path, &t.rel)
        } else {
            t.store
                .create_dir(&t.rel)
                .await
                .map_err(|e| e.context(&t.path))?
        };
        let entry = Entry::from_meta(t.path.clone(), &t.store, meta);
        let mut changes = self.meta.put_stat(asked, entry.clone());
        // New, so empty: listing it needs no store request.
        changes.extend(self.meta.put_list(asked, &t.path, Arc::new(Vec::new())));
        self.note_parents(&t.path, &t.rel, &t.store, asked, &mut changes);
        self.apply(&changes);
        Ok(entry)
    }

    /// Creates the symbolic link `path` to `target` (`symlink(2)`): the store keeps it (a
    /// real link on a local store, an s3fs-style link object on S3), and Silt never follows
    /// it itself (the kernel resolves it in the mount). Its parent must exist;
    /// `AlreadyExists` if anything has the path. Under `cache-only` (which has no store
    /// object to hold it) `Unsupported`.
    /// `attrs` (the caller's owner and group) are given to the link where the store keeps
    /// them; a store that cannot leaves its defaults (as `mkdir_attrs`).
    pub async fn symlink(
        &self,
        path: &str,
        target: &str,
        attrs: &silt_ufs::SetAttrs,
    ) -> Result<Entry> {
        if target.is_empty() || target.contains('\0') {
            return Err(Error::invalid(format!(
                "symlink {path}: the target must be non-empty text"
            )));
        }
        self.new_store_entry("symlink", path, |store, rel| async move {
            let meta = store.symlink(&rel, target).await?;
            if attrs.is_empty() {
                return Ok(meta);
            }
            match store.set_attrs(&rel, attrs).await {
                Ok(m) => Ok(m),
                Err(err) => {
                    tracing::debug!(path = %rel, "new link keeps default attributes: {err}");
                    Ok(meta)
                }
            }
        })
        .await
    }

    /// An entry only the store can hold (a link, a special file) made at `path` by `make`
    /// (given the mount's store and the path in it): the parent must exist, nothing may have
    /// the path, `Unsupported` under `cache-only` (no store object); then cached as stat'ed
    /// and the parent's times moved.
    async fn new_store_entry<F, Fut>(&self, what: &str, path: &str, make: F) -> Result<Entry>
    where
        F: FnOnce(silt_ufs::DynStore, String) -> Fut,
        Fut: std::future::Future<Output = Result<silt_ufs::ObjectMeta>>,
    {
        let t = self.dir_target(path, ErrorKind::AlreadyExists)?;
        if t.write_type == WriteType::CacheOnly {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{what} {}: cache-only files have no store object", t.path),
            ));
        }
        if self.session(&t.path).is_some() {
            return Err(already_exists(&t.path));
        }
        self.check_new_entry(&t.path).await?;
        let asked = self.opts.clock.now();
        let meta = make(t.store.clone(), t.rel.clone())
            .await
            .map_err(|e| e.context(&t.path))?;
        let entry = Entry::from_meta(t.path.clone(), &t.store, meta);
        let mut changes = self.meta.put_stat(asked, entry.clone());
        self.note_parents(&t.path, &t.rel, &t.store, asked, &mut changes);
        self.apply(&changes);
        self.dir_times.touch_parent_of(&t.path);
        self.tell_changed(&t.path).await;
        Ok(entry)
    }

    /// Makes the FIFO, socket or device node `path` (`mknod(2)`, `mkfifo(3)`, a Unix
    /// socket's `bind`), with `attrs` (the caller's mode after the umask, owner and group):
    /// the store keeps it (the real node on a local store, an s3fs-style empty object with
    /// its type in the metadata on S3); opening it is the kernel's (a pipe, a socket, a
    /// device), never a read of the store. Its parent must exist; `AlreadyExists` if anything
    /// has the path. Under `cache-only` (no store object to hold it) `Unsupported`.
    pub async fn mknod(
        &self,
        path: &str,
        kind: silt_ufs::SpecialKind,
        rdev: u32,
        attrs: &silt_ufs::SetAttrs,
    ) -> Result<Entry> {
        self.new_store_entry("mknod", path, |store, rel| async move {
            store.mknod(&rel, kind, rdev, attrs).await
        })
        .await
    }

    /// Gives the file `from` the second name `to` (`link(2)`), where the store can: a local
    /// directory (a real hard link); an object store answers `NotPermitted` (EPERM, as
    /// `link(2)` does on a file system without hard links). Both names then count the other
    /// (`posix.nlink`) and are asked of the store at every stat, as a change through one is a
    /// change of both. A file open for writing here is committed first, so the new name
    /// holds what was written. `AlreadyExists` if `to` exists.
    pub async fn link(&self, from: &str, to: &str) -> Result<Entry> {
        let src = self.dir_target(from, ErrorKind::NotPermitted)?;
        let t = self.dir_target(to, ErrorKind::AlreadyExists)?;
        if src.mount != t.mount || src.write_type == WriteType::CacheOnly {
            return Err(Error::new(
                ErrorKind::NotPermitted,
                format!("link {} to {}: not within one store", src.path, t.path),
            ));
        }
        if let Some(s) = self.session(&src.path) {
            self.commit_session(&s).await?;
        }
        // A `back` file may so far be only in the local log: the store's file must hold
        // its bytes before it gets a second name there (else the link would depend on
        // whether its upload happened to be done).
        if src.write_type == WriteType::Back && self.writes.back.is_some() {
            for (p, state) in self.persist(&src.path).await? {
                match state {
                    crate::persist::FileState::Persisted | crate::persist::FileState::Unknown => {}
                    other => {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            format!("link {p}: its upload did not finish ({other:?})"),
                        ))
                    }
                }
            }
        }
        let cur = self.stat(&src.path).await?;
        if cur.is_dir() {
            return Err(Error::new(
                ErrorKind::NotPermitted,
                format!("link {}: is a directory", src.path),
            ));
        }
        if self.session(&t.path).is_some() {
            return Err(already_exists(&t.path));
        }
        self.check_new_entry(&t.path).await?;
        let asked = self.opts.clock.now();
        let meta = t.store.hard_link(&src.rel, &t.rel).await.map_err(|e| {
            if e.kind() == ErrorKind::Unsupported {
                Error::new(ErrorKind::NotPermitted, e.to_string())
            } else {
                e.context(&t.path)
            }
        })?;
        let entry = Entry::from_meta(t.path.clone(), &t.store, meta);
        let mut changes = self.meta.put_stat(asked, entry.clone());
        // The source's count (and ctime) changed with it.
        if let Ok(m) = src.store.stat(&src.rel).await {
            let e = Entry::from_meta(src.path.clone(), &src.store, m);
            changes.extend(self.meta.put_stat(asked, e));
        }
        self.note_parents(&t.path, &t.rel, &t.store, asked, &mut changes);
        self.apply(&changes);
        self.dir_times.touch_parent_of(&t.path);
        self.tell_changed(&t.path).await;
        Ok(entry)
    }

    /// The target of the symbolic link `path` (`readlink(2)`); `InvalidInput` if `path` is
    /// not a link.
    pub async fn readlink(&self, path: &str) -> Result<String> {
        let e = self.stat(path).await?;
        if e.kind != EntryKind::Symlink {
            return Err(Error::invalid(format!("{}: not a symbolic link", e.path)));
        }
        let obj = e
            .object
            .as_ref()
            .ok_or_else(|| Error::internal(format!("{}: link without an object", e.path)))?;
        obj.store
            .read_link(&obj.meta.path)
            .await
            .map_err(|err| err.context(&e.path))
    }

    /// Removes the empty directory `path`.
    pub(crate) async fn rmdir_stored(&self, path: &str) -> Result<()> {
        let t = self.dir_target(path, ErrorKind::Busy)?;
        let e = self.stat(&t.path).await?;
        if !e.is_dir() {
            return Err(Error::new(
                ErrorKind::NotADirectory,
                format!("{}: not a directory", t.path),
            ));
        }
        if !self.list(&t.path).await?.is_empty() {
            return Err(Error::new(
                ErrorKind::NotEmpty,
                format!("{}: directory not empty", t.path),
            ));
        }
        let asked = self.opts.clock.now();
        if let Err(err) = t.store.remove_dir(&t.rel).await {
            if err.kind() == ErrorKind::NotEmpty {
                // The store has entries the cached listing does not: forget it.
                let changes = self.meta.invalidate(&t.path);
                self.apply(&changes);
            }
            return Err(err.context(&t.path));
        }
        let changes = self.meta.put_missing(asked, &t.path);
        self.apply(&changes);
        self.forget_emptied_parents(&t.path).await;
        Ok(())
    }

    /// After `path` left the store: an object store's directory goes away with its last entry
    /// unless a marker keeps it (docs/SEMANTICS.md, "Directories"). Each parent whose cached
    /// listing is now empty is asked about (one stat), and one the store no longer has is
    /// recorded as gone, so this client never lists a directory that is not there. Stops at
    /// the first that stays (a local directory always does), or whose listing is not cached.
    pub(crate) async fn forget_emptied_parents(&self, path: &str) {
        let mut below = path.to_string();
        while let Some((dir, _)) = parent_and_name(&below) {
            let dir = dir.to_string();
            let Ok(Resolved::Store { mount, rel }) = self.ns.resolve(&dir) else {
                return;
            };
            let emptied = matches!(self.meta.list(&dir, |_| true), Some((l, _)) if l.is_empty());
            if rel.is_empty() || !emptied {
                return;
            }
            let asked = self.opts.clock.now();
            match mount.store.stat(&rel).await {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    let changes = self.meta.put_missing(asked, &dir);
                    self.apply(&changes);
                }
                _ => return,
            }
            below = dir;
        }
    }

    /// Renames the file or directory `from` to `to` (see the module docs); returns `to`'s entry.
    pub(crate) async fn rename_stored(&self, from: &str, to: &str) -> Result<Entry> {
        let a = self.dir_target(from, ErrorKind::Busy)?;
        let b = self.dir_target(to, ErrorKind::Busy)?;
        if a.path == b.path {
            return self.stat(&a.path).await;
        }
        if a.mount != b.mount {
            return Err(Error::new(
                ErrorKind::CrossDevice,
                format!("rename {} to {}: different mounts", a.path, b.path),
            ));
        }
        if is_at_or_under(&b.path, &a.path) {
            return Err(Error::invalid(format!(
                "rename {} to {}: a directory cannot move into itself",
                a.path, b.path
            )));
        }
        let src = self.stat(&a.path).await?;
        match (src.is_dir(), self.stat_opt(&b.path).await?) {
            (false, Some(d)) if d.is_dir() => {
                return Err(Error::new(
                    ErrorKind::IsADirectory,
                    format!("rename {} to {}: the target is a directory", a.path, b.path),
                ))
            }
            (true, Some(d)) if !d.is_dir() => {
                return Err(Error::new(
                    ErrorKind::NotADirectory,
                    format!(
                        "rename {} to {}: the target is not a directory",
                        a.path, b.path
                    ),
                ))
            }
            (true, Some(_)) if !self.list(&b.path).await?.is_empty() => {
                return Err(Error::new(
                    ErrorKind::NotEmpty,
                    format!("rename {} to {}: the target is not empty", a.path, b.path),
                ))
            }
            _ => {}
        }
        let context = |e: Error| e.context(format!("rename {} to {}", a.path, b.path));
        // Open files at either name (below them, for a directory) keep their bytes.
        self.keep_open_bytes(&a.store, &a.rel, src.is_dir()).await;
        self.keep_open_bytes(&b.store, &b.rel, src.is_dir()).await;
        if !src.is_dir() {
            let meta = a.store.rename(&a.rel, &b.rel).await.map_err(context)?;
            // Stamped when the rename is done, not when it began: an upload of the old name
            // that ended meanwhile (and recorded it) must not outlive the rename.
            let asked = self.opts.clock.now();
            let mut changes = self.meta.put_missing(asked, &a.path);
            let entry = Entry::from_meta(b.path.clone(), &b.store, meta);
            changes.extend(self.meta.put_stat(asked, entry.clone()));
            self.note_parents(&b.path, &b.rel, &b.store, asked, &mut changes);
            self.apply(&changes);
            self.forget_emptied_parents(&a.path).await;
            return Ok(entry);
        }
        // A directory kept by the resident layer moves there, whatever the store can do.
        let meta = if a.store.capabilities().rename_dirs || self.writes.resident.has_dir(&a.path) {
            a.store.rename(&a.rel, &b.rel).await.map_err(context)?
        } else {
            self.move_tree(&a, &b).await.map_err(context)?
        };
        let asked = self.opts.clock.now();
        // What was cached below either name is gone; `to` is a directory whose listing is
        // asked for when next needed.
        self.too_big
            .lock()
            .retain(|d| !is_at_or_under(d, &a.path) && !is_at_or_under(d, &b.path));
        // Directories kept by the resident layer below it move too (a store's rename or
        // object-by-object move does not know them).
        self.writes.resident.rename_dirs(&a.path, &b.path);
        let mut changes = self.meta.put_missing(asked, &a.path);
        changes.extend(self.meta.put_missing(asked, &b.path));
        let entry = Entry::from_meta(b.path.clone(), &b.store, meta);
        changes.extend(self.meta.put_stat(asked, entry.clone()));
        self.note_parents(&b.path, &b.rel, &b.store, asked, &mut changes);
        self.apply(&changes);
        self.forget_emptied_parents(&a.path).await;
        Ok(entry)
    }

    /// Moves directory `a` to `b` object by object: copies every file and makes a marker for
    /// every directory (`b` included), then deletes the originals. Everything that can refuse
    /// is checked before the first copy; a failed copy deletes the copies made, so the source
    /// is whole and the target as before.
    async fn move_tree(&self, a: &Target, b: &Target) -> Result<ObjectMeta> {
        let store = &a.store;
        let Some(entries) = store.list_tree(&a.rel, MAX_DIR_RENAME).await? else {
            return Err(Error::new(
                ErrorKind::CrossDevice,
                format!(
                    "more than {MAX_DIR_RENAME} entries: an object store renames a directory \
                     object by object, and this one is too big (copy it instead)"
                ),
            ));
        };
        let inside = |p: &str| {
            p.len() > a.rel.len() && p.starts_with(&a.rel) && p.as_bytes()[a.rel.len()] == b'/'
        };
        let dest = |p: &str| format!("{}{}", b.rel, &p[a.rel.len()..]);
        let entries: Vec<ObjectMeta> = entries.into_iter().filter(|m| inside(&m.path)).collect();
        // Files kept in Silt (cache-only, or written back and not uploaded yet) are not in the
        // store: each moves with a rename of its own, after the copies. Replicated ones cannot
        // (their workers follow the path), checked before anything changes.
        let (resident, entries): (Vec<ObjectMeta>, Vec<ObjectMeta>) =
            entries.into_iter().partition(is_resident);
        if !resident.is_empty() && self.writes.resident.remote().is_some() {
            return Err(Error::new(
                ErrorKind::CrossDevice,
                format!("{}: files kept on workers are moved by copying", a.path),
            ));
        }
        let ns = |rel: &str| format!("{}{}", a.path, &rel[a.rel.len()..]);
        // No upload of a resident file may land under its old name once it moved.
        let mut holds = Vec::with_capacity(resident.len());
        if let Some(p) = &self.writes.back {
            for m in &resident {
                holds.push(p.hold(&ns(&m.path)).await);
            }
        }
        // Files, links and special files: each an object, copied with its metadata.
        let files: Vec<&str> = entries
            .iter()
            .filter(|m| m.kind != EntryKind::Dir)
            .map(|m| m.path.as_str())
            .collect();
        let mut dirs: Vec<&str> = entries
            .iter()
            .filter(|m| m.kind == EntryKind::Dir)
            .map(|m| m.path.as_str())
            .collect();
        // Deepest first, for the removal of the originals.
        dirs.sort_by(|x, y| y.len().cmp(&x.len()).then(x.cmp(y)));
        dirs.dedup();
        // Copies: every file, a marker for every directory below (a directory that had only
        // files under it gets one too: after a rename, removing those files must not make it
        // vanish, as it would not on a file system), and one for `b` itself.
        // (destination, source file): `None` makes a directory marker.
        let mut jobs: Vec<(String, Option<&str>)> =
            files.iter().map(|f| (dest(f), Some(*f))).collect();
        jobs.extend(dirs.iter().map(|d| (dest(d), None)));
        for m in &resident {
            let mut parent = m.path.rsplit_once('/').map(|(d, _)| d);
            while let Some(d) = parent.filter(|d| inside(d) && !dirs.contains(d)) {
                jobs.push((dest(d), None));
                parent = d.rsplit_once('/').map(|(d, _)| d);
            }
        }
        jobs.sort();
        jobs.dedup();
        jobs.push((b.rel.clone(), None));
        // An empty directory renamed over keeps its marker if the move is undone.
        let b_existed = matches!(store.stat(&b.rel).await, Ok(m) if m.kind == EntryKind::Dir);
        let results: Vec<(&str, bool, Result<()>)> = stream::iter(jobs.iter())
            .map(|(to, from)| async move {
                let r = match from {
                    Some(from) => store.copy(from, to).await.map(drop),
                    None => match store.create_dir(to).await {
                        Ok(_) => {
                            let src = format!("{}{}", a.rel, &to[b.rel.len()..]);
                            keep_dir_attrs(store, &src, to).await;
                            Ok(())
                        }
                        Err(e) => Err(e),
                    },
                };
                (to.as_str(), from.is_none(), r)
            })
            .buffer_unordered(RENAME_CONCURRENCY)
            .collect()
            .await;
        let failed = results.iter().find_map(|(_, _, r)| r.as_ref().err());
        if let Some(err) = failed {
            let err = Error::new(err.kind(), err.to_string());
            // Files first, then markers deepest first (a marker goes only once empty).
            let mut made: Vec<(&str, bool)> = results
                .iter()
                .filter(|(p, _, r)| r.is_ok() && !(b_existed && *p == b.rel))
                .map(|(p, marker, _)| (*p, *marker))
                .collect();
            made.sort_by(|x, y| x.1.cmp(&y.1).then(y.0.len().cmp(&x.0.len())));
            for (p, marker) in made {
                let undo = if marker {
                    store.remove_dir(p).await
                } else {
                    store.delete(p).await
                };
                if let Err(e) = undo {
                    tracing::warn!(path = p, "rename: could not remove a partial copy: {e}");
                }
            }
            return Err(err);
        }

        for m in &resident {
            store
                .rename(&m.path, &dest(&m.path))
                .await
                .map_err(|e| e.context("copied; moving the files kept in Silt"))?;
        }
        drop(holds);

        // Originals: files, then directories deepest first, then `a` itself. A directory that
        // something new was written into meanwhile stays.
        let deleted: Vec<Result<()>> = stream::iter(files.iter())
            .map(|f| store.delete(f))
            .buffer_unordered(RENAME_CONCURRENCY)
            .collect()
            .await;
        if let Some(Err(e)) = deleted.into_iter().find(|r| r.is_err()) {
            return Err(e.context("copied; removing the originals"));
        }
        for d in dirs.iter().copied().chain(std::iter::once(a.rel.as_str())) {
            match store.remove_dir(d).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotEmpty => {
                    tracing::warn!(dir = d, "rename: a directory filled meanwhile stays: {e}")
                }
                Err(e) => return Err(e.context("copied; removing the originals")),
            }
        }
        Ok(ObjectMeta::dir(&b.rel))
    }
}

/// The directory `to`, just made as the copy of `from`, given `from`'s mode, owner and times
/// where the store keeps them (an S3 marker's metadata). Best effort: a directory that cannot
/// keep them keeps the store's defaults (logged), as a new directory would.
async fn keep_dir_attrs(store: &DynStore, from: &str, to: &str) {
    let Ok(m) = store.stat(from).await else {
        return;
    };
    if m.kind != EntryKind::Dir
        || m.mode.is_none() && m.posix.uid.is_none() && m.posix.gid.is_none()
    {
        return;
    }
    let set = silt_ufs::SetAttrs {
        mode: m.mode,
        uid: m.posix.uid,
        gid: m.posix.gid,
        atime: m.posix.atime,
        mtime: m.mtime,
    };
    if let Err(e) = store.set_attrs(to, &set).await {
        tracing::debug!(
            dir = to,
            "rename: the moved directory keeps default attributes: {e}"
        );
    }
}

fn already_exists(path: &str) -> Error {
    Error::new(ErrorKind::AlreadyExists, format!("{path}: already exists"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::{MountPoint, Namespace};
    use crate::ClientOptions;
    use silt_cache::{PageStore, PageStoreConfig};
    use silt_reader::{PageReader, PageReaderOptions};
    use silt_ufs::{MemStore, UnderStore};

    struct Fx {
        client: Client,
        d: Arc<MemStore>,
        _spool: tempfile::TempDir,
    }

    /// `/d` and `/e` over two memory stores, writable `through` except `/d/ro`.
    fn fixture() -> Fx {
        let d = Arc::new(MemStore::new("mem://d"));
        let e = Arc::new(MemStore::new("mem://e"));
        let ns = Namespace::new(vec![
            MountPoint {
                path: "/d".into(),
                store: d.clone(),
            },
            MountPoint {
                path: "/e".into(),
                store: e,
            },
        ])
        .unwrap();
        let pages = Arc::new(PageStore::open(PageStoreConfig::in_memory(4096, 16 << 20)).unwrap());
        let worker = Arc::new(PageReader::new(
            pages,
            &PageReaderOptions {
                fetch_concurrency: 4,
                buffer_memory: 1 << 20,
                request_size: 8192,
            },
            tokio::runtime::Handle::current(),
        ));
        let opts = ClientOptions::from_config(&silt_common::config::Config::default());
        let spool = tempfile::tempdir().unwrap();
        let rules = silt_common::write::WriteRules::new(
            WriteType::Through,
            silt_common::write::parse_write_rules("/d/ro=read-only").unwrap(),
        );
        let client = Client::new(ns, worker, opts, tokio::runtime::Handle::current())
            .with_writes(rules, spool.path().to_path_buf())
            .unwrap();
        Fx {
            client,
            d,
            _spool: spool,
        }
    }

    async fn names(c: &Client, dir: &str) -> Vec<String> {
        let l = c.list(dir).await.unwrap();
        l.iter().map(|e| e.name().to_string()).collect()
    }

    async fn write(c: &Client, path: &str, data: &[u8]) {
        let w = c.create(path, true).await.unwrap();
        c.write_at(&w, 0, data).unwrap();
        c.commit(&w).await.unwrap();
    }

    async fn read(c: &Client, path: &str) -> Vec<u8> {
        let f = c.open(path).await.unwrap();
        c.read(&f, 0, f.size() + 1).await.unwrap().to_vec()
    }

    fn kind<T: std::fmt::Debug>(r: Result<T>) -> ErrorKind {
        r.unwrap_err().kind()
    }

    #[tokio::test]
    async fn mkdir_and_rmdir() {
        let fx = fixture();
        let c = &fx.client;
        assert!(names(c, "/d").await.is_empty());
        let e = c.mkdir("/d/a").await.unwrap();
        assert!(e.is_dir());
        assert!(fx.d.has_dir_marker("a"), "an S3-like store gets a marker");
        fx.d.reset_requests();
        assert_eq!(names(c, "/d").await, ["a"], "shown at once");
        assert!(names(c, "/d/a").await.is_empty());
        assert_eq!(fx.d.requests(), 0, "from the cache");
        assert_eq!(kind(c.mkdir("/d/a").await), ErrorKind::AlreadyExists);
        assert_eq!(kind(c.mkdir("/d").await), ErrorKind::AlreadyExists);
        assert_eq!(kind(c.mkdir("/d/x/y").await), ErrorKind::NotFound);
        assert_eq!(kind(c.mkdir("/d/ro/x").await), ErrorKind::ReadOnly);
        assert_eq!(kind(c.mkdir("/elsewhere").await), ErrorKind::ReadOnly);
        let long = format!("/d/a/{}", "n".repeat(1100));
        assert_eq!(kind(c.mkdir(&long).await), ErrorKind::NameTooLong);

        c.mkdir("/d/a/b").await.unwrap();
        write(c, "/d/a/b/f", b"file").await;
        assert_eq!(kind(c.rmdir("/d/a").await), ErrorKind::NotEmpty);
        assert_eq!(kind(c.rmdir("/d/a/b/f").await), ErrorKind::NotADirectory);
        assert_eq!(kind(c.rmdir("/d").await), ErrorKind::Busy);
        assert_eq!(kind(c.rmdir("/d/nope").await), ErrorKind::NotFound);
        c.remove_file("/d/a/b/f").await.unwrap();
        c.rmdir("/d/a/b").await.unwrap();
        assert!(!fx.d.has_dir_marker("a/b"));
        assert!(names(c, "/d/a").await.is_empty());
        c.rmdir("/d/a").await.unwrap();
        assert!(names(c, "/d").await.is_empty());
        assert_eq!(kind(c.stat("/d/a").await), ErrorKind::NotFound);

        // The store has entries the cached (empty) listing does not.
        c.mkdir("/d/c").await.unwrap();
        fx.d.put("c/behind", "x").unwrap();
        assert_eq!(kind(c.rmdir("/d/c").await), ErrorKind::NotEmpty);
        assert_eq!(names(c, "/d/c").await, ["behind"], "listed again");
    }

    #[tokio::test]
    async fn rename_files_and_directories() {
        let fx = fixture();
        let c = &fx.client;
        write(c, "/d/a/f", b"one").await;
        write(c, "/d/a/sub/g", b"two").await;
        c.mkdir("/d/a/empty").await.unwrap();
        assert_eq!(names(c, "/d/a").await, ["empty", "f", "sub"]);

        // A file, into a new directory.
        let e = c.rename("/d/a/f", "/d/b/f2").await.unwrap();
        assert_eq!((e.path.as_str(), e.size), ("/d/b/f2", 3));
        assert_eq!(names(c, "/d/a").await, ["empty", "sub"]);
        assert_eq!(names(c, "/d").await, ["a", "b"]);
        assert_eq!(read(c, "/d/b/f2").await, b"one");
        assert_eq!(kind(c.stat("/d/a/f").await), ErrorKind::NotFound);
        assert!(fx.d.get("a/f").is_none());

        // Over an existing file: replaced.
        write(c, "/d/b/old", b"old").await;
        c.rename("/d/b/f2", "/d/b/old").await.unwrap();
        assert_eq!(read(c, "/d/b/old").await, b"one");
        assert_eq!(names(c, "/d/b").await, ["old"]);

        // A directory, object by object (the memory store has no directory rename).
        let e = c.rename("/d/a", "/d/moved").await.unwrap();
        assert!(e.is_dir());
        assert_eq!(names(c, "/d").await, ["b", "moved"]);
        assert_eq!(names(c, "/d/moved").await, ["empty", "sub"]);
        assert_eq!(read(c, "/d/moved/sub/g").await, b"two");
        assert!(
            fx.d.has_dir_marker("moved/empty"),
            "an empty directory moves too"
        );
        assert!(!fx.d.has_dir_marker("a/empty"));
        assert_eq!(kind(c.stat("/d/a").await), ErrorKind::NotFound);
        assert_eq!(fx.d.get("moved/sub/g").unwrap(), "two");
        assert!(fx.d.get("a/sub/g").is_none());

        // An empty directory onto an empty one; then errors.
        c.mkdir("/d/e1").await.unwrap();
        c.mkdir("/d/e2").await.unwrap();
        c.rename("/d/e1", "/d/e2").await.unwrap();
        assert_eq!(names(c, "/d").await, ["b", "e2", "moved"]);
        assert_eq!(
            kind(c.rename("/d/e2", "/d/moved").await),
            ErrorKind::NotEmpty
        );
        assert_eq!(
            kind(c.rename("/d/b/old", "/d/moved").await),
            ErrorKind::IsADirectory
        );
        assert_eq!(
            kind(c.rename("/d/moved", "/d/b/old").await),
            ErrorKind::NotADirectory
        );
        assert_eq!(
            kind(c.rename("/d/moved", "/d/moved/sub/x").await),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(c.rename("/d/b/old", "/e/old").await),
            ErrorKind::CrossDevice
        );
        assert_eq!(
            kind(c.rename("/d/b/old", "/d/ro/old").await),
            ErrorKind::ReadOnly
        );
        assert_eq!(kind(c.rename("/d", "/d2").await), ErrorKind::Busy);
        assert_eq!(kind(c.rename("/d/none", "/d/x").await), ErrorKind::NotFound);
        assert_eq!(read(c, "/d/b/old").await, b"one", "nothing changed");
    }

    #[tokio::test]
    async fn a_big_directory_is_not_moved_object_by_object() {
        let fx = fixture();
        let c = &fx.client;
        for i in 0..=MAX_DIR_RENAME {
            fx.d.put(&format!("big/f{i}"), "x").unwrap();
        }
        assert_eq!(
            kind(c.rename("/d/big", "/d/big2").await),
            ErrorKind::CrossDevice
        );
        assert_eq!(fx.d.len(), MAX_DIR_RENAME + 1);
        assert!(fx.d.list("big2", false).await.is_err(), "nothing copied");
    }
}
