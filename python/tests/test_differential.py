"""Random sequences of fsspec calls through `silt://` over a `file://` store, each also done with
plain `os` calls on a local directory: every answer (value or error) must be the local one, and
after every call the store's directory and Silt's own view of it must hold what the local
directory holds.

The reference is POSIX, with the SDK's written choices (docs/python.md, "The filesystem"): a write
(a rename too) creates missing parent directories (as s3fs and gcsfs do), moving a path
below itself is EINVAL whatever it is, `rm` without `recursive` removes an
empty directory (as fsspec's memory file system does), `mv` onto an existing directory moves
into it (as `mv`, shutil.move and fsspec's local file system do), and a path below a file is
not found (`FileNotFoundError` or `NotADirectoryError`, counted as one answer).
"""

import contextlib
import errno
import os
import random
import shutil
import subprocess

import pytest

import silt
from conftest import run_silt

# Names that collide as files and directories, nest, and end in white space.
NAMES = ["a", "b", "a ", "d", "d/x", "d/y", "d/e", "d/e/z", "e", "e/w"]
OPS = [
    "pipe", "cat", "read", "write", "append", "create", "ls", "info", "exists", "makedirs",
    "mkdir", "rm_file", "rm", "rmdir", "mv", "cp", "ranges",
]


def answer(value):
    """A comparable form of a result or error: an error by its errno (a path below a file
    counts as missing), by its type where it has none; never by message."""
    if isinstance(value, BaseException):
        if isinstance(value, (FileNotFoundError, NotADirectoryError)):
            return ("error", "missing")
        no = getattr(value, "errno", None)
        return ("error", errno.errorcode.get(no, no) if no else type(value).__name__)
    if isinstance(value, list):
        return [answer(v) for v in value]
    return ("ok", value)


def outcome(fn):
    try:
        return answer(fn())
    except Exception as e:  # every error is an answer to compare
        return answer(e)


def reads(f):
    """Three bytes, a seek back to the second and the rest, then the end's offset."""
    out = [f.read(3)]
    f.seek(1)
    out.append(f.read())
    f.seek(0, 2)
    out.append(f.tell())
    return out


class Local:
    """The reference: `os` calls on a plain directory."""

    def __init__(self, root):
        self.root = root

    def p(self, rel):
        return os.path.join(self.root, rel) if rel else self.root

    def parents(self, rel):
        """Creates `rel`'s missing parents; a file in the way is NotADirectoryError."""
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = self.p("/".join(parts[:i]))
            if os.path.lexists(d) and not os.path.isdir(d):
                raise NotADirectoryError(errno.ENOTDIR, d)
            if not os.path.exists(d):
                os.mkdir(d)

    def write(self, rel, mode, chunks):
        self.parents(rel)
        with open(self.p(rel), mode) as f:
            for c in chunks:
                f.write(c)
            return f.tell()

    def cat(self, rel, start, end):
        with open(self.p(rel), "rb") as f:
            data = f.read()
        return data[slice(start, end)]

    def read(self, rel):
        with open(self.p(rel), "rb") as f:
            return reads(f)

    def ls(self, rel):
        path = self.p(rel)
        if os.path.isdir(path):
            return sorted(os.listdir(path))
        os.stat(path)
        return [os.path.basename(rel)]

    def info(self, rel):
        st = os.stat(self.p(rel))
        if os.path.isdir(self.p(rel)):
            return ("directory", None)
        return ("file", st.st_size)

    def makedirs(self, rel, exist_ok):
        path = self.p(rel)
        if os.path.exists(path):
            if exist_ok and os.path.isdir(path):
                return None
            raise FileExistsError(errno.EEXIST, path)
        self.parents(rel + "/x")
        return None

    def rm(self, rel, recursive):
        path = self.p(rel)
        if os.path.isdir(path):
            if recursive:
                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)

    def mv(self, src, dst):
        os.stat(self.p(src))
        if src == dst:
            return None  # as rename(2) of a name onto itself
        if os.path.isdir(self.p(dst)):
            dst = dst + "/" + src.rsplit("/", 1)[-1]
            if dst == src:
                return None
        if dst.startswith(src + "/"):
            raise OSError(errno.EINVAL, f"{src}: moved below itself")
        self.parents(dst)
        os.rename(self.p(src), self.p(dst))
        return None

    def cp(self, src, dst):
        if os.path.isdir(self.p(src)):
            return self.makedirs(dst, exist_ok=True)
        with open(self.p(src), "rb") as f:
            data = f.read()
        self.write(dst, "wb", [data])
        return None

    def ranges(self, paths, starts, ends):
        out = []
        for rel, s, e in zip(paths, starts, ends):
            try:
                out.append(self.cat(rel, s, e))
            except OSError as err:
                out.append(err)
        return out


def silt_read(fs, path):
    with fs.open(path, "rb") as f:
        return reads(f)


