//! What a volume is: its attributes (a PersistentVolume's `volumeAttributes`, a StorageClass's
//! `parameters`), its secrets, its capabilities, and the ids the Controller gives it.
//!
//! Attributes:
//! - `uri`: the under-store a single-process mount serves (`s3://bucket/prefix`,
//!   `file:///srv/data`); absent, the mount is a client of the cluster the plugin is
//!   configured for (`SILT_ETCD`/`SILT_WORKERS` in its environment or config file);
//! - `path`: the directory inside that namespace the pods see (default `/`);
//! - any Silt option (docs/CONFIGURATION.md, by its config-file key: `memory_capacity`,
//!   `write_type`, ...), set for this volume's mount; secret options come only as secrets.
//!
//! Keys with a `/` (what Kubernetes adds: `csi.storage.k8s.io/pod.name`, ...) are ignored.
//! Secrets (a Secret referenced by the PersistentVolume or StorageClass): the Silt options
//! `s3_access_key_id`, `s3_secret_access_key` and `cluster_secret`, and an `azblob://`
//! volume's `azure_storage_key` or `azure_storage_sas_token`.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use silt_common::config::{env_name, Config, OPTIONS, SECRET_OPTIONS};

use crate::grpc::Status;
use crate::proto::{self, VolumeCapability};

/// How a volume is mounted on a node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MountSpec {
    pub uri: Option<String>,
    /// Absolute, normalised (`/` for the root).
    pub path: String,
    /// The mount process's environment: `SILT_*` options and secrets.
    pub env: BTreeMap<String, String>,
}

/// Options a volume may not set: where its mount lives is the plugin's to choose.
const PLUGIN_OWNED: &[&str] = &["mountpoint", "state_dir", "mounts"];
/// Secrets a volume may carry.
const SECRET_KEYS: &[&str] = &[
    "s3_access_key_id",
    "s3_secret_access_key",
    "cluster_secret",
    "azure_storage_key",
    "azure_storage_sas_token",
];

/// The environment variable a secret reaches the mount process in: Silt's own option, or,
/// for an `azblob://` volume, the variable its store reads when the URI names none.
fn secret_env(key: &str) -> String {
    match key {
        "azure_storage_key" => "AZURE_STORAGE_KEY".to_string(),
        "azure_storage_sas_token" => "AZURE_STORAGE_SAS_TOKEN".to_string(),
        _ => env_name(key),
    }
}

