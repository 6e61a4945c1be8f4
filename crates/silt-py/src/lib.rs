//! `silt._native`: the Silt client for Python. No second implementation: every call goes to
//! the same `silt_client::Client` (built by `silt_node`) the FUSE daemon serves, on a Tokio
//! runtime owned by the Python object, with the GIL released while it waits.
//!
//! How a client connects (`connect`, docs/python.md) is `silt_node::connect`, the decision the
//! S3 gateway makes too, `mode` picking a role or `auto` the first that applies:
//! - **cluster**: the options name etcd or static workers: a cluster client, as `silt mount`.
//! - **attached**: a Silt on this host owns the state directory (`silt up`, or another
//!   Python process's single node): a cluster client of that one worker over its Unix
//!   socket, sharing its cache (whole cached files are read straight from its cache files).
//! - **single**: nothing owns it and mounts are given: this process becomes the single node
//!   owning the directory (cache, metadata snapshot) and serves it to same-host processes, so
//!   DataLoader workers it starts attach to it instead of opening a second cache.
//!
//! What is Python's own: a cluster or attached client keeps its spilled writes in
//! `client_dir` or a temporary directory; in auto mode a process that finds the directory
//! locked waits for its owner (a sibling DataLoader worker) to serve it, then attaches.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use pyo3::exceptions::{PyConnectionError, PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use silt_client::{Entry, FileWriter, LocalRead, OpenFile, OpenOptions};
use silt_common::config::Config;
use silt_common::sys::ForkLocal;
use silt_common::{Error, ErrorKind};
use silt_node::connect::{Connected, OwnDir, Words};
use silt_node::Node;
use silt_ufs::EntryKind;

type Result<T> = std::result::Result<T, Error>;

/// A Silt error as the Python exception a Python user expects: `OSError` with the errno
/// (Python picks `FileNotFoundError`, `FileExistsError`, ... from it), `ValueError` for bad
/// input, `ConnectionError`/`TimeoutError` when Silt or its store cannot be reached.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::InvalidInput => invalid_argument(e.kind().errno(), msg),
        ErrorKind::Unavailable => PyConnectionError::new_err(msg),
        ErrorKind::Timeout => PyTimeoutError::new_err(msg),
        k => PyOSError::new_err((k.errno(), msg)),
    }
}

/// `silt.InvalidArgument(EINVAL, msg)`: an `OSError` with the errno `os` gives such calls and
/// a `ValueError` at once (docs/python.md); a plain `ValueError` if the package's class cannot
/// be had (the native module imported on its own).
fn invalid_argument(errno: i32, msg: String) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("silt")
            .and_then(|m| m.getattr("InvalidArgument"))
            .and_then(|class| class.call1((errno, msg.clone())));
        match made {
            Ok(err) => PyErr::from_value(err),
            Err(_) => PyValueError::new_err(msg),
        }
    })
}

/// How long a process that finds the state directory locked waits for its owner to start
/// serving it (an owner being set up: a sibling DataLoader worker, a starting `silt up`).
const OWNER_WAIT: Duration = Duration::from_secs(20);

/// Options the binding takes itself (not `Config` options).
const CLIENT_DIR: &str = "client_dir";

/// What Python's messages ask for, in Python's words.
const WORDS: Words = Words {
    role: "mode",
    mounts: "mounts={\"/data\": \"s3://bucket/prefix\"}",
    cluster: "etcd=\"http://HOST:2379\" or workers=\"ID=HOST:PORT,...\"",
    state_dir: "cache_dir",
    own_dir: "client_dir=DIR",
};

struct Inner {
    conn: ForkLocal<Connected>,
    rt: ForkLocal<Option<tokio::runtime::Runtime>>,
}

impl Inner {
    fn rt(&self) -> &tokio::runtime::Runtime {
        // Only `drop` takes the runtime.
        self.rt.as_ref().expect("runtime present until drop")
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt().block_on(f)
    }

