//! `file://`: a local (or locally mounted) directory as an under-store, through `std::fs`.
//!
//! Every path is resolved beneath the root without following a link (`beneath`), so nothing
//! in the directory leads a request out of it. Reads are tied to the version asked for by
//! size + mtime checks around them (a local file has no ETag); a write fills a hidden file
//! beside its target and renames it over it, so it replaces the file whole as a PUT does.
//! Links, special files and hard links are the directory's own.

mod beneath;

use std::ops::Range;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use silt_common::metrics::{UFS_READ_BYTES, UFS_REQUESTS};
use silt_common::{Error, ErrorKind, Result};

use crate::common::{check_timeout, parts, FS_WRITE_TEMP, WRITE_PART};
use crate::uri::StoreUri;
use crate::{
    normalize_path, plan_read, xattrs, Capabilities, EntryKind, Headers, ObjectMeta, Posix,
    SetAttrs, SpecialKind, UnderStore,
};

/// A local directory as an under-store (`file:///abs/dir`).
pub struct FsStore {
    /// Canonical: metadata comes from `std::fs` (ns mtime, permission bits).
    root: PathBuf,
    uri: String,
}

impl FsStore {
    /// A store over the local directory `root`, which must exist. `timeout` is checked as
    /// every store's is (a local request is bounded by the stall layer, not here).
    pub fn new(root: &Path, timeout: Duration) -> Result<FsStore> {
        check_timeout(timeout)?;
        let shown = root.display().to_string();
        match std::fs::metadata(root) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::NotADirectory,
                    format!("{shown} is not a directory"),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::not_found(format!(
                    "local directory {shown} does not exist"
                )))
            }
            Err(e) => return Err(Error::from(e).context(format!("local directory {shown}"))),
        }
        let root = std::fs::canonicalize(root)
            .map_err(|e| Error::from(e).context(format!("local directory {shown}")))?;
        if root.to_str().is_none() {
            return Err(Error::invalid(format!(
                "local directory {shown}: path is not valid UTF-8"
            )));
        }
        Ok(FsStore {
            uri: StoreUri::File { root: root.clone() }.to_string(),
            root,
        })
    }

    /// Checks that the directory is readable.
    pub async fn verify(&self) -> Result<()> {
        UFS_REQUESTS.inc();
        tokio::fs::read_dir(&self.root)
            .await
            .map(drop)
            .map_err(|e| Error::from(e).context(format!("local directory {}", self.root.display())))
    }

    /// `uri/path` for messages.
    fn full(&self, path: &str) -> String {
        if path.is_empty() {
            self.uri.clone()
        } else {
            format!("{}/{path}", self.uri)
        }
    }

    /// A store path that may be written (not the root).
    fn writable<'a>(&self, path: &'a str) -> Result<&'a str> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "write {}: cannot write the store root",
                self.uri
            )));
        }
        Ok(path)
    }

    /// [`fs_read_pieces`] off the async workers: the bytes `range` of the version of the local
    /// file `path` that `expected` describes, in `piece`-byte pieces.
    async fn read_version(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        UFS_REQUESTS.inc();
        let want = expected.content_fingerprint();
        let (root, path, shown) = (self.root.clone(), path.to_string(), self.full(path));
        let what = shown.clone();
        let got = tokio::task::spawn_blocking(move || {
            fs_read_pieces(&root, &path, &shown, range, &want, piece)
        })
        .await
        .map_err(|e| Error::internal(format!("read {what}: {e}")))??;
        UFS_READ_BYTES.add(got.iter().map(|p| p.len() as u64).sum());
        Ok(got)
    }

    async fn stat_inner(&self, path: &str) -> Result<ObjectMeta> {
        UFS_REQUESTS.inc();
        let root = &self.root;
        // A link is reported as a link, never followed (the kernel resolves it in the mount),
        // nor one on the way (`beneath`).
        let stat = || std::fs::symlink_metadata(&*beneath::parent(root, path, false)?);
        match run_blocking(stat) {
            Ok(md) => fs_meta(path, &md).ok_or_else(|| {
                Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "stat {}: not a regular file, directory or symbolic link",
                        self.full(path)
                    ),
                )
            }),
            // `file/x`: ENOTDIR means the path does not exist.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Err(Error::not_found(format!(
                    "stat {}: not found",
                    self.full(path)
                )))
            }
            Err(e) => Err(Error::from(e).context(format!("stat {}", self.full(path)))),
        }
    }

    /// A whole file written into a local directory: into a hidden file beside it
    /// ([`FS_WRITE_TEMP`], left out of listings), then renamed over it and synced. A reader
    /// or another writer of the same path never meets a half-written or mixed file: each
    /// write replaces it whole and the last rename wins, as a PUT does (a write in place, as
    /// OpenDAL's writer makes it, truncated the file under a concurrent writer: it then failed
    /// or the bytes of two writes interleaved). The file gets the permission bits, owner and
    /// group of `like` (a copy's source), else of the file it replaces (a write keeps
    /// attributes here: `write_replaces_attrs` is false); a hard link to the replaced file
    /// keeps the old bytes, as after any save by rename. Holes in `src` stay holes: only data
    /// is written, then the length is set.
    fn write_file(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        like: Option<&std::fs::Metadata>,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        use std::os::unix::fs::FileExt;
        UFS_REQUESTS.inc();
        let headers = headers.filter(|h| !h.is_empty());
        let root = &self.root;
        let shown = self.full(path);
        let what = |e: std::io::Error| Error::from(e).context(format!("write {}", self.full(path)));
        let md = run_blocking(|| -> Result<std::fs::Metadata> {
            // Missing parents made; none of them a link (`beneath`).
            let full = beneath::parent(root, path, true).map_err(what)?;
            let fill = |file: &std::fs::File| -> Result<()> {
                let has_holes = (0..len)
                    .step_by(WRITE_PART)
                    .any(|off| src.is_hole(off, (len - off).min(WRITE_PART as u64)));
                if has_holes {
                    silt_common::io::copy_sparse(src, len, WRITE_PART as u64, |off, piece| {
                        file.write_all_at(piece, off).map_err(what)
                    })?;
                } else {
                    for part in parts(&shown, src, len, WRITE_PART) {
                        let (off, part) = part?;
                        file.write_all_at(&part, off).map_err(what)?;
                    }
                }
                file.set_len(len).map_err(what)
            };
            // A file with other names (hard links) is written in place: a replacement would
            // be a new file under this name only, and the other names would keep the old
            // bytes. Not atomic, as any in-place write (docs/SEMANTICS.md).
            if like.is_none() {
                let linked =
                    std::fs::symlink_metadata(&*full).is_ok_and(|m| m.is_file() && m.nlink() > 1);
                if linked {
                    use std::os::unix::fs::OpenOptionsExt;
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&*full)
                        .map_err(what)?;
                    fill(&file)?;
                    let in_xattrs = replace_headers(&file, headers).map_err(what)?;
                    file.set_modified(unique_mtime()).map_err(what)?;
                    file.sync_all().map_err(what)?;
                    keep_sidecar(&full, (!in_xattrs).then_some(headers).flatten()).map_err(what)?;
                    return file.metadata().map_err(what);
                }
            }
            let (file, tmp) = fs_create_hidden(full.dir()).map_err(what)?;
            let replace = || -> Result<std::fs::Metadata> {
                fill(&file)?;
                let replaced = match like {
                    Some(_) => None,
                    None => std::fs::symlink_metadata(&full)
                        .ok()
                        .filter(|m| m.is_file()),
                };
                if let Some(like) = like.or(replaced.as_ref()) {
                    keep_owner_and_mode(&file, like).map_err(what)?;
                }
                // On the hidden file: the name shows the bytes and their headers together.
                let in_xattrs = replace_headers(&file, headers).map_err(what)?;
                file.set_modified(unique_mtime()).map_err(what)?;
                std::fs::rename(&tmp, &full).map_err(what)?;
                // Where the file system keeps no extended attributes: the file beside it (a
                // write without headers removes an old one).
                keep_sidecar(&full, (!in_xattrs).then_some(headers).flatten()).map_err(what)?;
                // Durable, under its name, when the write returns: one sync after the rename
                // commits the file and its new name together on the journaling file systems
                // (ext4, XFS, btrfs; the rename changed the file's inode), as the sync of a
                // file written in place did. Syncing before the rename as well, or the
                // directory after it, made a second commit: 15-20 % fewer small files/s.
                file.sync_all().map_err(what)?;
                // This write's own version, whatever a later writer renamed there since.
                file.metadata().map_err(what)
            };
            replace().inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        })?;
        fs_meta(path, &md).ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                format!("write {}: not a file after writing", self.full(path)),
            )
        })
    }

    async fn list_dir(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        let meta = match self.stat_inner(dir).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::not_found(format!(
                    "list {}: no such directory",
                    self.full(dir)
                )))
            }
            Err(e) => return Err(e),
        };
        if meta.kind != EntryKind::Dir {
            return Err(Error::new(
                ErrorKind::NotADirectory,
                format!("list {}: not a directory", self.full(dir)),
            ));
        }
        // Walked here rather than by OpenDAL's lister, which completes a link's entry with a
        // stat that follows it (a link to a directory then breaks its entry invariants).
        // One lstat per entry gives the permission bits and link types, with the same ns
        // mtime that `stat` reports.
        UFS_REQUESTS.inc();
        let (root, dir_owned) = (self.root.clone(), dir.to_string());
        tokio::task::spawn_blocking(move || fs_walk(&root, &dir_owned, recursive))
            .await
            .map_err(|e| Error::internal(format!("list {}: {e}", self.full(dir))))?
            .map_err(|e| Error::from(e).context(format!("list {}", self.full(dir))))
    }

    /// A copy of the file, link or special file `from` at `to` (a local copy is a write of the
    /// source's bytes, holes kept, with its permission bits and owner, as S3's copy keeps the
    /// user metadata that holds them; it replaces `to` whole as a write does). A link is
    /// copied as the link, never its target, which may lie outside the store.
    async fn copy_entry(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let src = self.stat_inner(from).await?;
        if from == to && src.kind != EntryKind::Dir {
            return Ok(src);
        }
        let root = &self.root;
        let what = |e: std::io::Error| Error::from(e).context(format!("copy {}", self.full(from)));
        match src.kind {
            EntryKind::Dir => Err(Error::new(
                ErrorKind::IsADirectory,
                format!(
                    "copy {}: is a directory (moved object by object by the caller)",
                    self.full(from)
                ),
            )),
            EntryKind::File => {
                let opened = run_blocking(|| {
                    use std::os::unix::fs::OpenOptionsExt;
                    let file = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&*beneath::parent(root, from, false)?)?;
                    let md = file.metadata()?;
                    Ok((file, md))
                });
                let (file, md) = opened.map_err(what)?;
                // A copy keeps the object's headers, as an object store's copy does.
                let headers =
                    run_blocking(|| read_headers(&file, &beneath::parent(root, from, false)?))
                        .map_err(what)?;
                self.write_file(to, &file, md.len(), Some(&md), Some(&headers))
            }
            EntryKind::Special(_) => {
                UFS_REQUESTS.inc();
                run_blocking(|| fs_copy_special(root, from, to)).map_err(what)?;
                self.stat_inner(to).await
            }
            EntryKind::Symlink => {
                UFS_REQUESTS.inc();
                run_blocking(|| fs_copy_link(root, from, to)).map_err(what)?;
                self.stat_inner(to).await
            }
        }
    }
}

