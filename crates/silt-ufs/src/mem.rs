//! An in-memory under-store with S3 semantics, for tests.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use silt_common::{Error, ErrorKind, Result};

use crate::{
    normalize_path, plan_read, Capabilities, EntryKind, Headers, ObjectMeta, Posix, SetAttrs,
    SpecialKind, UnderStore,
};

/// An in-memory fake of an object store, keeping every [`UnderStore`] invariant.
///
/// Like S3, it stores objects, and directories are implied by the paths of the objects below
/// them (they vanish with their last object); `create_dir` adds a directory marker (S3's
/// zero-byte `dir/` object), which keeps an empty directory and which a recursive listing
/// returns as a directory entry (it returns files otherwise). `rename` of a file is a move
/// that gives the destination a new ETag, as S3's copy-then-delete does; directories cannot be
/// renamed (`IsADirectory`: callers move them object by object).
/// Every write bumps a store-wide counter that becomes the object's ETag, so an overwrite
/// always changes the fingerprint, even with the same bytes. Reads are conditional on the
/// expected fingerprint, like If-Match. Objects carry optional permission bits
/// ([`MemStore::set_mode`]): a metadata-only change that keeps the ETag, mtime and bytes (so
/// the content fingerprint) and changes only the metadata fingerprint; a write resets them.
///
/// The test helpers ([`MemStore::put`], [`MemStore::remove`], …) change objects out of band
/// and do not count as requests; [`MemStore::requests`] counts the trait calls that a real
/// store would have received (an empty-range read is answered without a request).
pub struct MemStore {
    uri: String,
    state: Mutex<State>,
    requests: AtomicU64,
    caps: Capabilities,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Object>,
    /// Directory markers (`create_dir`), by path without the trailing `/`.
    dirs: BTreeSet<String>,
    /// Attributes set on directories (`set_attrs`): mode, owner and times.
    dir_attrs: BTreeMap<String, (Option<u32>, Posix, Option<SystemTime>)>,
    next_etag: u64,
}

struct Object {
    data: Bytes,
    etag: String,
    mtime: SystemTime,
    mode: Option<u32>,
    posix: Posix,
    /// `File`, a `Symlink` whose target is `data` (S3: the `S_IFLNK` mode bits), or a
    /// `Special` file (no data; a device's number in `posix.rdev`).
    kind: EntryKind,
    /// Its S3 headers (replaced by every write, kept by a copy or rename).
    headers: Headers,
}

impl Object {
    fn meta(&self, path: &str) -> ObjectMeta {
        ObjectMeta {
            path: path.to_string(),
            kind: self.kind,
            size: self.data.len() as u64,
            mtime: Some(self.mtime),
            etag: Some(self.etag.clone()),
            version: None,
            mode: self.mode,
            posix: self.posix,
        }
    }
}

impl MemStore {
    /// An empty store; `uri` is what [`UnderStore::uri`] returns (e.g. `"mem://test"`).
    pub fn new(uri: impl Into<String>) -> MemStore {
        MemStore {
            uri: uri.into(),
            state: Mutex::new(State::default()),
            requests: AtomicU64::new(0),
            caps: Capabilities {
                native_recursive_list: true,
                conditional_read: true,
                rename_dirs: false,
                write_replaces_attrs: true,
                list_without_attrs: false,
                long_paths: false,
            },
        }
    }

    /// Overrides the advertised capabilities (to exercise callers' fallback strategies).
    pub fn with_capabilities(mut self, caps: Capabilities) -> MemStore {
        self.caps = caps;
        self
    }