pub fn mount_spec(
    attributes: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<MountSpec, Status> {
    let mut spec = MountSpec {
        uri: None,
        path: "/".into(),
        env: BTreeMap::new(),
    };
    let mut probe = Config::default();
    for (k, v) in attributes {
        match k.as_str() {
            _ if k.contains('/') => {}
            "uri" => spec.uri = Some(check_uri(v)?),
            "path" => spec.path = normalise_path(v)?,
            _ if SECRET_OPTIONS.contains(&k.as_str()) => {
                return Err(Status::invalid(format!(
                    "volume attribute {k} is a secret: pass it in the volume's secret"
                )))
            }
            _ if PLUGIN_OWNED.contains(&k.as_str()) => {
                return Err(Status::invalid(format!(
                    "volume attribute {k} is the CSI plugin's to set"
                )))
            }
            _ if OPTIONS.iter().any(|o| o.name == k) => {
                probe
                    .set(k, v)
                    .map_err(|e| Status::invalid(format!("volume attribute {k}: {e}")))?;
                spec.env.insert(env_name(k), v.clone());
            }
            _ => {
                return Err(Status::invalid(format!(
                    "unknown volume attribute {k} (known: uri, path and the options of docs/CONFIGURATION.md)"
                )))
            }
        }
    }
    for (k, v) in secrets {
        if !SECRET_KEYS.contains(&k.as_str()) {
            return Err(Status::invalid(format!(
                "unknown secret key {k} (known: {})",
                SECRET_KEYS.join(", ")
            )));
        }
        spec.env.insert(secret_env(k), v.clone());
    }
    Ok(spec)
}

fn check_uri(uri: &str) -> Result<String, Status> {
    silt_ufs::StoreUri::parse(uri)
        .map_err(|e| Status::invalid(format!("volume attribute uri: {e}")))?;
    Ok(uri.to_string())
}

/// `a/b/`, `/a//b` → `/a/b`; `..` and `.` are refused (a volume stays inside its namespace).
pub fn normalise_path(p: &str) -> Result<String, Status> {
    let mut parts = Vec::new();
    for c in p.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." || c.contains('\0') {
            return Err(Status::invalid(format!(
                "volume path {p:?}: `.`, `..` and NUL are not allowed"
            )));
        }
        parts.push(c);
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Silt volumes are file systems: a mount capability (any fs type: it is ignored) in any
/// access mode; a block capability is refused.
pub fn check_capability(cap: &VolumeCapability) -> Result<(), Status> {
    if cap.block.is_some() {
        return Err(Status::invalid(
            "block volumes are not supported: Silt volumes are file systems (use a mount capability)",
        ));
    }
    if cap.mount.is_none() {
        return Err(Status::invalid("volume_capability has no access type"));
    }
    match cap.access_mode.as_ref().map(|m| m.mode) {
        Some(1..=7) => Ok(()),
        _ => Err(Status::invalid(
            "volume_capability has no known access mode",
        )),
    }
}

pub fn reads_only(cap: &VolumeCapability) -> bool {
    matches!(
        cap.access_mode.as_ref().map(|m| m.mode),
        Some(proto::MODE_SINGLE_NODE_READER_ONLY) | Some(proto::MODE_MULTI_NODE_READER_ONLY)
    )
}

/// A created volume's id: `silt:<uri>#<path>` (empty uri: the plugin's cluster). It names all
/// DeleteVolume needs, which is given nothing else.
pub fn volume_id(uri: Option<&str>, path: &str) -> String {
    format!("silt:{}#{path}", uri.unwrap_or(""))
}

/// The (uri, path) of a created volume's id; `None` for an id this plugin did not make.
pub fn parse_volume_id(id: &str) -> Option<(Option<String>, String)> {
    let rest = id.strip_prefix("silt:")?;
    let (uri, path) = rest.rsplit_once('#')?;
    let path = normalise_path(path).ok()?;
    if path == "/" {
        return None;
    }
    Some(((!uri.is_empty()).then(|| uri.to_string()), path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn attributes_become_a_mount_spec_and_bad_ones_are_named() {
        let s = mount_spec(
            &map(&[
                ("uri", "file:///srv/data"),
                ("path", "a//b/"),
                ("write_type", "through"),
                ("csi.storage.k8s.io/pod.name", "p"),
            ]),
            &map(&[("s3_secret_access_key", "k"), ("azure_storage_key", "az")]),
        )
        .unwrap();
        assert_eq!(
            s.env.get("AZURE_STORAGE_KEY").map(String::as_str),
            Some("az"),
            "an azblob:// volume's key, where its store looks when the URI names no variable"
        );
        assert_eq!(s.uri.as_deref(), Some("file:///srv/data"));
        assert_eq!(s.path, "/a/b");
        assert_eq!(
            s.env.get("SILT_WRITE_TYPE").map(String::as_str),
            Some("through")
        );
        assert_eq!(
            s.env.get("SILT_S3_SECRET_ACCESS_KEY").map(String::as_str),
            Some("k")
        );
        for bad in [
            map(&[("bogus", "1")]),
            map(&[("path", "../x")]),
            map(&[("cluster_secret", "x")]),
            map(&[("state_dir", "/tmp")]),
            map(&[("write_type", "sideways")]),
            map(&[("uri", "gopher://x")]),
        ] {
            let e = mount_spec(&bad, &HashMap::new()).unwrap_err();
            assert_eq!(e.code, 3, "{bad:?}: {e}");
        }
        assert_eq!(
            mount_spec(&HashMap::new(), &map(&[("password", "x")]))
                .unwrap_err()
                .code,
            3
        );
    }

    #[test]
    fn volume_ids_round_trip_and_foreign_ones_are_not_ours() {
        let id = volume_id(Some("s3://b/p#q"), "/volumes/pvc-1");
        assert_eq!(
            parse_volume_id(&id),
            Some((Some("s3://b/p#q".into()), "/volumes/pvc-1".into()))
        );
        assert_eq!(
            parse_volume_id(&volume_id(None, "/v/x")),
            Some((None, "/v/x".into()))
        );
        for foreign in ["", "vol-1", "silt:", "silt:file:///x#/", "silt:#/../etc"] {
            assert_eq!(parse_volume_id(foreign), None, "{foreign}");
        }
    }
}
