//! The Controller service: dynamic volumes are directories. CreateVolume makes
//! `<basePath>/<name>` in the namespace the StorageClass names (`uri`, or the plugin's
//! cluster), DeleteVolume removes it with everything in it, ValidateVolumeCapabilities checks
//! it exists. Each goes through an in-process Silt client of that namespace (one per source,
//! kept; its state under `STATE_DIR/controller/`). Capacity is not enforced (a directory has
//! none): volumes report capacity 0, "unknown".

use std::collections::HashMap;
use std::sync::Arc;

use silt_client::Client;
use silt_common::config::Config;
use silt_common::ErrorKind;
use silt_node::local::StateLock;
use silt_node::Node;

use crate::grpc::{Code, Status};
use crate::proto;
use crate::volume;

/// The default `basePath` of created volumes.
pub const DEFAULT_BASE: &str = "/volumes";

struct Source {
    node: Node,
    _lock: StateLock,
}

pub struct ControllerService {
    /// The plugin's configuration: the cluster (if any) and defaults of every client.
    cfg: Config,
    /// The controller's clients run here (building one blocks on its runtime); made at the
    /// first controller call, so a node plugin that never gets one never starts it.
    rt: parking_lot::Mutex<Option<Arc<tokio::runtime::Runtime>>>,
    sources: parking_lot::Mutex<HashMap<String, Arc<Source>>>,
}

impl ControllerService {
    pub fn new(cfg: Config) -> Self {
        ControllerService {
            cfg,
            rt: parking_lot::Mutex::new(None),
            sources: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    fn runtime(&self) -> Result<Arc<tokio::runtime::Runtime>, Status> {
        let mut rt = self.rt.lock();
        if let Some(rt) = &*rt {
            return Ok(rt.clone());
        }
        let made = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("silt-csi-controller")
            .enable_all()
            .build()
            .map(Arc::new)
            .map_err(|e| Status::internal(format!("starting the controller's runtime: {e}")))?;
        *rt = Some(made.clone());
        Ok(made)
    }

    /// Runs `op` with the client of `uri` (or the cluster) on the controller's runtime.
    async fn with_client<T, F, Fut>(
        self: &Arc<Self>,
        uri: Option<String>,
        op: F,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Client>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, Status>> + Send + 'static,
    {
        let me = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A plain thread: building a client blocks on the controller's runtime, which must
        // not happen on one of the server runtime's threads.
        std::thread::spawn(move || {
            let out = me.runtime().and_then(|rt| {
                let s = me.source(uri.as_deref(), &rt)?;
                rt.block_on(op(s.node.client.clone()))
            });
            let _ = tx.send(out);
        });
        rx.await
            .unwrap_or_else(|_| Err(Status::internal("the controller's client thread died")))
    }

    fn source(
        &self,
        uri: Option<&str>,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Arc<Source>, Status> {
        let key = uri.unwrap_or("").to_string();
        if let Some(s) = self.sources.lock().get(&key) {
            return Ok(s.clone());
        }
        let mut cfg = self.cfg.clone();
        let h = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
        cfg.state_dir = self
            .cfg
            .state_dir
            .join("controller")
            .join(format!("{h:016x}"));
        match uri {
            Some(uri) => {
                cfg.mounts.clear();
                cfg.etcd.clear();
                cfg.workers.clear();
                cfg.set("mounts", &format!("/={uri}"))
                    .map_err(|e| Status::invalid(format!("parameter uri: {e}")))?;
            }
            None if !cfg.is_cluster() => {
                return Err(Status::invalid(
                    "no uri parameter, and the plugin names no cluster (SILT_ETCD or SILT_WORKERS)",
                ))
            }
            None => {}
        }
        // The controller makes and removes directories whatever the volumes' write type.
        cfg.set("write_type", "through")
            .map_err(|e| Status::internal(e.to_string()))?;
        cfg.write_rules.clear();
        silt_common::private::create_dir(&cfg.state_dir)
            .map_err(|e| Status::internal(format!("{}: {e}", cfg.state_dir.display())))?;
        let lock = silt_node::local::lock_state_dir(&cfg.state_dir)
            .map_err(|e| Status::internal(e.to_string()))?;
        let node = Node::build(&cfg, rt).map_err(|e| {
            Status::new(
                Code::Unavailable,
                format!("connecting to {}: {e}", uri.unwrap_or("the cluster")),
            )
        })?;
        let s = Arc::new(Source { node, _lock: lock });
        self.sources.lock().insert(key, s.clone());
        Ok(s)
    }

    pub async fn create(
        self: &Arc<Self>,
        req: proto::CreateVolumeRequest,
    ) -> Result<proto::CreateVolumeResponse, Status> {
        if req.name.is_empty() {
            return Err(Status::invalid("name is required"));
        }
        if req.name.contains(['/', '#', '\0']) || req.name == "." || req.name == ".." {
            return Err(Status::invalid(format!(
                "volume name {:?} is not one path component",
                req.name
            )));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid("volume_capabilities are required"));
        }
        for cap in &req.volume_capabilities {
            volume::check_capability(cap)?;
        }
        if req.volume_content_source.is_some() {
            return Err(Status::invalid(
                "volumes from snapshots or clones are not supported",
            ));
        }
        let mut context: HashMap<String, String> = HashMap::new();
        let mut base = DEFAULT_BASE.to_string();
        for (k, v) in &req.parameters {
            match k.as_str() {
                "basePath" => base = volume::normalise_path(v)?,
                _ if k.contains('/') => {}
                _ => {
                    context.insert(k.clone(), v.clone());
                }
            }
        }
        // The parameters must make a mountable volume: checked now, not at the first pod.
        volume::mount_spec(&context, &HashMap::new())?;
        let uri = context.get("uri").cloned();
        let path = format!("{}/{}", base.trim_end_matches('/'), req.name);
        let dir = path.clone();
        self.with_client(
            uri.clone(),
            move |c| async move { mkdir_all(&c, &dir).await },
        )
        .await?;
        context.insert("path".into(), path.clone());
        Ok(proto::CreateVolumeResponse {
            volume: Some(proto::Volume {
                capacity_bytes: 0,
                volume_id: volume::volume_id(uri.as_deref(), &path),
                volume_context: context,
            }),
        })
    }

    pub async fn delete(self: &Arc<Self>, req: proto::DeleteVolumeRequest) -> Result<(), Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid("volume_id is required"));
        }
        // An id this plugin never made names no volume: deleted already, as far as it knows.
        let Some((uri, path)) = volume::parse_volume_id(&req.volume_id) else {
            return Ok(());
        };
        self.with_client(uri, move |c| async move {
            // Pods may have written through other clients: list the store, not the cache.
            let _ = c.invalidate(&path).await;
            remove_all(&c, &path).await
        })
        .await
    }