#[async_trait]
impl UnderStore for FsStore {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_recursive_list: false,
            conditional_read: false,
            // rename(2) moves directories too.
            rename_dirs: true,
            write_replaces_attrs: false,
            list_without_attrs: false,
            long_paths: true,
        }
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.stat_inner(normalize_path(path)?).await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.list_dir(normalize_path(dir)?, recursive).await
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        let all = self.list_dir(normalize_path(dir)?, true).await?;
        Ok((all.len() <= max).then_some(all))
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
            return Ok(Bytes::new());
        };
        let len = range.end - range.start;
        let mut one = self.read_version(path, range, expected, len).await?;
        Ok(match one.len() {
            1 => one.remove(0),
            _ => Bytes::from(one.concat()),
        })
    }

    async fn read_pieces(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
            return Ok(Vec::new());
        };
        self.read_version(path, range, expected, piece).await
    }

    async fn local_file(&self, path: &str, expected: &ObjectMeta) -> Option<std::fs::File> {
        let (root, path) = (self.root.clone(), normalize_path(path).ok()?.to_string());
        let want = expected.content_fingerprint();
        tokio::task::spawn_blocking(move || fs_version_file(&root, &path, &want))
            .await
            .ok()
            .flatten()
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        self.write_file(path, &data, data.len() as u64, None, None)
    }

    async fn write_from(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        self.write_file(path, src, len, None, None)
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        let meta = self.write_file(path, src, len, None, headers)?;
        if attrs.is_empty() {
            return Ok(meta);
        }
        self.set_attrs(path, attrs).await
    }

    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        let path = normalize_path(path)?;
        UFS_REQUESTS.inc();
        let (root, want) = (&self.root, expected.content_fingerprint());
        let read = || -> std::io::Result<Option<Headers>> {
            use std::os::unix::fs::OpenOptionsExt;
            let entry = beneath::parent(root, path, false)?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&*entry)?;
            let h = read_headers(&file, &entry)?;
            // Read from the file it opened: the version is that file's.
            Ok(fs_is_version(path, &file.metadata()?, &want).then_some(h))
        };
        match run_blocking(read) {
            Ok(Some(h)) => Ok(h),
            Ok(None) => Err(Error::new(
                ErrorKind::ContentChanged,
                format!(
                    "{}: the file changed since its metadata was read",
                    self.full(path)
                ),
            )),
            Err(e) => Err(fs_error(e, format!("headers of {}", self.full(path)))),
        }
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "delete {}: cannot delete the store root",
                self.uri
            )));
        }
        UFS_REQUESTS.inc();
        run_blocking(|| {
            fs_delete(&self.root, path)?;
            drop_sidecar(&self.root, path)
        })
        .map_err(|e| Error::from(e).context(format!("delete {}", self.full(path))))
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        // Each missing directory made beneath the last (`beneath`).
        UFS_REQUESTS.inc();
        run_blocking(|| fs_create_dir(&self.root, path))
            .map_err(|e| Error::from(e).context(format!("mkdir {}", self.full(path))))?;
        self.stat_inner(path).await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        let path = self.writable(path)?;
        UFS_REQUESTS.inc();
        run_blocking(|| fs_remove_dir(&self.root, path))
            .map_err(|e| Error::from(e).context(format!("rmdir {}", self.full(path))))
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = self.writable(from)?;
        let to = self.writable(to)?;
        if from != to {
            // One rename(2) (files, links and directories alike), parents of `to` made.
            UFS_REQUESTS.inc();
            run_blocking(|| {
                fs_rename(&self.root, from, to)?;
                move_sidecar(&self.root, from, to)
            })
            .map_err(|e| Error::from(e).context(format!("rename {} to {to}", self.full(from))))?;
        }
        self.stat_inner(to).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = self.writable(from)?;
        let to = self.writable(to)?;
        self.copy_entry(from, to).await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        UFS_REQUESTS.inc();
        let made =
            || std::os::unix::fs::symlink(target, &*beneath::parent(&self.root, path, false)?);
        run_blocking(made).map_err(|e| {
            let kind = e.kind();
            let e = Error::from(e).context(format!("symlink {}", self.full(path)));
            if kind == std::io::ErrorKind::NotFound {
                Error::not_found(e.to_string())
            } else {
                e
            }
        })?;
        self.stat_inner(path).await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        let path = normalize_path(path)?;
        UFS_REQUESTS.inc();
        let read = || std::fs::read_link(&*beneath::parent(&self.root, path, false)?);
        let target = match run_blocking(read) {
            Ok(t) => t.into_os_string().into_vec(),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                return Err(Error::invalid(format!(
                    "readlink {}: not a symbolic link",
                    self.full(path)
                )))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Err(Error::not_found(format!(
                    "readlink {}: not found",
                    self.full(path)
                )))
            }
            Err(e) => return Err(Error::from(e).context(format!("readlink {}", self.full(path)))),
        };
        String::from_utf8(target).map_err(|_| {
            Error::invalid(format!(
                "readlink {}: the target is not UTF-8",
                self.full(path)
            ))
        })
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        UFS_REQUESTS.inc();
        run_blocking(|| fs_set_attrs(&self.root, path, attrs)).map_err(|e| {
            let e = if e.kind() == std::io::ErrorKind::NotFound {
                Error::not_found(e.to_string())
            } else {
                Error::from(e)
            };
            e.context(format!("set attributes of {}", self.full(path)))
        })?;
        self.stat_inner(path).await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        let rdev = if kind.is_device() { rdev } else { 0 };
        UFS_REQUESTS.inc();
        let mode = kind.type_bits() | attrs.mode.unwrap_or(0o644) & 0o7777;
        run_blocking(|| fs_mknod(&self.root, path, mode, rdev))
            .map_err(|e| fs_error(e, format!("mknod {}", self.full(path))))?;
        // The process's umask applied to mknod's bits: set as asked, with the owner.
        let set = SetAttrs {
            mode: Some(attrs.mode.unwrap_or(0o644) & 0o7777),
            ..*attrs
        };
        run_blocking(|| fs_set_attrs(&self.root, path, &set)).map_err(|e| {
            fs_error(
                e,
                format!("mknod {}: setting its attributes", self.full(path)),
            )
        })?;
        self.stat_inner(path).await
    }

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = normalize_path(from)?;
        let to = self.writable(to)?;
        UFS_REQUESTS.inc();
        run_blocking(|| fs_hard_link(&self.root, from, to))
            .map_err(|e| fs_error(e, format!("link {} to {}", self.full(from), self.full(to))))?;
        self.stat_inner(to).await
    }
}

