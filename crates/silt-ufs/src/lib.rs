//! Under-stores: where the data really lives (S3 and compatibles, local directories, …).
//!
//! Everything above this crate talks to an [`UnderStore`]. One module per store: `fs`
//! (`file://`), `s3` (`s3://` and the clouds that speak S3), `object` with one submodule per
//! OpenDAL service it serves (`gcs`, `azblob`, `webhdfs`); `uri` is the table that maps a
//! URI's scheme to its store. Layers (`layer`) stand in front of a store and forward every
//! call by default: [`Measured`] (times, error counts, a stalled store failing fast) in front
//! of every opened store, [`FaultStore`] for tests. [`MemStore`] is the in-memory store for
//! unit tests.
//!
//! Paths are relative to the store's root (`""` is the root, `"a/b.jpg"` a file), use `/`
//! as separator and never start or end with `/`.

use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_common::bufpool::BufferPool;
use silt_common::io::ReadAt;
use silt_common::{Error, Result};

mod common;
mod fault;
mod fs;
mod headers;
mod layer;
mod measure;
mod mem;
mod object;
mod s3;
mod synthetic;
mod uri;
mod user_meta;

pub use fault::{Fault, FaultOp, FaultStore, Faults};
pub use fs::FsStore;
pub use headers::{xattrs, Headers, CHECKSUM_ALGORITHMS};
pub use layer::{fault_op, Layer, Layered};
pub use measure::{measured, Measure, Measured};
pub use mem::MemStore;
pub use object::{ObjectScheme, ObjectStore, ObjectUri};
pub use s3::{redact_uri, S3Flavor, S3Options, S3Store, S3UriOptions};
pub use synthetic::SyntheticStore;
pub use uri::{open_store, open_store_as, StoreUri};

/// File, directory, symbolic link or special file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    /// A symbolic link: `size` is the length of its target; `read_link` gives the target.
    Symlink,
    /// A FIFO, socket or device node (`mknod`): it has no bytes in the store (`size` 0);
    /// opening it is the kernel's business (a pipe, a socket, a device driver), never a read
    /// of the store. A device's number is `Posix::rdev`.
    Special(SpecialKind),
}

/// The kinds of special file `mknod(2)` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// `S_IFMT`: the file type bits of a mode.
pub const S_IFMT: u32 = 0o170000;

impl SpecialKind {
    /// The file type bits of a mode of this kind (`S_IFIFO`, ...).
    pub fn type_bits(self) -> u32 {
        match self {
            SpecialKind::Fifo => 0o010000,
            SpecialKind::CharDevice => 0o020000,
            SpecialKind::BlockDevice => 0o060000,
            SpecialKind::Socket => 0o140000,
        }
    }

    /// The kind whose type bits `mode` carries, if it is a special file's.
    pub fn from_mode(mode: u32) -> Option<SpecialKind> {
        [
            SpecialKind::Fifo,
            SpecialKind::CharDevice,
            SpecialKind::BlockDevice,
            SpecialKind::Socket,
        ]
        .into_iter()
        .find(|k| mode & S_IFMT == k.type_bits())
    }

    /// Whether a device number belongs to this kind (a FIFO or socket has none).
    pub fn is_device(self) -> bool {
        matches!(self, SpecialKind::CharDevice | SpecialKind::BlockDevice)
    }
}

impl EntryKind {
    /// A FIFO, socket or device node.
    pub fn is_special(self) -> bool {
        matches!(self, EntryKind::Special(_))
    }
}

/// What a store knows about one entry. Serializable: an attached client asks the owner's
/// store for it over the worker socket (`silt_cluster::rpc`'s `store_*` operations).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// Path relative to the store root.
    pub path: String,
    pub kind: EntryKind,
    /// Size in bytes (0 for directories).
    pub size: u64,
    pub mtime: Option<SystemTime>,
    /// Opaque strong validator (S3 ETag), if the store has one.
    pub etag: Option<String>,
    /// Object version id, if the store versions objects.
    pub version: Option<String>,
    /// POSIX permission bits (`0o7777`), if the store keeps them (local directories, S3
    /// objects with `x-amz-meta-mode`).
    pub mode: Option<u32>,
    /// Owner, group and times beside the mtime, where the store keeps them.
    pub posix: Posix,
}