    fn node(&self) -> &Node {
        &self.conn.node
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.rt.here() {
            return; // a forked child's: see `ForkLocal`
        }
        // Stop serving first (attached processes fail over to reading the store) and save
        // what the next single-node start can reuse, then stop the runtime; the state
        // directory's lock and the client's temporary directory go last, with `conn`.
        self.conn.close();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("silt-py")
        .enable_all()
        .build()
        .map_err(|e| Error::from(e).context("starting the client's runtime"))
}

/// The configuration: Python's defaults (writes go `through` to the store, logging at
/// `warn`), then `SILT_*` variables, then the options given.
fn config(options: &HashMap<String, String>) -> Result<Config> {
    let mut cfg = Config::default();
    cfg.set("write_type", "through")?;
    cfg.set("log", "warn")?;
    cfg.apply_env()?;
    for (k, v) in options {
        if k == CLIENT_DIR {
            continue;
        }
        cfg.set(k, v).map_err(|e| match e.kind() {
            ErrorKind::InvalidInput => e,
            _ => Error::invalid(e.to_string()),
        })?;
    }
    cfg.load_secret_files()?;
    cfg.validate()?;
    Ok(cfg)
}

/// The client `options` and `mode` ask for: `silt_node::connect`, with what is Python's own
/// (see the module docs).
fn connect(options: HashMap<String, String>, mode: &str) -> Result<Inner> {
    let want = WORDS.want(mode)?;
    let cfg = config(&options)?;
    silt_node::init_logging(&cfg, "python", "SILT_LOG", "warn");
    let rt = runtime()?;
    let opts = silt_node::connect::Options {
        want,
        own_dir: match options.get(CLIENT_DIR) {
            Some(dir) => OwnDir::Given(PathBuf::from(dir)),
            None => OwnDir::Temporary,
        },
        share: true,
        owner_wait: OWNER_WAIT,
        words: WORDS,
    };
    let conn = silt_node::connect::connect(&cfg, &opts, &rt)?;
    Ok(Inner {
        conn: ForkLocal::new(conn),
        rt: ForkLocal::new(Some(rt)),
    })
}

/// The client: one per process and configuration (the Python layer keeps them, and makes a
/// new one in a forked child).
#[pyclass(module = "silt._native", name = "Client", frozen)]
struct PyClient {
    inner: RwLock<Option<Arc<Inner>>>,
}

impl PyClient {
    fn get(&self) -> PyResult<Arc<Inner>> {
        self.inner
            .read()
            .map_err(|_| PyOSError::new_err("silt client lock poisoned"))?
            .clone()
            .ok_or_else(|| PyValueError::new_err("this silt client is closed"))
    }
}

fn entry_dict<'py>(py: Python<'py>, e: &Entry) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &e.path)?;
    d.set_item("size", e.size)?;
    d.set_item(
        "type",
        match e.kind {
            EntryKind::File => "file",
            EntryKind::Dir => "directory",
            EntryKind::Symlink => "link",
            EntryKind::Special(_) => "other",
        },
    )?;
    let mtime = e
        .mtime
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    d.set_item("mtime", mtime)?;
    d.set_item(
        "mode",
        e.mode
            .unwrap_or_else(|| silt_client::attrs::default_mode(e.is_dir())),
    )?;
    if let Some(o) = &e.object {
        d.set_item("etag", o.meta.etag.clone())?;
        d.set_item("version", o.meta.version.clone())?;
    }
    Ok(d)
}

/// The version of `path` open now, for a read of `[start, end)` (`end` None: to its end; a
/// start past the end reads nothing).
async fn open_range(
    c: &silt_client::Client,
    path: &str,
    start: u64,
    end: Option<u64>,
) -> Result<(silt_client::OpenFile, u64, u64)> {
    let f = c.open(path).await?;
    let end = end.unwrap_or(u64::MAX).min(f.size());
    Ok((f, start.min(end), end))
}

/// Where a `bytes` made with its contents unset is filled, away from the GIL.
struct Unfilled(*mut u8, usize);

// SAFETY: the bytes object is this call's alone until it is returned (no Python code sees
// it before it is filled), and each is filled by one task.
unsafe impl Send for Unfilled {}