    /// Creates or overwrites an object out of band (not counted as a request) and returns its
    /// new metadata; the ETag always changes.
    pub fn put(&self, path: &str, data: impl Into<Bytes>) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid("cannot put an object at the store root"));
        }
        Ok(self.state.lock().insert(path, data.into()))
    }

    /// Sets (or clears) the permission bits of an object out of band (not counted as a
    /// request), a metadata-only change: bytes, ETag and mtime stay, so the content
    /// fingerprint does too. Returns the new metadata, or `None` if there is no such object.
    pub fn set_mode(&self, path: &str, mode: Option<u32>) -> Option<ObjectMeta> {
        let path = normalize_path(path).ok()?;
        let mut state = self.state.lock();
        let obj = state.objects.get_mut(path)?;
        obj.mode = mode;
        Some(obj.meta(path))
    }

    /// Deletes an object out of band; returns whether it existed.
    pub fn remove(&self, path: &str) -> bool {
        let Ok(path) = normalize_path(path) else {
            return false;
        };
        self.state.lock().objects.remove(path).is_some()
    }

    /// The current bytes of an object.
    pub fn get(&self, path: &str) -> Option<Bytes> {
        let path = normalize_path(path).ok()?;
        self.state.lock().objects.get(path).map(|o| o.data.clone())
    }

    /// The current metadata of an object (files only).
    pub fn meta(&self, path: &str) -> Option<ObjectMeta> {
        let path = normalize_path(path).ok()?;
        self.state.lock().objects.get(path).map(|o| o.meta(path))
    }

    /// Whether `create_dir` left a marker for directory `path`.
    pub fn has_dir_marker(&self, path: &str) -> bool {
        normalize_path(path).is_ok_and(|p| self.state.lock().dirs.contains(p))
    }

    /// Number of objects (directory markers not counted).
    pub fn len(&self) -> usize {
        self.state.lock().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Trait calls served so far (stat, list, read, write, delete).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn reset_requests(&self) {
        self.requests.store(0, Ordering::Relaxed);
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn full(&self, path: &str) -> String {
        format!("{}/{path}", self.uri.trim_end_matches('/'))
    }
}

impl State {
    fn insert(&mut self, path: &str, data: Bytes) -> ObjectMeta {
        self.next_etag += 1;
        let obj = Object {
            data,
            etag: format!("{:016x}", self.next_etag),
            mtime: SystemTime::now(),
            mode: None,
            posix: Posix::default(),
            kind: EntryKind::File,
            headers: Headers::default(),
        };
        let meta = obj.meta(path);
        self.objects.insert(path.to_string(), obj);
        meta
    }

    fn set_headers(&mut self, path: &str, headers: Headers) {
        if let Some(o) = self.objects.get_mut(path) {
            o.headers = headers;
        }
    }

    /// Marks the object `path` (just inserted) a link or not; its metadata.
    fn set_kind(&mut self, path: &str, kind: EntryKind, rdev: u32) -> ObjectMeta {
        match self.objects.get_mut(path) {
            Some(o) => {
                o.kind = kind;
                o.posix.rdev = rdev;
                o.meta(path)
            }
            None => ObjectMeta::dir(path),
        }
    }

    /// Objects strictly below `dir` (`""` = everything), as (key, object).
    fn below<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a String, &'a Object)> + 'a {
        let prefix = prefix_of(dir);
        self.objects
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
    }

    /// Directory markers strictly below `dir`.
    fn markers_below<'a>(&'a self, dir: &str) -> impl Iterator<Item = &'a String> + 'a {
        let prefix = prefix_of(dir);
        self.dirs
            .range(prefix.clone()..)
            .take_while(move |k| k.starts_with(&prefix))
    }

    /// Whether anything (an object or a marker) lies below `dir`.
    fn has_below(&self, dir: &str) -> bool {
        self.below(dir).next().is_some() || self.markers_below(dir).next().is_some()
    }

    /// A directory's metadata, with the attributes set on it.
    fn dir_meta(&self, path: &str) -> ObjectMeta {
        let mut m = ObjectMeta::dir(path);
        if let Some((mode, posix, mtime)) = self.dir_attrs.get(path) {
            m.mode = *mode;
            m.posix = *posix;
            m.mtime = *mtime;
        }
        m
    }

    /// Whether `path` is a directory: a marker, or something below it.
    fn is_dir(&self, path: &str) -> bool {
        path.is_empty() || self.dirs.contains(path) || self.has_below(path)
    }
}

