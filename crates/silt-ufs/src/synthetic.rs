//! A store that describes a namespace without storing it, for tests and benchmarks of metadata
//! at scale (issue 44: clients walking 10⁷–10⁸ entries on one machine): `dirs` directories
//! `d0000000`, ... of `files_per_dir` files `f0000000.bin`, ... each. Every size, mtime and
//! ETag is derived from the seed and the file's numbers, and every byte from those and its
//! offset, so nothing is held per entry and two stores made alike answer alike. Read-only: a
//! write, delete, mkdir, rmdir or rename is refused with `ReadOnly` (the other changes with
//! the trait's `Unsupported`). Not reachable from a URI: a benchmark or test builds it.

use std::ops::Range;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use silt_common::{Error, ErrorKind, Result};

use crate::{normalize_path, plan_read, Capabilities, EntryKind, ObjectMeta, Posix, UnderStore};

/// Sizes lie in `MIN_SIZE..MIN_SIZE + SIZE_SPAN` (1 KiB to 256 KiB: small training samples).
const MIN_SIZE: u64 = 1 << 10;
const SIZE_SPAN: u64 = 255 << 10;

/// A namespace of `dirs × files_per_dir` files computed on demand (module docs).
pub struct SyntheticStore {
    uri: String,
    dirs: u64,
    files_per_dir: u64,
    seed: u64,
}

/// What a store path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Root,
    Dir(u64),
    File(u64, u64),
}

/// splitmix64's finaliser: a well-mixed 64-bit value of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl SyntheticStore {
    pub fn new(dirs: u64, files_per_dir: u64, seed: u64) -> SyntheticStore {
        SyntheticStore {
            uri: format!("synthetic://{dirs}x{files_per_dir}/{seed}"),
            dirs,
            files_per_dir,
            seed,
        }
    }

    /// Files and directories below the root.
    pub fn entries(&self) -> u64 {
        self.dirs
            .saturating_mul(self.files_per_dir.saturating_add(1))
    }

    /// The path of file `f` of directory `d`.
    pub fn file_path(d: u64, f: u64) -> String {
        format!("d{d:07}/f{f:07}.bin")
    }

    fn key(&self, d: u64, f: u64) -> u64 {
        mix(self.seed ^ mix(d.wrapping_mul(0x1_0000_0001) ^ f))
    }

    fn node(&self, path: &str) -> Option<Node> {
        if path.is_empty() {
            return Some(Node::Root);
        }
        let number = |s: &str| -> Option<u64> {
            (s.len() == 7 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let (dir, file) = match path.split_once('/') {
            Some((dir, file)) => (dir, Some(file)),
            None => (path, None),
        };
        let d = number(dir.strip_prefix('d')?).filter(|&d| d < self.dirs)?;
        let Some(file) = file else {
            return Some(Node::Dir(d));
        };
        let f = number(file.strip_prefix('f')?.strip_suffix(".bin")?)
            .filter(|&f| f < self.files_per_dir)?;
        Some(Node::File(d, f))
    }

    fn dir_meta(d: Option<u64>) -> ObjectMeta {
        ObjectMeta::dir(&d.map(|d| format!("d{d:07}")).unwrap_or_default())
    }

    fn file_meta(&self, d: u64, f: u64) -> ObjectMeta {
        let k = self.key(d, f);
        ObjectMeta {
            path: Self::file_path(d, f),
            kind: EntryKind::File,
            size: MIN_SIZE + k % SIZE_SPAN,
            mtime: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000 + (k >> 40) % 1_000_000)),
            etag: Some(format!("\"{k:016x}\"")),
            version: None,
            mode: None,
            posix: Posix::default(),
        }
    }

    fn meta(&self, node: Node) -> ObjectMeta {
        match node {
            Node::Root => Self::dir_meta(None),
            Node::Dir(d) => Self::dir_meta(Some(d)),
            Node::File(d, f) => self.file_meta(d, f),
        }
    }

    /// Bytes `range` of file `f` of directory `d`: word `i` (bytes `8i..8i+8`) is
    /// `mix(key ^ i)`, little-endian.
    fn bytes(&self, d: u64, f: u64, range: Range<u64>) -> Bytes {
        let k = self.key(d, f);
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        let mut at = range.start;
        while at < range.end {
            let word = mix(k ^ (at / 8)).to_le_bytes();
            let from = (at % 8) as usize;
            let take = (8 - from).min((range.end - at) as usize);
            out.extend_from_slice(&word[from..from + take]);
            at += take as u64;
        }
        Bytes::from(out)
    }

    fn refuse(&self, op: &str, path: &str) -> Error {
        Error::new(
            ErrorKind::ReadOnly,
            format!("{op} {}/{path}: a synthetic store is read-only", self.uri),
        )
    }

    fn not_found(&self, op: &str, path: &str) -> Error {
        Error::not_found(format!("{op} {}/{path}: not found", self.uri))
    }
}