/// The ranges `[(path, start, end)]` read into `bytes` objects, side by side (64 at a time); a
/// failed range gives its error in its place. Each `bytes` is made at its final size first and
/// the client reads straight into it (`Client::read_into`: a same-host owner's cache file read
/// in place), so a fresh loader process touches each byte once, as a read through the mount
/// does.
fn read_ranges<'py>(
    py: Python<'py>,
    inner: &Inner,
    ranges: &[(String, u64, Option<u64>)],
) -> Vec<PyResult<Bound<'py, PyBytes>>> {
    use futures::stream::{self, StreamExt};
    let client = &inner.node().client;
    let opened: Vec<Result<(silt_client::OpenFile, u64, u64)>> = py.detach(|| {
        inner.block_on(
            stream::iter(ranges)
                .map(|(path, start, end)| open_range(client, path, *start, *end))
                .buffered(64)
                .collect(),
        )
    });
    let mut out: Vec<PyResult<Bound<'py, PyBytes>>> = Vec::with_capacity(ranges.len());
    let mut fills = Vec::new();
    for o in opened {
        match o.map_err(py_err).and_then(|(file, start, end)| {
            unfilled(py, (end - start) as usize).map(|(b, dest)| (b, file, start, dest))
        }) {
            Ok((bytes, file, start, dest)) => {
                fills.push((out.len(), file, start, dest));
                out.push(Ok(bytes));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    let filled: Vec<(usize, Result<()>)> = py.detach(|| {
        inner.block_on(
            stream::iter(fills)
                .map(|(i, file, start, dest)| async move {
                    // SAFETY: see `Unfilled`: the bytes object lives in `out` meanwhile.
                    let buf = unsafe { std::slice::from_raw_parts_mut(dest.0, dest.1) };
                    (i, client.read_into(&file, start, buf).await)
                })
                .buffered(64)
                .collect(),
        )
    });
    for (i, r) in filled {
        if let Err(e) = r {
            out[i] = Err(py_err(e));
        }
    }
    out
}

/// A `bytes` of `len` bytes with its contents unset, and where to write them. The caller
/// fills it whole before any Python code can see it.
fn unfilled(py: Python<'_>, len: usize) -> PyResult<(Bound<'_, PyBytes>, Unfilled)> {
    let n = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("read too large for bytes"))?;
    // SAFETY: a new bytes object of `len` bytes, owned here; its buffer is `len` bytes long.
    unsafe {
        let ptr = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), n);
        let bytes = Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked::<PyBytes>();
        let at = pyo3::ffi::PyBytes_AsString(ptr).cast::<u8>();
        Ok((bytes, Unfilled(at, len)))
    }
}

/// One `bytes` of the chunks, copied once (`PyBytes::new_with` would zero it first: for a
/// batch of files in a fresh loader process, a second pass over memory touched the first
/// time).
fn concat<'py>(py: Python<'py>, chunks: &[Bytes]) -> PyResult<Bound<'py, PyBytes>> {
    if let [one] = chunks {
        return Ok(PyBytes::new(py, one));
    }
    let total: usize = chunks.iter().map(Bytes::len).sum();
    let len = pyo3::ffi::Py_ssize_t::try_from(total)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("read too large for bytes"))?;
    // SAFETY: a bytes object of `total` bytes is made with its contents unset and filled
    // whole below, before any Python code can see it.
    unsafe {
        let ptr = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len);
        let bytes = Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked::<PyBytes>();
        let mut at = pyo3::ffi::PyBytes_AsString(ptr).cast::<u8>();
        for c in chunks {
            std::ptr::copy_nonoverlapping(c.as_ptr(), at, c.len());
            at = at.add(c.len());
        }
        Ok(bytes)
    }
}

#[pymethods]
impl PyClient {
    /// `options`: configuration options by name (docs/CONFIGURATION.md) as text, plus
    /// `client_dir`. `mode`: auto | single | attached | cluster (`silt_node::Role`; the earlier
    /// embedded and attach are taken too).
    #[new]
    #[pyo3(signature = (options, mode = "auto"))]
    fn new(py: Python<'_>, options: HashMap<String, String>, mode: &str) -> PyResult<Self> {
        let inner = py.detach(|| connect(options, mode)).map_err(py_err)?;
        Ok(PyClient {
            inner: RwLock::new(Some(Arc::new(inner))),
        })
    }

