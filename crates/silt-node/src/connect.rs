//! How a front end that may share a host's cache gets its client: the one decision the S3
//! gateway (`silt gateway`) and the Python SDK make, written once. In order:
//!
//! - a **cluster client** when the configuration names a cluster (etcd or static workers);
//! - **attached** to the single node that owns the state directory on this host (a `silt up`,
//!   a Python process's single node: [`crate::local`]), when one serves it: a client of that
//!   one worker over its Unix socket, sharing its cache and telling it of every change;
//! - its **own single node** over the mounts given, owning the state directory (its lock);
//! - else a clear error: nothing to attach to and nothing to serve.
//!
//! A role asked for ([`Options::want`]) skips the others, and is refused when it cannot be
//! had. What differs between the front ends is in [`Options`]: where a client of others keeps
//! its own state ([`OwnDir`]), whether a single node also serves the host's other processes
//! ([`Options::share`]), how long a process that finds the state directory locked waits for
//! its owner to serve it ([`Options::owner_wait`]), and how its users give what a refusal asks
//! for ([`Words`]).
//!
//! The daemon (`silt up`, `silt mount`) and the CSI controller never attach: each owns its
//! state directory (`local::lock_state_dir`, `Node::build`), so they do not come here.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use silt_cluster::auth::cluster_key;
use silt_common::config::Config;
use silt_common::write::{WriteRules, WriteType};
use silt_common::{Error, ErrorKind, Result};

use crate::local::{lock_state_dir, AttachInfo, LocalService, StateLock};
use crate::{Node, Role};

/// Where a client of others (a cluster or attached client) keeps what is its own: spilled
/// write buffers, the write-ahead log of `back` writes, and whatever else its front end keeps
/// there. Never the owner's state directory: that is the owner's.
#[derive(Clone, Debug)]
pub enum OwnDir {
    /// This directory, created owner-only and locked for the client's life, so no other
    /// process shares it (the gateway's `STATE_DIR/gateway`).
    Locked(PathBuf),
    /// This directory as given (the SDK's `client_dir`): its user keeps it to itself.
    Given(PathBuf),
    /// A private temporary directory, removed with the client. Refused when `back` writes
    /// are configured: they are acknowledged from a log that must outlive the process.
    Temporary,
}

/// How a front end's users give what a refusal asks for, in the front end's syntax.
#[derive(Clone, Copy, Debug)]
pub struct Words {
    /// What picks the role: `mode` (Python).
    pub role: &'static str,
    /// How mounts are given: `--mount PATH=URI`.
    pub mounts: &'static str,
    /// How a cluster is named: `--etcd http://HOST:2379 or --workers ID=HOST:PORT,...`.
    pub cluster: &'static str,
    /// How the state directory is named: `--state-dir`.
    pub state_dir: &'static str,
    /// How a client of others is given a directory of its own, for `back` writes
    /// ([`OwnDir::Temporary`] only): `client_dir=DIR`.
    pub own_dir: &'static str,
}

/// What differs between the front ends that connect here.
#[derive(Clone, Debug)]
pub struct Options {
    /// The role asked for; `None` (auto): the first that applies (see the module docs).
    pub want: Option<Role>,
    /// Where a cluster or attached client keeps its own state.
    pub own_dir: OwnDir,
    /// A single node also serves the host's other processes as `silt up` does: its cache on
    /// the state directory's socket ([`LocalService`]), its metadata cache kept across
    /// restarts ([`Node::keep_metadata`], saved again at [`Connected::close`]) and TTL'd pages
    /// swept ([`Node::keep_sweeping_ttl`]). The SDK's does; the gateway's serves only itself.
    pub share: bool,
    /// In auto mode, when the state directory is locked by another process that does not
    /// serve it yet (a sibling DataLoader worker or a `silt up` starting), how long to wait
    /// for it to serve it and attach then. Zero: refused at once, as the lock says.
    pub owner_wait: Duration,
    pub words: Words,
}