/// The entries below `dir` of a local store (its direct children, or with `recursive`
/// everything below, directories included), never following links. An entry removed
/// meanwhile is left out; a name that is not UTF-8 cannot be a store path and is skipped.
fn fs_walk(root: &Path, dir: &str, recursive: bool) -> std::io::Result<Vec<ObjectMeta>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_string()];
    while let Some(d) = todo.pop() {
        // The directory itself opened, not a link there (`beneath`): one swapped for a link
        // since it was listed is not followed out of the store.
        let pinned = match beneath::whole(root, &d) {
            Ok(p) => p,
            Err(e) if d != dir && e.kind() == std::io::ErrorKind::NotFound => continue,
            // Swapped for a link since it was seen: gone as a directory.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => match d == dir {
                true => return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR)),
                false => continue,
            },
            Err(e) => return Err(e),
        };
        let entries = match std::fs::read_dir(&*pinned) {
            Ok(e) => e,
            Err(e) if d != dir && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                tracing::warn!(dir = %d, "skipping a file name that is not UTF-8");
                continue;
            };
            if name.starts_with(FS_WRITE_TEMP) || name.starts_with(SIDECAR) {
                continue; // a write in progress, not an entry yet; a file's headers
            }
            let rel = if d.is_empty() {
                name
            } else {
                format!("{d}/{name}")
            };
            // fstatat of the name in the directory read, never following it.
            let Ok(md) = entry.metadata() else {
                continue; // raced delete
            };
            let Some(m) = fs_meta(&rel, &md) else {
                continue; // sockets, fifos, devices: not store entries
            };
            if recursive && m.kind == EntryKind::Dir {
                todo.push(rel);
            }
            out.push(m);
        }
    }
    Ok(out)
}

