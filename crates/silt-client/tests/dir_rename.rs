//! Directory renames through the client library against a real S3 server (versitygw behind
//! the fault proxy), checked against the keys in the bucket itself: the two sequences that used
//! to lose a directory, random trees renamed and pruned step by step against a model of the
//! key set (and, after a `sync`, Silt's view against the same model), and a copy failing in the
//! middle of a rename.
//!
//! Seeds: `SILT_MODEL_SEED` runs one seed; `SILT_MODEL_OPS` sets the operations per run.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_client::Client;
use silt_common::write::WriteType;
use silt_common::ErrorKind;
use silt_testkit::{FaultAction, S3Op, S3Proxy, S3Server};
use silt_ufs::{EntryKind, S3Options, S3Store, UnderStore};

mod common;

const PS: u64 = 4096;

struct Fx {
    proxy: S3Proxy,
    store: Arc<S3Store>,
    spool: tempfile::TempDir,
    _server: S3Server,
}

fn fixture() -> Fx {
    let server = S3Server::start();
    server.create_bucket("bkt");
    let proxy = S3Proxy::start(SocketAddr::from(([127, 0, 0, 1], server.port()))).unwrap();
    let opts = S3Options {
        endpoint: proxy.endpoint(),
        ..server.s3_options()
    };
    let store = Arc::new(S3Store::new("bkt", "w", &opts).unwrap());
    Fx {
        proxy,
        store,
        spool: tempfile::tempdir().unwrap(),
        _server: server,
    }
}

fn client(fx: &Fx) -> Client {
    Client::new(
        common::at_d(fx.store.clone()),
        common::worker(PS, 16 << 20),
        silt_client::ClientOptions::from_config(&silt_common::config::Config::default()),
        tokio::runtime::Handle::current(),
    )
    .with_writes(WriteType::Through, fx.spool.path().to_path_buf())
    .unwrap()
}

/// The keys in the bucket below the store's prefix: files as `a/f`, directory markers as `a/`.
async fn store_keys(store: &S3Store) -> BTreeSet<String> {
    let all = match store.list("", true).await {
        Ok(all) => all,
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("listing the bucket: {e}"),
    };
    all.into_iter()
        .filter(|m| !m.path.is_empty())
        .map(|m| match m.kind {
            EntryKind::Dir => format!("{}/", m.path),
            _ => m.path,
        })
        .collect()
}

/// Silt's view of `/d`, walked, in the same form as [`store_keys`].
async fn silt_keys(c: &Client) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo = vec!["/d".to_string()];
    while let Some(dir) = todo.pop() {
        for e in c.list(&dir).await.unwrap().iter() {
            let rel = e.path.strip_prefix("/d/").unwrap().to_string();
            if e.is_dir() {
                out.insert(format!("{rel}/"));
                todo.push(e.path.clone());
            } else {
                out.insert(rel);
            }
        }
    }
    out
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