fn prefix_of(dir: &str) -> String {
    if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    }
}

#[async_trait]
impl UnderStore for MemStore {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.count();
        let path = normalize_path(path)?;
        let state = self.state.lock();
        if path.is_empty() {
            return Ok(state.dir_meta(""));
        }
        if let Some(obj) = state.objects.get(path) {
            return Ok(obj.meta(path));
        }
        if state.is_dir(path) {
            return Ok(state.dir_meta(path));
        }
        Err(Error::not_found(format!(
            "stat {}: not found",
            self.full(path)
        )))
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.count();
        let dir = normalize_path(dir)?;
        let state = self.state.lock();
        let skip = if dir.is_empty() { 0 } else { dir.len() + 1 };
        let mut out = Vec::new();
        let mut subdirs = BTreeSet::new();
        for (key, obj) in state.below(dir) {
            match key[skip..].split_once('/') {
                Some((child, _)) if !recursive => {
                    subdirs.insert(key[..skip + child.len()].to_string());
                }
                _ => out.push(obj.meta(key)),
            }
        }
        for key in state.markers_below(dir) {
            match key[skip..].split_once('/') {
                Some((child, _)) if !recursive => {
                    subdirs.insert(key[..skip + child.len()].to_string());
                }
                _ => {
                    subdirs.insert(key.clone());
                }
            }
        }
        if out.is_empty() && subdirs.is_empty() && !dir.is_empty() && !state.dirs.contains(dir) {
            return Err(if state.objects.contains_key(dir) {
                Error::new(
                    ErrorKind::NotADirectory,
                    format!("list {}: not a directory", self.full(dir)),
                )
            } else {
                Error::not_found(format!("list {}: no such directory", self.full(dir)))
            });
        }
        out.extend(subdirs.iter().map(|d| state.dir_meta(d)));
        Ok(out)
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
            return Ok(Bytes::new());
        };
        self.count();
        let state = self.state.lock();
        let obj = state
            .objects
            .get(path)
            .ok_or_else(|| Error::not_found(format!("read {}: not found", self.full(path))))?;
        if obj.meta(path).content_fingerprint() != expected.content_fingerprint() {
            return Err(Error::new(
                ErrorKind::ContentChanged,
                format!(
                    "read {}: the object changed since its metadata was read",
                    self.full(path)
                ),
            ));
        }
        // Same fingerprint means same size, so the clamped range is inside the object.
        Ok(obj.data.slice(range.start as usize..range.end as usize))
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        self.count();
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "write {}: cannot write the store root",
                self.uri
            )));
        }
        Ok(self.state.lock().insert(path, data))
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let meta = self.write_from(path, src, len).await?;
        if let Some(h) = headers {
            self.state.lock().set_headers(&meta.path, h.clone());
        }
        if attrs.is_empty() {
            return Ok(meta);
        }
        self.set_attrs(path, attrs).await
    }

    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        self.count();
        let path = normalize_path(path)?;
        let state = self.state.lock();
        match state.objects.get(path) {
            Some(o) if o.meta(path).content_fingerprint() == expected.content_fingerprint() => {
                Ok(o.headers.clone())
            }
            Some(_) => Err(Error::new(
                ErrorKind::ContentChanged,
                format!("{}: changed", self.full(path)),
            )),
            None => Err(Error::not_found(format!("{}: not found", self.full(path)))),
        }
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.count();
        let path = normalize_path(path)?;
        self.state.lock().objects.remove(path);
        Ok(())
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        self.count();
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Ok(ObjectMeta::dir(""));
        }
        let mut state = self.state.lock();
        if state.objects.contains_key(path) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("mkdir {}: a file has this path", self.full(path)),
            ));
        }
        state.dirs.insert(path.to_string());
        Ok(ObjectMeta::dir(path))
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        self.count();
        let path = normalize_path(path)?;
        let mut state = self.state.lock();
        if state.has_below(path) {
            return Err(Error::new(
                ErrorKind::NotEmpty,
                format!("rmdir {}: directory not empty", self.full(path)),
            ));
        }
        state.dirs.remove(path);
        // A directory made again at this path starts with default attributes.
        state.dir_attrs.remove(path);
        Ok(())
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.count();
        let (from, to) = (normalize_path(from)?, normalize_path(to)?);
        let mut state = self.state.lock();
        let data = self.file_to_copy(&state, from, to)?;
        if from == to {
            return Ok(state.objects[from].meta(from));
        }
        let (kind, rdev, headers) = state
            .objects
            .remove(from)
            .map_or((EntryKind::File, 0, Headers::default()), |o| {
                (o.kind, o.posix.rdev, o.headers)
            });
        state.insert(to, data);
        state.set_headers(to, headers);
        Ok(state.set_kind(to, kind, rdev))
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.count();
        let (from, to) = (normalize_path(from)?, normalize_path(to)?);
        let mut state = self.state.lock();
        let data = self.file_to_copy(&state, from, to)?;
        if from == to {
            return Ok(state.objects[from].meta(from));
        }
        let (kind, rdev, headers) = state
            .objects
            .get(from)
            .map_or((EntryKind::File, 0, Headers::default()), |o| {
                (o.kind, o.posix.rdev, o.headers.clone())
            });
        state.insert(to, data);
        state.set_headers(to, headers);
        Ok(state.set_kind(to, kind, rdev))
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        self.count();
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "symlink {}: cannot replace the store root",
                self.uri
            )));
        }
        let mut state = self.state.lock();
        if state.objects.contains_key(path) || state.is_dir(path) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("symlink {}: already exists", self.full(path)),
            ));
        }
        state.insert(path, Bytes::copy_from_slice(target.as_bytes()));
        Ok(state.set_kind(path, EntryKind::Symlink, 0))
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        self.count();
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "mknod {}: cannot replace the store root",
                self.uri
            )));
        }
        let mut state = self.state.lock();
        if state.objects.contains_key(path) || state.is_dir(path) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("mknod {}: already exists", self.full(path)),
            ));
        }
        state.insert(path, Bytes::new());
        let rdev = if kind.is_device() { rdev } else { 0 };
        state.set_kind(path, EntryKind::Special(kind), rdev);
        let obj = state.objects.get_mut(path).ok_or_else(|| {
            Error::internal(format!("mknod {}: made, then gone", self.full(path)))
        })?;
        obj.mode = attrs.mode.or(Some(0o644));
        obj.posix.uid = attrs.uid;
        obj.posix.gid = attrs.gid;
        Ok(obj.meta(path))
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        self.count();
        let path = normalize_path(path)?;
        let state = self.state.lock();
        match state.objects.get(path) {
            Some(o) if o.kind == EntryKind::Symlink => {
                String::from_utf8(o.data.to_vec()).map_err(|_| {
                    Error::invalid(format!("readlink {}: target is not UTF-8", self.full(path)))
                })
            }
            Some(_) => Err(Error::invalid(format!(
                "readlink {}: not a symbolic link",
                self.full(path)
            ))),
            None if state.is_dir(path) => Err(Error::invalid(format!(
                "readlink {}: not a symbolic link",
                self.full(path)
            ))),
            None => Err(Error::not_found(format!(
                "readlink {}: not found",
                self.full(path)
            ))),
        }
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        self.count();
        let path = normalize_path(path)?;
        let mut state = self.state.lock();
        let now = SystemTime::now();
        if let Some(obj) = state.objects.get_mut(path) {
            // Metadata only: the ETag (content fingerprint) stays.
            obj.mode = attrs.mode.or(obj.mode);
            obj.posix.uid = attrs.uid.or(obj.posix.uid);
            obj.posix.gid = attrs.gid.or(obj.posix.gid);
            obj.posix.atime = attrs.atime.or(obj.posix.atime);
            obj.posix.ctime = Some(now);
            obj.mtime = attrs.mtime.unwrap_or(obj.mtime);
            return Ok(obj.meta(path));
        }
        if !state.is_dir(path) {
            return Err(Error::not_found(format!(
                "set_attrs {}: not found",
                self.full(path)
            )));
        }
        let (mode, mut posix, mtime) = state.dir_attrs.get(path).copied().unwrap_or_default();
        posix.uid = attrs.uid.or(posix.uid);
        posix.gid = attrs.gid.or(posix.gid);
        posix.atime = attrs.atime.or(posix.atime);
        posix.ctime = Some(now);
        let v = (attrs.mode.or(mode), posix, attrs.mtime.or(mtime));
        state.dir_attrs.insert(path.to_string(), v);
        Ok(state.dir_meta(path))
    }
}

