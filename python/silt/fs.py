"""The ``silt://`` fsspec filesystem: a thin adapter over the native Silt client.

Every call goes to the Rust client (``silt._native``); Python only translates fsspec's calls
and keeps one native client per process and configuration.  A client made in a parent is never
used in a forked child: the child makes its own (attaching to the parent's cache when the
parent owns one), and a filesystem unpickled in a spawned process does the same.
"""

import atexit
import errno
import io
import mmap
import os
import threading

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from silt import _native

# One native client per (options, mode) in this process, with the stamp of its owner's attach
# file for an attached one (see `_attach_stamp`).
_clients = {}
_clients_pid = os.getpid()
_lock = threading.Lock()
# Clients inherited through fork: never used and never freed in the child (freeing one would
# stop a runtime whose threads did not survive the fork).
_inherited = []


def _forget_after_fork():
    global _clients, _clients_pid, _lock
    _inherited.extend(c for c, _, _ in _clients.values())
    _clients = {}
    _clients_pid = os.getpid()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _close_all():
    # Owners save their metadata and stop serving before the interpreter goes.
    if os.getpid() != _clients_pid:
        return
    for c, _, _ in list(_clients.values()):
        try:
            c.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    _clients.clear()


def _attach_stamp(path):
    """Which attach file `path` is now (inode, mtime; None: none): an owner writes a new one
    when it starts (and when its sync rules change), so a different stamp means the client
    made from the old one may be talking to an owner that is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)


def _native_client(options, mode):
    key = (tuple(sorted(options.items())), mode)
    if os.getpid() != _clients_pid:
        _forget_after_fork()
    with _lock:
        found = _clients.get(key)
        if found is not None:
            c, attach_file, stamp = found
            # An attached client of an owner since restarted (or re-written) is replaced, not
            # reused: one made before a restart over a state directory made anew proved
            # nothing to the new owner and answered residency and cache space as empty. The
            # old one is left to whoever still holds it (its open files), not closed.
            if attach_file is None or _attach_stamp(attach_file) == stamp:
                return c
        c = _native.Client(options, mode)
        attach_file = os.path.join(c.owner_dir, "attach.json") if c.mode == "attached" else None
        _clients[key] = (c, attach_file, _attach_stamp(attach_file) if attach_file else None)
        return c


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _options(mounts, cache_dir, etcd, workers, client_dir, options):
    out = {k: _text(v) for k, v in options.items() if v is not None}
    if mounts is not None:
        out["mounts"] = _text(mounts)
    if cache_dir is not None:
        out["state_dir"] = os.fspath(cache_dir)
    if etcd is not None:
        out["etcd"] = _text(etcd)
    if workers is not None:
        out["workers"] = _text(workers)
    if client_dir is not None:
        out["client_dir"] = os.fspath(client_dir)
    return out


class SiltFileSystem(AbstractFileSystem):
    """Silt's namespace as an fsspec filesystem.

    ``SiltFileSystem()`` attaches to the ``silt up`` of this host (state dir
    ``SILT_STATE_DIR`` or /var/lib/silt); ``etcd=`` or ``workers=`` join a cluster;
    ``mounts={"/data": "s3://bucket/prefix"}`` with ``cache_dir=`` runs a single node when nothing
    serves that directory yet.  Other keyword arguments are Silt options by name
    (docs/CONFIGURATION.md), e.g. ``s3_endpoint=``, ``write_type=``, ``memory_capacity=``.
    """

    protocol = "silt"
    root_marker = "/"

    def __init__(
        self,
        mounts=None,
        cache_dir=None,
        etcd=None,
        workers=None,
        mode="auto",
        client_dir=None,
        block_size=None,
        **options,
    ):
        fsspec_options = {
            k: options.pop(k)
            for k in ("use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache", "asynchronous", "loop")
            if k in options
        }
        super().__init__(
            mounts=mounts,
            cache_dir=cache_dir,
            etcd=etcd,
            workers=workers,
            mode=mode,
            client_dir=client_dir,
            block_size=block_size,
            **options,
            **fsspec_options,
        )
        self._native_options = _options(mounts, cache_dir, etcd, workers, client_dir, options)
        self._mode = mode
        self.blocksize = block_size or 4 * 2**20
        # Connect now: a bad option or an unreachable cluster fails here, with its message.
        self.client

    def close(self):
        """Closes this process's native client of this configuration (a single node stops
        serving its cache and saves its metadata). A later call makes a new one."""
        key = (tuple(sorted(self._native_options.items())), self._mode)
        with _lock:
            found = _clients.pop(key, None) if os.getpid() == _clients_pid else None
        if found is not None:
            found[0].close()

    @property
    def client(self):
        """The native client of this process (made again in a forked or spawned child)."""
        return _native_client(self._native_options, self._mode)

    # -- paths -----------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = os.fspath(path)
        if path.startswith("silt://"):
            path = path[len("silt://") :]
        elif path.startswith("silt:"):
            path = path[len("silt:") :]
        path = "/" + path.lstrip("/")
        if len(path) > 1:
            path = path.rstrip("/")
        return path

    def unstrip_protocol(self, name):
        return "silt://" + name.lstrip("/")

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    def _parent(self, path):
        path = self._strip_protocol(path)
        parent = path.rsplit("/", 1)[0]
        return parent or "/"

    # -- metadata --------------------------------------------------------------------------

    def info(self, path, **kwargs):
        return self.client.stat(self._strip_protocol(path))

    def headers(self, path):
        """What an S3 client stored with the file besides its bytes (through Silt's S3
        gateway, or in the store): ``content_type`` and the other standard headers,
        ``metadata`` (the user metadata), ``checksums``, ``checksum_type`` and ``parts``."""
        return self.client.headers(self._strip_protocol(path))

    def metadata(self, path, **kwargs):
        """The file's user metadata (``x-amz-meta-*``), as s3fs's ``metadata()`` gives it."""
        return self.headers(path)["metadata"]

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if st["type"] != "directory":
            entries = [st]
        else:
            entries = self.client.ls(path)
        if detail:
            return entries
        return [e["name"] for e in entries]

    def exists(self, path, **kwargs):
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def modified(self, path):
        import datetime

        mtime = self.info(path).get("mtime")
        if mtime is None:
            raise ValueError(f"{path}: the store keeps no modification time")
        return datetime.datetime.fromtimestamp(mtime, tz=datetime.timezone.utc)

    def checksum(self, path):
        """A number that changes when the file's version changes (ETag or mtime and size)."""
        i = self.info(path)
        return int(
            abs(hash((i["name"], i["size"], i.get("etag"), i.get("version"), i.get("mtime"))))
        )

    def invalidate_cache(self, path=None):
        """Forgets what Silt has cached (metadata and pages) at or below ``path`` (all
        mounts when None): the next access asks the store."""
        paths = [self._strip_protocol(path)] if path else [p for p, _ in self.client.mounts()]
        for p in paths:
            try:
                self.client.invalidate(p)
            except FileNotFoundError:
                pass
        super().invalidate_cache(path)

    def sync(self, path, recursive=False):
        """Revalidates ``path`` against the store now: (entries checked, changes found)."""
        return self.client.sync(self._strip_protocol(path), recursive)

    def residency(self, paths):
        """For each path the fraction of it in Silt's cache (None: not a file)."""
        return self.client.residency([self._strip_protocol(p) for p in paths])

    def cached_fraction(self, paths):
        """The same as `residency`: for each path the fraction of it cached (one batched
        question per worker)."""
        return self.residency(paths)

    def prefetch(self, paths):
        """Starts fetching files for reads coming soon, in the background, in the order given.
        Unlike ``load``, what is fetched is kept only as the read would keep it (the cache's
        admission decides) and does not count as a read."""
        self.client.prefetch([self._strip_protocol(p) for p in paths])

    def pin(self, path):
        """Keeps the files at or below ``path`` cached (loaded now, never evicted); refused
        when they would not fit. In this process's cache (single) or on the owner or
        workers that hold each part (attached, cluster), as ``silt fs pin`` does."""
        return self.client.pin(self._strip_protocol(path))

    def unpin(self, path):
        """Lets the files at or below ``path`` be evicted again; how many were pinned."""
        return self.client.unpin(self._strip_protocol(path))

    def free(self, path):
        """Drops the cached pages (and pins) of the files at or below ``path`` now (a list of
        paths: each, many at once); what was cached before, as ``cache_usage`` says it."""
        if isinstance(path, (list, tuple)):
            return self.client.free_all([self._strip_protocol(p) for p in path])
        return self.client.free(self._strip_protocol(path))

    def cache_space(self):
        """``(capacity, used)`` in bytes of the cache holding this client's data (its disk tiers,
        or the owner's or the workers' for an attached or cluster client)."""
        return tuple(self.client.cache_space())

    def cache_usage(self, path):
        """{files, bytes, cached_bytes, pinned_bytes} of the files at or below ``path``."""
        return self.client.cache_usage(self._strip_protocol(path))

    def load(self, path):
        """Loads every file at or below ``path`` into the cache and waits: (files, bytes)."""
        return self.client.load(self._strip_protocol(path))

    # -- directories -----------------------------------------------------------------------

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            return self.makedirs(path, exist_ok=True)
        self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if self.exists(path):
            if not exist_ok or not self.isdir(path):
                raise FileExistsError(17, f"{path}: file exists")
            return
        parent = self._parent(path)
        if parent != path and not self.exists(parent):
            self.makedirs(parent, exist_ok=True)
        try:
            self.client.mkdir(path)
        except FileExistsError:
            if not exist_ok or not self.isdir(path):
                raise

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    # -- files -----------------------------------------------------------------------------

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.info(path)["size"]
            if start is not None and start < 0:
                start = max(size + start, 0)
            if end is not None and end < 0:
                end = max(size + end, 0)
        return self.client.cat(path, start or 0, end)

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        n = len(paths)
        if not isinstance(starts, list):
            starts = [starts] * n
        if not isinstance(ends, list):
            ends = [ends] * n
        if len(starts) != n or len(ends) != n:
            raise ValueError("paths, starts and ends must have the same length")
        ranges, failed = [], {}
        for i, (p, s, e) in enumerate(zip(paths, starts, ends)):
            p = self._strip_protocol(p)
            if (s is not None and s < 0) or (e is not None and e < 0):
                # A range from the end needs the size: a path without one fails in its own
                # slot, as a failed read does.
                try:
                    size = self.info(p)["size"]
                except OSError as err:
                    failed[i] = err
                    continue
                s = max(size + s, 0) if s is not None and s < 0 else s
                e = max(size + e, 0) if e is not None and e < 0 else e
            ranges.append((p, s or 0, e))
        read = iter(self.client.cat_ranges(ranges))
        out = [failed[i] if i in failed else next(read) for i in range(n)]
        if on_error == "raise":
            for r in out:
                if isinstance(r, BaseException):
                    raise r
        return out

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        if mode == "create":
            w = self.client.open_write(path, "x")
            try:
                w.write(bytes(value))
            finally:
                w.close()
            return
        self.client.pipe(path, bytes(value))

    def rm_file(self, path):
        self.client.rm_file(self._strip_protocol(path))

    def _rm(self, path):
        self.rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        # fsspec's expansion keeps a path named without wildcards even when nothing is there:
        # removing it is FileNotFoundError, as on a local disk, not a quiet no-op.
        for p in [path] if isinstance(path, str) else list(path):
            if not any(c in p for c in "*?[") and not self.exists(p):
                p = self._strip_protocol(p)
                raise FileNotFoundError(errno.ENOENT, f"{p}: no such file or directory")
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        # Deepest first: a directory is empty by the time it is removed.
        for p in sorted(paths, key=lambda p: (-p.count("/"), p)):
            try:
                if self.isdir(p):
                    self.client.rmdir(p)
                else:
                    self.client.rm_file(p)
            except FileNotFoundError:
                # An object store's directory goes away with its last file.
                if self.exists(p):
                    raise

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """One path onto another: a rename (Silt renames in place: a file is one copy in the
        store, a directory what the store does for it), into the target when it is a
        directory. Several paths or wildcards: copy and delete, as fsspec does."""
        if (
            isinstance(path1, str)
            and isinstance(path2, str)
            and not any(c in path1 for c in "*?[")
            and not path2.endswith("/")
        ):
            p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
            self.info(p1)  # FileNotFoundError for a missing source, even onto itself
            if p1 == p2:
                return
            # Onto an existing directory: into it, under the source's name (as `mv a d`,
            # shutil.move and fsspec's local file system do). A directory is renamed whole
            # whatever `recursive` says: one rename, no copy, nothing left behind.
            if self.isdir(p2):
                p2 = p2.rstrip("/") + "/" + p1.rsplit("/", 1)[-1]
                if p1 == p2:
                    return
            self.client.rename(p1, p2)
            return
        return super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(p1):
            self.makedirs(p2, exist_ok=True)
            return
        reader = self.client.open(p1)
        w = self.client.open_write(p2, "w")
        try:
            step = 16 * 2**20
            for off in range(0, reader.size, step):
                w.write(reader.read(off, step))
        finally:
            w.close()

    def created(self, path):
        return self.modified(path)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if mode == "rb":
            return SiltReadFile(
                self,
                path,
                mode="rb",
                block_size=block_size or self.blocksize,
                cache_type=kwargs.get("cache_type", "readahead"),
                cache_options=cache_options,
            )
        if mode in ("wb", "ab", "xb"):
            raw = _SiltRawWriter(self, path, mode[0])
            f = io.BufferedWriter(raw, buffer_size=block_size or self.blocksize)
            return f
        raise ValueError(f"mode {mode!r}: Silt opens files rb, wb, ab or xb (text modes wrap them)")


