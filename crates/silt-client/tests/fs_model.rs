//! Reference test of the file-system core (`silt_client::fs::FileSystem`), the layer every
//! POSIX front end adapts, without a kernel: random sequences of create, open for reading or
//! writing, pwrite, read and fstat through a handle, flush, close, truncate, unlink, rename
//! (with and without `noreplace`) and lookup, over several handles at once, checked step by
//! step against a model of what POSIX promises one process:
//!
//! - a handle reads its *file* (an inode), which follows renames and outlives its names:
//!   whatever was written to that file through any handle, committed or not;
//! - `fstat` through a handle shows that file's size, and no link once it has no name;
//! - a path keeps its inode number while it names the same file; a new file gets a new one;
//! - `noreplace` onto an existing name is `EEXIST`, a name over 255 bytes `ENAMETOOLONG`.
//!
//! Run under every write type, on a local directory and on an object store (in memory: a
//! unit test of the core; the real stores are driven through mounts in `crates/silt/tests`).
//! Seeds: `SILT_MODEL_SEED` runs one seed; `SILT_MODEL_OPS` sets the operations per run.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_cache::{Arena, ArenaConfig};
use silt_client::attrs::Caller;
use silt_client::fs::{FileSystem, FsOptions, NoLocalFiles, OpenedAs, SetAttr};
use silt_client::{Client, ClientOptions, Clock, OpenOptions, WriteSetup};
use silt_common::config::DiskTierSpec;
use silt_common::write::{WriteRules, WriteType};
use silt_common::ErrorKind;
use silt_ufs::{DynStore, FsStore, MemStore};

mod common;

const PS: u64 = 4096;
const NAMES: [&str; 3] = ["a", "b", "c"];
const DIRS: [&str; 2] = ["/d", "/d/x"];

/// One handle as the model sees it: the file it has open, and the core's numbers for it.
struct Handle {
    file: usize,
    ino: u64,
    fh: u64,
    writes: bool,
}

#[derive(Default)]
struct Model {
    /// Names: path → file.
    names: BTreeMap<String, usize>,
    /// Every file's bytes, by file (a file without names lives on for its handles).
    bytes: Vec<Vec<u8>>,
    /// The inode number the core gave each file, once seen.
    inos: HashMap<usize, u64>,
    handles: BTreeMap<usize, Handle>,
}

impl Model {
    fn new_file(&mut self, path: &str) -> usize {
        self.bytes.push(Vec::new());
        let f = self.bytes.len() - 1;
        self.names.insert(path.to_string(), f);
        f
    }

    fn named(&self, file: usize) -> bool {
        self.names.values().any(|f| *f == file)
    }

    /// Checks (and learns) the core's number for `file`.
    fn check_ino(&mut self, file: usize, ino: u64, what: &str) {
        match self.inos.get(&file) {
            Some(known) => assert_eq!(*known, ino, "{what}: the file's inode number changed"),
            None => {
                let others: Vec<_> = self
                    .inos
                    .iter()
                    .filter(|(f, n)| {
                        **n == ino && **f != file && (self.named(**f) || self.open(**f))
                    })
                    .collect();
                assert!(
                    others.is_empty(),
                    "{what}: inode {ino} already names another live file"
                );
                self.inos.insert(file, ino);
            }
        }
    }

    fn open(&self, file: usize) -> bool {
        self.handles.values().any(|h| h.file == file)
    }
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').expect("an absolute path")
}

struct Rig {
    fs: FileSystem,
    who: Caller,
}