impl MemStore {
    /// The bytes of file `from`, checking that `from` is a file and `to` not a directory.
    fn file_to_copy(&self, state: &State, from: &str, to: &str) -> Result<Bytes> {
        if to.is_empty() {
            return Err(Error::invalid(format!(
                "rename {}: cannot write the store root",
                self.full(from)
            )));
        }
        let Some(obj) = state.objects.get(from) else {
            return Err(if state.is_dir(from) {
                Error::new(
                    ErrorKind::IsADirectory,
                    format!("rename {}: is a directory", self.full(from)),
                )
            } else {
                Error::not_found(format!("rename {}: not found", self.full(from)))
            });
        };
        if to != from && state.is_dir(to) {
            return Err(Error::new(
                ErrorKind::IsADirectory,
                format!("rename to {}: is a directory", self.full(to)),
            ));
        }
        Ok(obj.data.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn implied_directories_and_request_counting() {
        let m = MemStore::new("mem://t");
        m.put("a/b/c.txt", "abc").unwrap();
        m.put("a/d.txt", "d").unwrap();
        m.put("top", "t").unwrap();
        assert_eq!(m.requests(), 0, "helpers are not requests");

        assert_eq!(m.stat("a/b").await.unwrap().kind, EntryKind::Dir);
        assert_eq!(m.stat("").await.unwrap().kind, EntryKind::Dir);
        assert_eq!(
            m.stat("a/b/c").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        let mut names: Vec<_> = m
            .list("a", false)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.path, e.kind))
            .collect();
        names.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            names,
            vec![
                ("a/b".to_string(), EntryKind::Dir),
                ("a/d.txt".to_string(), EntryKind::File)
            ]
        );
        assert_eq!(m.list("a", true).await.unwrap().len(), 2);
        assert_eq!(m.requests(), 5);

        assert!(m.remove("a/b/c.txt"));
        assert_eq!(m.stat("a/b").await.unwrap_err().kind(), ErrorKind::NotFound);
        m.reset_requests();
        assert_eq!(m.requests(), 0);
    }

