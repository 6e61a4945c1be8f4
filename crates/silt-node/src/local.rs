//! Same-host sharing of a node: the process that owns a state directory (a `silt up`, single
//! node or cluster client, or a Python client in mode `single`) serves its client on
//! `STATE_DIR/worker.sock` and says so in `STATE_DIR/attach.json`; other processes of the host
//! (Python clients, DataLoader workers, pods given the directory) attach to it as cluster
//! clients of that one worker instead of opening a second cache over the same directory. The socket is owner-only and every connection proves the
//! state directory's cluster secret (docs/SECURITY.md), like any worker connection.

use std::fs::File;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use silt_client::Client;
use silt_cluster::rpc::{Change, FixedStores, Service, StoreResolver};
use silt_cluster::{local_host_id, ClusterKey, Member};
use silt_common::{Error, ErrorKind, Result};

/// What an attaching process reads to find the owner of a state directory.
pub const ATTACH_FILE: &str = "attach.json";
/// The owner's worker socket.
pub const LOCAL_SOCKET: &str = "worker.sock";

/// `STATE_DIR/attach.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachInfo {
    /// Worker id of the owner (`local-PID`).
    pub id: String,
    /// Its Unix socket.
    pub uds: String,
    /// Its host id: only a process of the same host (and network namespace) may attach.
    pub host: String,
    /// The namespace it serves, `PATH=URI,...`.
    pub mounts: String,
    pub pid: u32,
    /// Its sync policy and rules when it started serving (`sync_policy`, `sync_rules`
    /// syntax): an attached client keeps its own metadata by them too, so the owner's policy
    /// holds for it (absent in an older owner's file).
    #[serde(default)]
    pub sync_policy: Option<String>,
    #[serde(default)]
    pub sync_rules: Option<String>,
}

impl AttachInfo {
    /// The owner of `state_dir`, if one serves it now: the file names a live process on this
    /// host (or its socket takes a connection) whose socket exists. `Ok(None)` when nothing
    /// serves it.
    pub fn read(state_dir: &Path) -> Result<Option<AttachInfo>> {
        let path = state_dir.join(ATTACH_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::from(e).context(path.display().to_string())),
        };
        let info: AttachInfo = serde_json::from_str(&text).map_err(|e| {
            Error::new(
                ErrorKind::Corrupted,
                format!("{}: not an attach file: {e}", path.display()),
            )
        })?;
        // The socket is always the state directory's own, named as this process sees that
        // directory: a container may be given it at another path than the owner's.
        let uds = state_dir.join(LOCAL_SOCKET);
        if !uds.exists() {
            return Ok(None);
        }
        let info = AttachInfo {
            uds: uds.display().to_string(),
            ..info
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(info.pid as libc::pid_t, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        let here = local_host_id();
        if alive && info.host == here {
            return Ok(Some(info));
        }
        // Another PID or network namespace than the owner's (a container given the state
        // directory: its PID is not ours to see, its host id names another namespace): the
        // owner is alive, and on this kernel, if its socket takes a connection (a socket file
        // left by a dead owner, or one on a file system shared with another host, refuses).
        // It is then served as on its own host: over that socket, descriptors passed. The
        // connection's handshake still proves the state directory's secret.
        match std::os::unix::net::UnixStream::connect(&info.uds) {
            Ok(_) => Ok(Some(AttachInfo { host: here, ..info })),
            Err(_) => Ok(None),
        }
    }

    /// The owner as the one member of a static cluster.
    pub fn member(&self) -> Member {
        Member {
            id: self.id.clone(),
            // Never dialled: the socket is always used on the same host (see `Node::attach`).
            addr: format!("unix:{}", self.uds),
            host: self.host.clone(),
            uds: Some(self.uds.clone()),
            capacity: 0,
        }
    }
}

/// Holds a state directory's lock for the life of the value (released when the fd closes).
pub struct StateLock {
    _file: File,
}

/// Takes `dir`'s lock (`dir/lock`, the one every Silt process owning a state directory
/// takes), creating the directory owner-only. `Busy` when another process holds it.
pub fn lock_state_dir(dir: &Path) -> Result<StateLock> {
    silt_common::private::create_dir(dir)
        .map_err(|e| Error::from(e).context(format!("creating state dir {}", dir.display())))?;
    let path = dir.join("lock");
    let mut file = silt_common::private::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| Error::from(e).context(format!("opening {}", path.display())))?;
    // SAFETY: flock on an fd we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(Error::new(
            ErrorKind::Busy,
            format!(
                "state dir {} is in use by another silt process (pid {}); stop it (`silt down`) or pass --state-dir",
                dir.display(),
                holder.trim()
            ),
        ));
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(StateLock { _file: file })
}

