//! Model-based test of the write path: random sequences of open (create, exclusive, truncate,
//! append), write, pwrite past the end, read through a handle, truncate, fsync, close, rename
//! (files and directories, onto existing names), unlink, mkdir, rmdir, crashes (every handle
//! and the client dropped without a close) and clean restarts, over several handles at once,
//! run on the client library and checked step by step against an in-memory model of what
//! POSIX promises one process.
//!
//! The model: `stored` is what survives a crash (committed files), each open handle points at
//! a shared session (all handles of a file share its bytes), an unlinked or renamed-over file's
//! session is detached (its handles go on, nothing of it is committed again).
//!
//! Seeds: `SILT_MODEL_SEED` runs one seed; `SILT_MODEL_OPS` sets the operations per run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_cache::{Arena, ArenaConfig};
use silt_client::{Client, ClientOptions, Clock, FileWriter, OpenOptions, WriteSetup};
use silt_common::config::DiskTierSpec;
use silt_common::write::{WriteRules, WriteType};
use silt_common::ErrorKind;
use silt_ufs::{DynStore, FsStore, MemStore};

mod common;

const PS: u64 = 4096;
const ROOT: &str = "/d";
const NAMES: [&str; 4] = ["a", "b", "c", "e"];

/// A file being written, as the model sees it.
#[derive(Clone)]
struct SessionModel {
    path: String,
    data: Vec<u8>,
    dirty: bool,
    /// Unlinked or renamed over.
    detached: bool,
    handles: usize,
}

#[derive(Clone)]
struct HandleModel {
    session: usize,
    append: bool,
}

#[derive(Default, Clone)]
struct Model {
    /// Committed files: what a crash keeps.
    stored: BTreeMap<String, Vec<u8>>,
    /// Directories (every one made by mkdir; files are only made in them).
    dirs: BTreeSet<String>,
    sessions: Vec<SessionModel>,
    handles: BTreeMap<usize, HandleModel>,
    /// `cache-only`: files and directories live in the client only, and a restart ends them.
    volatile: bool,
}

type Outcome = Result<Vec<u8>, ErrorKind>;

impl Model {
    fn live_session(&self, path: &str) -> Option<usize> {
        self.sessions
            .iter()
            .position(|s| s.path == path && !s.detached && s.handles > 0)
    }

    fn is_file(&self, path: &str) -> bool {
        self.stored.contains_key(path) || self.live_session(path).is_some()
    }

    fn under(p: &str, dir: &str) -> bool {
        p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/'
    }

    fn has_children(&self, dir: &str) -> bool {
        self.stored.keys().any(|p| Self::under(p, dir))
            || self.dirs.iter().any(|p| Self::under(p, dir))
            || self
                .sessions
                .iter()
                .any(|s| !s.detached && s.handles > 0 && Self::under(&s.path, dir))
    }

    fn commit(&mut self, si: usize) {
        let s = &mut self.sessions[si];
        if s.detached || !s.dirty {
            return;
        }
        s.dirty = false;
        self.stored.insert(s.path.clone(), s.data.clone());
    }

    fn open(&mut self, id: usize, path: &str, o: OpenOptions) -> Outcome {
        if self.dirs.contains(path) {
            // open(2): O_CREAT|O_EXCL of any existing name is EEXIST, a directory's too.
            return Err(if o.exclusive && o.create {
                ErrorKind::AlreadyExists
            } else {
                ErrorKind::IsADirectory
            });
        }
        let si = match self.live_session(path) {
            Some(_) if o.exclusive && o.create => return Err(ErrorKind::AlreadyExists),
            Some(si) => si,
            None => {
                let data = match self.stored.get(path) {
                    Some(_) if o.exclusive && o.create => return Err(ErrorKind::AlreadyExists),
                    Some(d) => d.clone(),
                    None if o.create => Vec::new(),
                    None => return Err(ErrorKind::NotFound),
                };
                let dirty = !self.stored.contains_key(path);
                self.sessions.push(SessionModel {
                    path: path.to_string(),
                    data,
                    dirty,
                    detached: false,
                    handles: 0,
                });
                self.sessions.len() - 1
            }
        };
        let s = &mut self.sessions[si];
        s.handles += 1;
        if o.truncate {
            s.data.clear();
            s.dirty = true;
        }
        self.handles.insert(
            id,
            HandleModel {
                session: si,
                append: o.append,
            },
        );
        Ok(Vec::new())
    }