class SiltReadFile(AbstractBufferedFile):
    """A file open for reading: one pinned version; fsspec's read-ahead buffer on top of the
    client's own read-ahead for sequential readers."""

    def __init__(self, fs, path, **kwargs):
        self._reader = fs.client.open(path)
        super().__init__(fs, path, size=self._reader.size, **kwargs)

    def _fetch_range(self, start, end):
        return self._reader.read(start, end - start)

    def read_buffer(self, length=-1):
        """Like ``read``, but a read-only buffer (``memoryview``) over the cache file itself
        where the file is whole in a cache on this host: no copy. pyarrow's Python files
        read through it (``pyarrow.PythonFile`` calls ``read_buffer``), so Parquet and Arrow
        files read through ``silt://`` as from a local file. The view keeps the cache file's
        pages pinned while it lives; each page is checked once before it is given out."""
        if length is None or length < 0:
            length = self.size - self.loc
        end = min(self.loc + length, self.size)
        mapped = self._mapped()
        if mapped is None or self.closed:
            return self.read(length)
        try:
            mapped.pin.check(self.loc, end - self.loc)
        except OSError:
            # A page changed under the map: no views from it any more (those given out were
            # checked), and these bytes come through the client, which fetches good ones.
            self._map = None
            return self.read(length)
        view = memoryview(mapped)[self.loc : end]
        self.loc = end
        return view

    def _mapped(self):
        if getattr(self, "_map", False) is False:
            m = self._reader.map()
            self._map = None if m is None else _PinnedMap.of(m)
        return self._map

    def close(self):
        self._map = None  # views given out keep their map (and its pin) themselves
        super().close()

    def read(self, length=-1):
        # Large reads skip fsspec's buffer (one copy less): the client reads ahead for
        # sequential readers itself, and a file cached on this host is read in place.
        if length is None or length < 0:
            length = self.size - self.loc
        if self.closed or length < min(self.blocksize, self.fs.client.page_size):
            return super().read(length)
        data = self._fetch_range(self.loc, min(self.loc + length, self.size))
        self.loc += len(data)
        return data


class _PinnedMap(mmap.mmap):
    """A read-only map of a local cache file that holds its native ``Mapping`` (the pin on the
    file) for as long as any view of it lives."""

    @classmethod
    def of(cls, mapping):
        m = cls(mapping.fileno(), mapping.size, access=mmap.ACCESS_READ)
        m.pin = mapping
        return m


class _SiltRawWriter(io.RawIOBase):
    """The unbuffered side of a file open for writing (io.BufferedWriter batches writes)."""

    def __init__(self, fs, path, mode):
        super().__init__()
        self.fs = fs
        self.path = path
        self.name = path
        self._w = fs.client.open_write(path, mode)

    def writable(self):
        return True

    def seekable(self):
        return False

    def tell(self):
        # In append mode the file's end, as a local file's tell() is.
        return self._w.tell()

    def write(self, b):
        data = bytes(b)
        self._w.write(data)
        return len(data)

    def close(self):
        if self.closed:
            return
        try:
            self._w.close()
        finally:
            super().close()


def filesystem(**kwargs):
    """``SiltFileSystem(**kwargs)`` (docs/python.md)."""
    return SiltFileSystem(**kwargs)