/// `read_pieces` of a local file: `pread` straight into the pieces (a pooled page buffer per
/// whole piece, see [`crate::pieces`]), no intermediate buffer and no user-space copy. The
/// version is checked through the open handle before and after reading, so the bytes are
/// those of the version asked for: a file replaced meanwhile is still read whole from the
/// old one (kept open), and one changed in place is refused as changed.
fn fs_read_pieces(
    root: &Path,
    path: &str,
    shown: &str,
    range: Range<u64>,
    want: &str,
    piece: u64,
) -> Result<Vec<Bytes>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let changed = || {
        Error::new(
            ErrorKind::ContentChanged,
            format!("read {shown}: the object changed since its metadata was read"),
        )
    };
    let io = |e: std::io::Error| Error::from(e).context(format!("read {shown}"));
    let opened = beneath::parent(root, path, false).and_then(|file| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&*file)
    });
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::not_found(format!("read {shown}: not found")))
        }
        // Now a link (ELOOP): not the file whose metadata was read.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(changed()),
        // A parent is a file (or a link) now: the version asked for is gone.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Err(Error::not_found(format!("read {shown}: not found")))
        }
        Err(e) => return Err(io(e)),
    };
    let version = |f: &std::fs::File| -> Result<()> {
        let md = f.metadata().map_err(io)?;
        if fs_is_version(shown, &md, want) {
            Ok(())
        } else {
            Err(changed())
        }
    };
    version(&f)?;
    let total = usize::try_from(range.end - range.start)
        .map_err(|_| Error::invalid(format!("read {shown}: range too large")))?;
    let piece = usize::try_from(piece.max(1)).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(total.div_ceil(piece));
    let mut at = range.start;
    for mut buf in crate::piece_bufs(total, piece) {
        let dst = buf.as_mut_slice();
        match f.read_exact_at(dst, at) {
            Ok(()) => {}
            // Shorter than the version's size: it changed.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(changed()),
            Err(e) => return Err(io(e)),
        }
        at += dst.len() as u64;
        // A whole piece is checksummed now, while hot, for the disk tier (`bufpool::known_crc`).
        out.push(buf.freeze());
    }
    version(&f)?;
    Ok(out)
}

