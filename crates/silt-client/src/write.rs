//! Files written through Silt. While a file is open for writing its bytes live in a local
//! spool file without a name (`tempfile`: `O_TMPFILE` where the file system has it), so a
//! crash leaves nothing behind; `commit` (on close) hands the whole object to the under-store (in parts where the
//! store has multipart uploads), records the version the store reported for that write in the
//! metadata cache and, for `through`, caches the bytes as written. Writes may land anywhere
//! in the spool: a file opened without truncation is first copied into it, so a write into the
//! middle of an existing object is a rewrite of the whole object on close.

use std::fs::File;
use std::os::unix::fs::FileExt;

use bytes::Bytes;
use silt_common::{Error, ErrorKind, PageKey, Result};
use silt_ufs::{DynStore, ObjectMeta};

use crate::meta::Lookup;
use crate::namespace::{parent_and_name, Resolved};
use crate::{Client, Entry};

/// Longest S3 object key, in bytes, checked against the path within the mount (a mount's own
/// prefix makes the full key longer; the store refuses that itself).
const MAX_KEY_BYTES: usize = 1024;

/// A file open for writing.
pub struct FileWriter {
    path: String,
    rel: String,
    store: DynStore,
    spool: File,
    len: u64,
    dirty: bool,
}

impl FileWriter {
    pub fn path(&self) -> &str {
        &self.path
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Whether there are bytes the store does not have yet.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }
}

impl Client {
    /// The store path a write to `path` goes to, after checking that `path` may be written.
    fn writable_target(&self, path: &str) -> Result<(String, String, DynStore)> {
        let path = Self::normalize(path)?;
        let write_type = self.writes.of(&path);
        if !write_type.writable() {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{path}: read-only (write type {write_type})"),
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
                if rel.len() > MAX_KEY_BYTES {
                    return Err(Error::new(ErrorKind::NameTooLong, format!(
                        "{path}: the store key would be {} bytes; object stores allow {MAX_KEY_BYTES}",
                        rel.len()
                    )));
                }
                let rel = rel.to_string();
                let store = mount.store.clone();
                Ok((path, rel, store))
            }
        }
    }

    /// Opens `path` for writing: empty with `truncate` (or when it does not exist), else with
    /// the current bytes copied into the spool (read through the cache).
    pub async fn create(&self, path: &str, truncate: bool) -> Result<FileWriter> {
        let (path, rel, store) = self.writable_target(path)?;
        let existing = match self.stat(&path).await {
            Ok(e) if e.is_dir() => {
                return Err(Error::new(
                    ErrorKind::IsADirectory,
                    format!("{path}: is a directory"),
                ))
            }
            Ok(e) => Some(e),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let spool = tempfile::tempfile_in(&self.spool_dir).map_err(|e| {
            Error::from(e).context(format!(
                "creating a spool file in {}",
                self.spool_dir.display()
            ))
        })?;
        let mut w = FileWriter {
            path,
            rel,
            store,
            spool,
            len: 0,
            // A new file exists once closed, even if nothing was written.
            dirty: existing.is_none() || truncate,
        };
        if let (Some(_), false) = (&existing, truncate) {
            let file = self.open(&w.path).await?;
            let chunk = (self.worker.page_size() * 16).max(1 << 20);
            let mut off = 0;
            while off < file.size() {
                let b = self.read(&file, off, chunk).await?;
                if b.is_empty() {
                    break;
                }
                self.write_at(&mut w, off, &b)?;
                off += b.len() as u64;
            }
            w.dirty = false;
        }
        Ok(w)
    }

    /// Writes `data` at `offset` of the spool (a gap reads back as zeros).
    pub fn write_at(&self, w: &mut FileWriter, offset: u64, data: &[u8]) -> Result<()> {
        w.spool
            .write_all_at(data, offset)
            .map_err(|e| Error::from(e).context(format!("{}: spooling a write", w.path)))?;
        w.len = w.len.max(offset + data.len() as u64);
        w.dirty = true;
        Ok(())
    }

    /// Cuts or extends the file to `len` bytes.
    pub fn set_len(&self, w: &mut FileWriter, len: u64) -> Result<()> {
        w.spool
            .set_len(len)
            .map_err(|e| Error::from(e).context(format!("{}: truncating the spool", w.path)))?;
        w.len = len;
        w.dirty = true;
        Ok(())
    }

    /// Hands the file to the store if it has unsaved bytes and returns the version the store
    /// reported for this write. If the store refuses, the object is as it was and the file
    /// stays dirty (a later commit tries again).
    pub async fn commit(&self, w: &mut FileWriter) -> Result<Entry> {
        if !w.dirty {
            return self.stat(&w.path).await;
        }
        let asked = self.opts.clock.now();
        let meta = w
            .store
            .write_from(&w.rel, &w.spool, w.len)
            .await
            .map_err(|e| e.context(&w.path))?;
        w.dirty = false;
        let entry = Entry::from_meta(w.path.clone(), &w.store, meta);
        let mut changes = self.meta.put_stat(asked, entry.clone());
        self.note_parents(&w.path, &w.rel, &w.store, asked, &mut changes);
        self.apply(&changes);
        if self.writes.of(&w.path).caches() && entry.size == w.len {
            if let Some(obj) = &entry.object {
                self.cache_written(obj.id, w);
            }
        }
        Ok(entry)
    }

    /// A new object implies its parent directories (object stores have no others): records
    /// each one not known as a directory, so cached listings above show it at once.
    fn note_parents(
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

    /// Puts a freshly written file's pages into the page store, read back from the spool a
    /// page at a time (the local page cache has them); a full cache only costs the caching.
    fn cache_written(&self, object: silt_common::ObjectId, w: &FileWriter) {
        let store = self.worker.page_store();
        let ps = self.worker.page_size();
        let mut buf = vec![0u8; ps as usize];
        for (index, off) in (0..w.len).step_by(ps as usize).enumerate() {
            let n = (w.len - off).min(ps) as usize;
            if let Err(e) = w.spool.read_exact_at(&mut buf[..n], off) {
                tracing::debug!("not caching written pages: {e}");
                return;
            }
            let page = Bytes::copy_from_slice(&buf[..n]);
            if let Err(e) = store.put(PageKey::new(object, index as u64), page, w.len) {
                tracing::debug!("not caching written pages: {e}");
                return;
            }
        }
    }

    /// Deletes a file.
    pub async fn remove_file(&self, path: &str) -> Result<()> {
        let (path, rel, store) = self.writable_target(path)?;
        let e = self.stat(&path).await?;
        if e.is_dir() {
            return Err(Error::new(
                ErrorKind::IsADirectory,
                format!("{path}: is a directory"),
            ));
        }
        store.delete(&rel).await.map_err(|e| e.context(&path))?;
        let changes = self.meta.put_missing(self.opts.clock.now(), &path);
        self.apply(&changes);
        Ok(())
    }
}