    #[tokio::test]
    async fn overwrite_with_same_bytes_changes_fingerprint() {
        let m = MemStore::new("mem://t");
        let v1 = m.put("x", "same").unwrap();
        let v2 = m.put("x", "same").unwrap();
        assert_ne!(v1.content_fingerprint(), v2.content_fingerprint());
        let e = m.read("x", 0..4, &v1).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ContentChanged);
        assert_eq!(m.read("x", 0..4, &v2).await.unwrap(), "same");
        assert_eq!(m.get("x").unwrap(), "same");
        assert_eq!(m.meta("x").unwrap(), v2);
        assert_eq!(m.len(), 1);

        let v3 = m.set_mode("x", Some(0o600)).unwrap();
        assert_eq!(v3.mode, Some(0o600));
        assert_eq!(v3.content_fingerprint(), v2.content_fingerprint());
        assert_ne!(v3.metadata_fingerprint(), v2.metadata_fingerprint());
        assert_eq!(m.read("x", 0..4, &v2).await.unwrap(), "same");
        assert_eq!(m.stat("x").await.unwrap(), v3);
        assert_eq!(
            m.put("x", "new").unwrap().mode,
            None,
            "a write resets the mode"
        );
        assert!(m.set_mode("missing", Some(0o600)).is_none());
        assert!(m.put("", "x").is_err());
        assert!(m.put("../x", "x").is_err());
    }
}