/// A connected client and what must live as long as it.
pub struct Connected {
    // Dropped first: attached processes stop reaching this node before it goes away.
    local: Option<LocalService>,
    pub node: Node,
    owner_dir: PathBuf,
    state_dir: PathBuf,
    /// Save the metadata cache at close (a shared single node).
    save_metadata: bool,
    _lock: Option<StateLock>,
    _temp: Option<tempfile::TempDir>,
}

impl Connected {
    /// How its client reaches its cache.
    pub fn role(&self) -> Role {
        self.node.role
    }

    /// The state directory it owns (single) or attached to; for a cluster client the one its
    /// configuration named.
    pub fn owner_dir(&self) -> &Path {
        &self.owner_dir
    }

    /// Where its own state lives: the owner directory for a single node, else its
    /// [`OwnDir`].
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Stops serving the host's other processes (they fail over to reading the stores) and
    /// saves what the next start can reuse. Called before the runtime stops; the state
    /// directory stays locked until the value is dropped. Done once; dropping does it too.
    pub fn close(&mut self) {
        self.local.take();
        if std::mem::take(&mut self.save_metadata) {
            let snapshot = self.owner_dir.join(crate::METADATA_SNAPSHOT);
            if let Err(e) = self.node.client.save_metadata(&snapshot) {
                tracing::warn!(error = %e, "could not save the metadata cache");
            }
        }
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.close();
    }
}

impl Words {
    /// `auto` (`None`) or a role's word ([`Role::parse`], the earlier `embedded` and
    /// `attach` too), as the front end's role option takes it.
    pub fn want(&self, word: &str) -> Result<Option<Role>> {
        if word == "auto" {
            return Ok(None);
        }
        Role::parse(word).map(Some).ok_or_else(|| {
            Error::invalid(format!(
                "{} {word:?}: expected auto, single, attached or cluster",
                self.role
            ))
        })
    }
}

/// Connects as the module docs say: `cfg.state_dir` is the owner's state directory.
pub fn connect(cfg: &Config, opts: &Options, rt: &tokio::runtime::Runtime) -> Result<Connected> {
    let owner_dir = cfg.state_dir.clone();
    let w = &opts.words;
    let want = opts.want;
    if cfg.is_cluster() {
        if let Some(r) = want.filter(|&r| r != Role::Cluster) {
            return Err(Error::invalid(format!(
                "{} {}, but etcd or workers were given: they name a cluster ({} cluster)",
                w.role,
                r.word(),
                w.role
            )));
        }
        let own = crate::with_state_dir_secret(cfg.clone(), &owner_dir);
        let (own, lock, temp) = own_state(own, opts)?;
        let node = Node::build(&own, rt)?;
        return Ok(client_of_others(node, owner_dir, own, lock, temp));
    }
    if want == Some(Role::Cluster) {
        return Err(Error::invalid(format!(
            "{} cluster needs {}",
            w.role, w.cluster
        )));
    }
    if want != Some(Role::Single) {
        if let Some(c) = attach(cfg, opts, rt)? {
            return Ok(c);
        }
    }
    if want == Some(Role::Attached) {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "no Silt serves {} on this host: start `silt up` (or give {} for a single node)",
                owner_dir.display(),
                w.mounts
            ),
        ));
    }
    if cfg.mounts.is_empty() {
        return Err(Error::invalid(format!(
            "no Silt serves {} on this host and no mounts were given: start `silt up` (or give the {} of the one running), give {} for a single node, or name a cluster ({})",
            owner_dir.display(),
            w.state_dir,
            w.mounts,
            w.cluster
        )));
    }
    match lock_state_dir(&owner_dir) {
        Ok(lock) => single(cfg, opts, lock, rt),
        Err(e) if e.kind() == ErrorKind::Busy && want.is_none() && !opts.owner_wait.is_zero() => {
            // Another process owns it and is starting to serve it (a sibling worker won the
            // lock): attach once it does.
            let until = Instant::now() + opts.owner_wait;
            while Instant::now() < until {
                if let Some(c) = attach(cfg, opts, rt)? {
                    return Ok(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e.context(format!(
                "its owner did not start serving it within {:?}",
                opts.owner_wait
            )))
        }
        Err(e) if e.kind() == ErrorKind::Busy && want == Some(Role::Single) => {
            // A DataLoader worker of a single-node parent asking for `single` itself.
            Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "{e}; a single node owns its state directory alone: leave {} auto (or attached) to share the cache of the process that owns it, as DataLoader workers do",
                    w.role
                ),
            ))
        }
        Err(e) => Err(e),
    }
}

