//! `silt csi`: the Container Storage Interface plugin that puts Silt paths into Kubernetes
//! pods' volumes.
//!
//! - Identity: the driver's name and version; it is ready once its socket serves.
//! - Node ([`node`]): NodeStageVolume starts a client mount process for the volume on the
//!   staging path (one per volume per node: every pod of the volume shares it and its cache),
//!   NodePublishVolume bind-mounts the volume's directory into the pod (read-only on request),
//!   NodeUnpublish/NodeUnstage undo them. Mount processes that die are started again onto their
//!   kept FUSE connection, so pods never meet "transport endpoint is not connected".
//! - Controller ([`controller`]): CreateVolume/DeleteVolume of directory volumes and
//!   ValidateVolumeCapabilities, for dynamic provisioning.
//!
//! The plugin speaks gRPC on a Unix socket ([`grpc`]: HTTP/2 via hyper, messages via prost,
//! written by hand from the spec in [`proto`]).

pub mod controller;
pub mod grpc;
pub mod mounts;
pub mod node;
pub mod proto;
pub mod volume;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use silt_common::config::Config;
use silt_common::metrics::{self, CsiCall};

use crate::grpc::{decode, encode, BoxFuture, Code, Handler, Status};
use crate::proto::{RpcCapability, TypeOnly};

/// The driver name when none is given (the Helm chart's default too).
pub const DEFAULT_DRIVER_NAME: &str = "csi.silt.local";

/// How the plugin runs.
pub struct Settings {
    /// The Unix socket to serve on.
    pub socket: PathBuf,
    pub driver_name: String,
    pub node_id: String,
    /// The plugin's configuration: its state dir (volumes' records and mount states), the
    /// cluster its volumes' mounts join by default, and the defaults of their options.
    pub cfg: Config,
    /// Passed on to every mount process.
    pub config_file: Option<PathBuf>,
    /// The silt executable the mount processes run.
    pub exe: PathBuf,
}

/// The three CSI services behind one socket.
pub struct Plugin {
    driver_name: String,
    pub node: Arc<node::NodeService>,
    pub controller: Arc<controller::ControllerService>,
}

impl Plugin {
    pub fn new(s: &Settings) -> std::io::Result<Arc<Self>> {
        silt_common::private::create_dir(&s.cfg.state_dir)?;
        Ok(Arc::new(Plugin {
            driver_name: s.driver_name.clone(),
            node: Arc::new(node::NodeService::new(
                s.node_id.clone(),
                s.cfg.state_dir.clone(),
                s.exe.clone(),
                s.config_file.clone(),
            )),
            controller: Arc::new(controller::ControllerService::new(s.cfg.clone())),
        }))
    }

    async fn dispatch(self: Arc<Self>, method: String, m: Bytes) -> grpc::Reply {
        let _timer = call_kind(&method).timer();
        let out = self.answer(&method, m).await;
        if out.is_err() {
            metrics::CSI_CALL_ERRORS.inc();
        }
        out
    }

    async fn answer(self: Arc<Self>, method: &str, m: Bytes) -> grpc::Reply {
        let rpc = |types: &[i32]| proto::CapabilitiesResponse {
            capabilities: types
                .iter()
                .map(|&t| RpcCapability {
                    rpc: Some(TypeOnly { r#type: t }),
                })
                .collect(),
        };
        let empty = || encode(&proto::Empty {});
        match method {
            "/csi.v1.Identity/GetPluginInfo" => encode(&proto::GetPluginInfoResponse {
                name: self.driver_name.clone(),
                vendor_version: env!("CARGO_PKG_VERSION").into(),
            }),
            "/csi.v1.Identity/GetPluginCapabilities" => {
                encode(&proto::GetPluginCapabilitiesResponse {
                    capabilities: vec![proto::PluginCapability {
                        service: Some(TypeOnly {
                            r#type: proto::PLUGIN_CONTROLLER_SERVICE,
                        }),
                    }],
                })
            }
            "/csi.v1.Identity/Probe" => encode(&proto::ProbeResponse {
                ready: Some(proto::BoolValue { value: true }),
            }),
            "/csi.v1.Controller/ControllerGetCapabilities" => {
                encode(&rpc(&[proto::CONTROLLER_CREATE_DELETE_VOLUME]))
            }
            "/csi.v1.Controller/CreateVolume" => {
                encode(&self.controller.create(decode(&m)?).await?)
            }
            "/csi.v1.Controller/DeleteVolume" => {
                self.controller.delete(decode(&m)?).await?;
                empty()
            }
            "/csi.v1.Controller/ValidateVolumeCapabilities" => {
                encode(&self.controller.validate(decode(&m)?).await?)
            }
            "/csi.v1.Node/NodeGetCapabilities" => encode(&rpc(&[
                proto::NODE_STAGE_UNSTAGE_VOLUME,
                proto::NODE_GET_VOLUME_STATS,
            ])),
            "/csi.v1.Node/NodeGetInfo" => encode(&proto::NodeGetInfoResponse {
                node_id: self.node.node_id.clone(),
                max_volumes_per_node: 0,
            }),
            "/csi.v1.Node/NodeStageVolume" => {
                self.node.stage(decode(&m)?).await?;
                empty()
            }
            "/csi.v1.Node/NodeUnstageVolume" => {
                self.node.unstage(decode(&m)?).await?;
                empty()
            }
            "/csi.v1.Node/NodePublishVolume" => {
                self.node.publish(decode(&m)?).await?;
                empty()
            }
            "/csi.v1.Node/NodeUnpublishVolume" => {
                self.node.unpublish(decode(&m)?).await?;
                empty()
            }
            "/csi.v1.Node/NodeGetVolumeStats" => encode(&self.node.stats(decode(&m)?).await?),
            _ => Err(Status::new(
                Code::Unimplemented,
                format!("{method} is not implemented by the Silt CSI plugin"),
            )),
        }
    }
}

/// The `call` label of a method's latency.
fn call_kind(method: &str) -> CsiCall {
    match method.rsplit('/').next().unwrap_or("") {
        "NodeStageVolume" => CsiCall::Stage,
        "NodeUnstageVolume" => CsiCall::Unstage,
        "NodePublishVolume" => CsiCall::Publish,
        "NodeUnpublishVolume" => CsiCall::Unpublish,
        "NodeGetVolumeStats" => CsiCall::Stats,
        "CreateVolume" => CsiCall::Create,
        "DeleteVolume" => CsiCall::Delete,
        "ValidateVolumeCapabilities" => CsiCall::Validate,
        _ => CsiCall::Other,
    }
}

impl Handler for Plugin {
    fn call(self: Arc<Self>, method: String, message: Bytes) -> BoxFuture {
        Box::pin(self.dispatch(method, message))
    }
}

/// `unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a plain path → the socket's path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(format!(
            "--endpoint {endpoint}: a Unix socket path (unix:///path/csi.sock) is expected"
        ));
    }
    Ok(PathBuf::from(path))
}

/// Serves the plugin until the future is dropped: adopts what an earlier run staged, then
/// answers calls on the socket.
pub async fn serve(plugin: Arc<Plugin>, socket: &std::path::Path) -> std::io::Result<()> {
    let listener = grpc::bind(socket)?;
    plugin.node.adopt();
    grpc::serve_on(listener, plugin).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_unix_sockets() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
        assert!(socket_path("csi.sock").is_err());
    }
}