/// POSIX attributes beyond the permission bits: on a local directory the real ones, on S3
/// the object's user metadata in the conventions s3fs-fuse uses (`x-amz-meta-uid`, `-gid`,
/// `-atime`, `-ctime`; see `user_meta.rs`). `None`: the store has no value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Posix {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<SystemTime>,
    pub ctime: Option<SystemTime>,
    /// A device node's number (Linux's encoding, as `st_rdev`); 0 for anything else.
    pub rdev: u32,
    /// Names the file has (hard links), where the store counts them (a local directory);
    /// `None`: one. A file with more than one may change under another of its names, so the
    /// client asks the store for it every time rather than trusting a cached answer.
    pub nlink: Option<u32>,
}

impl Posix {
    /// Whether the file has other names (hard links) the store counts.
    pub fn linked(&self) -> bool {
        self.nlink.is_some_and(|n| n > 1)
    }
}

/// A change of attributes (`UnderStore::set_attrs`); `None` leaves one as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SetAttrs {
    /// Permission bits (`0o7777`).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
}

impl SetAttrs {
    pub fn is_empty(&self) -> bool {
        *self == SetAttrs::default()
    }

    /// `self`, with what `later` sets replacing it.
    pub fn then(self, later: SetAttrs) -> SetAttrs {
        SetAttrs {
            mode: later.mode.or(self.mode),
            uid: later.uid.or(self.uid),
            gid: later.gid.or(self.gid),
            atime: later.atime.or(self.atime),
            mtime: later.mtime.or(self.mtime),
        }
    }
}

impl ObjectMeta {
    /// A directory with nothing known but its path (object stores have only key prefixes).
    pub fn dir(path: &str) -> ObjectMeta {
        ObjectMeta {
            path: path.to_string(),
            kind: EntryKind::Dir,
            size: 0,
            mtime: None,
            etag: None,
            version: None,
            mode: None,
            posix: Posix::default(),
        }
    }

    /// An empty regular file with nothing else known (the base of a new object's attributes).
    pub fn empty_file(path: &str) -> ObjectMeta {
        ObjectMeta {
            kind: EntryKind::File,
            ..ObjectMeta::dir(path)
        }
    }

    /// The *content* fingerprint: it changes whenever the bytes may have changed (ETag, version
    /// id, or size+mtime when the store has neither), and does not change for a metadata-only
    /// change such as a chmod.
    pub fn content_fingerprint(&self) -> String {
        let mtime_ns = self
            .mtime
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        match (&self.version, &self.etag) {
            (Some(v), _) => format!("v:{v}:{}", self.size),
            (None, Some(e)) => format!("e:{e}:{}", self.size),
            (None, None) => format!("m:{mtime_ns}:{}", self.size),
        }
    }

    /// The *metadata* fingerprint: attributes outside the content fingerprint (permission bits,
    /// and the mtime when an ETag or version id already identifies the content). A change
    /// here alone updates attributes and keeps every cached page.
    pub fn metadata_fingerprint(&self) -> String {
        let mtime_ns = self
            .mtime
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos());
        let mode = self.mode.map_or(String::new(), |m| format!("{m:o}"));
        let owner = match (self.posix.uid, self.posix.gid) {
            (None, None) => String::new(),
            (u, g) => format!(":own:{}:{}", u.unwrap_or(u32::MAX), g.unwrap_or(u32::MAX)),
        };
        match (&self.version, &self.etag, mtime_ns) {
            (None, None, _) | (_, _, None) => format!("mode:{mode}{owner}"),
            (_, _, Some(t)) => format!("mode:{mode}{owner}:mtime:{t}"),
        }
    }

    /// Whether `self` and `other` (the same path asked twice) are the same version as far
    /// as both tell: their version ids or ETags where both have one, else their size and
    /// mtime to the second (an ETag one answer lacks, as a server may leave one empty for an
    /// object it did not write itself, says nothing).
    pub fn same_version(&self, other: &ObjectMeta) -> bool {
        let given = |t: &Option<String>| t.clone().filter(|t| !t.is_empty());
        let secs = |t: Option<SystemTime>| {
            t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        };
        if self.size != other.size {
            return false;
        }
        if let (Some(a), Some(b)) = (given(&self.version), given(&other.version)) {
            return a == b;
        }
        if let (Some(a), Some(b)) = (given(&self.etag), given(&other.etag)) {
            return a == b;
        }
        match (secs(self.mtime), secs(other.mtime)) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }

    /// The name: the last path component (`""` for the root).
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }
}