async fn write(c: &Client, path: &str, data: &[u8]) {
    let w = c.create(path, true).await.unwrap();
    c.write_at(&w, 0, data).unwrap();
    c.commit(&w).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_directory_stays_whole_in_the_store() {
    let fx = fixture();
    let c = client(&fx);
    // mkdir d1 d1/d1; mv d1 f3; rmdir f3/d1
    c.mkdir("/d/d1").await.unwrap();
    c.mkdir("/d/d1/d1").await.unwrap();
    c.rename("/d/d1", "/d/f3").await.unwrap();
    assert_eq!(store_keys(&fx.store).await, set(&["f3/", "f3/d1/"]));
    c.rmdir("/d/f3/d1").await.unwrap();
    assert_eq!(store_keys(&fx.store).await, set(&["f3/"]));
    c.sync("/d", true).await.unwrap();
    assert_eq!(silt_keys(&c).await, set(&["f3/"]), "after a sync");
    c.rmdir("/d/f3").await.unwrap();

    // mkdir -p p/a/b; mv p/a p/c; rmdir p/c/b; mv p q
    c.mkdir("/d/p").await.unwrap();
    c.mkdir("/d/p/a").await.unwrap();
    c.mkdir("/d/p/a/b").await.unwrap();
    c.rename("/d/p/a", "/d/p/c").await.unwrap();
    c.rmdir("/d/p/c/b").await.unwrap();
    c.rename("/d/p", "/d/q").await.unwrap();
    assert_eq!(store_keys(&fx.store).await, set(&["q/", "q/c/"]));
    c.sync("/d", true).await.unwrap();
    assert_eq!(silt_keys(&c).await, set(&["q/", "q/c/"]), "after a sync");

    // A directory the store holds only implied by a file: its new name is a directory for
    // good (a marker), so removing the file leaves it.
    fx.store
        .write("imp/sub/f", bytes::Bytes::from_static(b"x"))
        .await
        .unwrap();
    c.sync("/d", true).await.unwrap();
    c.rename("/d/imp", "/d/imp2").await.unwrap();
    c.remove_file("/d/imp2/sub/f").await.unwrap();
    let keys = store_keys(&fx.store).await;
    assert!(
        keys.contains("imp2/") && keys.contains("imp2/sub/"),
        "{keys:?}"
    );
    assert!(!keys.iter().any(|k| k.starts_with("imp/")), "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_failing_mid_rename_leaves_the_source_and_no_target() {
    let fx = fixture();
    let c = client(&fx);
    c.mkdir("/d/a").await.unwrap();
    c.mkdir("/d/a/empty").await.unwrap();
    c.mkdir("/d/a/s").await.unwrap();
    for i in 0..12 {
        write(&c, &format!("/d/a/s/f{i}"), format!("data {i}").as_bytes()).await;
    }
    let before = store_keys(&fx.store).await;
    assert_eq!(before.len(), 15);
    // The sixth copy (or marker) is refused, not retryably.
    fx.proxy.inject(
        S3Op::Put,
        5,
        1,
        FaultAction::status(403, "AccessDenied", "injected"),
    );
    let err = c.rename("/d/a", "/d/b").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    fx.proxy.clear_faults();
    assert_eq!(
        store_keys(&fx.store).await,
        before,
        "source whole, no target"
    );
    c.sync("/d", true).await.unwrap();
    assert_eq!(silt_keys(&c).await, before);

    c.rename("/d/a", "/d/b").await.unwrap();
    let moved: BTreeSet<String> = before.iter().map(|k| format!("b{}", &k[1..])).collect();
    assert_eq!(store_keys(&fx.store).await, moved);
}

/// The expected key set, and the directories and files in it.
struct Model {
    keys: BTreeSet<String>,
}

impl Model {
    fn dirs(&self) -> Vec<String> {
        self.keys
            .iter()
            .filter_map(|k| k.strip_suffix('/'))
            .map(str::to_string)
            .collect()
    }

    fn files(&self) -> Vec<String> {
        self.keys
            .iter()
            .filter(|k| !k.ends_with('/'))
            .cloned()
            .collect()
    }

    fn exists(&self, p: &str) -> bool {
        self.keys.contains(p) || self.keys.contains(&format!("{p}/"))
    }

    fn is_empty_dir(&self, d: &str) -> bool {
        let prefix = format!("{d}/");
        !self
            .keys
            .iter()
            .any(|k| k.starts_with(&prefix) && *k != prefix)
    }
}

/// A random directory (or the root, as "").
fn pick_dir(rng: &mut StdRng, m: &Model) -> String {
    let mut dirs = m.dirs();
    dirs.push(String::new());
    dirs[rng.gen_range(0..dirs.len())].clone()
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

async fn run_seed(seed: u64, ops: usize) {
    let fx = fixture();
    let c = client(&fx);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut m = Model {
        keys: BTreeSet::new(),
    };
    for step in 0..ops {
        let what = rng.gen_range(0..10);
        let desc;
        match what {
            // mkdir
            0..=2 => {
                let p = join(
                    &pick_dir(&mut rng, &m),
                    &format!("d{}", rng.gen_range(0..4)),
                );
                if m.exists(&p) || p.split('/').count() > 4 {
                    continue;
                }
                desc = format!("mkdir {p}");
                c.mkdir(&format!("/d/{p}")).await.unwrap();
                m.keys.insert(format!("{p}/"));
            }
            // a file
            3..=4 => {
                let p = join(
                    &pick_dir(&mut rng, &m),
                    &format!("f{}", rng.gen_range(0..3)),
                );
                if m.exists(&p) {
                    continue;
                }
                desc = format!("write {p}");
                write(&c, &format!("/d/{p}"), p.as_bytes()).await;
                m.keys.insert(p);
            }
            // rename a directory to a new name (or onto an empty directory)
            5..=7 => {
                let dirs = m.dirs();
                if dirs.is_empty() {
                    continue;
                }
                let from = dirs[rng.gen_range(0..dirs.len())].clone();
                let to = join(
                    &pick_dir(&mut rng, &m),
                    &format!("d{}", rng.gen_range(0..4)),
                );
                let prefix = format!("{from}/");
                if to == from || to.starts_with(&prefix) || to.split('/').count() > 4 {
                    continue;
                }
                let onto_empty = m.keys.contains(&format!("{to}/")) && m.is_empty_dir(&to);
                if m.exists(&to) && !onto_empty {
                    continue;
                }
                desc = format!("rename {from} {to}");
                c.rename(&format!("/d/{from}"), &format!("/d/{to}"))
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: {desc}: {e}"));
                let moved: Vec<String> = m
                    .keys
                    .iter()
                    .filter(|k| k.starts_with(&prefix))
                    .cloned()
                    .collect();
                for k in moved {
                    m.keys.remove(&k);
                    m.keys.insert(format!("{to}/{}", &k[prefix.len()..]));
                }
            }
            // rmdir an empty directory
            8 => {
                let empty: Vec<String> =
                    m.dirs().into_iter().filter(|d| m.is_empty_dir(d)).collect();
                if empty.is_empty() {
                    continue;
                }
                let d = empty[rng.gen_range(0..empty.len())].clone();
                desc = format!("rmdir {d}");
                c.rmdir(&format!("/d/{d}")).await.unwrap();
                m.keys.remove(&format!("{d}/"));
            }
            // unlink a file
            _ => {
                let files = m.files();
                if files.is_empty() {
                    continue;
                }
                let f = files[rng.gen_range(0..files.len())].clone();
                desc = format!("unlink {f}");
                c.remove_file(&format!("/d/{f}")).await.unwrap();
                m.keys.remove(&f);
            }
        }
        assert_eq!(
            store_keys(&fx.store).await,
            m.keys,
            "seed {seed} step {step}: {desc}: the store's keys"
        );
    }
    c.sync("/d", true).await.unwrap();
    assert_eq!(
        silt_keys(&c).await,
        m.keys,
        "seed {seed}: Silt's view after a sync"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_trees_renamed_match_the_model_of_the_store() {
    let ops = std::env::var("SILT_MODEL_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(80);
    let seeds: Vec<u64> = match std::env::var("SILT_MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("SILT_MODEL_SEED: a number")],
        Err(_) => (1..=3).collect(),
    };
    for seed in seeds {
        run_seed(seed, ops).await;
    }
}