/// The file `path` of the local store at `root` opened read-only, if it is (through its open
/// handle, not a link) a file whose content fingerprint is `want`.
fn fs_version_file(root: &Path, path: &str, want: &str) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&*beneath::parent(root, path, false).ok()?)
        .ok()?;
    let md = f.metadata().ok()?;
    fs_is_version(path, &md, want).then_some(f)
}

/// Whether `md` is of a file (a directory there now is not the file version asked for) whose
/// content fingerprint is `want`.
fn fs_is_version(shown: &str, md: &std::fs::Metadata, want: &str) -> bool {
    fs_meta(shown, md).is_some_and(|m| m.kind == EntryKind::File && m.content_fingerprint() == want)
}

/// An entry from `lstat` (a link's size is its target's length).
fn fs_meta(path: &str, md: &std::fs::Metadata) -> Option<ObjectMeta> {
    use std::os::unix::fs::FileTypeExt;
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        EntryKind::Dir
    } else if ft.is_file() {
        EntryKind::File
    } else if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_fifo() {
        EntryKind::Special(SpecialKind::Fifo)
    } else if ft.is_socket() {
        EntryKind::Special(SpecialKind::Socket)
    } else if ft.is_char_device() {
        EntryKind::Special(SpecialKind::CharDevice)
    } else if ft.is_block_device() {
        EntryKind::Special(SpecialKind::BlockDevice)
    } else {
        return None;
    };
    Some(ObjectMeta {
        path: path.to_string(),
        kind,
        size: match kind {
            EntryKind::File | EntryKind::Symlink => md.len(),
            EntryKind::Dir | EntryKind::Special(_) => 0,
        },
        mtime: md.modified().ok(),
        etag: None,
        version: None,
        mode: Some(md.permissions().mode() & 0o7777),
        posix: Posix {
            uid: Some(md.uid()),
            gid: Some(md.gid()),
            atime: md.accessed().ok(),
            ctime: epoch_time(md.ctime(), md.ctime_nsec()),
            // Linux's dev_t keeps major < 4096 and minor < 2^20 in its low 32 bits, the
            // encoding FUSE carries.
            rdev: if ft.is_char_device() || ft.is_block_device() {
                md.rdev() as u32
            } else {
                0
            },
            nlink: (kind != EntryKind::Dir).then(|| md.nlink().min(u32::MAX as u64) as u32),
        },
    })
}

/// The mtime a local write gives its file: now, to the nanosecond, and always at least a
/// microsecond past the last one this process gave (a file system may keep only
/// microseconds). The kernel stamps files from a coarse clock (a few ms), so two writes of
/// one size in a row got the same size and mtime, the content fingerprint of a local file,
/// and a reader kept the pages it had cached of the earlier bytes.
fn unique_mtime() -> SystemTime {
    static LAST_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let mut last = LAST_NS.load(Ordering::Relaxed);
    loop {
        let next = now.max(last.saturating_add(1_000));
        match LAST_NS.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return UNIX_EPOCH + Duration::from_nanos(next),
            Err(seen) => last = seen,
        }
    }
}