    /// `single`, `attached` or `cluster` (`silt_node::Role::word`).
    #[getter]
    fn mode(&self) -> PyResult<&'static str> {
        Ok(self.get()?.conn.role().word())
    }

    /// The state directory this client owns (single) or attached to.
    #[getter]
    fn owner_dir(&self) -> PyResult<String> {
        Ok(self.get()?.conn.owner_dir().display().to_string())
    }

    #[getter]
    fn page_size(&self) -> PyResult<u64> {
        Ok(self.get()?.node().client.page_size())
    }

    /// The namespace: `[(path, uri), ...]`.
    fn mounts(&self) -> PyResult<Vec<(String, String)>> {
        Ok(silt_node::client_mounts(&self.get()?.node().client)
            .into_iter()
            .map(|m| (m.path, m.uri))
            .collect())
    }

    /// Stops the client: a single node stops serving its cache and saves its metadata.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self
            .inner
            .write()
            .map_err(|_| PyOSError::new_err("silt client lock poisoned"))?
            .take();
        py.detach(move || drop(inner));
        Ok(())
    }

    fn stat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.get()?;
        let e = py
            .detach(|| inner.block_on(inner.node().client.stat_live(path)))
            .map_err(py_err)?
            .0;
        entry_dict(py, &e)
    }

    /// The S3 headers of the file at `path` (`Client::headers`): `content_type` and the other
    /// standard headers (None when absent), `metadata` (the user metadata), `checksums` and
    /// `checksum_type`, `parts` (the part sizes of a multipart upload).
    fn headers<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.get()?;
        let h = py
            .detach(|| {
                inner.block_on(async {
                    let e = inner.node().client.stat(path).await?;
                    inner.node().client.headers(&e).await
                })
            })
            .map_err(py_err)?;
        let d = PyDict::new(py);
        d.set_item("content_type", h.content_type.clone())?;
        d.set_item("cache_control", h.cache_control.clone())?;
        d.set_item("content_disposition", h.content_disposition.clone())?;
        d.set_item("content_encoding", h.content_encoding.clone())?;
        d.set_item("content_language", h.content_language.clone())?;
        d.set_item("expires", h.expires.clone())?;
        let user = PyDict::new(py);
        for (k, v) in &h.user {
            user.set_item(k, v)?;
        }
        d.set_item("metadata", user)?;
        let sums = PyDict::new(py);
        for (k, v) in &h.checksums {
            sums.set_item(k, v)?;
        }
        d.set_item("checksums", sums)?;
        d.set_item("checksum_type", h.checksum_type.clone())?;
        d.set_item("parts", h.parts.clone())?;
        Ok(d)
    }

    fn ls<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyList>> {
        let inner = self.get()?;
        let list = py
            .detach(|| inner.block_on(inner.node().client.list_live(path)))
            .map_err(py_err)?;
        let out = PyList::empty(py);
        for e in list.iter() {
            out.append(entry_dict(py, e)?)?;
        }
        Ok(out)
    }

    /// Bytes `[start, end)` of a file (`end` None: to the end).
    #[pyo3(signature = (path, start = 0, end = None))]
    fn cat<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        start: u64,
        end: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let inner = self.get()?;
        let ranges = [(path.to_string(), start, end)];
        read_ranges(py, &inner, &ranges)
            .pop()
            .unwrap_or_else(|| Err(PyValueError::new_err("no range read")))
    }

    /// Many ranges at once, read side by side: `[(path, start, end), ...]` → `[bytes, ...]`;
    /// a failed range gives its exception in its place.
    fn cat_ranges<'py>(
        &self,
        py: Python<'py>,
        ranges: Vec<(String, u64, Option<u64>)>,
    ) -> PyResult<Bound<'py, PyList>> {
        let inner = self.get()?;
        let out = PyList::empty(py);
        for r in read_ranges(py, &inner, &ranges) {
            match r {
                Ok(b) => out.append(b)?,
                Err(e) => out.append(e.into_value(py))?,
            }
        }
        Ok(out)
    }

    /// Opens a file for reading: the version it has now, for every read of the handle.
    fn open(&self, py: Python<'_>, path: &str) -> PyResult<Reader> {
        let inner = self.get()?;
        let file = py
            .detach(|| inner.block_on(inner.node().client.open(path)))
            .map_err(py_err)?;
        Ok(Reader {
            local: ForkLocal::new(Default::default()),
            tried_local: AtomicBool::new(false),
            inner,
            file: ForkLocal::new(file),
        })
    }

    /// Opens a file for writing: `w` (create or truncate), `a` (create, append) or `x`
    /// (create, fail if it exists). The bytes are the store's (per the write type) at
    /// `close`.
    fn open_write(&self, py: Python<'_>, path: &str, mode: &str) -> PyResult<Writer> {
        let opts = match mode {
            "w" => OpenOptions {
                create: true,
                truncate: true,
                load_now: true,
                ..Default::default()
            },
            "a" => OpenOptions {
                create: true,
                append: true,
                load_now: true,
                ..Default::default()
            },
            "x" => OpenOptions {
                create: true,
                exclusive: true,
                load_now: true,
                ..Default::default()
            },
            m => {
                return Err(PyValueError::new_err(format!(
                    "write mode {m:?}: expected w, a or x"
                )))
            }
        };
        let inner = self.get()?;
        let w = py
            .detach(|| inner.block_on(inner.node().client.open_write(path, opts)))
            .map_err(py_err)?;
        Ok(Writer {
            pos: AtomicU64::new(w.len()),
            closed: AtomicBool::new(false),
            inner,
            w: ForkLocal::new(w),
        })
    }

    /// Writes a whole file (`w`) in one call.
    fn pipe(&self, py: Python<'_>, path: &str, data: &[u8]) -> PyResult<()> {
        let inner = self.get()?;
        py.detach(|| {
            inner.block_on(async {
                let c = &inner.node().client;
                let w = c
                    .open_write(
                        path,
                        OpenOptions {
                            create: true,
                            truncate: true,
                            load_now: true,
                            ..Default::default()
                        },
                    )
                    .await?;
                let wrote = c.write(&w, 0, data).await;
                let closed = c.close(&w).await;
                wrote.and(closed)
            })
        })
        .map_err(py_err)
    }

    fn mkdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().client.mkdir(path)))
            .map(drop)
            .map_err(py_err)
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().client.rmdir(path)))
            .map_err(py_err)
    }

    fn rm_file(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().client.remove_file(path)))
            .map_err(py_err)
    }

    fn rename(&self, py: Python<'_>, from: &str, to: &str) -> PyResult<()> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().client.rename(from, to)))
            .map(drop)
            .map_err(py_err)
    }

    /// Forgets the cached metadata and pages at or below `path`.
    fn invalidate(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().client.invalidate(path)))
            .map(drop)
            .map_err(py_err)
    }

    /// Revalidates `path` (below it with `recursive`) against the store now.
    #[pyo3(signature = (path, recursive = false))]
    fn sync(&self, py: Python<'_>, path: &str, recursive: bool) -> PyResult<(u64, u64)> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().client.sync(path, recursive)))
            .map(|r| {
                (
                    r.checked,
                    r.added + r.removed + r.content_changed + r.metadata_changed,
                )
            })
            .map_err(py_err)
    }

    /// For each path the fraction of its pages cached here or on the cluster's workers (None:
    /// not a file). No data moves.
    fn residency(&self, py: Python<'_>, paths: Vec<String>) -> PyResult<Vec<Option<f64>>> {
        let inner = self.get()?;
        Ok(py.detach(|| inner.block_on(inner.node().residency(&paths))))
    }

    /// Starts fetching `paths` for reads coming soon, in the background; returns at once.
    /// Not a load: each page is admitted as the read will find it, and nothing counts as a
    /// read until it is read (see `Node::prefetch`).
    fn prefetch(&self, paths: Vec<String>) -> PyResult<()> {
        let inner = self.get()?;
        let node = inner.node().clone();
        inner.rt().spawn(async move {
            node.prefetch(&paths).await;
        });
        Ok(())
    }

    /// Pins the files at or below `path` (loaded, never evicted): a dict of files, bytes,
    /// cached_bytes, pinned_bytes. In this process's cache (single) or on the owner or
    /// workers holding each part (attached, cluster), like `silt fs pin`.
    fn pin<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.get()?;
        let u = py
            .detach(|| inner.block_on(inner.node().pin(path)))
            .map_err(py_err)?;
        usage_dict(py, &u)
    }

    /// Unpins the files at or below `path`; how many were pinned.
    fn unpin(&self, py: Python<'_>, path: &str) -> PyResult<u64> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().unpin(path)))
            .map_err(py_err)
    }

    /// Drops the cached pages (and pins) of the files at or below `path`: what was cached.
    fn free<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.get()?;
        let u = py
            .detach(|| inner.block_on(inner.node().free(path)))
            .map_err(py_err)?;
        usage_dict(py, &u)
    }

    /// `free` of each of `paths`, many at once: what was cached before, summed.
    fn free_all<'py>(&self, py: Python<'py>, paths: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.get()?;
        let u = py
            .detach(|| inner.block_on(inner.node().free_all(&paths)))
            .map_err(py_err)?;
        usage_dict(py, &u)
    }

    /// `(capacity, used)` in bytes of the cache holding this client's data (its disk tiers, or
    /// the owner's or the workers'): what a sampler may prefetch into without evicting.
    fn cache_space(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        let inner = self.get()?;
        Ok(py.detach(|| inner.block_on(inner.node().cache_space())))
    }

    /// How much of the files at or below `path` is cached and pinned (here, and on the owner
    /// or workers for attached and cluster clients).
    fn cache_usage<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.get()?;
        let u = py
            .detach(|| inner.block_on(inner.node().cache_usage(path)))
            .map_err(py_err)?;
        usage_dict(py, &u)
    }

    /// Loads every file at or below `path` into the cache and waits: (files, bytes).
    fn load(&self, py: Python<'_>, path: &str) -> PyResult<(u64, u64)> {
        let inner = self.get()?;
        py.detach(|| inner.block_on(inner.node().client.load(path, |_| {})))
            .map(|p| (p.files_total, p.bytes_total))
            .map_err(py_err)
    }

    /// Page-cache counters of this process: hits, misses, bytes per tier.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.get()?;
        let s = inner.node().client.cache_stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("bytes_cached", s.tiers.iter().map(|t| t.used).sum::<u64>())?;
        Ok(d)
    }
}