    fn write(&mut self, id: usize, off: u64, data: &[u8]) -> Outcome {
        let h = &self.handles[&id];
        let s = &mut self.sessions[h.session];
        let at = if h.append { s.data.len() } else { off as usize };
        if s.data.len() < at + data.len() {
            s.data.resize(at + data.len(), 0);
        }
        s.data[at..at + data.len()].copy_from_slice(data);
        s.dirty = true;
        Ok(Vec::new())
    }

    fn read(&self, id: usize, off: u64, len: u64) -> Outcome {
        let s = &self.sessions[self.handles[&id].session];
        let start = (off as usize).min(s.data.len());
        let end = (off.saturating_add(len) as usize).min(s.data.len());
        Ok(s.data[start..end].to_vec())
    }

    fn truncate(&mut self, id: usize, len: u64) -> Outcome {
        let s = &mut self.sessions[self.handles[&id].session];
        s.data.resize(len as usize, 0);
        s.dirty = true;
        Ok(Vec::new())
    }

    fn close(&mut self, id: usize) -> Outcome {
        let Some(h) = self.handles.remove(&id) else {
            return Ok(Vec::new());
        };
        self.sessions[h.session].handles -= 1;
        if self.sessions[h.session].handles == 0 {
            self.commit(h.session);
        }
        Ok(Vec::new())
    }

    fn unlink(&mut self, path: &str) -> Outcome {
        if self.dirs.contains(path) {
            return Err(ErrorKind::IsADirectory);
        }
        let live = self.live_session(path);
        if let Some(si) = live {
            self.sessions[si].detached = true;
        }
        match (self.stored.remove(path), live) {
            (None, None) => Err(ErrorKind::NotFound),
            _ => Ok(Vec::new()),
        }
    }

    fn mkdir(&mut self, path: &str) -> Outcome {
        if self.dirs.contains(path) || self.is_file(path) {
            return Err(ErrorKind::AlreadyExists);
        }
        self.dirs.insert(path.to_string());
        Ok(Vec::new())
    }

    fn rmdir(&mut self, path: &str) -> Outcome {
        if self.is_file(path) {
            return Err(ErrorKind::NotADirectory);
        }
        if !self.dirs.contains(path) {
            return Err(ErrorKind::NotFound);
        }
        if self.has_children(path) {
            return Err(ErrorKind::NotEmpty);
        }
        self.dirs.remove(path);
        Ok(Vec::new())
    }

    fn rename_check(&mut self, from: &str, to: &str) -> Outcome {
        let from_dir = self.dirs.contains(from);
        if !from_dir && !self.is_file(from) {
            return Err(ErrorKind::NotFound);
        }
        if from == to {
            return Ok(Vec::new());
        }
        if Self::under(to, from) {
            return Err(ErrorKind::InvalidInput);
        }
        let to_dir = self.dirs.contains(to);
        if !from_dir && to_dir {
            return Err(ErrorKind::IsADirectory);
        }
        if from_dir && self.is_file(to) {
            return Err(ErrorKind::NotADirectory);
        }
        if to_dir && self.has_children(to) {
            return Err(ErrorKind::NotEmpty);
        }
        // Files open for writing at or below `from` commit first, then follow.
        for si in self.moving(from) {
            self.commit(si);
        }
        Ok(Vec::new())
    }

    /// Sessions at or below `from`.
    fn moving(&self, from: &str) -> Vec<usize> {
        (0..self.sessions.len())
            .filter(|&i| {
                let s = &self.sessions[i];
                !s.detached && s.handles > 0 && (s.path == from || Self::under(&s.path, from))
            })
            .collect()
    }

    /// The rename itself, after `rename_check` (which commits what moves).
    fn rename_apply(&mut self, from: &str, to: &str) {
        if from == to {
            return;
        }
        let moving = self.moving(from);
        if let Some(si) = self.live_session(to) {
            self.sessions[si].detached = true;
        }
        let moved = |p: &str| format!("{to}{}", &p[from.len()..]);
        let keys: Vec<String> = self
            .stored
            .keys()
            .filter(|p| p.as_str() == from || Self::under(p, from))
            .cloned()
            .collect();
        self.stored.remove(to);
        for k in keys {
            let v = self.stored.remove(&k).unwrap_or_default();
            self.stored.insert(moved(&k), v);
        }
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .filter(|p| p.as_str() == from || Self::under(p, from))
            .cloned()
            .collect();
        self.dirs.remove(to);
        for d in dirs {
            self.dirs.remove(&d);
            self.dirs.insert(moved(&d));
        }
        for si in moving {
            let p = moved(&self.sessions[si].path);
            self.sessions[si].path = p;
        }
    }