/// A new hidden write file in `dir` ([`FS_WRITE_TEMP`] and a random number), created
/// exclusively: a name left by a crash, or taken by a daemon on another host of a shared
/// directory, is skipped for another.
fn fs_create_hidden(dir: &Path) -> std::io::Result<(std::fs::File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    fs_make_hidden(dir, |tmp| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)
    })
}

/// `make` run on a new hidden name in `dir` (see [`fs_create_hidden`]) until it does not find
/// the name taken (`EEXIST`, a few tries); what it made, and the name.
fn fs_make_hidden<T>(
    dir: &Path,
    mut make: impl FnMut(&Path) -> std::io::Result<T>,
) -> std::io::Result<(T, PathBuf)> {
    let mut tries = 0;
    loop {
        let tmp = dir.join(format!("{FS_WRITE_TEMP}{:016x}", rand::random::<u64>()));
        match make(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
            made => return made.map(|m| (m, tmp)),
        }
    }
}

/// How long a hidden write file ([`FS_WRITE_TEMP`]) goes unchanged before it is taken for one a
/// killed daemon left: a write in progress changes it with every part it writes (8 MiB), so
/// only a writer stalled that long loses its file (its rename then fails: an error, not a loss).
const FS_WRITE_ABANDONED: Duration = Duration::from_secs(600);

/// Removes from `dir` the hidden write files ([`FS_WRITE_TEMP`]) unchanged for `age` or more:
/// invisible in listings, they would keep an apparently empty directory from being removed.
/// Stops at the first other entry (the directory is not empty anyway), so an `rmdir` of a
/// full directory reads no more of it than before. A missing `dir` is nothing to clear.
/// `shown`: the directory's store path, for the log (`dir` may be a descriptor's path).
fn fs_clear_abandoned_writes(dir: &Path, shown: &str, age: Duration) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(of) = name.strip_prefix(SIDECAR) {
            // The headers of a file: the directory is not empty while it is there.
            match std::fs::symlink_metadata(dir.join(of)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let _ = std::fs::remove_file(entry.path());
                    continue;
                }
                _ => return Ok(()),
            }
        }
        if !name.starts_with(FS_WRITE_TEMP) {
            return Ok(());
        }
        let Ok(md) = entry.metadata() else {
            continue; // renamed meanwhile: its write ended
        };
        let idle = md.modified().ok().and_then(|m| m.elapsed().ok());
        if md.is_file() && idle.is_some_and(|idle| idle >= age) {
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => tracing::info!(
                    dir = shown,
                    file = %entry.file_name().to_string_lossy(),
                    "removed an abandoned write"
                ),
            }
        }
    }
    Ok(())
}

/// Runs blocking file work from async code: on a multi-threaded runtime the worker hands its
/// other tasks on first (`block_in_place`); elsewhere (a current-thread runtime, no runtime)
/// it runs in place.
fn run_blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Gives `file` the permission bits, owner and group of `old`, the file it is about to
/// replace. An owner this process may not give (not root) stays its own, as a copy's would.
fn keep_owner_and_mode(file: &std::fs::File, old: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fchown on a descriptor this function borrows; no memory is passed.
    let chowned = unsafe { libc::fchown(file.as_raw_fd(), old.uid(), old.gid()) };
    if chowned != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(e);
        }
    }
    // After chown, which clears the set-id bits.
    file.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))
}