/// What a store can do; callers pick strategies from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Capabilities {
    /// `list(dir, recursive = true)` is one paginated sweep rather than a walk.
    pub native_recursive_list: bool,
    /// `read` with an expected fingerprint is enforced by the store itself (If-Match).
    pub conditional_read: bool,
    /// `rename` moves a whole directory in one operation (a local directory). Otherwise
    /// `rename` takes files only, and a caller moves a directory object by object.
    pub rename_dirs: bool,
    /// A write replaces a file's attributes with the ones it passes (`write_from_attrs`), as
    /// an object store's PUT replaces the user metadata. Otherwise a write keeps them (a local
    /// file: its replacement gets the replaced file's mode, owner and group).
    pub write_replaces_attrs: bool,
    /// `list` answers carry no attributes by nature (an S3 listing without `list_attrs`:
    /// no mode, owner or link type, whatever the objects hold), so `None` there means
    /// "unknown", not "none". Elsewhere a listed `None` is the store's answer.
    pub list_without_attrs: bool,
    /// Paths may be as long as a local path (`PATH_MAX`, 4,096 bytes): a local directory.
    /// Otherwise at most 1,024 bytes, an object store's key limit.
    pub long_paths: bool,
}

impl Capabilities {
    /// The longest store path, in bytes, this store takes.
    pub fn max_path_bytes(&self) -> usize {
        if self.long_paths {
            4096
        } else {
            1024
        }
    }
}

/// `chunks` (consecutive bytes of a response) cut into pieces of `piece` bytes, the last one
/// shorter: a single chunk of at most one piece is passed on as it is; otherwise every byte is
/// copied once, a whole piece into a pooled page buffer ([`BufferPool::for_size`]: reused,
/// aligned for `O_DIRECT`, its crc32c taken while the bytes are hot if a disk tier wants it),
/// a shorter last piece into an allocation of its own length (a piece never shares a larger
/// buffer, so whoever keeps it keeps only its own bytes).
pub fn pieces(chunks: impl IntoIterator<Item = Bytes>, piece: u64) -> Vec<Bytes> {
    let piece = usize::try_from(piece.max(1)).unwrap_or(usize::MAX);
    let chunks: Vec<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
    if let [only] = &chunks[..] {
        if only.len() <= piece {
            return vec![only.clone()];
        }
    }
    let total: usize = chunks.iter().map(Bytes::len).sum();
    let mut out = Vec::with_capacity(total.div_ceil(piece));
    let mut src = chunks.iter().map(|c| &c[..]);
    let mut rest: &[u8] = &[];
    for mut buf in piece_bufs(total, piece) {
        let dst = buf.as_mut_slice();
        let len = dst.len();
        let mut at = 0;
        while at < len {
            if rest.is_empty() {
                // `total` counted every chunk's bytes, so one is left while bytes are.
                match src.next() {
                    Some(c) => rest = c,
                    None => break,
                }
                continue;
            }
            let n = (len - at).min(rest.len());
            dst[at..at + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            at += n;
        }
        out.push(buf.freeze());
    }
    out
}

/// The buffers `total` bytes are received into as `piece`-long pieces, the last one shorter,
/// in order; each is taken when the iterator reaches it.
pub(crate) fn piece_bufs(total: usize, piece: usize) -> impl Iterator<Item = PieceBuf> {
    let piece = piece.max(1);
    let pool = BufferPool::for_size(piece).filter(|_| total >= piece);
    (0..total).step_by(piece).map(move |at| match &pool {
        Some(pool) if total - at >= piece => PieceBuf::Pooled(pool.take(), piece),
        _ => PieceBuf::Own(vec![0; (total - at).min(piece)]),
    })
}

/// One piece being filled: a whole piece in a pooled page buffer (aligned, its crc32c taken
/// when frozen), a shorter one in an allocation of its own length (a piece never shares a
/// larger buffer, so whoever keeps it keeps only its own bytes).
pub(crate) enum PieceBuf {
    Pooled(silt_common::bufpool::PageBuf, usize),
    Own(Vec<u8>),
}

impl PieceBuf {
    /// The piece's `len` bytes, to fill.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            PieceBuf::Pooled(buf, len) => &mut buf.as_mut_slice()[..*len],
            PieceBuf::Own(v) => v,
        }
    }

    pub(crate) fn freeze(self) -> Bytes {
        match self {
            PieceBuf::Pooled(buf, len) => buf.freeze_checked(len),
            PieceBuf::Own(v) => Bytes::from(v),
        }
    }
}