    /// Every handle gone without a close: only what was committed stays.
    fn crash(&mut self) {
        self.handles.clear();
        self.sessions.clear();
        self.restart();
    }

    /// A new client: under `cache-only` nothing of the old one is left.
    fn restart(&mut self) {
        if self.volatile {
            self.stored.clear();
            self.dirs.clear();
        }
    }

    /// Files as a listing shows them: path → size.
    fn view(&self) -> BTreeMap<String, u64> {
        let mut v: BTreeMap<String, u64> = self
            .stored
            .iter()
            .map(|(p, d)| (p.clone(), d.len() as u64))
            .collect();
        for s in &self.sessions {
            if !s.detached && s.handles > 0 {
                v.insert(s.path.clone(), s.data.len() as u64);
            }
        }
        v
    }
}

/// The store and (for `back`) the write-ahead log a run's clients share across restarts.
struct Rig {
    store: DynStore,
    write_type: WriteType,
    spill: tempfile::TempDir,
    wal: tempfile::TempDir,
}

impl Rig {
    fn client(&self) -> Client {
        let opts = ClientOptions {
            prefetch_max: 0,
            clock: Clock::system(),
            ..ClientOptions::from_config(&silt_common::config::Config::default())
        };
        let setup = WriteSetup {
            rules: WriteRules::new(self.write_type, Vec::new()),
            arena: Arena::open(ArenaConfig {
                chunk_size: PS,
                memory_ceiling: 1 << 20,
                file_memory: 1 << 20,
                spill: vec![DiskTierSpec {
                    dir: self.spill.path().to_path_buf(),
                    quota: 1 << 30,
                }],
                jobs: Vec::new(),
            })
            .expect("arena"),
            cache_only_ttl: None,
            wal_dir: (self.write_type == WriteType::Back).then(|| self.wal.path().to_path_buf()),
            // Uploads of `back` files start at once and race with everything else.
            upload_delay: Duration::ZERO,
        };
        Client::new(
            common::at_d(self.store.clone()),
            common::worker(PS, 4 << 20),
            opts,
            tokio::runtime::Handle::current(),
        )
        .with_write_setup(setup)
        .expect("client")
    }
}

fn kind<T>(r: silt_common::Result<T>) -> Result<T, ErrorKind> {
    r.map_err(|e| e.kind())
}

