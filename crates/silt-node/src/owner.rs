//! The stores of an attached client: each stands for one of the owner's stores and makes
//! every call of it on the owner's Unix socket (`silt_cluster::rpc::store`), so a process
//! attached to a `silt up` opens no store and reads no credential: the owner holds them.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use silt_client::{MountPoint, Namespace};
use silt_cluster::rpc::{answer, CallError, Request, WorkerClient, MAX_RANGE};
use silt_common::config::MountSpec;
use silt_common::io::ReadAt;
use silt_common::Result;
use silt_ufs::{Capabilities, Headers, ObjectMeta, SetAttrs, SpecialKind, UnderStore};

/// One of the owner's under-stores, reached through its worker socket. Its URI and
/// capabilities are the owner's store's, asked once when it is opened (`store_info`);
/// errors keep the kind the owner's store gave them.
pub struct OwnerStore {
    owner: Arc<WorkerClient>,
    uri: String,
    caps: Capabilities,
}

impl OwnerStore {
    /// The owner's store `uri` (one of its mount table), checked to be there.
    pub async fn open(owner: Arc<WorkerClient>, uri: &str) -> Result<OwnerStore> {
        let info: answer::StoreInfo = owner
            .ask(&Request::StoreInfo {
                store: uri.to_string(),
            })
            .await
            .map_err(CallError::into_error)?;
        Ok(OwnerStore {
            owner,
            uri: info.uri,
            caps: info.capabilities,
        })
    }

    async fn meta(&self, req: Request) -> Result<ObjectMeta> {
        let answer::StoreMeta { meta } = self.ask(req).await?;
        Ok(meta)
    }

    async fn ask<A: answer::Answer>(&self, req: Request) -> Result<A> {
        self.owner.ask(&req).await.map_err(CallError::into_error)
    }

    fn store(&self) -> String {
        self.uri.clone()
    }
}

/// The namespace of `mounts` (the owner's mount table) over the owner's stores.
pub async fn owner_namespace(owner: Arc<WorkerClient>, mounts: &[MountSpec]) -> Result<Namespace> {
    let mut points = Vec::new();
    for m in mounts {
        let store = OwnerStore::open(owner.clone(), &m.uri)
            .await
            .map_err(|e| e.context(format!("mount {} (through the owner)", m.path)))?;
        points.push(MountPoint {
            path: m.path.clone(),
            store: Arc::new(store),
        });
    }
    Namespace::new(points)
}

#[async_trait]
impl UnderStore for OwnerStore {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.meta(Request::StoreStat {
            store: self.store(),
            path: path.to_string(),
        })
        .await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        let answer::StoreEntries { entries } = self
            .ask(Request::StoreList {
                store: self.store(),
                path: dir.to_string(),
                recursive,
            })
            .await?;
        Ok(entries)
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        let answer::StoreTree { entries } = self
            .ask(Request::StoreListTree {
                store: self.store(),
                path: dir.to_string(),
                max: max as u64,
            })
            .await?;
        Ok(entries)
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        // The owner serves at most MAX_RANGE bytes at once.
        let end = range.end.min(expected.size);
        let mut at = range.start.min(end);
        if at + MAX_RANGE >= end {
            return self
                .owner
                .store_read(&self.uri, path, expected, at..end)
                .await
                .map_err(CallError::into_error);
        }
        let mut out = bytes::BytesMut::with_capacity((end - at) as usize);
        while at < end {
            let stop = (at + MAX_RANGE).min(end);
            let b = self
                .owner
                .store_read(&self.uri, path, expected, at..stop)
                .await
                .map_err(CallError::into_error)?;
            if b.is_empty() {
                break;
            }
            at += b.len() as u64;
            out.extend_from_slice(&b);
        }
        Ok(out.freeze())
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        let len = data.len() as u64;
        self.write_from_attrs(path, &data, len, &SetAttrs::default(), None)
            .await
    }

    async fn write_from(&self, path: &str, src: &dyn ReadAt, len: u64) -> Result<ObjectMeta> {
        self.write_from_attrs(path, src, len, &SetAttrs::default(), None)
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
        self.owner
            .store_write(&self.uri, path, src, len, attrs, headers)
            .await
            .map_err(CallError::into_error)
    }

    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        let answer::StoreHeaders { headers } = self
            .ask(Request::StoreHeaders {
                store: self.store(),
                path: path.to_string(),
                expected: expected.clone(),
            })
            .await?;
        Ok(headers)
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let answer::StoreDone { .. } = self
            .ask(Request::StoreDelete {
                store: self.store(),
                path: path.to_string(),
            })
            .await?;
        Ok(())
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        self.meta(Request::StoreCreateDir {
            store: self.store(),
            path: path.to_string(),
        })
        .await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        let answer::StoreDone { .. } = self
            .ask(Request::StoreRemoveDir {
                store: self.store(),
                path: path.to_string(),
            })
            .await?;
        Ok(())
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.meta(Request::StoreRename {
            store: self.store(),
            from: from.to_string(),
            to: to.to_string(),
        })
        .await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.meta(Request::StoreCopy {
            store: self.store(),
            from: from.to_string(),
            to: to.to_string(),
        })
        .await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        self.meta(Request::StoreSymlink {
            store: self.store(),
            path: path.to_string(),
            target: target.to_string(),
        })
        .await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        let answer::StoreLink { target } = self
            .ask(Request::StoreReadLink {
                store: self.store(),
                path: path.to_string(),
            })
            .await?;
        Ok(target)
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        self.meta(Request::StoreSetAttrs {
            store: self.store(),
            path: path.to_string(),
            attrs: *attrs,
        })
        .await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        self.meta(Request::StoreMknod {
            store: self.store(),
            path: path.to_string(),
            kind,
            rdev,
            attrs: *attrs,
        })
        .await
    }

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        self.meta(Request::StoreHardLink {
            store: self.store(),
            from: from.to_string(),
            to: to.to_string(),
        })
        .await
    }
}