/// An under-store.
///
/// Invariants every implementation MUST keep:
/// - `stat` of a missing path returns `ErrorKind::NotFound`; of a directory (a prefix with
///   children, or a real directory) returns `EntryKind::Dir`.
/// - `list(dir, false)` returns the direct children of `dir` (files and sub-directories), each
///   once, with paths relative to the store root; `list(dir, true)` returns every file below
///   `dir` and may also return directory entries. Order is unspecified. Listing a missing
///   directory returns `NotFound`; listing a file returns `NotADirectory`.
/// - `read(path, range, expected)` returns exactly the bytes `range` of the version of `path`
///   that `expected` describes, clamped to its size, or `ErrorKind::ContentChanged` if the object
///   no longer matches `expected.content_fingerprint()`. It never returns bytes from two versions.
/// - `create_dir(path)` makes `path` a directory that `stat` and `list` show even when empty:
///   a real directory (with its parents) where the store has directories, else a zero-byte
///   `path/` marker object. Creating an existing directory succeeds. It does not check that no
///   file has the same path (an object store can hold both `a` and `a/`): callers do.
/// - `remove_dir(path)` removes an empty directory: `ErrorKind::NotEmpty` if anything lies
///   below it (nothing is removed then). On an object store it deletes the `path/` marker; a
///   directory without one (implied by keys) cannot be removed while it has keys, and an empty
///   one is nothing to delete. Removing a missing directory is not an error (like `delete`).
/// - `rename(from, to)` moves the file `from` to `to`, replacing a file at `to`, and returns
///   `to`'s new metadata; afterwards `from` is gone. Where the store renames natively (local
///   directories) it is one atomic step, and a directory moves whole when
///   `capabilities().rename_dirs` says so (onto a missing or empty directory only, else
///   `NotEmpty`); elsewhere it is a server-side copy then a delete (S3): not atomic, a failure
///   between the two leaves both, and a directory `from` is `IsADirectory`. A missing `from`
///   is `NotFound`.
/// - `copy(from, to)` copies the file `from` to `to` (server-side where the store can),
///   replacing a file at `to`, and returns `to`'s metadata.
/// - `set_attrs(path, attrs)` changes the permission bits, owner, group, atime and mtime of the
///   file or directory `path` (what `attrs` leaves `None` stays) and returns its metadata,
///   which then shows them. A local directory changes the real ones (chmod, lchown,
///   utimensat: the content fingerprint of a file moves with its mtime); an object store
///   keeps them in the object's user metadata, changing only the metadata fingerprint where
///   the store can (the bytes are never changed). A store that cannot keep them answers
///   `Unsupported`. A missing path is `NotFound`.
/// - `symlink(path, target)` creates a symbolic link `path` whose target is the text `target`
///   (never resolved by the store: a link may dangle or point outside the store), failing
///   with `AlreadyExists` if anything is at `path`. `stat` reports it as
///   `EntryKind::Symlink` with `size` = the target's length in bytes, never as what it points
///   to, and so does `list` where listings carry attributes (an S3 listing without
///   `s3_list_attrs` carries none: there a link is listed as a small file, as are its mode
///   and owner unknown; the client's metadata cache keeps a `stat`'s answer for the same
///   object version); `read_link` returns the target (`NotFound` if missing, `InvalidInput` if `path` is
///   not a link). `delete` removes the link itself and `rename` moves the link itself. A local
///   directory keeps a real symlink; an object store an object whose body is the target and
///   whose user metadata `mode` has the `S_IFLNK` type bits (as s3fs-fuse writes them).
/// - `mknod(path, kind, rdev, attrs)` makes a FIFO, socket or device node at `path`
///   (`AlreadyExists` if anything is there; its parent must exist), with the permission bits,
///   owner and group of `attrs` where given. `stat` and `list` report it as
///   `EntryKind::Special` with `size` 0 and, for a device, `posix.rdev`. A local directory
///   makes the real node (`mknod(2)`: the daemon must be allowed to make devices); an object
///   store a zero-byte object whose user metadata `mode` carries the type bits and `rdev`
///   the number (as s3fs-fuse writes them). `read` of one is `InvalidInput`; `delete`,
///   `rename`, `copy` and `set_attrs` act on the entry itself.
/// - `hard_link(from, to)` gives the file (or link, or special file) `from` a second name
///   `to`, failing with `AlreadyExists` if anything is at `to`, `NotFound` if `from` is
///   missing; both then report `posix.nlink` = the count of names, and a change through one
///   is seen through every other. Only a store whose files are real files has it (a local
///   directory); an object store cannot give one object two names that stay one file and
///   answers `Unsupported` (the default).
/// - Errors carry a kind whose `is_retryable()` tells whether trying again can help; messages
///   never contain credentials.
/// - The directory and rename methods have defaults that answer `Unsupported`, so wrappers and
///   test stores that do not need them keep compiling; a wrapper in front of a real store must
///   forward them.
#[async_trait]
pub trait UnderStore: Send + Sync + 'static {
    /// The URI this store was opened from (credentials never included).
    fn uri(&self) -> &str;
    fn capabilities(&self) -> Capabilities;
    async fn stat(&self, path: &str) -> Result<ObjectMeta>;
    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>>;
    /// `list(dir, true)`, or `None` if the tree below `dir` has more than `max` entries (a
    /// store that streams its listing stops reading there). Same errors as `list`.
    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        let all = self.list(dir, true).await?;
        Ok((all.len() <= max).then_some(all))
    }
    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes>;
    /// `read`, delivered as consecutive pieces of `piece` bytes (the last one may be shorter),
    /// each its own allocation, so a cache can keep one page without pinning the whole
    /// response. This default copies the pieces out of `read`'s answer (none when it is one
    /// piece); a store that receives a response in chunks assembles the pieces from them
    /// directly, copying each byte once.
    async fn read_pieces(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        let bytes = self.read(path, range, expected).await?;
        Ok(pieces(std::iter::once(bytes), piece))
    }
    /// The store's own file holding the version `expected` of `path`, opened read-only, where
    /// the store keeps its objects as files this host can open (a local or NFS directory) and
    /// `path` holds that version now; `None` anywhere else (an object store, another version,
    /// a missing file, an error: the caller then reads through `read`). It lets a reader read
    /// the bytes without a copy through the cache (FUSE passthrough to the source). Unlike
    /// `read`, nothing pins the version afterwards: a file changed in place later is read as
    /// it is then, as a direct reader of the directory would read it.
    async fn local_file(&self, path: &str, expected: &ObjectMeta) -> Option<std::fs::File> {
        let _ = (path, expected);
        None
    }
    /// Writes a whole object; returns the new version's metadata as the store reported it for
    /// this write (so a caller never mistakes another writer's version for its own). A write
    /// replaces the object whole: a reader never sees part of one, and of writes racing on one
    /// path the one that lands last is what stays, whole (as PUTs of one key).
    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta>;
    /// `write` of the first `len` bytes of `src` (a spool, a write buffer, a log record). A
    /// store that can upload in parts (S3 multipart) reads a part at a time, so memory does not
    /// grow with the object; this default reads it whole.
    async fn write_from(&self, path: &str, src: &dyn ReadAt, len: u64) -> Result<ObjectMeta> {
        let len = usize::try_from(len)
            .map_err(|_| Error::invalid(format!("write {path}: {len} bytes is too large")))?;
        let data = src
            .read_at(0, len)
            .map_err(|e| e.context(format!("write {path}: reading the local bytes")))?;
        self.write(path, data).await
    }
    /// `write_from`, the new version carrying the attributes `attrs` (the mode, owner and
    /// times of a created file, or those a rewrite must keep where a write replaces them) and,
    /// where given, the S3 `headers` of the object, kept where [`Headers`] says for each
    /// store. An object store sends them with the upload; this default writes, then
    /// `set_attrs`, and takes no headers (`Unsupported`).
    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        if headers.is_some_and(|h| !h.is_empty()) {
            return Err(unsupported(self.uri(), "write with S3 metadata", path));
        }
        let meta = self.write_from(path, src, len).await?;
        if attrs.is_empty() {
            return Ok(meta);
        }
        self.set_attrs(path, attrs).await
    }
    /// The S3 headers of the version `expected` of the file `path` (an empty [`Headers`] when
    /// it has none, or the store keeps none: this default). `ContentChanged` if `path` holds
    /// another version now; `NotFound` if nothing.
    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        let _ = (path, expected);
        Ok(Headers::default())
    }
    /// Deletes an object; deleting a missing object is not an error.
    async fn delete(&self, path: &str) -> Result<()>;
    /// Makes `path` a directory (see the trait invariants); returns its metadata.
    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        Err(unsupported(self.uri(), "create_dir", path))
    }
    /// Removes the empty directory `path` (see the trait invariants).
    async fn remove_dir(&self, path: &str) -> Result<()> {
        Err(unsupported(self.uri(), "remove_dir", path))
    }
    /// Moves the file (or, with `rename_dirs`, the directory) `from` to `to`; returns `to`'s
    /// metadata (see the trait invariants).
    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        Err(unsupported(self.uri(), "rename", from).context(format!("to {to}")))
    }
    /// Copies the file `from` to `to`; returns `to`'s metadata.
    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        Err(unsupported(self.uri(), "copy", from).context(format!("to {to}")))
    }
    /// Creates the symbolic link `path` to `target` (see the trait invariants).
    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        let _ = target;
        Err(unsupported(self.uri(), "symlink", path))
    }
    /// The target of the symbolic link `path` (see the trait invariants).
    async fn read_link(&self, path: &str) -> Result<String> {
        Err(unsupported(self.uri(), "readlink", path))
    }
    /// Changes attributes of `path` (see the trait invariants); returns its new metadata.
    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let _ = attrs;
        Err(unsupported(self.uri(), "set_attrs", path))
    }
    /// Makes the special file `path` of `kind` (device number `rdev`) with `attrs` (see the
    /// trait invariants).
    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        let _ = (kind, rdev, attrs);
        Err(unsupported(self.uri(), "mknod", path))
    }
    /// Gives the file `from` the second name `to` (see the trait invariants); returns `to`'s
    /// metadata.
    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        Err(unsupported(self.uri(), "link", from).context(format!("to {to}")))
    }
}