fn usage_dict<'py>(py: Python<'py>, u: &silt_client::CacheUsage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("files", u.files)?;
    d.set_item("bytes", u.bytes)?;
    d.set_item("cached_bytes", u.cached_bytes)?;
    d.set_item("pinned_bytes", u.pinned_bytes)?;
    Ok(d)
}

/// A file open for reading (one pinned version). Reads of a file whole in a same-host cache
/// come straight from the cache file (like FUSE passthrough); others through the client,
/// whose read-ahead follows sequential readers.
#[pyclass(module = "silt._native", frozen)]
struct Reader {
    inner: Arc<Inner>,
    file: ForkLocal<OpenFile>,
    local: ForkLocal<RwLock<Option<Arc<dyn LocalRead>>>>,
    tried_local: AtomicBool,
}

impl Reader {
    /// Looks for a local cache file once, when a read wants more than a page (small files
    /// are one page read anyway).
    fn try_local(&self) {
        if self.tried_local.swap(true, Ordering::AcqRel) {
            return;
        }
        let found = self.inner.node().client.local_reader(self.file.object());
        if let Ok(mut local) = self.local.write() {
            *local = found.map(Arc::from);
        }
    }
}

#[pymethods]
impl Reader {
    #[getter]
    fn size(&self) -> u64 {
        self.file.size()
    }

