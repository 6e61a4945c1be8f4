//! Layers: a store in front of another that does something before each call (injects a
//! fault, counts, waits) and then forwards it unchanged.
//!
//! A layer implements [`Layer`] (its inner store and one `before` hook); [`Layered`] is the
//! store, and it forwards **every** [`UnderStore`] method. So a layer cannot forget one and
//! fall through to a trait default that answers `Unsupported` (a hand-written wrapper that
//! missed `mknod` would have made a store without special files of one with them). A new trait
//! method is added here once, for every layer.

use std::ops::{Deref, Range};

use async_trait::async_trait;
use bytes::Bytes;
use silt_common::io::ReadAt;
use silt_common::Result;

use crate::{Capabilities, DynStore, FaultOp, ObjectMeta, SetAttrs, SpecialKind, UnderStore};

/// What a layer adds in front of its inner store.
#[async_trait]
pub trait Layer: Send + Sync + 'static {
    /// The store every call goes on to.
    fn inner(&self) -> &DynStore;
    /// Runs before a call of kind `op` on `path` reaches the inner store; an error is the
    /// call's answer and the inner store never sees the call. Directory operations, renames,
    /// links and attribute changes count as the request kind they make (a write or a delete).
    async fn before(&self, op: FaultOp, path: &str) -> Result<()>;
    /// Whether `local_file` may hand out the inner store's own file. A reader of that file
    /// goes around the layer, so a layer that must see every read says no.
    fn lends_local_files(&self) -> bool {
        true
    }
}

/// The store a [`Layer`] makes: every call through `before`, then to the inner store.
pub struct Layered<L>(L);

impl<L: Layer> Layered<L> {
    pub fn from_layer(layer: L) -> Layered<L> {
        Layered(layer)
    }
}

impl<L> Deref for Layered<L> {
    type Target = L;
    fn deref(&self) -> &L {
        &self.0
    }
}

#[async_trait]
impl<L: Layer> UnderStore for Layered<L> {
    fn uri(&self) -> &str {
        self.0.inner().uri()
    }

    fn capabilities(&self) -> Capabilities {
        self.0.inner().capabilities()
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Stat, path).await?;
        self.0.inner().stat(path).await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.0.before(FaultOp::List, dir).await?;
        self.0.inner().list(dir, recursive).await
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        self.0.before(FaultOp::List, dir).await?;
        self.0.inner().list_tree(dir, max).await
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        self.0.before(FaultOp::Read, path).await?;
        self.0.inner().read(path, range, expected).await
    }

    async fn read_pieces(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        self.0.before(FaultOp::Read, path).await?;
        self.0
            .inner()
            .read_pieces(path, range, expected, piece)
            .await
    }

    async fn local_file(&self, path: &str, expected: &ObjectMeta) -> Option<std::fs::File> {
        if !self.0.lends_local_files() {
            return None;
        }
        self.0.inner().local_file(path, expected).await
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, path).await?;
        self.0.inner().write(path, data).await
    }

    async fn write_from(&self, path: &str, src: &dyn ReadAt, len: u64) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, path).await?;
        self.0.inner().write_from(path, src, len).await
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn ReadAt,
        len: u64,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, path).await?;
        self.0.inner().write_from_attrs(path, src, len, attrs).await
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.0.before(FaultOp::Delete, path).await?;
        self.0.inner().delete(path).await
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, path).await?;
        self.0.inner().create_dir(path).await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        self.0.before(FaultOp::Delete, path).await?;
        self.0.inner().remove_dir(path).await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, from).await?;
        self.0.inner().rename(from, to).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, from).await?;
        self.0.inner().copy(from, to).await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, path).await?;
        self.0.inner().symlink(path, target).await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        self.0.before(FaultOp::Read, path).await?;
        self.0.inner().read_link(path).await
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, path).await?;
        self.0.inner().set_attrs(path, attrs).await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, path).await?;
        self.0.inner().mknod(path, kind, rdev, attrs).await
    }

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.0.before(FaultOp::Write, to).await?;
        self.0.inner().hard_link(from, to).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::{EntryKind, MemStore};

    /// Counts every call it sees.
    struct Counting {
        inner: DynStore,
        seen: AtomicU64,
    }

    #[async_trait]
    impl Layer for Counting {
        fn inner(&self) -> &DynStore {
            &self.inner
        }
        async fn before(&self, _op: FaultOp, _path: &str) -> Result<()> {
            self.seen.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    /// Every call a store answers, a layer in front of it answers the same way, and sees it:
    /// the calls a hand-written wrapper could forget (directories, links, special files,
    /// attributes) included.
    #[tokio::test]
    async fn a_layer_forwards_every_call() {
        let mem: DynStore = Arc::new(MemStore::new("mem://layer"));
        let s = Layered::from_layer(Counting {
            inner: mem,
            seen: AtomicU64::new(0),
        });
        s.write("a", Bytes::from_static(b"bytes")).await.unwrap();
        let m = s.stat("a").await.unwrap();
        assert_eq!(&s.read("a", 0..5, &m).await.unwrap()[..], b"bytes");
        assert_eq!(s.read_pieces("a", 0..5, &m, 2).await.unwrap().len(), 3);
        s.create_dir("d").await.unwrap();
        s.copy("a", "d/b").await.unwrap();
        s.rename("d/b", "d/c").await.unwrap();
        s.symlink("l", "a").await.unwrap();
        assert_eq!(s.read_link("l").await.unwrap(), "a");
        let n = s
            .mknod("p", SpecialKind::Fifo, 0, &SetAttrs::default())
            .await
            .unwrap();
        assert_eq!(n.kind, EntryKind::Special(SpecialKind::Fifo));
        let attrs = SetAttrs {
            mode: Some(0o600),
            ..Default::default()
        };
        assert_eq!(s.set_attrs("a", &attrs).await.unwrap().mode, Some(0o600));
        assert_eq!(s.list("", true).await.unwrap().len(), 5);
        assert!(s.list_tree("", 100).await.unwrap().is_some());
        s.delete("d/c").await.unwrap();
        s.remove_dir("d").await.unwrap();
        assert_eq!(s.seen.load(Ordering::Relaxed), 15);
        assert_eq!(s.uri(), "mem://layer");
    }
}