fn unsupported(uri: &str, op: &str, path: &str) -> Error {
    Error::new(
        silt_common::ErrorKind::Unsupported,
        format!("{op} {uri}/{path}: not supported by this store"),
    )
}

pub type DynStore = Arc<dyn UnderStore>;

/// Checks a store path and returns it without leading/trailing `/` (tolerated, e.g. `"dir/"`).
/// Rejects empty, `.` and `..` components so no path can escape the store root.
pub(crate) fn normalize_path(path: &str) -> Result<&str> {
    let p = path.trim_matches('/');
    if p.is_empty() {
        return Ok(p);
    }
    if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(Error::invalid(format!(
            "invalid store path {path:?}: empty, '.' and '..' components are not allowed"
        )));
    }
    Ok(p)
}

/// Clamps `range` to an object of `size` bytes. A reversed range is an input error; a range
/// that starts at or past the end is empty.
/// Validates a read the same way for every store: the normalised path and the range clamped
/// to the expected size, or `None` when there is nothing to read. `full` names the object in
/// messages.
pub(crate) fn plan_read<'a>(
    path: &'a str,
    range: &Range<u64>,
    expected: &ObjectMeta,
    full: impl FnOnce(&str) -> String,
) -> Result<Option<(&'a str, Range<u64>)>> {
    let path = normalize_path(path)?;
    if expected.kind == EntryKind::Dir {
        return Err(silt_common::Error::new(
            silt_common::ErrorKind::IsADirectory,
            format!("read {}: is a directory", full(path)),
        ));
    }
    if expected.kind == EntryKind::Symlink {
        // The kernel resolves links; a read of one is a caller's mistake.
        return Err(silt_common::Error::invalid(format!(
            "read {}: is a symbolic link",
            full(path)
        )));
    }
    if expected.kind.is_special() {
        // A FIFO, socket or device has no bytes in the store (its reads are the kernel's).
        return Err(silt_common::Error::invalid(format!(
            "read {}: is a special file (a FIFO, socket or device)",
            full(path)
        )));
    }
    let range = clamp_range(range, expected.size)?;
    Ok((!range.is_empty()).then_some((path, range)))
}

