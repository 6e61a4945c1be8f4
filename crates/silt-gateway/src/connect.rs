//! Where a standalone gateway (`silt gateway`) gets its client: `silt_node::connect`, the one
//! decision it shares with the Python SDK (a cluster client when the configuration names a
//! cluster, else attached to the Silt that owns the state directory on this host, else its
//! own single node over the mounts given). What is the gateway's own in it:
//!
//! - a cluster or attached gateway keeps what is its own (spilled write buffers, the
//!   write-ahead log of `back` writes, multipart parts) in `STATE_DIR/gateway`, locked, so it
//!   never shares them with the Silt it is attached to or another gateway;
//! - its single node serves only the gateway (no socket for the host's other processes);
//! - a state directory locked by another process is refused at once.
//!
//! `silt up --gateway ADDR` needs none of this: it serves its own client.
//!
//! Writes follow the configuration's write rules (`--write-type`, `--write-rule`), as for the
//! mount.

use std::path::PathBuf;
use std::time::Duration;

use silt_common::config::Config;
use silt_node::connect::{OwnDir, Words};
use silt_node::{Node, Role};

use crate::GatewayError;

/// The directory of a cluster or attached gateway's own state, under the state dir.
pub const OWN_DIR: &str = "gateway";
/// Where multipart parts wait, under the directory the gateway's client writes in.
pub const UPLOADS_DIR: &str = "gateway-uploads";

/// A client for the gateway, and what must live as long as it.
pub struct Connected(silt_node::connect::Connected);

impl Connected {
    pub fn node(&self) -> &Node {
        &self.0.node
    }

    /// How its client reaches its cache.
    pub fn role(&self) -> Role {
        self.0.role()
    }

    /// Where the gateway keeps multipart uploads.
    pub fn uploads_dir(&self) -> PathBuf {
        self.0.state_dir().join(UPLOADS_DIR)
    }
}

/// Builds the gateway's client from `cfg` (see the module docs) on runtime `rt`.
pub fn connect(cfg: &Config, rt: &tokio::runtime::Runtime) -> Result<Connected, GatewayError> {
    let opts = silt_node::connect::Options {
        want: None,
        own_dir: OwnDir::Locked(cfg.state_dir.join(OWN_DIR)),
        share: false,
        owner_wait: Duration::ZERO,
        words: Words {
            role: "role",
            mounts: "--mount PATH=URI",
            cluster: "--etcd http://HOST:2379 or --workers ID=HOST:PORT,...",
            state_dir: "--state-dir",
            own_dir: "--state-dir",
        },
    };
    Ok(Connected(silt_node::connect::connect(cfg, &opts, rt)?))
}