/// Waits (blocking) until what the node learned so far is shown by its other front ends: a
/// mount's kernel caches told of every change (`FuseState::wait_for_invalidations`).
pub type Settled = Arc<dyn Fn() + Send + Sync>;

/// The serving side: removes the socket and the attach file when dropped.
pub struct LocalService {
    dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
    /// What `attach.json` says, rewritten when the client's sync rules change.
    info: std::sync::Mutex<AttachInfo>,
}

/// The stores this node serves to attached clients, with what its namespace knows of files.
struct OwnerStores {
    stores: FixedStores,
    /// Weak: the service must not keep the client alive.
    client: std::sync::Weak<Client>,
}

#[async_trait::async_trait]
impl StoreResolver for OwnerStores {
    async fn store(&self, uri: &str) -> Result<silt_ufs::DynStore> {
        self.stores.store(uri).await
    }

    async fn known_file(&self, uri: &str, path: &str) -> Option<silt_ufs::ObjectMeta> {
        let client = self.client.upgrade()?;
        let entry = client
            .stat(&namespace_path(&client, uri, path)?)
            .await
            .ok()?;
        let meta = stored_meta(&entry)?;
        (meta.path.trim_matches('/') == path.trim_matches('/')).then_some(meta)
    }

    async fn known_listing(&self, uri: &str, dir: &str) -> Option<Vec<silt_ufs::ObjectMeta>> {
        let client = self.client.upgrade()?;
        let ns_dir = namespace_path(&client, uri, dir)?;
        let entries = client.list(&ns_dir).await.ok()?;
        // All or nothing: one entry the store would not list as it is (a file being written,
        // a name the namespace made) and the store is asked.
        entries.iter().map(stored_meta).collect()
    }
}

/// The namespace path of the mount whose store is `uri`.
fn mount_of(client: &Client, uri: &str) -> Option<String> {
    let ns = client.namespace();
    Some(
        ns.mounts()
            .iter()
            .find(|m| m.store.uri() == uri)?
            .path
            .clone(),
    )
}

/// The namespace path of `path` in the store `uri`.
fn namespace_path(client: &Client, uri: &str, path: &str) -> Option<String> {
    let mount = mount_of(client, uri)?;
    match (mount.as_str(), path.trim_matches('/')) {
        (m, "") => Some(m.to_string()),
        ("/", rel) => Some(format!("/{rel}")),
        (m, rel) => Some(format!("{m}/{rel}")),
    }
}

/// What the store holds for `entry`, if the entry is the stored object as it is (a file being
/// written here shows its live size, not the stored one).
fn stored_meta(entry: &silt_client::Entry) -> Option<silt_ufs::ObjectMeta> {
    let obj = entry.object.as_ref()?;
    (entry.kind == obj.meta.kind
        && (entry.kind != silt_ufs::EntryKind::File || entry.size == obj.meta.size))
        .then(|| obj.meta.clone())
}