    pub async fn validate(
        self: &Arc<Self>,
        req: proto::ValidateVolumeCapabilitiesRequest,
    ) -> Result<proto::ValidateVolumeCapabilitiesResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid("volume_id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid("volume_capabilities are required"));
        }
        let Some((uri, path)) = volume::parse_volume_id(&req.volume_id) else {
            return Err(Status::not_found(format!("no volume {}", req.volume_id)));
        };
        let p = path.clone();
        let exists = self
            .with_client(uri, move |c| async move {
                let _ = c.invalidate(&p).await;
                match c.stat(&p).await {
                    Ok(e) => Ok(e.is_dir()),
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(status_of(e)),
                }
            })
            .await?;
        if !exists {
            return Err(Status::not_found(format!(
                "no volume {} ({path} does not exist)",
                req.volume_id
            )));
        }
        if let Some(bad) = req
            .volume_capabilities
            .iter()
            .find_map(|c| volume::check_capability(c).err())
        {
            return Ok(proto::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: bad.message,
            });
        }
        Ok(proto::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(proto::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
            }),
            message: String::new(),
        })
    }
}

fn status_of(e: silt_common::Error) -> Status {
    let code = match e.kind() {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::InvalidInput | ErrorKind::NotADirectory => Code::InvalidArgument,
        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::RateLimited => Code::Unavailable,
        ErrorKind::AlreadyExists
        | ErrorKind::Busy
        | ErrorKind::NotEmpty
        | ErrorKind::ReadOnly
        | ErrorKind::NoSpace => Code::FailedPrecondition,
        ErrorKind::PermissionDenied | ErrorKind::NotPermitted => Code::PermissionDenied,
        _ => Code::Internal,
    };
    Status::new(code, e.to_string())
}

/// `mkdir -p` through the client (a directory that exists is fine: CreateVolume is
/// idempotent).
async fn mkdir_all(c: &Client, path: &str) -> Result<(), Status> {
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        match c.mkdir(&at).await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => match c.stat(&at).await {
                Ok(entry) if entry.is_dir() => {}
                Ok(_) => {
                    return Err(Status::new(
                        Code::AlreadyExists,
                        format!("{at} exists and is not a directory"),
                    ))
                }
                Err(e) => return Err(status_of(e)),
            },
            Err(e) => return Err(status_of(e)),
        }
    }
    Ok(())
}

/// `rm -r` through the client; a path already gone is fine.
async fn remove_all(c: &Client, path: &str) -> Result<(), Status> {
    let mut dirs = vec![path.to_string()];
    let mut order = Vec::new();
    while let Some(dir) = dirs.pop() {
        let entries = match c.list(&dir).await {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(status_of(e)),
        };
        for e in entries.iter() {
            let child = format!("{}/{}", dir.trim_end_matches('/'), e.name());
            if e.is_dir() {
                dirs.push(child);
            } else {
                match c.remove_file(&child).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(status_of(e)),
                }
            }
        }
        order.push(dir);
    }
    // Deepest first: every directory is empty by the time it is removed.
    for dir in order.iter().rev() {
        match c.rmdir(dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(status_of(e)),
        }
    }
    Ok(())
}