    /// Up to `len` bytes at `offset` (fewer only at end of file).
    fn read<'py>(&self, py: Python<'py>, offset: u64, len: u64) -> PyResult<Bound<'py, PyBytes>> {
        let size = self.file.size();
        let n = len.min(size.saturating_sub(offset));
        if n == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        if n > self.inner.node().client.page_size() {
            py.detach(|| self.try_local());
        }
        let failed = match self.local.read().as_deref() {
            Ok(Some(l)) => {
                let read = PyBytes::new_with(py, n as usize, |buf| {
                    py.detach(|| l.read_into(offset, buf))
                        .map_err(|e| PyOSError::new_err(e.to_string()))
                });
                match read {
                    Ok(b) => return Ok(b),
                    Err(e) => {
                        tracing::warn!(path = %self.file.object().meta.path, error = %e, "local read failed; reading through Silt");
                        true
                    }
                }
            }
            _ => false,
        };
        if failed {
            // A page failed its check (the worker restarted under the lease, say): read
            // through the client from now on, as if there were no local file.
            if let Ok(mut local) = self.local.write() {
                *local = None;
            }
        }
        let inner = &self.inner;
        let chunks = py
            .detach(|| inner.block_on(inner.node().client.read_chunks(&self.file, offset, n)))
            .map_err(py_err)?;
        concat(py, &chunks)
    }

    /// Whether reads come from a local cache file.
    #[getter]
    fn is_local(&self) -> bool {
        self.local.read().map(|l| l.is_some()).unwrap_or(false)
    }

    /// [`map`] begun now on the client's threads, every page mapped and checked there too: a
    /// `PendingMap` whose `wait()` gives the `Mapping`, or `None` where `map` would, or where
    /// a page does not hold its checksum (the caller reads through the client then). For a
    /// reader that wants the next file ready while it works on this one, without the GIL.
    fn map_ahead(slf: Py<Reader>) -> PendingMap {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let rt = slf.get().inner.rt().handle().clone();
        rt.spawn_blocking(move || {
            let r = slf.get();
            r.try_local();
            let source = r.local.read().ok().and_then(|l| l.clone());
            let mapped = match source.map(Mapping::new) {
                Some(Ok(Some(m))) => {
                    m.populate_now();
                    match m.check_range(0, m.size) {
                        Ok(()) => Ok(Some(m)),
                        Err(why) => {
                            tracing::warn!(path = %r.file.object().meta.path, why, "mapped cache file failed its check; reading through Silt");
                            Ok(None)
                        }
                    }
                }
                Some(Err(e)) => Err(e),
                _ => Ok(None),
            };
            let _ = tx.send(mapped);
            // `slf` is let go here, off the GIL: pyo3 defers the reference count.
        });
        PendingMap {
            rx: std::sync::Mutex::new(Some(rx)),
        }
    }

    /// The local cache file mapped for zero-copy views (`None`: no local file, or an empty
    /// one): it keeps the file's pages pinned while it lives (see `Mapping`).
    fn map(&self, py: Python<'_>) -> PyResult<Option<Mapping>> {
        py.detach(|| self.try_local());
        let source = match self.local.read() {
            Ok(l) => l.clone(),
            Err(_) => None,
        };
        let Some(source) = source else {
            return Ok(None);
        };
        Mapping::new(source).map_err(py_err)
    }
}

