//! Membership: the set of live workers, and the shared mount table.
//!
//! Invariants every implementation keeps:
//! - `view()` lists each live worker once, sorted by `id`; ids are stable across restarts
//!   (a worker keeps its id in its state dir), so a restarted worker gets back the same share
//!   of the keyspace and finds its disk tier warm.
//! - `subscribe()` yields a new `View` after every change, with a larger `revision`; a
//!   subscriber that lags sees the latest view, never an older one after a newer.
//! - `register` makes the caller visible until its `Registration` is dropped or the process
//!   dies; with etcd a dead process disappears once its lease expires (`member_ttl`).
//! - The mount table is one string (the `mounts` option's syntax) shared by every process of
//!   the cluster; `publish_mounts` stores it only if none is stored yet and returns the table
//!   in force, so every process ends up with the same namespace.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use silt_common::Result;
use tokio::sync::watch;

/// One worker as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Stable identity (kept in the worker's state dir).
    pub id: String,
    /// `host:port` of the worker's TCP RPC listener.
    pub addr: String,
    /// Which host (and network namespace) the worker runs in: a client with the same host id
    /// may use `uds` instead of TCP.
    #[serde(default)]
    pub host: String,
    /// Path of the worker's Unix socket, for clients on the same host.
    #[serde(default)]
    pub uds: Option<String>,
    /// Cache capacity in bytes (all tiers).
    #[serde(default)]
    pub capacity: u64,
}

impl Member {
    /// A worker known only by id and address (a static worker list): no host, no Unix
    /// socket, capacity unknown.
    pub fn new(id: impl Into<String>, addr: impl Into<String>) -> Member {
        Member {
            id: id.into(),
            addr: addr.into(),
            host: String::new(),
            uds: None,
            capacity: 0,
        }
    }
}

/// A membership view: the live workers at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// Sorted by id, no duplicates.
    pub members: Vec<Member>,
    /// Grows with every change (etcd's revision for the etcd implementation).
    pub revision: u64,
}

impl View {
    pub fn new(mut members: Vec<Member>, revision: u64) -> View {
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members.dedup_by(|a, b| a.id == b.id);
        View { members, revision }
    }

    pub fn get(&self, id: &str) -> Option<&Member> {
        self.members
            .binary_search_by(|m| m.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.members[i])
    }
}

/// Keeps a worker registered while it lives; dropping it deregisters (best effort, in the
/// background); [`Registration::leave`] deregisters and waits until that is done.
pub struct Registration {
    keep: Box<dyn Send + Sync>,
    /// Completes once deregistration has finished (after `keep` is dropped).
    done: Option<futures::future::BoxFuture<'static, ()>>,
}

impl Registration {
    pub fn new(keep: impl Send + Sync + 'static) -> Registration {
        Registration {
            keep: Box::new(keep),
            done: None,
        }
    }

    /// Dropping `keep` starts deregistration; `done` completes when it has finished.
    pub fn with_leave(
        keep: impl Send + Sync + 'static,
        done: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Registration {
        Registration {
            keep: Box::new(keep),
            done: Some(Box::pin(done)),
        }
    }

    /// Deregisters now and waits for it (a clean shutdown: clients stop routing here at once).
    pub async fn leave(self) {
        let Registration { keep, done } = self;
        drop(keep);
        if let Some(done) = done {
            done.await;
        }
    }
}

#[async_trait]
pub trait Membership: Send + Sync {
    /// The latest view.
    fn view(&self) -> Arc<View>;
    /// Views as they change (see the module's invariants).
    fn subscribe(&self) -> watch::Receiver<Arc<View>>;
    /// Makes `me` a live member until the returned guard drops.
    async fn register(&self, me: Member) -> Result<Registration>;
    /// Stores `table` as the cluster's mount table unless one is stored; returns the table
    /// in force afterwards.
    async fn publish_mounts(&self, table: &str) -> Result<String>;
    /// The stored mount table, if any.
    async fn mounts(&self) -> Result<Option<String>>;
    /// Human-readable description (`static: 3 workers`, `etcd http://...`).
    fn describe(&self) -> String;
}

/// A fixed list of workers from configuration (`workers` option), or the single in-process
/// worker of `silt up`. `register` adds to the list in memory only.
pub struct StaticMembership {
    tx: watch::Sender<Arc<View>>,
    mounts: Mutex<Option<String>>,
}

impl StaticMembership {
    pub fn new(members: Vec<Member>) -> StaticMembership {
        let (tx, _) = watch::channel(Arc::new(View::new(members, 1)));
        StaticMembership {
            tx,
            mounts: Mutex::new(None),
        }
    }

    fn update(&self, f: impl FnOnce(&mut Vec<Member>)) {
        let cur = self.tx.borrow().clone();
        let mut members = cur.members.clone();
        f(&mut members);
        let _ = self
            .tx
            .send_replace(Arc::new(View::new(members, cur.revision + 1)));
    }

    /// Removes a member (tests and `silt up`'s own shutdown).
    pub fn remove(&self, id: &str) {
        self.update(|m| m.retain(|x| x.id != id));
    }
}

#[async_trait]
impl Membership for StaticMembership {
    fn view(&self) -> Arc<View> {
        self.tx.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<View>> {
        self.tx.subscribe()
    }

    async fn register(&self, me: Member) -> Result<Registration> {
        self.update(|m| {
            m.retain(|x| x.id != me.id);
            m.push(me);
        });
        // Static members stay listed until removed; nothing to keep alive.
        Ok(Registration::new(()))
    }

    async fn publish_mounts(&self, table: &str) -> Result<String> {
        let mut m = self.mounts.lock();
        Ok(m.get_or_insert_with(|| table.to_string()).clone())
    }

    async fn mounts(&self) -> Result<Option<String>> {
        Ok(self.mounts.lock().clone())
    }

    fn describe(&self) -> String {
        format!("static: {} workers", self.view().members.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str) -> Member {
        Member::new(id, format!("{id}:1"))
    }

    #[tokio::test]
    async fn static_views_are_sorted_and_revisions_grow() {
        let m = StaticMembership::new(vec![member("b"), member("a"), member("b")]);
        let v = m.view();
        assert_eq!(
            v.members.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let mut rx = m.subscribe();
        let _r = m.register(member("c")).await.unwrap();
        rx.changed().await.unwrap();
        let v2 = rx.borrow().clone();
        assert!(v2.revision > v.revision);
        assert!(v2.get("c").is_some());
        m.remove("a");
        assert!(m.view().get("a").is_none());
    }

    #[tokio::test]
    async fn first_published_mount_table_wins() {
        let m = StaticMembership::new(vec![]);
        assert_eq!(m.mounts().await.unwrap(), None);
        assert_eq!(
            m.publish_mounts("/=file:///a").await.unwrap(),
            "/=file:///a"
        );
        assert_eq!(
            m.publish_mounts("/=file:///b").await.unwrap(),
            "/=file:///a"
        );
    }
}