impl Rig {
    fn new(
        rt: &tokio::runtime::Runtime,
        store: DynStore,
        write_type: WriteType,
        dirs: &Dirs,
    ) -> Rig {
        let _guard = rt.enter();
        let opts = ClientOptions {
            prefetch_max: 0,
            clock: Clock::system(),
            ..ClientOptions::from_config(&silt_common::config::Config::default())
        };
        let setup = WriteSetup {
            rules: WriteRules::new(write_type, Vec::new()),
            arena: Arena::open(ArenaConfig {
                chunk_size: PS,
                memory_ceiling: 1 << 20,
                file_memory: 1 << 20,
                spill: vec![DiskTierSpec {
                    dir: dirs.spill.path().to_path_buf(),
                    quota: 1 << 30,
                }],
                jobs: Vec::new(),
            })
            .expect("arena"),
            cache_only_ttl: None,
            wal_dir: (write_type == WriteType::Back).then(|| dirs.wal.path().to_path_buf()),
            upload_delay: Duration::ZERO,
        };
        let client = Client::new(
            common::at_d(store),
            common::worker(PS, 4 << 20),
            opts,
            rt.handle().clone(),
        )
        .with_write_setup(setup)
        .expect("client");
        let fs = FileSystem::new(
            Arc::new(client),
            FsOptions::default(),
            Arc::new(NoLocalFiles),
        );
        let (uid, gid) = silt_client::attrs::default_owner();
        Rig {
            fs,
            who: Caller {
                uid,
                gid,
                groups: Vec::new(),
            },
        }
    }

    /// The inode of directory `dir`, looked up from the root.
    fn dir_ino(&self, dir: &str) -> u64 {
        let mut ino = 1;
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            ino = self
                .fs
                .lookup(ino, OsStr::new(part))
                .expect("lookup of a directory")
                .attr
                .ino;
        }
        ino
    }

    fn parent_and_name<'a>(&self, path: &'a str) -> (u64, &'a OsStr) {
        let (dir, name) = split(path);
        (self.dir_ino(dir), OsStr::new(name))
    }
}

struct Dirs {
    spill: tempfile::TempDir,
    wal: tempfile::TempDir,
}

fn kind<T>(r: silt_common::Result<T>) -> Result<T, ErrorKind> {
    r.map_err(|e| e.kind())
}