/// A whole local cache file mapped read-only, holding what keeps it as it is (the lease on its
/// owner's pin) for as long as it lives. Python maps the same file (`mmap`, through `fileno`)
/// to hand out views and keeps this object beside that map; `check` verifies each page once,
/// before a view of it is given out, against the owner's checksums (a file of this process's
/// own cache was verified when taken). A cache file truncated by hand under a map makes reads
/// of the lost part fault (SIGBUS), as for any mapped file; Silt itself never truncates a
/// pinned file.
#[pyclass(module = "silt._native", frozen)]
struct Mapping {
    /// The reader of the file: it keeps the file (and the owner's pin on it) while it lives.
    source: ForkLocal<Arc<dyn LocalRead>>,
    addr: usize,
    size: u64,
    /// The pages checked so far (each one once), when the file has checksums to check.
    checked: Vec<AtomicBool>,
    /// Where `read` goes on from (the map read as a stream).
    pos: AtomicU64,
}

impl Mapping {
    fn new(source: Arc<dyn LocalRead>) -> Result<Option<Mapping>> {
        use std::os::fd::AsRawFd;
        let Some(ms) = source.map_source() else {
            return Ok(None);
        };
        let Ok(len) = usize::try_from(ms.size) else {
            return Ok(None);
        };
        if len == 0 {
            return Ok(None);
        }
        let pages = ms.pages.map_or(0, |(_, crcs)| crcs.len());
        // SAFETY: a read-only shared map of a file we hold open; unmapped in `drop`.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                ms.file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(
                Error::from(std::io::Error::last_os_error()).context("mapping a local cache file")
            );
        }
        let size = ms.size;
        Ok(Some(Mapping {
            addr: addr as usize,
            size,
            checked: (0..pages).map(|_| AtomicBool::new(false)).collect(),
            pos: AtomicU64::new(0),
            source: ForkLocal::new(source),
        }))
    }

    /// Maps every page now, in one call, instead of a fault per 4 KiB as they are first read
    /// (`MADV_POPULATE_READ`; a kernel older than 5.14 faults them in as before).
    fn populate_now(&self) {
        // SAFETY: advice on the map made in `new`; it changes no byte of it.
        unsafe {
            libc::madvise(
                self.addr as *mut libc::c_void,
                self.size as usize,
                libc::MADV_POPULATE_READ,
            );
        }
    }

    /// Checks the pages of `[offset, offset + len)` not checked yet (each once); the message
    /// names the first page that does not hold its checksum.
    fn check_range(&self, offset: u64, len: u64) -> std::result::Result<(), String> {
        let Some(ms) = self.source.map_source() else {
            return Ok(());
        };
        let Some((ps, _)) = ms.pages else {
            return Ok(());
        };
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(());
        }
        for page in offset / ps..=(end - 1) / ps {
            let Some(done) = self.checked.get(page as usize) else {
                break;
            };
            if done.load(Ordering::Acquire) {
                continue;
            }
            let start = (page * ps) as usize;
            let stop = ((page + 1) * ps).min(self.size) as usize;
            ms.check(page, &self.bytes()[start..stop])
                .map_err(|e| format!("page {page} of a mapped cache file: {e}"))?;
            done.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `addr` maps `size` bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.size as usize) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the map made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.size as usize);
        }
    }
}

