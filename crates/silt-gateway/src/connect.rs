//! Where a standalone gateway (`silt gateway`) gets its client, the way the Python SDK does
//! (`silt_node::Node`):
//!
//! - a **cluster client** when the configuration names a cluster (`--etcd`, `--workers`);
//! - **attached** to the Silt that owns the state directory on this host (`silt up`): a
//!   client of that one worker over its Unix socket, sharing its cache, so the gateway and the
//!   mount read the same pages; what it changes its client tells that Silt
//!   (`silt_client::ChangeSink`, set by `Node::attach`);
//! - its **own single node** over the mounts given, when nothing serves the state directory
//!   (it then holds the directory's lock, like `silt up`).
//!
//! `silt up --gateway ADDR` needs none of this: it serves its own client.
//!
//! Writes follow the configuration's write rules (`--write-type`, `--write-rule`), as for the
//! mount. A cluster or attached gateway keeps what is its own (spilled write buffers, the
//! write-ahead log of `back` writes, multipart parts) in `STATE_DIR/gateway`, locked, so
//! it never shares them with the Silt it is attached to or another gateway.

use std::path::PathBuf;

use silt_common::config::Config;
use silt_node::local::{lock_state_dir, StateLock};
use silt_node::{Node, Role};

use crate::GatewayError;

/// The directory of a cluster or attached gateway's own state, under the state dir.
pub const OWN_DIR: &str = "gateway";
/// Where multipart parts wait, under the directory the gateway's client writes in.
pub const UPLOADS_DIR: &str = "gateway-uploads";

/// A client for the gateway, and what must live as long as it.
pub struct Connected {
    pub node: Node,
    /// How its client reaches its cache.
    pub role: Role,
    /// Where the gateway keeps multipart uploads.
    pub uploads_dir: PathBuf,
    _lock: Option<StateLock>,
}

/// Builds the gateway's client from `cfg` (see the module docs) on runtime `rt`.
pub fn connect(cfg: &Config, rt: &tokio::runtime::Runtime) -> Result<Connected, GatewayError> {
    let owner_dir = cfg.state_dir.clone();
    // A client of others: its own state in a directory of its own, locked.
    let own_state = |own: &mut Config| -> Result<StateLock, GatewayError> {
        let dir = owner_dir.join(OWN_DIR);
        silt_common::private::create_dir(&dir)
            .map_err(|e| silt_common::Error::from(e).context(format!("{}", dir.display())))?;
        let lock = lock_state_dir(&dir)?;
        own.state_dir = dir;
        Ok(lock)
    };
    let connected = |node: Node, dir: &PathBuf, lock| Connected {
        role: node.role,
        node,
        uploads_dir: dir.join(UPLOADS_DIR),
        _lock: Some(lock),
    };
    let mut own = cfg.clone();
    if own.is_cluster() {
        let mut own = silt_node::with_state_dir_secret(own, &owner_dir);
        let lock = own_state(&mut own)?;
        let node = Node::build(&own, rt)?;
        return Ok(connected(node, &own.state_dir, lock));
    }
    if silt_node::local::AttachInfo::read(&owner_dir)?.is_some() {
        let lock = own_state(&mut own)?;
        if let Some(node) = Node::attach(&own, &owner_dir, rt)? {
            return Ok(connected(node, &own.state_dir, lock));
        }
    }
    if own.mounts.is_empty() {
        return Err(GatewayError::Config(format!(
            "no Silt serves {} on this host and no mounts were given: start `silt up` (or pass --state-dir of the one running), give --mount PATH=URI, or --etcd/--workers for a cluster",
            owner_dir.display()
        )));
    }
    let lock = lock_state_dir(&owner_dir)?;
    let node = Node::build(&own, rt)?;
    Ok(connected(node, &owner_dir, lock))
}