#[async_trait::async_trait]
impl UnderStore for SyntheticStore {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        let node = self
            .node(path)
            .ok_or_else(|| self.not_found("stat", path))?;
        Ok(self.meta(node))
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        let dir = normalize_path(dir)?;
        let files_of = |d: u64| (0..self.files_per_dir).map(move |f| self.file_meta(d, f));
        match self.node(dir) {
            Some(Node::Root) => {
                let mut out = Vec::new();
                for d in 0..self.dirs {
                    out.push(Self::dir_meta(Some(d)));
                    if recursive {
                        out.extend(files_of(d));
                    }
                }
                Ok(out)
            }
            Some(Node::Dir(d)) => Ok(files_of(d).collect()),
            Some(Node::File(..)) => Err(Error::new(
                ErrorKind::NotADirectory,
                format!("list {}/{dir}: not a directory", self.uri),
            )),
            None => Err(self.not_found("list", dir)),
        }
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        let Some((path, range)) =
            plan_read(path, &range, expected, |p| format!("{}/{p}", self.uri))?
        else {
            return Ok(Bytes::new());
        };
        let Some(Node::File(d, f)) = self.node(path) else {
            return Err(self.not_found("read", path));
        };
        if self.file_meta(d, f).content_fingerprint() != expected.content_fingerprint() {
            return Err(Error::new(
                ErrorKind::ContentChanged,
                format!("read {}/{path}: not the version asked for", self.uri),
            ));
        }
        Ok(self.bytes(d, f, range))
    }

    async fn write(&self, path: &str, _data: Bytes) -> Result<ObjectMeta> {
        Err(self.refuse("write", path))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        Err(self.refuse("delete", path))
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        Err(self.refuse("mkdir", path))
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        Err(self.refuse("rmdir", path))
    }

    async fn rename(&self, from: &str, _to: &str) -> Result<ObjectMeta> {
        Err(self.refuse("rename", from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn names_sizes_and_bytes_follow_from_the_seed_alone() {
        let rt = rt();
        let a = SyntheticStore::new(3, 5, 7);
        let b = SyntheticStore::new(3, 5, 7);
        let other = SyntheticStore::new(3, 5, 8);
        assert_eq!(a.entries(), 18);
        let root = rt.block_on(a.list("", false)).unwrap();
        assert_eq!(
            root.iter().map(|m| m.path.as_str()).collect::<Vec<_>>(),
            ["d0000000", "d0000001", "d0000002"]
        );
        let files = rt.block_on(a.list("d0000001/", false)).unwrap();
        assert_eq!(files.len(), 5);
        assert_eq!(rt.block_on(a.list("", true)).unwrap().len(), 18);
        let m = rt.block_on(a.stat("d0000001/f0000004.bin")).unwrap();
        assert_eq!(m, files[4]);
        assert!((MIN_SIZE..MIN_SIZE + SIZE_SPAN).contains(&m.size));
        assert_eq!(m, rt.block_on(b.stat(&m.path)).unwrap());
        assert_ne!(m.etag, rt.block_on(other.stat(&m.path)).unwrap().etag);
        // Any range is the same bytes as the whole file's slice.
        let whole = rt.block_on(a.read(&m.path, 0..m.size, &m)).unwrap();
        assert_eq!(whole.len() as u64, m.size);
        let part = rt.block_on(a.read(&m.path, 13..1000, &m)).unwrap();
        assert_eq!(part, whole.slice(13..1000));
        assert_eq!(whole, rt.block_on(b.read(&m.path, 0..m.size, &m)).unwrap());
    }

    #[test]
    fn what_it_does_not_describe_is_not_found_and_changes_are_refused() {
        let rt = rt();
        let s = SyntheticStore::new(2, 3, 1);
        for p in [
            "d0000002",
            "d0000000/f0000003.bin",
            "d0000000/f000000.bin",
            "x",
            "d0000000/g",
        ] {
            let e = rt.block_on(s.stat(p)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{p}: {e}");
        }
        assert_eq!(
            rt.block_on(s.list("d0000000/f0000000.bin", false))
                .unwrap_err()
                .kind(),
            ErrorKind::NotADirectory
        );
        let e = rt
            .block_on(s.write("d0000000/new", Bytes::new()))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ReadOnly);
        assert_eq!(
            rt.block_on(s.delete("d0000000/f0000000.bin"))
                .unwrap_err()
                .kind(),
            ErrorKind::ReadOnly
        );
        // A read of another version is refused, never answered with these bytes.
        let mut m = rt.block_on(s.stat("d0000000/f0000001.bin")).unwrap();
        m.etag = Some("\"other\"".into());
        let e = rt.block_on(s.read(&m.path, 0..10, &m)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ContentChanged);
    }

    #[test]
    fn a_hundred_million_entries_cost_nothing_to_describe() {
        let rt = rt();
        let s = SyntheticStore::new(10_000, 10_000, 3);
        assert_eq!(s.entries(), 100_010_000);
        let last = rt.block_on(s.stat("d0009999/f0009999.bin")).unwrap();
        assert_eq!(last.path, SyntheticStore::file_path(9_999, 9_999));
        assert_eq!(
            rt.block_on(s.list("d0004242", false)).unwrap().len(),
            10_000
        );
    }
}