pub(crate) fn clamp_range(range: &Range<u64>, size: u64) -> Result<Range<u64>> {
    if range.start > range.end {
        return Err(Error::invalid(format!(
            "invalid byte range {}..{}: start is after end",
            range.start, range.end
        )));
    }
    let end = range.end.min(size);
    Ok(range.start.min(end)..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_ranges() {
        assert_eq!(normalize_path("").unwrap(), "");
        assert_eq!(normalize_path("/a/b/").unwrap(), "a/b");
        for bad in ["a//b", "a/./b", "../a", "a/.."] {
            assert!(normalize_path(bad).is_err(), "{bad}");
        }
        assert_eq!(clamp_range(&(5..100), 10).unwrap(), 5..10);
        assert_eq!(clamp_range(&(20..30), 10).unwrap(), 10..10);
        assert_eq!(clamp_range(&(0..0), 10).unwrap(), 0..0);
        let reversed = Range { start: 3, end: 2 };
        assert!(clamp_range(&reversed, 10).is_err());
    }
}

#[cfg(test)]
mod pieces_tests {
    use super::pieces;
    use bytes::Bytes;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Pieces reassemble to the input whatever the chunking, are `piece` long but the last,
    /// and a single short chunk is passed on without a copy.
    #[test]
    fn pieces_cut_any_chunking_into_pages() {
        let all = data(10_000);
        for piece in [1u64, 7, 1000, 4096, 10_000, 20_000] {
            for cuts in [
                vec![],
                vec![1],
                vec![999, 1000, 1001],
                vec![4096, 8192],
                vec![3, 5000, 9999],
            ] {
                let mut chunks = Vec::new();
                let mut at = 0;
                for &c in cuts.iter().chain(std::iter::once(&all.len())) {
                    chunks.push(Bytes::copy_from_slice(&all[at..c]));
                    at = c;
                }
                chunks.push(Bytes::new()); // empty chunks are ignored
                let got = pieces(chunks, piece);
                assert_eq!(got.concat(), all, "piece {piece}, cuts {cuts:?}");
                let (last, full) = got.split_last().unwrap();
                assert!(
                    full.iter().all(|p| p.len() as u64 == piece),
                    "piece {piece}, cuts {cuts:?}"
                );
                assert!(!last.is_empty() && last.len() as u64 <= piece);
                if piece % 4096 == 0 && got.len() > 1 {
                    // Whole pages land in pooled buffers a disk tier can write with O_DIRECT.
                    assert!(full.iter().all(|p| silt_common::bufpool::is_aligned(p)));
                }
            }
        }
        let one = Bytes::from(data(100));
        let got = pieces([one.clone()], 100);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ptr(), one.as_ptr(), "a single piece was copied");
        assert!(pieces(Vec::<Bytes>::new(), 10).is_empty());
        // No piece holds more memory than its bytes (a short last piece is not a page).
        let got = pieces([Bytes::from(data(100)), Bytes::from(data(50))], 1 << 20);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), 150);
    }
}
