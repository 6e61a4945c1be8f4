//! The cluster layer: which worker owns which bytes (`placement`), who the workers are
//! (`membership`, with static and etcd implementations), how clients talk to workers (`rpc`)
//! and how a client routes page fetches to owners with failover (`router`); cache-only files
//! replicated to workers (`replica`).
//!
//! There is no master in the read path: a client computes the owner of every page group from
//! the membership view it holds and talks to that worker directly.

pub mod auth;
pub mod etcd;
pub mod membership;
pub mod placement;
pub mod replica;
pub mod router;
pub mod rpc;
pub mod tls;

pub use auth::ClusterKey;
pub use etcd::EtcdMembership;
pub use membership::{Member, Membership, Registration, StaticMembership, View};
pub use replica::{Replicas, ResidentTable};
pub use router::{local_host_id, Router, RouterOptions};