/// Attached to the owner of `cfg.state_dir`, if one serves it.
fn attach(cfg: &Config, opts: &Options, rt: &tokio::runtime::Runtime) -> Result<Option<Connected>> {
    let owner_dir = &cfg.state_dir;
    if AttachInfo::read(owner_dir)?.is_none() {
        return Ok(None);
    }
    let (own, lock, temp) = own_state(cfg.clone(), opts)?;
    Ok(Node::attach(&own, owner_dir, rt)?
        .map(|node| client_of_others(node, owner_dir.clone(), own, lock, temp)))
}

/// This process's own single node over `cfg`'s mounts, owning its state directory (`lock`).
fn single(
    cfg: &Config,
    opts: &Options,
    lock: StateLock,
    rt: &tokio::runtime::Runtime,
) -> Result<Connected> {
    let owner_dir = cfg.state_dir.clone();
    let node = Node::build(cfg, rt)?;
    let local = if opts.share {
        node.keep_metadata(&owner_dir)?;
        node.keep_sweeping_ttl()?;
        let key = cluster_key(&cfg.cluster_secret, &owner_dir, true)?;
        Some(LocalService::start(
            &node.client,
            &owner_dir,
            key,
            rt.handle(),
            None,
        )?)
    } else {
        None
    };
    Ok(Connected {
        local,
        node,
        state_dir: owner_dir.clone(),
        owner_dir,
        save_metadata: opts.share,
        _lock: Some(lock),
        _temp: None,
    })
}

fn client_of_others(
    node: Node,
    owner_dir: PathBuf,
    own: Config,
    lock: Option<StateLock>,
    temp: Option<tempfile::TempDir>,
) -> Connected {
    Connected {
        local: None,
        node,
        owner_dir,
        state_dir: own.state_dir,
        save_metadata: false,
        _lock: lock,
        _temp: temp,
    }
}

