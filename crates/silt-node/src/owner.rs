//! The stores of an attached client: each stands for one of the owner's stores and makes
//! every call of it on the owner's Unix socket (`silt_cluster::rpc::store`), so a process
//! attached to a `silt up` opens no store and reads no credential: the owner holds them.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use silt_client::{MountPoint, Namespace};
use silt_cluster::rpc::{answer, CallError, Request, WorkerClient, MAX_RANGE};
use silt_common::config::MountSpec;
use silt_common::io::ReadAt;
use silt_common::{Error, ErrorKind, Result};
use silt_ufs::{Capabilities, Headers, ObjectMeta, SetAttrs, SpecialKind, UnderStore};

/// One of the owner's under-stores, reached through its worker socket. Its URI and
/// capabilities are the owner's store's, asked once when it is opened (`store_info`);
/// errors keep the kind the owner's store gave them.
pub struct OwnerStore {
    owner: Arc<WorkerClient>,
    uri: String,
    caps: Capabilities,
    /// The longest a call but a write waits for the owner (`owner_deadline`): an owner that
    /// stopped answering (a stopped process) fails its attached clients' calls with
    /// `ETIMEDOUT` instead of hanging them.
    deadline: Duration,
}

/// How long an attached client waits for its owner's answer to a store call: as long as the
/// owner's own store may take to fail it (`ufs_timeout × (ufs_retries + 1)`), twice over for
/// backoff and queueing, at least 10 s. A write is not bounded (its bytes may take longer).
pub fn owner_deadline(cfg: &silt_common::config::Config) -> Duration {
    let store = cfg.ufs_timeout.saturating_mul(cfg.ufs_retries as u32 + 1);
    store.saturating_mul(2).max(Duration::from_secs(10))
}

/// `call`, or `ETIMEDOUT` once `deadline` passed without the owner's answer.
async fn bounded<T>(
    deadline: Duration,
    what: &str,
    call: impl std::future::Future<Output = std::result::Result<T, CallError>>,
) -> Result<T> {
    match tokio::time::timeout(deadline, call).await {
        Ok(r) => r.map_err(CallError::into_error),
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!("the owner did not answer {what} within {deadline:?}"),
        )),
    }
}

impl OwnerStore {
    /// The owner's store `uri` (one of its mount table), checked to be there.
    pub async fn open(
        owner: Arc<WorkerClient>,
        uri: &str,
        deadline: Duration,
    ) -> Result<OwnerStore> {
        let req = Request::StoreInfo {
            store: uri.to_string(),
        };
        let info: answer::StoreInfo = bounded(deadline, "store_info", owner.ask(&req)).await?;
        // Listed directory by directory, each answered from the owner's own listings (its
        // metadata cache, `store_list`), not by bulk sweeps of the store: a new attached
        // process (a DataLoader worker) then asks the store nothing the owner knows.
        let caps = Capabilities {
            native_recursive_list: false,
            ..info.capabilities
        };
        Ok(OwnerStore {
            owner,
            uri: info.uri,
            caps,
            deadline,
        })
    }

    async fn meta(&self, req: Request) -> Result<ObjectMeta> {
        let answer::StoreMeta { meta } = self.ask(req).await?;
        Ok(meta)
    }

    async fn ask<A: answer::Answer>(&self, req: Request) -> Result<A> {
        bounded(self.deadline, req.name(), self.owner.ask(&req)).await
    }

    async fn read_piece(
        &self,
        path: &str,
        expected: &ObjectMeta,
        range: Range<u64>,
    ) -> Result<Bytes> {
        let call = self.owner.store_read(&self.uri, path, expected, range);
        bounded(self.deadline, "store_read", call).await
    }

    fn store(&self) -> String {
        self.uri.clone()
    }
}

/// The namespace of `mounts` (the owner's mount table) over the owner's stores.
pub async fn owner_namespace(
    owner: Arc<WorkerClient>,
    mounts: &[MountSpec],
    deadline: Duration,
) -> Result<Namespace> {
    let mut points = Vec::new();
    for m in mounts {
        let store = OwnerStore::open(owner.clone(), &m.uri, deadline)
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
        let req = Request::StoreList {
            store: self.store(),
            path: dir.to_string(),
            recursive,
            paged: true,
        };
        let pages: Vec<answer::StoreEntries> =
            bounded(self.deadline, req.name(), self.owner.ask_pages(&req)).await?;
        Ok(pages.into_iter().flat_map(|p| p.entries).collect())
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
            return self.read_piece(path, expected, at..end).await;
        }
        let mut out = bytes::BytesMut::with_capacity((end - at) as usize);
        while at < end {
            let stop = (at + MAX_RANGE).min(end);
            let b = self.read_piece(path, expected, at..stop).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use silt_cluster::auth::ClusterKey;
    use silt_cluster::rpc::Endpoint;
    use silt_common::secret::Secret;

    /// An owner that proves the client's membership, then answers nothing (a process stopped
    /// between two calls): the attached client's store call fails with ETIMEDOUT instead of
    /// hanging.
    #[tokio::test]
    async fn an_owner_that_stops_answering_times_the_call_out() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("worker.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let key = ClusterKey::new(&Secret::new("a secret of the test".to_string())).unwrap();
        let owner_key = key.clone();
        let held = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((mut c, _)) = listener.accept().await {
                let accepted = silt_cluster::auth::accept(
                    &mut c,
                    &owner_key,
                    "test",
                    silt_cluster::auth::Channel::Unix,
                )
                .await;
                assert!(accepted.is_ok(), "the client's proof was refused");
                kept.push(c); // then read nothing, answer nothing
            }
        });
        let owner = Arc::new(WorkerClient::new(Endpoint::Unix(sock), key));
        let e = OwnerStore::open(owner, "s3://bucket", Duration::from_millis(200))
            .await
            .err()
            .expect("an answer from an owner that gives none");
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        held.abort();
    }
}
