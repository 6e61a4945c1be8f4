//! The messages of the CSI spec (`csi.v1`) that this plugin reads or writes, written by hand
//! with the spec's field numbers (no code generation, no protoc at build time). Fields the
//! plugin does not use are left out: protobuf skips unknown fields when decoding, and a field
//! never written reads as its default on the other side.

use std::collections::HashMap;

/// `google.protobuf.BoolValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    #[prost(bool, tag = "1")]
    pub value: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub vendor_version: String,
}

/// `PluginCapability` with its `service` arm (the only one used).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapability {
    #[prost(message, optional, tag = "1")]
    pub service: Option<TypeOnly>,
}

/// The `{ Type type = 1; }` message that every capability arm wraps.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeOnly {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<PluginCapability>,
}

/// `PluginCapability.Service.Type.CONTROLLER_SERVICE`.
pub const PLUGIN_CONTROLLER_SERVICE: i32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

/// `ControllerServiceCapability` and `NodeServiceCapability` share this shape: `rpc = 1`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcCapability {
    #[prost(message, optional, tag = "1")]
    pub rpc: Option<TypeOnly>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<RpcCapability>,
}

/// `ControllerServiceCapability.RPC.Type.CREATE_DELETE_VOLUME`.
pub const CONTROLLER_CREATE_DELETE_VOLUME: i32 = 1;
/// `NodeServiceCapability.RPC.Type` values.
pub const NODE_STAGE_UNSTAGE_VOLUME: i32 = 1;
pub const NODE_GET_VOLUME_STATS: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct MountVolume {
    #[prost(string, tag = "1")]
    pub fs_type: String,
    #[prost(string, repeated, tag = "2")]
    pub mount_flags: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AccessMode {
    #[prost(int32, tag = "1")]
    pub mode: i32,
}

/// `VolumeCapability.AccessMode.Mode` values that only read.
pub const MODE_SINGLE_NODE_READER_ONLY: i32 = 2;
pub const MODE_MULTI_NODE_READER_ONLY: i32 = 3;

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    /// `BlockVolume block = 1` (an empty message: presence is what counts).
    #[prost(message, optional, tag = "1")]
    pub block: Option<Empty>,
    #[prost(message, optional, tag = "2")]
    pub mount: Option<MountVolume>,
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<AccessMode>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CapacityRange {
    #[prost(int64, tag = "1")]
    pub required_bytes: i64,
    #[prost(int64, tag = "2")]
    pub limit_bytes: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateVolumeRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub capacity_range: Option<CapacityRange>,
    #[prost(message, repeated, tag = "3")]
    pub volume_capabilities: Vec<VolumeCapability>,
    #[prost(map = "string, string", tag = "4")]
    pub parameters: HashMap<String, String>,
    #[prost(map = "string, string", tag = "5")]
    pub secrets: HashMap<String, String>,
    /// `VolumeContentSource` (snapshot or clone): refused when present.
    #[prost(message, optional, tag = "6")]
    pub volume_content_source: Option<Empty>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Volume {
    #[prost(int64, tag = "1")]
    pub capacity_bytes: i64,
    #[prost(string, tag = "2")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "3")]
    pub volume_context: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateVolumeResponse {
    #[prost(message, optional, tag = "1")]
    pub volume: Option<Volume>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub secrets: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValidateVolumeCapabilitiesRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub volume_context: HashMap<String, String>,
    #[prost(message, repeated, tag = "3")]
    pub volume_capabilities: Vec<VolumeCapability>,
    #[prost(map = "string, string", tag = "4")]
    pub parameters: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Confirmed {
    #[prost(map = "string, string", tag = "1")]
    pub volume_context: HashMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    pub volume_capabilities: Vec<VolumeCapability>,
    #[prost(map = "string, string", tag = "3")]
    pub parameters: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValidateVolumeCapabilitiesResponse {
    #[prost(message, optional, tag = "1")]
    pub confirmed: Option<Confirmed>,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeStageVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(message, optional, tag = "4")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(map = "string, string", tag = "5")]
    pub secrets: HashMap<String, String>,
    #[prost(map = "string, string", tag = "6")]
    pub volume_context: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnstageVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub staging_target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(string, tag = "4")]
    pub target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    #[prost(map = "string, string", tag = "7")]
    pub secrets: HashMap<String, String>,
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub volume_path: String,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeUsage {
    #[prost(int64, tag = "1")]
    pub available: i64,
    #[prost(int64, tag = "2")]
    pub total: i64,
    #[prost(int64, tag = "3")]
    pub used: i64,
    /// 1 bytes, 2 inodes.
    #[prost(int32, tag = "4")]
    pub unit: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsResponse {
    #[prost(message, repeated, tag = "1")]
    pub usage: Vec<VolumeUsage>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    #[prost(string, tag = "1")]
    pub node_id: String,
    #[prost(int64, tag = "2")]
    pub max_volumes_per_node: i64,
}