/// `cfg` with its state directory moved to the [`OwnDir`] of a client of others, and what
/// holds that directory.
fn own_state(
    mut cfg: Config,
    opts: &Options,
) -> Result<(Config, Option<StateLock>, Option<tempfile::TempDir>)> {
    match &opts.own_dir {
        OwnDir::Locked(dir) => {
            let lock = lock_state_dir(dir)?;
            cfg.state_dir = dir.clone();
            Ok((cfg, Some(lock), None))
        }
        OwnDir::Given(dir) => {
            cfg.state_dir = dir.clone();
            Ok((cfg, None, None))
        }
        OwnDir::Temporary => {
            let rules = WriteRules::new(cfg.write_type, cfg.write_rules.clone());
            let back = cfg.write_type == WriteType::Back
                || cfg
                    .write_rules
                    .iter()
                    .any(|r| r.write_type == WriteType::Back);
            if back && rules.any_writable() {
                return Err(Error::invalid(format!(
                    "`back` writes are acknowledged from a log that must outlive the process: give {} (a directory of this client's own), or write `through`",
                    opts.words.own_dir
                )));
            }
            let tmp = tempfile::Builder::new()
                .prefix("silt-client-")
                .tempdir()
                .map_err(|e| Error::from(e).context("creating the client's temporary directory"))?;
            cfg.state_dir = tmp.path().to_path_buf();
            Ok((cfg, None, Some(tmp)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: Words = Words {
        role: "mode",
        mounts: "mounts=M",
        cluster: "etcd=E",
        state_dir: "cache_dir",
        own_dir: "client_dir=DIR",
    };

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A configuration over `store` (none: no mounts) owning `state`.
    fn config(state: &Path, store: Option<&Path>) -> Config {
        let mut cfg = Config::default();
        cfg.set("state_dir", state.to_str().unwrap()).unwrap();
        cfg.set("memory_capacity", "16MiB").unwrap();
        cfg.set("disk_tiers", "none").unwrap();
        if let Some(store) = store {
            cfg.set("mounts", &format!("/data=file://{}", store.display()))
                .unwrap();
        }
        cfg
    }

    fn options(want: Option<Role>, own_dir: OwnDir, share: bool) -> Options {
        Options {
            want,
            own_dir,
            share,
            owner_wait: Duration::ZERO,
            words: WORDS,
        }
    }

    #[test]
    fn role_words_take_auto_and_the_earlier_words() {
        assert_eq!(WORDS.want("auto").unwrap(), None);
        assert_eq!(WORDS.want("embedded").unwrap(), Some(Role::Single));
        assert_eq!(WORDS.want("attach").unwrap(), Some(Role::Attached));
        assert_eq!(WORDS.want("cluster").unwrap(), Some(Role::Cluster));
        let e = WORDS.want("sideways").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(
            e.to_string()
                .contains("mode \"sideways\": expected auto, single, attached or cluster"),
            "{e}"
        );
    }

    #[test]
    fn a_shared_single_node_is_attached_to_and_stops_serving_at_close() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("f"), b"shared").unwrap();
        let state = dir.path().join("state");
        let rt = runtime();
        let cfg = config(&state, Some(&store));

        let mut owner = connect(&cfg, &options(None, OwnDir::Temporary, true), &rt).unwrap();
        assert_eq!(owner.role(), Role::Single);
        assert_eq!(owner.state_dir(), state);
        assert!(AttachInfo::read(&state).unwrap().is_some());

        // A second client of the same directory (no mounts needed) attaches, keeping its own
        // state in a directory of its own.
        let own = dir.path().join("own");
        let attached = connect(
            &config(&state, None),
            &options(None, OwnDir::Given(own.clone()), true),
            &rt,
        )
        .unwrap();
        assert_eq!(attached.role(), Role::Attached);
        assert_eq!(attached.owner_dir(), state);
        assert_eq!(attached.state_dir(), own);
        let c = attached.node.client.clone();
        let data = rt.block_on(async move {
            let f = c.open("/data/f").await.unwrap();
            c.read(&f, 0, 100).await.unwrap()
        });
        assert_eq!(&data[..], b"shared");

        // Asked for, a single node is refused while another owns the directory.
        let e = connect(
            &cfg,
            &options(Some(Role::Single), OwnDir::Temporary, true),
            &rt,
        )
        .err()
        .unwrap();
        assert_eq!(e.kind(), ErrorKind::Busy);

        owner.close();
        assert!(AttachInfo::read(&state).unwrap().is_none());
        assert!(state.join(crate::METADATA_SNAPSHOT).exists());
    }

    /// An attached client opens no store: every call of its stores is one of the owner's
    /// (`store_*` on the owner's socket), reads, writes and directory changes alike, and the
    /// owner's store holds the result.
    #[test]
    fn an_attached_client_calls_the_owners_store() {
        use silt_common::metrics::RpcOp;
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir_all(store.join("d")).unwrap();
        std::fs::write(store.join("d/f"), b"in the store").unwrap();
        let state = dir.path().join("state");
        let rt = runtime();
        let mut cfg = config(&state, Some(&store));
        cfg.set("write_type", "through").unwrap();
        let mut owner = connect(&cfg, &options(None, OwnDir::Temporary, true), &rt).unwrap();

        let mut acfg = config(&state, None);
        acfg.set("write_type", "through").unwrap();
        let own = dir.path().join("own");
        let attached = connect(&acfg, &options(None, OwnDir::Given(own), true), &rt).unwrap();
        assert_eq!(attached.role(), Role::Attached);
        let ns = attached.node.client.namespace();
        let uri = format!("file://{}", store.display());
        assert_eq!(ns.mounts()[0].store.uri(), uri);

        let calls = || RpcOp::Store.histogram().snapshot().count();
        let before = calls();
        let c = attached.node.client.clone();
        let s = ns.mounts()[0].store.clone();
        rt.block_on(async move {
            let names: Vec<String> = c
                .list("/data/d")
                .await
                .unwrap()
                .iter()
                .map(|e| e.name().to_string())
                .collect();
            assert_eq!(names, ["f"]);
            assert_eq!(c.stat("/data/d/f").await.unwrap().size, 12);
            let f = c.open("/data/d/f").await.unwrap();
            assert_eq!(&c.read(&f, 0, 100).await.unwrap()[..], b"in the store");

            let w = c.create("/data/d/new", true).await.unwrap();
            c.write_at(&w, 0, b"written attached").unwrap();
            c.commit(&w).await.unwrap();
            c.mkdir("/data/e").await.unwrap();
            c.rename("/data/d/new", "/data/e/moved").await.unwrap();

            // The store itself, as the client sees it: the owner's answers, kinds kept.
            let m = s.stat("e/moved").await.unwrap();
            assert_eq!(m.size, 16);
            let e = s.stat("nothing").await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
            assert_eq!(&s.read("e/moved", 0..7, &m).await.unwrap()[..], b"written");
            let tree = s.list_tree("", 100).await.unwrap().unwrap();
            assert!(tree.iter().any(|e| e.path == "e/moved"), "{tree:?}");
            assert!(s.list_tree("", 1).await.unwrap().is_none());
            s.symlink("e/link", "moved").await.unwrap();
            assert_eq!(s.read_link("e/link").await.unwrap(), "moved");
            s.copy("e/moved", "e/copy").await.unwrap();
            s.delete("e/copy").await.unwrap();
            s.delete("e/link").await.unwrap();
        });
        assert_eq!(
            std::fs::read(store.join("e/moved")).unwrap(),
            b"written attached"
        );
        assert!(!store.join("d/new").exists() && !store.join("e/copy").exists());
        assert!(calls() > before, "no call reached the owner's store");
        drop(attached);
        owner.close();
    }

    #[test]
    fn an_unshared_single_node_serves_no_one_and_a_busy_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        let state = dir.path().join("state");
        let rt = runtime();
        let cfg = config(&state, Some(&store));
        let locked = OwnDir::Locked(state.join("gateway"));

        let owner = connect(&cfg, &options(None, locked.clone(), false), &rt).unwrap();
        assert_eq!(owner.role(), Role::Single);
        assert!(AttachInfo::read(&state).unwrap().is_none());

        // Nothing to attach to and the lock held: refused at once without a wait...
        let e = connect(&cfg, &options(None, locked.clone(), false), &rt)
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::Busy);
        // ... and after it with one.
        let mut opts = options(None, locked, false);
        opts.owner_wait = Duration::from_millis(100);
        let e = connect(&cfg, &opts, &rt).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert!(e.to_string().contains("did not start serving it"), "{e}");
    }

    #[test]
    fn what_cannot_be_had_is_refused_in_the_front_ends_words() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let rt = runtime();
        let none = config(&state, None);

        let e = connect(&none, &options(None, OwnDir::Temporary, true), &rt)
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let msg = e.to_string();
        assert!(
            msg.contains("no Silt serves") && msg.contains("mounts=M"),
            "{msg}"
        );

        let e = connect(
            &none,
            &options(Some(Role::Attached), OwnDir::Temporary, true),
            &rt,
        )
        .err()
        .unwrap();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.to_string().contains("no Silt serves"), "{e}");

        let e = connect(
            &none,
            &options(Some(Role::Cluster), OwnDir::Temporary, true),
            &rt,
        )
        .err()
        .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("mode cluster needs etcd=E"), "{e}");

        let mut cluster = none.clone();
        cluster.set("workers", "w1=127.0.0.1:1").unwrap();
        let e = connect(
            &cluster,
            &options(Some(Role::Single), OwnDir::Temporary, true),
            &rt,
        )
        .err()
        .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("mode single"), "{e}");

        // `back` writes need a directory that outlives the process.
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        let mut back = config(&state, Some(&store));
        back.set("write_type", "back").unwrap();
        back.set("workers", "w1=127.0.0.1:1").unwrap();
        let e = connect(&back, &options(None, OwnDir::Temporary, true), &rt)
            .err()
            .unwrap();
        assert!(e.to_string().contains("client_dir=DIR"), "{e}");
    }
}