#[pymethods]
impl Mapping {
    /// The mapped file's descriptor (for Python's `mmap`, which duplicates it).
    fn fileno(&self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        match self.source.map_source() {
            Some(ms) => Ok(ms.file.as_raw_fd()),
            None => Err(PyOSError::new_err("the mapped file is gone")),
        }
    }

    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// Up to `n` bytes from the stream position (all the rest: `n` < 0), their pages checked
    /// first, as `bytes`: the map read as a binary file (tarfile's stream mode reads through
    /// it), by one reader at a time, as a file object is.
    #[pyo3(signature = (n = -1))]
    fn read<'py>(&self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, PyBytes>> {
        let at = self.pos.load(Ordering::Acquire).min(self.size);
        let rest = self.size - at;
        let len = if n < 0 { rest } else { (n as u64).min(rest) };
        // Checked here, holding the GIL: a page's check is once (a CRC of one page), every
        // later read of it a look at its flag, cheaper than letting go of the GIL.
        self.check_range(at, len)
            .map_err(|e| PyOSError::new_err((libc::EIO, e)))?;
        self.pos.store(at + len, Ordering::Release);
        Ok(PyBytes::new(
            py,
            &self.bytes()[at as usize..(at + len) as usize],
        ))
    }

    /// Moves the stream position (`whence` 0: from the start, 1: from here, 2: from the end);
    /// returns it.
    #[pyo3(signature = (offset, whence = 0))]
    fn seek(&self, offset: i64, whence: i32) -> PyResult<u64> {
        let base = match whence {
            0 => 0,
            1 => self.pos.load(Ordering::Acquire) as i64,
            2 => self.size as i64,
            w => {
                return Err(PyValueError::new_err(format!(
                    "whence {w}: expected 0, 1 or 2"
                )))
            }
        };
        let to = base
            .checked_add(offset)
            .filter(|&p| p >= 0)
            .ok_or_else(|| PyValueError::new_err("negative seek position"))?;
        self.pos.store(to as u64, Ordering::Release);
        Ok(to as u64)
    }

    fn tell(&self) -> u64 {
        self.pos.load(Ordering::Acquire)
    }

    fn readable(&self) -> bool {
        true
    }

    /// Verifies the pages of `[offset, offset + len)` not verified yet; `OSError` (EIO) when
    /// one does not hold its checksum (nothing of it may be used).
    fn check(&self, py: Python<'_>, offset: u64, len: u64) -> PyResult<()> {
        py.detach(|| self.check_range(offset, len))
            .map_err(|e| PyOSError::new_err((libc::EIO, e)))
    }
}

/// A `Mapping` being made (`Reader.map_ahead`).
#[pyclass(module = "silt._native", frozen)]
struct PendingMap {
    rx: std::sync::Mutex<Option<std::sync::mpsc::Receiver<Result<Option<Mapping>>>>>,
}

#[pymethods]
impl PendingMap {
    /// The `Mapping` (or `None`), once made; the second call is an error.
    fn wait(&self, py: Python<'_>) -> PyResult<Option<Mapping>> {
        let rx = self
            .rx
            .lock()
            .ok()
            .and_then(|mut rx| rx.take())
            .ok_or_else(|| PyValueError::new_err("PendingMap.wait called twice"))?;
        match py.detach(move || rx.recv()) {
            Ok(r) => r.map_err(py_err),
            Err(_) => Err(PyOSError::new_err(
                "the map was dropped unmade (client closed)",
            )),
        }
    }
}

/// A file open for writing.
#[pyclass(module = "silt._native", frozen)]
struct Writer {
    inner: Arc<Inner>,
    w: ForkLocal<FileWriter>,
    pos: AtomicU64,
    closed: AtomicBool,
}

#[pymethods]
impl Writer {
    /// Writes `data` at the handle's position (at the end for `a`); returns its length.
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<usize> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PyValueError::new_err("write to a closed file"));
        }
        let pos = self.pos.fetch_add(data.len() as u64, Ordering::AcqRel);
        let inner = &self.inner;
        py.detach(|| inner.block_on(inner.node().client.write(&self.w, pos, data)))
            .map_err(py_err)?;
        Ok(data.len())
    }

    /// Where the next write goes: bytes written so far, after the file's length at open for
    /// `a`.
    fn tell(&self) -> u64 {
        self.pos.load(Ordering::Acquire)
    }

    /// Makes what was written so far what the write type promises (the store has it, for
    /// `through`), keeping the file open.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.block_on(inner.node().client.commit(&self.w)))
            .map(drop)
            .map_err(py_err)
    }

    /// Commits and closes (once; later calls do nothing).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let inner = &self.inner;
        py.detach(|| inner.block_on(inner.node().client.close(&self.w)))
            .map_err(py_err)
    }
}

/// glibc's allocator, tuned for a process that reads many files of 100 KB to a few MiB (a data
/// loader): by default each buffer over 128 KiB is a fresh `mmap` (and each thread's heap gives
/// freed memory back at once), so every read pays page faults and zeroing for memory it just
/// freed; measured here at a third of the SDK's time per small file. Buffers up to 4 MiB come
/// from the heap instead, and up to 128 MiB of freed heap is kept for the next reads. Left
/// alone when the process chose its own (`GLIBC_TUNABLES`, `MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`) or with `SILT_PY_MALLOC=system`.
fn tune_allocator() {
    let chosen = [
        "GLIBC_TUNABLES",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    if chosen || std::env::var("SILT_PY_MALLOC").is_ok_and(|v| v == "system") {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's thresholds; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tune_allocator();
    m.add_class::<PyClient>()?;
    m.add_class::<Reader>()?;
    m.add_class::<Mapping>()?;
    m.add_class::<PendingMap>()?;
    m.add_class::<Writer>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