def silt_write(fs, path, mode, chunks):
    with fs.open(path, mode) as f:
        for c in chunks:
            f.write(c)
        return f.tell()


def directory(root):
    """{relative path: bytes, or "dir"} under `root`, leaving out a commit's hidden files."""
    out = {}
    for parent, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(parent, d), root)] = "dir"
        for name in files:
            if name.startswith(".silt-write-"):
                continue
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def silt_view(fs):
    """{relative path: size, or "dir"} as Silt lists /data."""
    found = fs.find("/data", withdirs=True, detail=True)
    return {
        name[len("/data/"):]: ("dir" if e["type"] == "directory" else e["size"])
        for name, e in found.items()
        if name != "/data"
    }


def step(rnd, fs, local):
    op = rnd.choice(OPS)
    p, q = rnd.choice(NAMES), rnd.choice(NAMES)
    data = rnd.randbytes(rnd.choice([0, 1, 7, 100, 5000]))
    chunks = [data[:10], data[10:]]
    start = rnd.choice([None, 0, 3, -2, 50, 10000])
    end = rnd.choice([None, 0, 5, -1, 60, 20000])
    flag = rnd.choice([True, False])
    S = "/data/" + p
    Q = "/data/" + q
    calls = {
        "pipe": (lambda: fs.pipe_file(S, data), lambda: (local.write(p, "wb", [data]), None)[1]),
        "cat": (lambda: fs.cat_file(S, start=start, end=end), lambda: local.cat(p, start, end)),
        "read": (lambda: silt_read(fs, S), lambda: local.read(p)),
        "write": (lambda: silt_write(fs, S, "wb", chunks), lambda: local.write(p, "wb", chunks)),
        "append": (lambda: silt_write(fs, S, "ab", chunks), lambda: local.write(p, "ab", chunks)),
        "create": (lambda: silt_write(fs, S, "xb", chunks), lambda: local.write(p, "xb", chunks)),
        "ls": (
            lambda: sorted(n.rsplit("/", 1)[-1] for n in fs.ls(S, detail=False)),
            lambda: local.ls(p),
        ),
        "info": (
            lambda: (lambda i: (i["type"], i["size"] if i["type"] == "file" else None))(fs.info(S)),
            lambda: local.info(p),
        ),
        "exists": (lambda: fs.exists(S), lambda: os.path.exists(local.p(p))),
        "makedirs": (lambda: fs.makedirs(S, exist_ok=flag), lambda: local.makedirs(p, flag)),
        "mkdir": (lambda: fs.mkdir(S, create_parents=False), lambda: os.mkdir(local.p(p))),
        "rm_file": (lambda: fs.rm_file(S), lambda: os.unlink(local.p(p))),
        "rm": (lambda: fs.rm(S, recursive=flag), lambda: local.rm(p, flag)),
        "rmdir": (lambda: fs.rmdir(S), lambda: os.rmdir(local.p(p))),
        "mv": (lambda: fs.mv(S, Q, recursive=flag), lambda: local.mv(p, q)),
        "cp": (lambda: fs.cp_file(S, Q), lambda: local.cp(p, q)),
        "ranges": (
            lambda: fs.cat_ranges([S, Q], [start, 0], [end, 2]),
            lambda: local.ranges([p, q], [start, 0], [end, 2]),
        ),
    }
    through_silt, through_os = calls[op]
    # Silt first: the local directory must not change before Silt's answer is taken.
    return f"{op}({p!r}, {q!r}, start={start}, end={end}, flag={flag}, {len(data)} bytes)", (
        outcome(through_silt),
        outcome(through_os),
    )


SEEDS = int(os.environ.get("SEEDS", 12))


