//! Layers: a store in front of another that acts around its calls (injects a fault, counts,
//! times, fails fast, answers some calls itself) and forwards the rest unchanged.
//!
//! A layer implements [`Layer`]: its inner store, and whichever calls it changes. Every
//! [`UnderStore`] method has a default here that runs the call through [`Layer::around`] (by
//! default [`Layer::before`], then the call) and on to the inner store, and [`Layered`] is
//! the store a layer makes. So a layer cannot forget a method and fall through to a trait
//! default that answers `Unsupported` (a hand-written wrapper that missed `mknod` would have
//! made a store without special files of one with them), and a new trait method is added
//! here once, for every layer. The layers: [`crate::FaultStore`] (fault injection),
//! [`crate::Measured`] (request times, error counts, a stalled store failing fast), and the
//! client's store of resident files.

use std::ops::{Deref, Range};

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use silt_common::io::ReadAt;
use silt_common::metrics::UfsOp;
use silt_common::Result;

use crate::{
    Capabilities, DynStore, FaultOp, Headers, ObjectMeta, SetAttrs, SpecialKind, UnderStore,
};

/// The fault kind of a call kind: a rename is a write.
pub fn fault_op(op: UfsOp) -> FaultOp {
    match op {
        UfsOp::Read => FaultOp::Read,
        UfsOp::Stat => FaultOp::Stat,
        UfsOp::List => FaultOp::List,
        UfsOp::Write | UfsOp::Rename => FaultOp::Write,
        UfsOp::Delete => FaultOp::Delete,
    }
}

/// What a layer adds in front of its inner store. Each method's default forwards the call
/// through [`Layer::around`] to the inner store; a layer overrides the calls it answers
/// differently. Directory operations, links and attribute changes count as the request kind
/// they make (a write or a delete).
#[async_trait]
pub trait Layer: Send + Sync + 'static {
    /// The store every call goes on to.
    fn inner(&self) -> &DynStore;

    /// Runs before a call of kind `op` on `path` reaches the inner store; an error is the
    /// call's answer and the inner store never sees the call.
    async fn before(&self, op: FaultOp, path: &str) -> Result<()> {
        let _ = (op, path);
        Ok(())
    }

    /// Runs `call` (a call of kind `op` on `path`, not started yet): by default `before`,
    /// then the call. A layer that acts on both sides of every call (a timer) overrides this.
    async fn around<'a, T: Send + 'a>(
        &'a self,
        op: UfsOp,
        path: &'a str,
        call: BoxFuture<'a, Result<T>>,
    ) -> Result<T> {
        self.before(fault_op(op), path).await?;
        call.await
    }

    /// Whether `local_file` may hand out the inner store's own file. A reader of that file
    /// goes around the layer, so a layer that must see every read says no.
    fn has_local_files(&self) -> bool {
        true
    }

    fn uri(&self) -> &str {
        self.inner().uri()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.around(UfsOp::Stat, path, self.inner().stat(path))
            .await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        self.around(UfsOp::List, dir, self.inner().list(dir, recursive))
            .await
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        self.around(UfsOp::List, dir, self.inner().list_tree(dir, max))
            .await
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        self.around(UfsOp::Read, path, self.inner().read(path, range, expected))
            .await
    }

    async fn read_pieces(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        let call = self.inner().read_pieces(path, range, expected, piece);
        self.around(UfsOp::Read, path, call).await
    }

    async fn local_file(&self, path: &str, expected: &ObjectMeta) -> Option<std::fs::File> {
        if !self.has_local_files() {
            return None;
        }
        self.inner().local_file(path, expected).await
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        self.around(UfsOp::Write, path, self.inner().write(path, data))
            .await
    }

    async fn write_from(&self, path: &str, src: &dyn ReadAt, len: u64) -> Result<ObjectMeta> {
        self.around(UfsOp::Write, path, self.inner().write_from(path, src, len))
            .await
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let call = self
            .inner()
            .write_from_attrs(path, src, len, attrs, headers);
        self.around(UfsOp::Write, path, call).await
    }

    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        self.around(UfsOp::Stat, path, self.inner().headers(path, expected))
            .await
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.around(UfsOp::Delete, path, self.inner().delete(path))
            .await
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        self.around(UfsOp::Write, path, self.inner().create_dir(path))
            .await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        self.around(UfsOp::Delete, path, self.inner().remove_dir(path))
            .await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.around(UfsOp::Rename, from, self.inner().rename(from, to))
            .await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.around(UfsOp::Write, from, self.inner().copy(from, to))
            .await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        self.around(UfsOp::Write, path, self.inner().symlink(path, target))
            .await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        self.around(UfsOp::Read, path, self.inner().read_link(path))
            .await
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        self.around(UfsOp::Write, path, self.inner().set_attrs(path, attrs))
            .await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        let call = self.inner().mknod(path, kind, rdev, attrs);
        self.around(UfsOp::Write, path, call).await
    }

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.around(UfsOp::Write, to, self.inner().hard_link(from, to))
            .await
    }
}

/// The store a [`Layer`] makes: every call to the layer's method of the same name.
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
        Layer::uri(&self.0)
    }

    fn capabilities(&self) -> Capabilities {
        Layer::capabilities(&self.0)
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        Layer::stat(&self.0, path).await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        Layer::list(&self.0, dir, recursive).await
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        Layer::list_tree(&self.0, dir, max).await
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        Layer::read(&self.0, path, range, expected).await
    }

    async fn read_pieces(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        Layer::read_pieces(&self.0, path, range, expected, piece).await
    }

    async fn local_file(&self, path: &str, expected: &ObjectMeta) -> Option<std::fs::File> {
        Layer::local_file(&self.0, path, expected).await
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        Layer::write(&self.0, path, data).await
    }

    async fn write_from(&self, path: &str, src: &dyn ReadAt, len: u64) -> Result<ObjectMeta> {
        Layer::write_from(&self.0, path, src, len).await
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        Layer::write_from_attrs(&self.0, path, src, len, attrs, headers).await
    }

    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        Layer::headers(&self.0, path, expected).await
    }

    async fn delete(&self, path: &str) -> Result<()> {
        Layer::delete(&self.0, path).await
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        Layer::create_dir(&self.0, path).await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        Layer::remove_dir(&self.0, path).await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        Layer::rename(&self.0, from, to).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        Layer::copy(&self.0, from, to).await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        Layer::symlink(&self.0, path, target).await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        Layer::read_link(&self.0, path).await
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        Layer::set_attrs(&self.0, path, attrs).await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        Layer::mknod(&self.0, path, kind, rdev, attrs).await
    }

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        Layer::hard_link(&self.0, from, to).await
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