impl LocalService {
    /// Serves `client`'s page store (a single node's) on `STATE_DIR/worker.sock` and writes
    /// the attach file. The caller holds the state directory's lock. An attached client's
    /// reported change is answered after `settled` returned, if given.
    pub fn start(
        client: &Arc<Client>,
        state_dir: &Path,
        key: ClusterKey,
        rt: &tokio::runtime::Handle,
        settled: Option<Settled>,
    ) -> Result<LocalService> {
        let uds = state_dir.join(LOCAL_SOCKET);
        let _ = std::fs::remove_file(&uds);
        let listener = {
            let _guard = rt.enter();
            tokio::net::UnixListener::bind(&uds)
                .map_err(|e| Error::from(e).context(format!("binding {}", uds.display())))?
        };
        silt_common::private::restrict(&uds)
            .map_err(|e| Error::from(e).context(format!("restricting {}", uds.display())))?;
        let id = format!("local-{}", std::process::id());
        let stores = OwnerStores {
            stores: FixedStores(
                client
                    .namespace()
                    .mounts()
                    .iter()
                    .map(|m| m.store.clone())
                    .collect(),
            ),
            client: Arc::downgrade(client),
        };
        // An attached client's write: revalidate the directory (one listing) before
        // answering, so this node and its mount list the new entries. Weak: the service must
        // not keep the client alive.
        let weak = Arc::downgrade(client);
        // An attached client's free: this node's mount drops its kernel's copy too.
        // An attached recursive sync: the tree, in one recursive listing.
        let on_changed = move |dir: String,
                               change: Change|
              -> futures::future::BoxFuture<'static, ()> {
            let client = weak.upgrade();
            let settled = settled.clone();
            Box::pin(async move {
                let Some(client) = client else { return };
                if change == Change::Freed {
                    match client.walk_files(&dir).await {
                        Ok(files) => client.freed_here(&files),
                        Err(e) => {
                            tracing::debug!(path = %dir, error = %e, "an attached free not passed to the mount")
                        }
                    }
                } else if let Err(e) = client.sync(&dir, change == Change::Below).await {
                    tracing::debug!(dir = %dir, error = %e, "revalidation after an attached change failed");
                }
                if let Some(settled) = settled {
                    let _ = tokio::task::spawn_blocking(move || settled()).await;
                }
            })
        };
        let svc = Arc::new(
            Service::new(
                client.page_reader().clone(),
                Arc::new(stores),
                silt_cluster::rpc::answer::Identity::new(id.clone()).at(uds.display().to_string()),
                key,
            )
            .with_changed(Arc::new(on_changed))
            .with_store_calls(),
        );
        let task = rt.spawn(silt_cluster::rpc::serve_unix(listener, svc));
        let (sync_policy, sync_rules) = sync_rules_text(client);
        let info = AttachInfo {
            id,
            uds: uds.display().to_string(),
            host: local_host_id(),
            mounts: crate::mount_table_text(&crate::client_mounts(client)),
            pid: std::process::id(),
            sync_policy: Some(sync_policy),
            sync_rules: Some(sync_rules),
        };
        write_attach_file(state_dir, &info)?;
        Ok(LocalService {
            dir: state_dir.to_path_buf(),
            task,
            info: std::sync::Mutex::new(info),
        })
    }

    /// Rewrites `attach.json` with `client`'s sync rules as they are now (after `silt fs
    /// sync-policy`): a client attaching from now on keeps its metadata by them. One attached
    /// before keeps the rules it attached with.
    pub fn rules_changed(&self, client: &Client) -> Result<()> {
        let mut info = self.info.lock().unwrap_or_else(|e| e.into_inner());
        let (policy, rules) = sync_rules_text(client);
        info.sync_policy = Some(policy);
        info.sync_rules = Some(rules);
        write_attach_file(&self.dir, &info)
    }
}

/// `client`'s sync policy and rules in the options' syntax (`sync_policy`, `sync_rules`).
fn sync_rules_text(client: &Client) -> (String, String) {
    let rules = client.sync_rules();
    let text = rules
        .rules()
        .map(|r| format!("{}={}", r.prefix, r.policy))
        .collect::<Vec<_>>()
        .join(",");
    (rules.default_policy().to_string(), text)
}

/// Writes `STATE_DIR/attach.json` whole under another name, then renames it: a reader never
/// sees half of it.
fn write_attach_file(state_dir: &Path, info: &AttachInfo) -> Result<()> {
    let tmp = state_dir.join(format!("{ATTACH_FILE}.tmp"));
    let text = serde_json::to_string(info).map_err(|e| Error::internal(e.to_string()))?;
    let _ = std::fs::remove_file(&tmp);
    silt_common::private::options()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, state_dir.join(ATTACH_FILE)))
        .map_err(|e| Error::from(e).context(format!("writing {}", tmp.display())))
}

impl Drop for LocalService {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(self.dir.join(ATTACH_FILE));
        let _ = std::fs::remove_file(self.dir.join(LOCAL_SOCKET));
    }
}
