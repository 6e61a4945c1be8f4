//! Where a standalone gateway (`silt gateway`) gets its client, the way the Python SDK does
//! (`silt_node::Node`):
//!
//! - a **cluster client** when the configuration names a cluster (`--etcd`, `--workers`);
//! - **attached** to the Silt that owns the state directory on this host (`silt up`): a
//!   client of that one worker over its Unix socket, sharing its cache, so the gateway and the
//!   mount read the same pages;
//! - its **own single node** over the mounts given, when nothing serves the state directory
//!   (it then holds the directory's lock, like `silt up`).
//!
//! `silt up --gateway ADDR` needs none of this: it serves its own client.
//!
//! The gateway serves no writes yet, so its client is read-only whatever the configuration
//! says about writes.

use silt_common::config::Config;
use silt_common::write::WriteType;
use silt_node::local::{lock_state_dir, StateLock};
use silt_node::Node;

use crate::GatewayError;

/// A client for the gateway, and what must live as long as it.
pub struct Connected {
    pub node: Node,
    /// `attached`, `cluster` or `single node`.
    pub mode: &'static str,
    _lock: Option<StateLock>,
}

/// Builds the gateway's client from `cfg` (see the module docs) on runtime `rt`.
pub fn connect(cfg: &Config, rt: &tokio::runtime::Runtime) -> Result<Connected, GatewayError> {
    let mut own = cfg.clone();
    own.write_type = WriteType::ReadOnly;
    own.write_rules.clear();
    let connected = |node, mode, lock| Connected {
        node,
        mode,
        _lock: lock,
    };
    if own.is_cluster() {
        return Ok(connected(Node::build(&own, rt)?, "cluster", None));
    }
    let owner_dir = own.state_dir.clone();
    if let Some(node) = Node::attach(&own, &owner_dir, rt)? {
        return Ok(connected(node, "attached", None));
    }
    if own.mounts.is_empty() {
        return Err(GatewayError::Config(format!(
            "no Silt serves {} on this host and no mounts were given: start `silt up` (or pass --state-dir of the one running), give --mount PATH=URI, or --etcd/--workers for a cluster",
            owner_dir.display()
        )));
    }
    let lock = lock_state_dir(&owner_dir)?;
    let node = Node::build(&own, rt)?;
    Ok(connected(node, "single node", Some(lock)))
}