/// One random run; returns the number of operations it made.
async fn run(store: DynStore, write_type: WriteType, seed: u64, ops: usize) -> usize {
    let rig = Rig {
        store,
        write_type,
        spill: tempfile::tempdir().expect("tempdir"),
        wal: tempfile::tempdir().expect("tempdir"),
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = rig.client();
    let mut m = Model {
        volatile: write_type == WriteType::CacheOnly,
        ..Model::default()
    };
    let mut handles: HashMap<usize, FileWriter> = HashMap::new();
    let mut next_id = 0usize;
    let mut history: Vec<String> = Vec::new();
    c.mkdir(&format!("{ROOT}/x")).await.expect("mkdir");
    m.dirs.insert(format!("{ROOT}/x"));

    for step in 0..ops {
        let dirs: Vec<String> = std::iter::once(ROOT.to_string())
            .chain(m.dirs.iter().cloned())
            .collect();
        let dir = &dirs[rng.gen_range(0..dirs.len())];
        let any_path = format!("{dir}/{}", NAMES[rng.gen_range(0..NAMES.len())]);
        let ids: Vec<usize> = m.handles.keys().copied().collect();
        let pick = |rng: &mut StdRng| ids.get(rng.gen_range(0..ids.len().max(1))).copied();
        let mut undo_model: Option<Model> = None;
        let mut choice = rng.gen_range(0..100);
        if ids.is_empty() && (18..=72).contains(&choice) {
            // An operation on a handle, with none open: open one instead.
            choice = rng.gen_range(0..18);
        }
        let (desc, got, want): (String, Outcome, Outcome) = match choice {
            0..=17 => {
                let o = OpenOptions {
                    create: rng.gen_bool(0.8),
                    exclusive: rng.gen_bool(0.1),
                    truncate: rng.gen_bool(0.2),
                    append: rng.gen_bool(0.2),
                    ..Default::default()
                };
                let id = next_id;
                next_id += 1;
                let got = match c.open_write(&any_path, o).await {
                    Ok(w) => {
                        handles.insert(id, w);
                        Ok(Vec::new())
                    }
                    Err(e) => Err(e.kind()),
                };
                let want = m.open(id, &any_path, o);
                (format!("open {any_path} {o:?} -> h{id}"), got, want)
            }
            18..=39 if !ids.is_empty() => {
                let id = pick(&mut rng).unwrap_or_default();
                let len = rng.gen_range(1..3000);
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                // Mostly near the end, sometimes far past it (a hole).
                let off = rng.gen_range(0..(3 * PS + 100));
                let got = kind(c.write(&handles[&id], off, &data).await).map(|_| Vec::new());
                let want = m.write(id, off, &data);
                (format!("write h{id} @{off} +{len}"), got, want)
            }
            40..=51 if !ids.is_empty() => {
                let id = pick(&mut rng).unwrap_or_default();
                let off = rng.gen_range(0..(3 * PS));
                let len = rng.gen_range(1..(2 * PS));
                let got = kind(c.read_written(&handles[&id], off, len).await).map(|b| b.to_vec());
                let want = m.read(id, off, len);
                (format!("read h{id} @{off} +{len}"), got, want)
            }
            52..=57 if !ids.is_empty() => {
                let id = pick(&mut rng).unwrap_or_default();
                let len = rng.gen_range(0..(3 * PS));
                let got = kind(c.truncate(&handles[&id], len).await).map(|_| Vec::new());
                let want = m.truncate(id, len);
                (format!("ftruncate h{id} {len}"), got, want)
            }
            58..=62 if !ids.is_empty() => {
                let id = pick(&mut rng).unwrap_or_default();
                let got = kind(c.commit(&handles[&id]).await).map(|_| Vec::new());
                let si = m.handles[&id].session;
                m.commit(si);
                (format!("fsync h{id}"), got, Ok(Vec::new()))
            }
            63..=72 if !ids.is_empty() => {
                let id = pick(&mut rng).unwrap_or_default();
                let w = handles.remove(&id).expect("handle");
                let got = kind(c.close(&w).await).map(|_| Vec::new());
                let want = m.close(id);
                (format!("close h{id}"), got, want)
            }
            73..=77 => {
                let got = kind(c.remove_file(&any_path).await).map(|_| Vec::new());
                let want = m.unlink(&any_path);
                (format!("unlink {any_path}"), got, want)
            }
            78..=82 => {
                let got = kind(c.mkdir(&any_path).await).map(|_| Vec::new());
                let want = m.mkdir(&any_path);
                (format!("mkdir {any_path}"), got, want)
            }
            83..=86 => {
                let got = kind(c.rmdir(&any_path).await).map(|_| Vec::new());
                let want = m.rmdir(&any_path);
                (format!("rmdir {any_path}"), got, want)
            }
            87..=95 => {
                // Sources among what exists, mostly.
                let mut existing: Vec<String> = m.view().into_keys().collect();
                existing.extend(m.dirs.iter().cloned());
                let from = if !existing.is_empty() && rng.gen_bool(0.9) {
                    existing[rng.gen_range(0..existing.len())].clone()
                } else {
                    any_path.clone()
                };
                let to_dir = &dirs[rng.gen_range(0..dirs.len())];
                let to = format!("{to_dir}/{}", NAMES[rng.gen_range(0..NAMES.len())]);
                let got = kind(c.rename(&from, &to).await).map(|_| Vec::new());
                let want = m.rename_check(&from, &to);
                if want.is_ok() {
                    // A refused move (below) keeps the commits made before it.
                    undo_model = Some(m.clone());
                    m.rename_apply(&from, &to);
                }
                (format!("rename {from} {to}"), got, want)
            }
            96..=97 => {
                // Crash: no close, no commit; a new client over the same store (and log).
                handles.clear();
                drop(c);
                c = rig.client();
                m.crash();
                ("crash+restart".to_string(), Ok(Vec::new()), Ok(Vec::new()))
            }
            _ => {
                // Clean restart: every handle closed first.
                let mut got = Ok(Vec::new());
                let mut ids: Vec<usize> = handles.keys().copied().collect();
                ids.sort_unstable();
                for id in ids {
                    let w = handles.remove(&id).expect("handle");
                    if let Err(e) = c.close(&w).await {
                        got = Err(e.kind());
                    }
                    let _ = m.close(id);
                }
                drop(c);
                c = rig.client();
                m.restart();
                ("close all+restart".to_string(), got, Ok(Vec::new()))
            }
        };
        history.push(desc.clone());
        // A directory holding `back` files not uploaded yet is not moved on an object store
        // (EXDEV, documented): whether the uploads finished first is a race.
        let exdev = write_type == WriteType::Back
            && desc.starts_with("rename")
            && got == Err(ErrorKind::CrossDevice)
            && want.is_ok();
        if exdev {
            history.push("  (EXDEV: not applied to the model)".into());
            if let Some(undo) = undo_model.take() {
                m = undo;
            }
        } else if got != want {
            panic!(
                "seed {seed} ({write_type}) step {step}: {desc}\n  got  {:?}\n  want {:?}\nhistory:\n{}",
                got.as_ref().map(|v| v.len()),
                want.as_ref().map(|v| v.len()),
                history.join("\n")
            );
        }
        check_view(&c, &m, seed, write_type, step, &history).await;
    }
    ops
}

/// Every file and its size as the client shows them (listings with live sessions), and the
/// bytes of every committed file not open for writing, equal the model's.
async fn check_view(
    c: &Client,
    m: &Model,
    seed: u64,
    write_type: WriteType,
    step: usize,
    history: &[String],
) {
    let mut seen = BTreeMap::new();
    let mut dirs = vec![ROOT.to_string()];
    let mut seen_dirs = BTreeSet::new();
    while let Some(d) = dirs.pop() {
        let list = c.list_live(&d).await.expect("list");
        for e in list.iter() {
            if e.is_dir() {
                seen_dirs.insert(e.path.clone());
                dirs.push(e.path.clone());
            } else {
                seen.insert(e.path.clone(), e.size);
            }
        }
    }
    let want = m.view();
    let fail = |what: String| -> ! {
        panic!(
            "seed {seed} ({write_type}) after step {step}: {what}\nhistory:\n{}",
            history.join("\n")
        )
    };
    if seen != want {
        fail(format!("files\n  got  {seen:?}\n  want {want:?}"));
    }
    // What a crash would keep: the committed files alone.
    let mut stored = BTreeSet::new();
    let mut dirs = vec![ROOT.to_string()];
    while let Some(d) = dirs.pop() {
        for e in c.list(&d).await.expect("list").iter() {
            if e.is_dir() {
                dirs.push(e.path.clone());
            } else {
                stored.insert(e.path.clone());
            }
        }
    }
    let want_stored: BTreeSet<String> = m.stored.keys().cloned().collect();
    if stored != want_stored {
        fail(format!(
            "committed files\n  got  {stored:?}\n  want {want_stored:?}"
        ));
    }
    if seen_dirs != m.dirs {
        fail(format!("dirs\n  got  {seen_dirs:?}\n  want {:?}", m.dirs));
    }
    for (p, data) in &m.stored {
        if m.live_session(p).is_some() {
            continue;
        }
        let got = match c.open(p).await {
            Ok(f) => c.read(&f, 0, f.size() + 1).await.map(|b| b.to_vec()),
            Err(e) => Err(e),
        };
        match got {
            Ok(b) if &b == data => {}
            other => fail(format!(
                "{p}: read {:?}, want {} bytes",
                other.map(|b| b.len()),
                data.len()
            )),
        }
    }
}

async fn runs(make: impl Fn(&Path) -> DynStore, write_type: WriteType) {
    let mut total = 0;
    for seed in common::model_seeds() {
        let dir = tempfile::tempdir().expect("tempdir");
        total += run(make(dir.path()), write_type, seed, common::model_ops()).await;
    }
    println!("write model ({write_type}): {total} operations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_on_an_object_store_through() {
    runs(object_store, WriteType::Through).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_on_a_local_directory_through() {
    runs(local, WriteType::Through).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_with_write_back_and_crashes() {
    runs(object_store, WriteType::Back).await;
}

fn local(p: &Path) -> DynStore {
    Arc::new(FsStore::new(p, Duration::from_secs(30)).expect("fs store"))
}

fn object_store(_: &Path) -> DynStore {
    Arc::new(MemStore::new("mem://model"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_on_a_local_directory_write_back() {
    runs(local, WriteType::Back).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_on_a_local_directory_store_only() {
    runs(local, WriteType::StoreOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_on_an_object_store_store_only() {
    runs(object_store, WriteType::StoreOnly).await;
}

/// Cache-only: the store never sees a file or a directory, and directories last until their
/// rmdir (Spark's pattern of renaming its last file out of one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_on_a_local_directory_cache_only() {
    runs(local, WriteType::CacheOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_matches_the_model_on_an_object_store_cache_only() {
    runs(object_store, WriteType::CacheOnly).await;
}