/// One random run of `ops` operations.
fn run(store: DynStore, write_type: WriteType, seed: u64, ops: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dirs = Dirs {
        spill: tempfile::tempdir().expect("tempdir"),
        wal: tempfile::tempdir().expect("tempdir"),
    };
    let rig = Rig::new(&rt, store, write_type, &dirs);
    let fs = &rig.fs;
    let (root, x) = rig.parent_and_name("/d/x");
    fs.mkdir(root, x, (&rig.who).into(), 0o755)
        .expect("mkdir /d/x");
    let mut m = Model::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_id = 0usize;
    let mut history: Vec<String> = Vec::new();

    for step in 0..ops {
        let path = format!(
            "{}/{}",
            DIRS[rng.gen_range(0..DIRS.len())],
            NAMES[rng.gen_range(0..NAMES.len())]
        );
        let ids: Vec<usize> = m.handles.keys().copied().collect();
        let handle = (!ids.is_empty()).then(|| ids[rng.gen_range(0..ids.len())]);
        let (parent, name) = rig.parent_and_name(&path);
        let desc;
        match (rng.gen_range(0..100), handle) {
            // create (O_CREAT|O_TRUNC), write, close: a whole new content.
            (0..=11, _) => {
                let len = rng.gen_range(0..3 * PS as usize);
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                desc = format!("create {path} with {len} bytes");
                let opts = OpenOptions {
                    truncate: true,
                    ..Default::default()
                };
                let (a, fh) = fs
                    .create(parent, name, (&rig.who).into(), Some(1), 0o644, opts)
                    .unwrap_or_else(|e| panic!("{desc}: {e}"));
                fs.write(fh, 0, &data).expect("write");
                fs.flush(fh, || Some(1)).expect("flush");
                fs.release(fh);
                let file = match m.names.get(&path) {
                    Some(f) => *f,
                    None => m.new_file(&path),
                };
                m.bytes[file] = data;
                m.check_ino(file, a.attr.ino, &desc);
            }
            // open for reading or writing
            (12..=35, _) => {
                let writes = rng.gen_bool(0.4);
                desc = format!("open {path} (writing: {writes})");
                let looked = kind(fs.lookup(parent, name));
                let Some(&file) = m.names.get(&path) else {
                    assert_eq!(looked.err(), Some(ErrorKind::NotFound), "{desc}");
                    continue;
                };
                let ino = looked
                    .unwrap_or_else(|e| panic!("{desc}: lookup {e:?}"))
                    .attr
                    .ino;
                m.check_ino(file, ino, &desc);
                let fh = if writes {
                    fs.open_write(ino, Some(1), OpenOptions::default())
                        .unwrap_or_else(|e| panic!("{desc}: {e}"))
                } else {
                    let o = fs.open_read(ino).unwrap_or_else(|e| panic!("{desc}: {e}"));
                    assert!(matches!(o.how, OpenedAs::Core { .. }), "{desc}");
                    o.fh
                };
                let id = next_id;
                next_id += 1;
                m.handles.insert(
                    id,
                    Handle {
                        file,
                        ino,
                        fh,
                        writes,
                    },
                );
            }
            // read the whole file through a handle
            (36..=55, Some(id)) => {
                let h = &m.handles[&id];
                desc = format!("read handle {id} (file {})", h.file);
                let got = fs
                    .read(h.ino, h.fh, 0, 16 * PS)
                    .unwrap_or_else(|e| panic!("{desc}: {e}"));
                let want = &m.bytes[h.file];
                assert!(
                    got[..] == want[..],
                    "{desc}: {} bytes read, the file has {}\n{}",
                    got.len(),
                    want.len(),
                    history.join("\n")
                );
            }
            // fstat through a handle
            (56..=62, Some(id)) => {
                let h = &m.handles[&id];
                desc = format!("fstat handle {id}");
                let a = fs
                    .getattr(h.ino, Some(h.fh))
                    .unwrap_or_else(|e| panic!("{desc}: {e}"));
                assert_eq!(
                    a.attr.size,
                    m.bytes[h.file].len() as u64,
                    "{desc}: size\n{}",
                    history.join("\n")
                );
                assert_eq!(a.attr.nlink == 0, !m.named(h.file), "{desc}: nlink");
            }
            // pwrite through a writing handle
            (63..=72, Some(id)) if m.handles[&id].writes => {
                let h = &m.handles[&id];
                let offset = rng.gen_range(0..2 * PS);
                let len = rng.gen_range(1..PS as usize);
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                desc = format!("pwrite {len} bytes at {offset} through handle {id}");
                fs.write(h.fh, offset, &data)
                    .unwrap_or_else(|e| panic!("{desc}: {e}"));
                let bytes = &mut m.bytes[h.file];
                let end = offset as usize + len;
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[offset as usize..end].copy_from_slice(&data);
            }
            // close (a writer's flush and release commit)
            (73..=80, Some(id)) => {
                let h = m.handles.remove(&id).expect("a handle");
                desc = format!("close handle {id}");
                fs.flush(h.fh, || Some(1))
                    .unwrap_or_else(|e| panic!("{desc}: {e}"));
                fs.release(h.fh);
            }
            // unlink
            (81..=85, _) => {
                desc = format!("unlink {path}");
                let got = kind(fs.unlink(parent, name));
                match m.names.remove(&path) {
                    Some(_) => got.unwrap_or_else(|e| panic!("{desc}: {e:?}")),
                    None => assert_eq!(got.err(), Some(ErrorKind::NotFound), "{desc}"),
                }
            }
            // rename, maybe without replacing
            (86..=93, _) => {
                let to = format!(
                    "{}/{}",
                    DIRS[rng.gen_range(0..DIRS.len())],
                    NAMES[rng.gen_range(0..NAMES.len())]
                );
                let noreplace = rng.gen_bool(0.3);
                desc = format!("rename {path} to {to} (noreplace: {noreplace})");
                let (tparent, tname) = rig.parent_and_name(&to);
                let got = kind(fs.rename(parent, name, tparent, tname, noreplace));
                match m.names.get(&path).copied() {
                    None => assert_eq!(got.err(), Some(ErrorKind::NotFound), "{desc}"),
                    Some(_) if path == to => {
                        if noreplace {
                            assert_eq!(got.err(), Some(ErrorKind::AlreadyExists), "{desc}");
                        } else {
                            got.unwrap_or_else(|e| panic!("{desc}: {e:?}"));
                        }
                    }
                    Some(_) if noreplace && m.names.contains_key(&to) => {
                        assert_eq!(got.err(), Some(ErrorKind::AlreadyExists), "{desc}");
                    }
                    Some(file) => {
                        got.unwrap_or_else(|e| panic!("{desc}: {e:?}"));
                        m.names.remove(&path);
                        m.names.insert(to, file);
                    }
                }
            }
            // truncate(2) by path
            (94..=96, _) => {
                let size = rng.gen_range(0..2 * PS);
                desc = format!("truncate {path} to {size}");
                let Some(&file) = m.names.get(&path) else {
                    continue;
                };
                let ino = fs.lookup(parent, name).expect("lookup").attr.ino;
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                let a = fs
                    .setattr(ino, None, || rig.who.clone(), &set)
                    .unwrap_or_else(|e| panic!("{desc}: {e}"));
                assert_eq!(a.attr.size, size, "{desc}");
                m.bytes[file].resize(size as usize, 0);
            }
            // lookup: the number and size of what the name holds
            _ => {
                desc = format!("lookup {path}");
                let got = kind(fs.lookup(parent, name));
                match m.names.get(&path).copied() {
                    None => assert_eq!(got.err(), Some(ErrorKind::NotFound), "{desc}"),
                    Some(file) => {
                        let a = got.unwrap_or_else(|e| panic!("{desc}: {e:?}"));
                        assert_eq!(a.attr.size, m.bytes[file].len() as u64, "{desc}: size");
                        m.check_ino(file, a.attr.ino, &desc);
                    }
                }
            }
        }
        history.push(format!("{step}: {desc}"));
    }
    // Names and bytes as the model has them, after every handle closed.
    for (_, h) in std::mem::take(&mut m.handles) {
        fs.flush(h.fh, || Some(1)).expect("flush at the end");
        fs.release(h.fh);
    }
    for (path, file) in &m.names {
        let (parent, name) = rig.parent_and_name(path);
        let ino = fs.lookup(parent, name).expect("lookup at the end").attr.ino;
        let o = fs.open_read(ino).expect("open at the end");
        let got = fs.read(ino, o.fh, 0, 16 * PS).expect("read at the end");
        assert!(got[..] == m.bytes[*file][..], "{path} at the end");
        fs.release(o.fh);
    }
    // The names that must be refused, whatever the store.
    let long = "n".repeat(256);
    let (root, _) = rig.parent_and_name("/d/a");
    assert_eq!(
        kind(fs.lookup(root, OsStr::new(&long))).err(),
        Some(ErrorKind::NameTooLong)
    );
    assert_eq!(
        kind(fs.mkdir(root, OsStr::new(&long), (&rig.who).into(), 0o755)).err(),
        Some(ErrorKind::NameTooLong)
    );
    drop(rig);
    rt.shutdown_timeout(Duration::from_secs(5));
}