@pytest.mark.parametrize(
    "write_type,seed",
    [("through", s) for s in range(SEEDS)]
    + [(w, s) for w in ("store-only", "cache-only", "back") for s in range(max(1, SEEDS // 3))],
)
def test_fsspec_calls_answer_as_a_local_directory_does(write_type, seed, workdir):
    """Under every write type: `cache-only` leaves the store empty, `back` uploads in the
    background (its store is not compared step by step)."""
    store = os.path.join(workdir, "store")
    os.makedirs(store)
    fs = silt.SiltFileSystem(
        mounts={"/data": f"file://{store}"},
        cache_dir=os.path.join(workdir, "cache"),
        skip_instance_cache=True,
        write_type=write_type,
    )
    stored = {"cache-only": "empty", "back": None}.get(write_type, "same")
    run(seed, fs, store, os.path.join(workdir, "ref"), stored=stored)


def test_a_directory_emptied_on_s3_is_gone_for_the_client_that_emptied_it(s3, workdir):
    """On S3 a directory without a marker goes away with its last object (docs/SEMANTICS.md):
    the client that removed that object must not list it any more than a fresh client does,
    through a file's removal, a directory's and a rename; one made by mkdir stays."""

    def client(name):
        return silt.SiltFileSystem(
            mounts={"/data": f"s3://{s3.bucket}"},
            cache_dir=os.path.join(workdir, name),
            skip_instance_cache=True,
            write_type="through",
            **s3.options(),
        )

    fs = client("cache")
    try:
        fs.pipe_file("/data/d/e/z", b"x")
        fs.pipe_file("/data/r/s/t", b"y")
        fs.makedirs("/data/m/n")
        fs.pipe_file("/data/m/n/f", b"z")
        fs.pipe_file("/data/q/x", b"w")
        fs.mkdir("/data/q/l", create_parents=False)  # a marker in q, which has none
        assert fs.find("/data", withdirs=True) == [
            "/data", "/data/d", "/data/d/e", "/data/d/e/z", "/data/m", "/data/m/n",
            "/data/m/n/f", "/data/q", "/data/q/l", "/data/q/x", "/data/r", "/data/r/s",
            "/data/r/s/t",
        ]
        fs.rm_file("/data/d/e/z")  # d/e, then d: no object left under them
        fs.rm_file("/data/q/x")
        fs.rmdir("/data/q/l")  # its marker removed: q has nothing left
        fs.mv("/data/r/s/t", "/data/t")  # r/s, then r
        fs.rm_file("/data/m/n/f")  # m/n has a marker: stays
        want = ["/data", "/data/m", "/data/m/n", "/data/t"]
        assert fs.find("/data", withdirs=True) == want
        assert not any(fs.exists(p) for p in ["/data/d", "/data/q", "/data/r/s"])
        fresh = client("fresh")
        try:
            assert fresh.find("/data", withdirs=True) == want
        finally:
            fresh.close()
    finally:
        fs.close()


@pytest.mark.parametrize("seed", range(int(os.environ.get("SEEDS", 12)) // 3))
def test_an_attached_client_answers_so_and_the_mount_shows_each_change(seed, workdir, procs):
    """The same through a client attached to `silt up`: its calls go to the daemon, which must
    answer as a local directory does, and its mount must show every change when the call has
    returned (read through the kernel: listings and bytes)."""
    with attached(workdir, procs) as (fs, store, mount):
        run(seed, fs, store, os.path.join(workdir, "ref"), mount=mount)


def test_a_rename_onto_an_empty_directory_the_mount_listed_shows_what_it_moved(workdir, procs):
    """The target directory's own listing, cached empty by the owner and its kernel, is read
    again: it now holds the moved directory's entries (random sequences find this rarely)."""
    with attached(workdir, procs) as (fs, store, mount):
        fs.pipe_file("/data/e/w", b"moved")
        fs.makedirs("/data/d/e")
        assert directory(mount) == {"e": "dir", "e/w": b"moved", "d": "dir", "d/e": "dir"}
        fs.mv("/data/e", "/data/d")  # into d, replacing the empty d/e
        assert directory(mount) == {"d": "dir", "d/e": "dir", "d/e/w": b"moved"}


@contextlib.contextmanager
def attached(workdir, procs):
    """A client attached to `silt up` over an empty `file://` store: (fs, store, mount)."""
    store = os.path.join(workdir, "store")
    state = os.path.join(workdir, "state")
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(store)
    os.makedirs(mnt)
    up = run_silt(
        ["up", "--mount", f"/data=file://{store}", "--mountpoint", mnt, "--state-dir", state,
         "--write-type", "through"],
        procs,
    )
    up.wait_for("silt: serving", "silt up")
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert fs.client.mode == "attached"
        yield fs, store, os.path.join(mnt, "data")
    finally:
        up.stop()
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)


def run(seed, fs, store, ref, mount=None, stored="same"):
    """`stored`: what the store's directory holds after each call: "same" as the local one,
    "empty" (cache-only), or None (not compared: uploads in the background)."""
    os.makedirs(ref)
    local = Local(ref)
    rnd = random.Random(seed)
    done = []
    try:
        for _ in range(300):
            call, (got, want) = step(rnd, fs, local)
            done.append(call)
            history = "\n  ".join(done[-int(os.environ.get("HISTORY", 12)):])
            assert got == want, f"seed {seed}, after:\n  {history}\nSilt answered {got}, a local directory {want}"
            expected = directory(ref)
            if stored is not None:
                in_store = expected if stored == "same" else {}
                assert directory(store) == in_store, f"seed {seed}, the store's directory after:\n  {history}"
            view = {k: (v if v == "dir" else len(v)) for k, v in expected.items()}
            assert silt_view(fs) == view, f"seed {seed}, Silt's listing after:\n  {history}"
            if mount is not None:
                assert directory(mount) == expected, f"seed {seed}, the mount after:\n  {history}"
    finally:
        fs.close()