/// A time from `stat`'s seconds and nanoseconds, if it is after the epoch.
fn epoch_time(secs: i64, nanos: i64) -> Option<SystemTime> {
    let secs = u64::try_from(secs).ok()?;
    let nanos = u32::try_from(nanos).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// `chmod`, `lchown` and `utimensat` of the entry `path` of the local store at `root`, as
/// asked; none follows a link (`beneath`).
fn fs_set_attrs(root: &Path, path: &str, a: &SetAttrs) -> std::io::Result<()> {
    let entry = beneath::parent(root, path, false)?;
    let p = &*entry;
    // Owner first: chown clears setuid/setgid, which a mode given with it must keep.
    if a.uid.is_some() || a.gid.is_some() {
        std::os::unix::fs::lchown(p, a.uid, a.gid)?;
    }
    // chmod follows links (Linux keeps no mode on a link): it is given the entry itself,
    // opened without following, so it never changes a link's target (maybe outside the store).
    if let Some(mode) = a.mode {
        match entry.entry() {
            Ok(entry) => {
                std::fs::set_permissions(&*entry, std::fs::Permissions::from_mode(mode & 0o7777))?
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {} // a link: no mode of its own
            Err(e) => return Err(e),
        }
    }
    if a.atime.is_some() || a.mtime.is_some() {
        let ts = |t: Option<SystemTime>| match t.map(|t| t.duration_since(UNIX_EPOCH)) {
            Some(Ok(d)) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as _,
            },
            // Before the epoch: the epoch.
            Some(Err(_)) => libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
        };
        let times = [ts(a.atime), ts(a.mtime)];
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid C string and two timespecs.
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether a local operation's error says its path (or a parent) is not there.
fn fs_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

/// Removes the file or link `path` of the local store at `root` (an empty directory too, as
/// OpenDAL's local delete did); a missing one, or one below a file, is nothing to remove.
fn fs_delete(root: &Path, path: &str) -> std::io::Result<()> {
    let p = match beneath::parent(root, path, false) {
        Err(e) if fs_gone(&e) => return Ok(()),
        p => p?,
    };
    let removed = match std::fs::symlink_metadata(&*p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(&*p),
        Ok(_) => std::fs::remove_file(&*p),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if fs_gone(&e) => Ok(()),
        r => r,
    }
}

/// `mkdir -p path` in the local store at `root`, each directory made beneath the last; an
/// existing directory is done, anything else there (a link included) `EEXIST`.
fn fs_create_dir(root: &Path, path: &str) -> std::io::Result<()> {
    let p = beneath::parent(root, path, true)?;
    match std::fs::create_dir(&*p) {
        Err(e)
            if e.kind() == std::io::ErrorKind::AlreadyExists
                && std::fs::symlink_metadata(&*p).is_ok_and(|m| m.is_dir()) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// `rmdir path` in the local store at `root` (`ENOTEMPTY` if anything is left in it), after
/// the hidden files of writes a killed daemon left there; a missing one is nothing to remove.
fn fs_remove_dir(root: &Path, path: &str) -> std::io::Result<()> {
    let p = match beneath::parent(root, path, false) {
        Err(e) if fs_gone(&e) => return Ok(()),
        p => p?,
    };
    match p.entry() {
        Ok(dir) => fs_clear_abandoned_writes(&dir, path, FS_WRITE_ABANDONED)?,
        Err(e) if fs_gone(&e) => return Ok(()),
        // A link: not a directory (rmdir below says so).
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
        Err(e) => return Err(e),
    }
    match std::fs::remove_dir(&*p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// The link `from` of the local store at `root` copied as a link to `to` (made under a hidden
/// name beside it, then renamed over it: `to` is replaced whole, its parents made).
fn fs_copy_link(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let target = std::fs::read_link(&*beneath::parent(root, from, false)?)?;
    let dst = beneath::parent(root, to, true)?;
    let ((), tmp) = fs_make_hidden(dst.dir(), |tmp| std::os::unix::fs::symlink(&target, tmp))?;
    std::fs::rename(&tmp, &*dst).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `rename(2)` of `from` to `to` in the local store at `root` (files, links and directories
/// alike, none followed), the parents of `to` made.
fn fs_rename(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    // A parent of `from` that is a file or a link: `from` is missing.
    let src = beneath::parent(root, from, false).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => std::io::Error::from_raw_os_error(libc::ENOENT),
        _ => e,
    })?;
    let dst = beneath::parent(root, to, true)?;
    std::fs::rename(&*src, &*dst)
}

/// A local operation's error in the store's terms: a missing path (or parent) `NotFound`,
/// an existing target `AlreadyExists`, anything else as the system said.
fn fs_error(e: std::io::Error, what: String) -> Error {
    let kind = match e.kind() {
        _ if fs_gone(&e) => Some(ErrorKind::NotFound),
        std::io::ErrorKind::AlreadyExists => Some(ErrorKind::AlreadyExists),
        _ => None,
    };
    match kind {
        Some(kind) => Error::new(kind, format!("{what}: {e}")),
        None => Error::from(e).context(what),
    }
}

/// `mknod(2)` of `path` in the local store at `root` (its parent must exist), not following
/// a link there (`beneath`).
fn fs_mknod(root: &Path, path: &str, mode: u32, rdev: u32) -> std::io::Result<()> {
    mknod_at(&beneath::parent(root, path, false)?, mode, rdev)
}

/// `mknod(2)` of the path `p`.
fn mknod_at(p: &Path, mode: u32, rdev: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string; mknod reads nothing else.
    if unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, libc::dev_t::from(rdev)) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The special file `from` of the local store at `root` copied as such to `to` (the node
/// made under a hidden name beside it with the same type, number, mode and owner, then
/// renamed over it): a FIFO's or device's "content" is never read.
fn fs_copy_special(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let md = std::fs::symlink_metadata(&*beneath::parent(root, from, false)?)?;
    let dst = beneath::parent(root, to, true)?;
    let ((), tmp) = fs_make_hidden(dst.dir(), |tmp| mknod_at(tmp, md.mode(), md.rdev() as u32))?;
    let made = std::os::unix::fs::lchown(&tmp, Some(md.uid()), Some(md.gid()))
        .and_then(|()| {
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(md.mode() & 0o7777))
        })
        .and_then(|()| std::fs::rename(&tmp, &*dst));
    made.inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `link(2)` of `from` to `to` in the local store at `root`: neither is followed if it is a
/// link (Linux's `link` gives the link itself a second name), both resolved `beneath`.
fn fs_hard_link(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let src = beneath::parent(root, from, false).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => std::io::Error::from_raw_os_error(libc::ENOENT),
        _ => e,
    })?;
    let dst = beneath::parent(root, to, false)?;
    std::fs::hard_link(&*src, &*dst)
}

/// Name prefix of the file that keeps a file's S3 headers beside it (`.silt-s3.NAME`, JSON)
/// where the file system has no extended attributes; left out of listings.
const SIDECAR: &str = ".silt-s3.";

fn sidecar_of(p: &Path) -> Option<PathBuf> {
    let name = p.file_name()?.to_str()?;
    Some(p.with_file_name(format!("{SIDECAR}{name}")))
}

fn unsupported_xattrs(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP | libc::ENOSYS))
}

/// Gives `file` the `user.s3.*` extended attributes of `headers` (none: it keeps none);
/// `false` where its file system has no extended attributes (the caller keeps a sidecar).
fn replace_headers(file: &std::fs::File, headers: Option<&Headers>) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // Those of an earlier version written in place (a hard-linked file) go first.
    let old = match list_xattrs(fd) {
        Ok(names) => names,
        Err(e) if unsupported_xattrs(&e) => return Ok(headers.is_none()),
        Err(e) => return Err(e),
    };
    for name in old.iter().filter(|n| n.starts_with(xattrs::PREFIX)) {
        let c = std::ffi::CString::new(name.as_str()).map_err(std::io::Error::other)?;
        // SAFETY: a valid NUL-terminated name, on a descriptor `file` owns.
        if unsafe { libc::fremovexattr(fd, c.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    for (name, value) in headers.map(xattrs::of).unwrap_or_default() {
        let c = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
        // SAFETY: a valid NUL-terminated name and a value slice of the given length.
        let r = unsafe { libc::fsetxattr(fd, c.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return if unsupported_xattrs(&e) {
                Ok(false)
            } else {
                Err(e)
            };
        }
    }
    Ok(true)
}

/// Writes (or, with `None`, removes) the sidecar of the file `full`.
fn keep_sidecar(full: &Path, headers: Option<&Headers>) -> std::io::Result<()> {
    let Some(side) = sidecar_of(full) else {
        return Ok(());
    };
    match headers {
        None => match std::fs::remove_file(&side) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        Some(h) => {
            let json = serde_json::to_vec(h).map_err(std::io::Error::other)?;
            let tmp = side.with_file_name(format!("{FS_WRITE_TEMP}{:016x}", rand::random::<u64>()));
            std::fs::write(&tmp, json)?;
            std::fs::rename(&tmp, &side).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        }
    }
}

/// The sidecar of the store path `path` goes with its file.
fn drop_sidecar(root: &Path, path: &str) -> std::io::Result<()> {
    match beneath::parent(root, path, false) {
        Err(e) if fs_gone(&e) => Ok(()),
        p => keep_sidecar(&p?, None),
    }
}

/// The sidecar of `from` follows its rename to `to` (one at `to` is replaced or goes).
fn move_sidecar(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let src = beneath::parent(root, from, false)?;
    let dst = beneath::parent(root, to, false)?;
    let (Some(a), Some(b)) = (sidecar_of(&src), sidecar_of(&dst)) else {
        return Ok(());
    };
    match std::fs::rename(&a, &b) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => keep_sidecar(&dst, None),
        r => r,
    }
}

/// The names of the extended attributes of `fd`.
fn list_xattrs(fd: std::os::fd::RawFd) -> std::io::Result<Vec<String>> {
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: the buffer is writable for its length.
        let n = unsafe { libc::flistxattr(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf
                .split(|&b| b == 0)
                .filter(|n| !n.is_empty())
                .filter_map(|n| std::str::from_utf8(n).ok().map(str::to_string))
                .collect());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || buf.len() >= 1 << 20 {
            return Err(e);
        }
        buf.resize(buf.len() * 4, 0);
    }
}

/// The S3 headers of the open file `file` (at `path`): its `user.s3.*` extended
/// attributes, or its sidecar where there are none.
fn read_headers(file: &std::fs::File, path: &Path) -> std::io::Result<Headers> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let names = match list_xattrs(fd) {
        Ok(n) => n,
        Err(e) if unsupported_xattrs(&e) => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut attrs = Vec::new();
    for name in names.into_iter().filter(|n| n.starts_with(xattrs::PREFIX)) {
        let c = std::ffi::CString::new(name.as_str()).map_err(std::io::Error::other)?;
        let mut buf = vec![0u8; 4096];
        loop {
            // SAFETY: a valid NUL-terminated name; the buffer is writable for its length.
            let n = unsafe { libc::fgetxattr(fd, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                buf.truncate(n as usize);
                break;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
                // Removed meanwhile.
                Some(libc::ENODATA) => {
                    buf.clear();
                    break;
                }
                _ => return Err(e),
            }
        }
        if let Ok(v) = String::from_utf8(buf) {
            attrs.push((name, v));
        }
    }
    if !attrs.is_empty() {
        return Ok(xattrs::to_headers(attrs));
    }
    match sidecar_of(path).map(std::fs::read) {
        Some(Ok(json)) => Ok(serde_json::from_slice(&json).unwrap_or_default()),
        Some(Err(e)) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(Headers::default()),
    }
}