fn runs(make: impl Fn(&Path) -> DynStore, write_type: WriteType) {
    for seed in common::model_seeds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = make(dir.path());
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(store, write_type, seed, common::model_ops())
        }));
        // The failure above says what broke; this says how to run it again alone.
        if ran.is_err() {
            panic!("failed at seed {seed} ({write_type}): SILT_MODEL_SEED={seed} reruns it");
        }
    }
}

fn local(p: &Path) -> DynStore {
    Arc::new(FsStore::new(p, Duration::from_secs(30)).expect("fs store"))
}

fn object_store(_: &Path) -> DynStore {
    Arc::new(MemStore::new("mem://fs-model"))
}

#[test]
fn the_core_matches_posix_on_a_local_directory_through() {
    runs(local, WriteType::Through);
}

#[test]
fn the_core_matches_posix_on_an_object_store_through() {
    runs(object_store, WriteType::Through);
}

#[test]
fn the_core_matches_posix_on_a_local_directory_write_back() {
    runs(local, WriteType::Back);
}

#[test]
fn the_core_matches_posix_on_an_object_store_write_back() {
    runs(object_store, WriteType::Back);
}

#[test]
fn the_core_matches_posix_on_an_object_store_store_only() {
    runs(object_store, WriteType::StoreOnly);
}

#[test]
fn the_core_matches_posix_on_a_local_directory_cache_only() {
    runs(local, WriteType::CacheOnly);
}
