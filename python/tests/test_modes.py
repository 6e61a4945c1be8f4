"""The three ways to connect (single, attached, cluster) against a real S3 server and real
`silt` processes, a worker killed during reads, and clear errors for bad input."""

import ctypes
import hashlib
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import threading

import fsspec
import pytest

import silt
from conftest import SILT, Proc, cluster_secret, free_port, run_silt

DATA = {f"train/{i:03d}.bin": hashlib.sha256(str(i).encode()).digest() * (97 + 1000 * i) for i in range(24)}


def fill(s3):
    for rel, data in DATA.items():
        s3.put(rel, data)


def check_all(fs, prefix="/data"):
    for rel, data in DATA.items():
        assert fs.cat_file(f"{prefix}/{rel}") == data, rel


def embedded(s3, workdir, **kw):
    return silt.SiltFileSystem(
        mounts={"/data": f"s3://{s3.bucket}"},
        cache_dir=os.path.join(workdir, "cache"),
        skip_instance_cache=True,
        **s3.options(),
        **kw,
    )


def test_the_earlier_mode_word_embedded_is_the_single_role(s3, workdir):
    fill(s3)
    fs = embedded(s3, workdir, mode="embedded")
    try:
        assert fs.client.mode == "single"
        check_all(fs)
    finally:
        fs.close()


def test_a_single_node_reads_a_file_whole_in_its_cache_from_its_cache_file(s3, workdir):
    """The same local read as attached clients get (Client::local_reader), from the process's
    own disk tier: once a file is whole there, a reader reads the cache file (its pages kept
    while it reads), and its bytes are right."""
    big = os.urandom(5 << 20)
    s3.put("big.bin", big)
    fs = embedded(s3, workdir)
    try:
        fs.load("/data/big.bin")
        r = fs.client.open("/data/big.bin")
        assert r.read(0, len(big)) == big
        assert r.is_local
        assert r.read(777, 3 << 20) == big[777 : 777 + (3 << 20)]
        small = fs.client.open("/data/big.bin")
        assert small.read(10, 100) == big[10:110]
        assert not small.is_local, "a read of less than a page looks for no local file"
    finally:
        fs.close()


def test_embedded_reads_writes_and_lists(s3, workdir):
    fill(s3)
    fs = embedded(s3, workdir)
    try:
        assert fs.client.mode == "single"
        check_all(fs)
        assert sorted(fs.ls("/data/train", detail=False)) == sorted(f"/data/{r}" for r in DATA)
        big = DATA["train/023.bin"]
        assert fs.cat_file("/data/train/023.bin", start=1000, end=5000) == big[1000:5000]
        assert fs.cat_file("/data/train/023.bin", start=-10) == big[-10:]
        paths = ["/data/train/023.bin", "/data/train/001.bin", "/data/missing.bin"]
        got = fs.cat_ranges(paths, [5, 0, 0], [9000, None, 10])
        assert got[:2] == [big[5:9000], DATA["train/001.bin"]]
        assert isinstance(got[2], FileNotFoundError)
        with pytest.raises(FileNotFoundError):
            fs.cat_ranges(paths, 0, 10, on_error="raise")
        # Random access through a file object, then a sequential read.
        with fs.open("silt://data/train/023.bin", "rb", block_size=4096) as f:
            f.seek(len(big) - 100)
            assert f.read(100) == big[-100:]
            f.seek(7)
            assert f.read(3) == big[7:10]
            f.seek(0)
            assert f.read() == big
        # Writes are the store's once closed (write type through).
        with fs.open("/data/out/new.bin", "wb") as f:
            f.write(b"a" * 10)
            f.write(b"b" * 5)
        with open(s3.path("out/new.bin"), "rb") as f:
            assert f.read() == b"a" * 10 + b"b" * 5
        with fs.open("/data/out/new.bin", "ab") as f:
            f.write(b"c")
        assert fs.cat_file("/data/out/new.bin") == b"a" * 10 + b"b" * 5 + b"c"
        with pytest.raises(FileExistsError):
            fs.open("/data/out/new.bin", "xb")
        before = fs.checksum("/data/out/new.bin")
        fs.pipe_file("/data/out/new.bin", b"z" * 15 + b"c")  # other bytes, same size
        assert fs.checksum("/data/out/new.bin") != before  # a new version
        assert fs.glob("/data/out/*.bin") == ["/data/out/new.bin"]
        assert [(d, sorted(f)) for d, _, f in fs.walk("/data/out")] == [("/data/out", ["new.bin"])]
        fs.mv("/data/out/new.bin", "/data/out/moved.bin")
        assert not os.path.exists(s3.path("out/new.bin"))
        assert fs.cat_file("/data/out/moved.bin").endswith(b"c")
        assert fs.du("/data/out") == 16
        fs.rm("/data/out", recursive=True)
        assert not fs.exists("/data/out/moved.bin")
        with pytest.raises(FileNotFoundError):
            fs.cat_file("/data/out/moved.bin")
        # A file changed behind Silt's back is seen after invalidate_cache.
        s3.put("train/000.bin", b"changed")
        fs.invalidate_cache("/data/train/000.bin")
        assert fs.cat_file("/data/train/000.bin") == b"changed"
    finally:
        fs.close()


def test_pin_free_and_cache_usage(s3, workdir):
    fill(s3)
    fs = embedded(s3, workdir)
    try:
        size = len(DATA["train/003.bin"])
        u = fs.pin("/data/train/003.bin")
        assert (u["files"], u["cached_bytes"], u["pinned_bytes"]) == (1, size, size)
        total = sum(len(d) for d in DATA.values())
        u = fs.cache_usage("/data/train")
        assert (u["files"], u["bytes"], u["pinned_bytes"]) == (len(DATA), total, size)
        assert fs.cached_fraction(["/data/train/003.bin"]) == [1.0]
        assert fs.free("/data/train/003.bin")["cached_bytes"] == size
        assert fs.cached_fraction(["/data/train/003.bin"]) == [0.0]
        assert fs.cache_usage("/data/train/003.bin")["pinned_bytes"] == 0
        assert fs.unpin("/data/train") == 0
        with pytest.raises(FileNotFoundError):
            fs.pin("/data/nope")
    finally:
        fs.close()


def test_fsspec_url_and_entry_point(s3, workdir):
    fill(s3)
    fs = embedded(s3, workdir)
    try:
        # Registered through the `fsspec.specs` entry point: fsspec finds the class itself.
        assert fsspec.get_filesystem_class("silt") is silt.SiltFileSystem
        with fsspec.open(
            "silt://data/train/001.bin",
            "rb",
            mounts={"/data": f"s3://{s3.bucket}"},
            cache_dir=os.path.join(workdir, "cache"),
            **s3.options(),
        ) as f:
            assert f.read() == DATA["train/001.bin"]
    finally:
        fs.close()


CHILD = r"""
import sys, json, silt
fs = silt.SiltFileSystem(mounts={"/data": sys.argv[1]}, cache_dir=sys.argv[2], skip_instance_cache=True, **json.loads(sys.argv[3]))
data = fs.cat_file("/data/train/005.bin")
print(fs.client.mode, len(data), fs.residency(["/data/train/006.bin"])[0])
"""


def test_a_second_process_attaches_to_the_embedded_owner(s3, workdir):
    import json

    fill(s3)
    fs = embedded(s3, workdir)
    try:
        fs.cat_file("/data/train/006.bin")  # cached by the owner
        out = subprocess.run(
            [sys.executable, "-c", CHILD, f"s3://{s3.bucket}", os.path.join(workdir, "cache"), json.dumps(s3.options())],
            capture_output=True, text=True, timeout=120,
        )
        assert out.returncode == 0, out.stderr
        mode, n, resident = out.stdout.split()
        # The child uses the owner's cache: it sees what the owner cached.
        assert (mode, int(n), float(resident)) == ("attached", len(DATA["train/005.bin"]), 1.0)
        # ... and what it read went into the owner's cache.
        assert fs.residency(["/data/train/005.bin"]) == [1.0]
        assert fs.cached_fraction(["/data/train/005.bin", "/data/train"]) == [1.0, None]
    finally:
        fs.close()


def silt_up(s3, workdir, procs, extra=()):
    state = os.path.join(workdir, "state")
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt)
    p = run_silt(
        ["up", "--mount", f"/data=s3://{s3.bucket}", "--mountpoint", mnt, "--state-dir", state, "--write-type", "through"]
        + list(extra)
        + s3.flags(),
        procs,
    )
    p.wait_for("silt: serving", "silt up")
    return p, state, mnt


def owner_cache_file(state, size):
    """The one data file of `size` bytes in the disk tier of the Silt whose state is `state`."""
    files = [os.path.join(d, f) for d, _, fs_ in os.walk(os.path.join(state, "cache")) for f in fs_ if f.endswith(".data")]
    found = [p for p in files if os.path.getsize(p) == size]
    assert len(found) == 1, files
    return found[0]


def attached_in_own_namespaces(state, workdir, body):
    """Runs `body` (Python, with `fs` attached) as a pod would: in PID, network and mount
    namespaces of its own, the state directory `state` given at another path (the owner's own
    path hidden, as it is not in a pod) and no store option or credential in its environment.
    Returns its standard output; fails the test if it fails."""
    elsewhere = os.path.join(workdir, "given")
    os.makedirs(elsewhere)
    code = (
        "import hashlib, silt, subprocess, sys\n"
        f"subprocess.run(['mount', '--bind', {state!r}, {elsewhere!r}], check=True)\n"
        f"subprocess.run(['mount', '-t', 'tmpfs', 'none', {state!r}], check=True)\n"
        f"fs = silt.SiltFileSystem(cache_dir={elsewhere!r}, skip_instance_cache=True)\n"
        "assert fs.client.mode == 'attached', fs.client.mode\n"
    ) + body
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SILT_"))}
    r = subprocess.run(
        # --mount-proc: a mount namespace of its own too, so the bind mount goes with it.
        ["unshare", "--pid", "--net", "--fork", "--mount-proc", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_a_process_in_its_own_pid_and_network_namespaces_attaches_through_the_state_dir(s3, workdir, procs):
    """As a pod given the node's state directory would: in a PID namespace of its own (the
    owner's PID is not there to see), a network namespace of its own (another host id) and a
    mount namespace where the state directory is at another path (a hostPath mounted
    elsewhere), with no store option or credential, a client attaches through the socket and
    reads the owner's bytes, a large file's through the passed cache file."""
    fill(s3)
    big = os.urandom((3 << 20) + 5)
    s3.put("big.bin", big)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        with open(os.path.join(mnt, "data", "big.bin"), "rb") as f:
            assert f.read() == big  # cached whole by the owner
        out = attached_in_own_namespaces(
            state,
            workdir,
            "r = fs.client.open('/data/big.bin')\n"
            "big = r.read(0, r.size)\n"
            "print(hashlib.sha256(fs.cat_file('/data/train/003.bin')).hexdigest(),"
            " hashlib.sha256(big).hexdigest(), r.is_local)\n",
        )
        assert out.split() == [
            hashlib.sha256(DATA["train/003.bin"]).hexdigest(), hashlib.sha256(big).hexdigest(), "True",
        ], out
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_attach_to_silt_up_shares_its_cache_and_reads_cached_files_locally(s3, workdir, procs):
    fill(s3)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True, **s3.options())
        assert fs.client.mode == "attached"
        assert fs.client.mounts() == [("/data", f"s3://{s3.bucket}")]
        big = os.urandom(10 << 20)  # several pages, two placement groups (8 MiB each)
        s3.put("big.bin", big)
        # Read through the mount: the daemon caches it whole.
        with open(os.path.join(mnt, "data", "big.bin"), "rb") as f:
            assert f.read() == big
        assert fs.residency(["/data/big.bin"]) == [1.0]
        r = fs.client.open("/data/big.bin")
        assert r.read(0, len(big)) == big
        assert fs.cat_file("/data/big.bin") == big
        # Whole in the daemon's cache on this host: read straight from its cache file.
        assert r.is_local
        assert r.read(12345, 100000) == big[12345:112345]
        # A byte flipped in the owner's cache file under the open reader: its checks catch
        # it, and the bytes still come right (through the client instead).
        data_files = [
            os.path.join(d, f) for d, _, fs_ in os.walk(os.path.join(state, "cache")) for f in fs_ if f.endswith(".data")
        ]
        cached = [p for p in data_files if os.path.getsize(p) >= len(big)]
        assert len(cached) == 1, data_files
        at = (5 << 20) + 3
        with open(cached[0], "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))
        assert r.read(at - 100, 4 << 20) == big[at - 100 : at - 100 + (4 << 20)]
        assert not r.is_local
        # Reads into `bytes` (cat_file, cat_ranges) read the owner's cache file in place, each
        # page checked there: the flipped one is refused and read the usual way instead.
        assert fs.cat_file("/data/big.bin") == big
        got = fs.cat_ranges(["/data/big.bin"] * 2, [at - 100, 0], [at + 100, 10])
        assert got == [big[at - 100 : at + 100], big[:10]]
        check_all(fs)
        # A pin from the attached client lands in the owner's cache: `silt fs stat` there
        # shows it, and unpinning from here removes it.
        u = fs.pin("/data/big.bin")
        assert u["pinned_bytes"] == len(big) and u["cached_bytes"] == len(big), u
        stat = json.loads(subprocess.run([SILT, "fs", "stat", "/data/big.bin", "--state-dir", state],
                                         capture_output=True, text=True, check=True).stdout)
        assert stat["cache"]["pinned_bytes"] == len(big), stat
        assert fs.unpin("/data/big.bin") == 1
        assert fs.cache_usage("/data/big.bin")["pinned_bytes"] == 0
        # A write through the SDK is seen through the mount.
        fs.pipe_file("/data/sdk.txt", b"from python")
        with open(os.path.join(mnt, "data", "sdk.txt"), "rb") as f:
            assert f.read() == b"from python"
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_attached_client_needs_no_store_endpoint_or_credentials(s3, workdir, procs, monkeypatch):
    """Attached means served by the owner: with no S3 option and no credential anywhere in this
    process, a client attached to `silt up` lists, stats, reads and writes through the owner's
    store."""
    fill(s3)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        for k in list(os.environ):
            if k.startswith(("AWS_", "SILT_S3_")):
                monkeypatch.delenv(k)
        monkeypatch.setenv("AWS_CONFIG_FILE", os.path.join(workdir, "no-aws-config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.path.join(workdir, "no-aws-credentials"))
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert fs.client.mode == "attached"
        listed = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/data/train", detail=False))
        assert listed == sorted(rel.split("/", 1)[1] for rel in DATA)
        assert fs.info("/data/train/003.bin")["size"] == len(DATA["train/003.bin"])
        assert fs.isdir("/data/train")
        check_all(fs)
        # Written by the owner's store: in the bucket and seen through the mount.
        fs.pipe_file("/data/out/new.txt", b"attached, without keys")
        with open(s3.path("out/new.txt"), "rb") as f:
            assert f.read() == b"attached, without keys"
        with open(os.path.join(mnt, "data", "out", "new.txt"), "rb") as f:
            assert f.read() == b"attached, without keys"
        assert fs.cat_file("/data/out/new.txt") == b"attached, without keys"
        fs.rm("/data/out/new.txt")
        assert not os.path.exists(s3.path("out/new.txt"))
        assert not fs.exists("/data/out/new.txt")
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def resident_pages(f, size):
    """How many pages of open file `f` the kernel's page cache holds (mincore(2) of a map)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        return sum(b & 1 for b in vec)
    finally:
        libc.munmap(addr, size)


def test_a_free_from_an_attached_client_drops_the_owners_kernel_pages_too(s3, workdir, procs):
    """`fs.free` from a process attached to `silt up` frees the owner's cache and its mount's
    page cache: the next read through the mount is a cold one there too."""
    data = os.urandom((3 << 20) + 5)
    s3.put("f.bin", data)
    # Without passthrough, so the mount's own page cache holds what was read.
    up, state, mnt = silt_up(s3, workdir, procs, ["--passthrough", "off"])
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True, **s3.options())
        assert fs.client.mode == "attached"
        with open(os.path.join(mnt, "data", "f.bin"), "rb") as f:
            assert f.read() == data
            assert resident_pages(f, len(data)) > 0, "nothing in the page cache"
            fs.free("/data/f.bin")
            assert resident_pages(f, len(data)) == 0, "the attached free left the owner's kernel pages"
            assert fs.residency(["/data/f.bin"]) == [0.0]
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def start_workers(s3, workdir, procs, n=2):
    secret = cluster_secret(workdir)
    ports = [free_port() for _ in range(n)]
    listed = ",".join(f"w{i}=127.0.0.1:{p}" for i, p in enumerate(ports))
    workers = []
    for i, port in enumerate(ports):
        w = run_silt(
            ["worker", "--workers", listed, "--worker-id", f"w{i}", "--listen", f"127.0.0.1:{port}",
             "--mount", f"/data=s3://{s3.bucket}", "--state-dir", os.path.join(workdir, f"w{i}"),
             "--cluster-secret-file", secret] + s3.flags(),
            procs,
        )
        w.wait_for("silt: serving as worker", f"worker w{i}")
        workers.append(w)
    return workers, listed, secret


def test_cluster_client_reads_through_workers_and_survives_a_worker_killed_mid_read(s3, workdir, procs):
    fill(s3)
    workers, listed, secret = start_workers(s3, workdir, procs)
    fs = silt.SiltFileSystem(
        workers=listed,
        mounts={"/data": f"s3://{s3.bucket}"},
        cluster_secret_file=secret,
        # No same-host shortcut: every read goes over the workers' TCP protocol.
        cluster_unix_socket=False,
        memory_capacity="0",
        skip_instance_cache=True,
        **s3.options(),
    )
    try:
        assert fs.client.mode == "cluster"
        check_all(fs)
        # Workers now hold the pages: residency asks them.
        assert fs.residency(["/data/train/010.bin"]) == [1.0]
        # Kill a worker while 4 threads keep reading everything: no error, right bytes.
        errors, rounds = [], [0]
        started = threading.Barrier(5)

        def reader():
            started.wait()
            try:
                for _ in range(3):
                    check_all(fs)
                    rounds[0] += 1
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait()
        workers[0].kill()
        for t in threads:
            t.join()
        assert errors == [] and rounds[0] == 12
    finally:
        fs.close()


def test_a_pod_attaches_to_its_nodes_cluster_client_served_with_no_mount(s3, workdir, procs):
    """The chart's `sdk` DaemonSet: a cluster client on the node (`silt up` with mountpoint
    none: no FUSE mount, run here as nobody) serves its state directory. A process in PID,
    network and mount namespaces of its own, given that directory at another path and no store
    option, credential or cluster secret, attaches and reads the workers' bytes and writes
    through the node's store; what proves it on the socket is the state directory's own
    secret, never the cluster's, and the workers refuse a client proving that one."""
    fill(s3)
    workers, listed, secret = start_workers(s3, workdir, procs)
    # Run as nobody, as the chart runs it without privilege: its state directory and its copy
    # of the cluster secret are nobody's own.
    os.chmod(workdir, 0o711)
    state = os.path.join(workdir, "node")
    os.makedirs(state, mode=0o700)
    node_secret = os.path.join(workdir, "node-cluster-secret")
    shutil.copyfile(secret, node_secret)
    for p in (state, node_secret):
        os.chown(p, 65534, 65534)
    node = Proc(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SILT, "up", "--workers", listed,
         "--cluster-secret-file", node_secret, "--mount", f"/data=s3://{s3.bucket}", "--state-dir", state,
         "--mountpoint", "none", "--cluster-unix-socket", "false", "--write-type", "through"] + s3.flags(),
        env=dict(os.environ, SILT_LOG="warn"),
    )
    procs.append(node)
    node.wait_for("silt: serving", "silt up --mountpoint none, as nobody")
    with open(os.path.join(state, "cluster-secret")) as a, open(secret) as b:
        assert a.read().strip() != b.read().strip()
    out = attached_in_own_namespaces(
        state,
        workdir,
        "names = sorted(p.rsplit('/', 1)[-1] for p in fs.ls('/data/train', detail=False))\n"
        "fs.pipe_file('/data/out/from-pod.txt', b'written by a pod')\n"
        "print(len(names), hashlib.sha256(b''.join(fs.cat_file('/data/' + k) for k in sorted(%r))).hexdigest())\n"
        % sorted(DATA),
    )
    whole = hashlib.sha256(b"".join(DATA[k] for k in sorted(DATA))).hexdigest()
    assert out.split() == [str(len(DATA)), whole], out
    with open(s3.path("out/from-pod.txt"), "rb") as f:
        assert f.read() == b"written by a pod"
    # The workers hold the bytes the pod read: the node reads through them.
    fs = silt.SiltFileSystem(workers=listed, mounts={"/data": f"s3://{s3.bucket}"}, cluster_secret_file=secret,
                             cluster_unix_socket=False, memory_capacity="0", skip_instance_cache=True, **s3.options())
    try:
        assert fs.residency(["/data/" + k for k in sorted(DATA)]) == [1.0] * len(DATA)
    finally:
        fs.close()
    # The state directory's secret does not make a member of the cluster: the workers refuse
    # a client proving it (each counts a failed proof), so it learns nothing of what they hold.
    def refused():
        return sum(json.loads(subprocess.run([SILT, "report", "--json", "--state-dir", os.path.join(workdir, f"w{i}")],
                                             capture_output=True, text=True, check=True).stdout)["metrics"]
                   .get("silt_rpc_auth_failures_total", 0) for i in range(len(workers)))
    before = refused()
    outsider = silt.SiltFileSystem(workers=listed, mounts={"/data": f"s3://{s3.bucket}"},
                                   cluster_secret_file=os.path.join(state, "cluster-secret"),
                                   cluster_unix_socket=False, memory_capacity="0", skip_instance_cache=True,
                                   **s3.options())
    try:
        assert outsider.residency(["/data/train/001.bin"]) == [0.0]
    finally:
        outsider.close()
    assert refused() > before
    node.stop()


def test_etcd_cluster_unreachable_is_a_clear_error(workdir):
    port = free_port()  # nothing listens there
    with pytest.raises(ConnectionError) as e:
        silt.SiltFileSystem(etcd=f"http://127.0.0.1:{port}", cache_dir=workdir, skip_instance_cache=True,
                            cluster_secret="x" * 32, ufs_timeout="2s")
    assert f"127.0.0.1:{port}" in str(e.value)


def test_bad_input_gives_python_exceptions_with_messages(s3, workdir):
    with pytest.raises(ValueError, match="ftp"):
        silt.SiltFileSystem(mounts={"/d": "ftp://host/x"}, cache_dir=workdir, skip_instance_cache=True)
    with pytest.raises(ValueError, match="no_such_option"):
        silt.SiltFileSystem(mounts={"/d": "file:///tmp"}, cache_dir=workdir, no_such_option=1, skip_instance_cache=True)
    with pytest.raises(ValueError, match="no Silt serves"):
        silt.SiltFileSystem(cache_dir=os.path.join(workdir, "empty"), skip_instance_cache=True)
    with pytest.raises(ConnectionError, match="no Silt serves"):
        silt.SiltFileSystem(cache_dir=os.path.join(workdir, "empty"), mode="attach", skip_instance_cache=True)
    with pytest.raises(ValueError, match="expected auto, single, attached or cluster"):
        silt.SiltFileSystem(cache_dir=workdir, mode="sideways", skip_instance_cache=True)
    with pytest.raises(ConnectionError, match="no Silt serves"):
        silt.SiltFileSystem(cache_dir=os.path.join(workdir, "empty"), mode="attached", skip_instance_cache=True)
    # Wrong credentials: the store refuses, and the message says which mount.
    opts = dict(s3.options(), s3_secret_access_key="wrong")
    with pytest.raises(OSError, match="/data"):
        silt.SiltFileSystem(mounts={"/data": f"s3://{s3.bucket}"}, cache_dir=os.path.join(workdir, "c2"),
                            skip_instance_cache=True, **opts)
    fs = embedded(s3, workdir)
    try:
        with pytest.raises(FileNotFoundError):
            fs.cat_file("/data/nope")
        with pytest.raises(FileNotFoundError):
            fs.info("/elsewhere/x")
        with pytest.raises(IsADirectoryError):
            fs.cat_file("/data")
        with pytest.raises(ValueError):
            fs.open("/data/x", "r+b")
    finally:
        fs.close()


def test_headers_an_s3_client_stored_show_through_the_sdk(s3, workdir):
    """What an S3 client stored with an object (Content-Type, user metadata, a checksum)
    is what `headers()` and s3fs's `metadata()` give, read through the same client core the
    gateway and the mount use; a file written through the SDK has none (a write replaces an
    object's metadata, as a PUT does)."""
    import boto3
    from botocore.config import Config

    store = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3.options()["s3_access_key_id"],
        aws_secret_access_key=s3.options()["s3_secret_access_key"],
        config=Config(s3={"addressing_style": "path"}),
    )
    store.put_object(
        Bucket=s3.bucket,
        Key="img/cat.png",
        Body=b"\x89PNG...",
        ContentType="image/png",
        CacheControl="max-age=3600",
        Metadata={"label": "cat", "source": "web"},
    )
    fs = embedded(s3, workdir)
    try:
        h = fs.headers("/data/img/cat.png")
        assert h["content_type"] == "image/png", h
        assert h["cache_control"] == "max-age=3600", h
        assert h["metadata"] == {"label": "cat", "source": "web"}, h
        assert fs.metadata("/data/img/cat.png") == {"label": "cat", "source": "web"}
        fs.pipe_file("/data/img/cat.png", b"rewritten")
        h = fs.headers("/data/img/cat.png")
        assert h["metadata"] == {} and h["cache_control"] is None, h
        with pytest.raises(FileNotFoundError):
            fs.headers("/data/img/missing.png")
    finally:
        fs.close()


def store_requests(state):
    report = subprocess.run([SILT, "report", "--json", "--state-dir", state], capture_output=True, text=True, check=True)
    return json.loads(report.stdout)["metrics"].get("silt_ufs_requests_total", 0)


def test_an_attached_client_sees_the_files_its_owner_knows_without_asking_the_store(s3, workdir, procs):
    """A new attached process (a DataLoader worker) stats files through its owner's metadata
    cache: no store request for files the owner has listed; a file put in the store since is
    seen after a sync (the owner revalidates), by the attached client and the owner's mount."""
    fill(s3)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        os.listdir(os.path.join(mnt, "data", "train"))  # the owner lists (and knows) them
        s3.put("train/new.bin", b"put after the listing")
        before = store_requests(state)
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        for rel, data in DATA.items():
            assert fs.info(f"/data/{rel}")["size"] == len(data)
        assert store_requests(state) == before
        # A file put behind Silt's back after the owner listed: seen once the owner's sync
        # policy (an hour here) or a sync says so, for the attached client as for the owner.
        assert not fs.exists("/data/train/new.bin")
        fs.sync("/data/train")
        assert store_requests(state) > before
        assert fs.cat_file("/data/train/new.bin") == b"put after the listing"
        assert os.path.exists(os.path.join(mnt, "data", "train", "new.bin"))
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


@pytest.mark.parametrize("when", ["start", "run_time", "run_time_after_attaching"])
def test_an_attached_client_follows_its_owners_sync_policy(s3, workdir, procs, when):
    """The owner's policy holds for its attached clients, whatever theirs would be: under
    `always` on the owner, given at its start or set at run time with `silt fs sync-policy`
    (which reaches the clients attaching afterwards, a DataLoader's next workers, and a process
    attached before, from its next call), a file put behind Silt's back is seen at the next
    stat of a client that had already listed the directory (its own default, an hour, would
    hide it)."""
    fill(s3)
    up, state, mnt = silt_up(s3, workdir, procs, extra=["--sync-policy", "always"] if when == "start" else [])
    try:
        set_policy = lambda: subprocess.run(  # noqa: E731
            [SILT, "fs", "sync-policy", "/data/train", "always", "--state-dir", state], check=True, capture_output=True)
        if when == "run_time":
            set_policy()
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert "new.bin" not in [p.rsplit("/", 1)[-1] for p in fs.ls("/data/train", detail=False)]
        if when == "run_time_after_attaching":
            set_policy()
            assert "new.bin" not in [p.rsplit("/", 1)[-1] for p in fs.ls("/data/train", detail=False)]
        s3.put("train/new.bin", b"put after the listing")
        assert fs.cat_file("/data/train/new.bin") == b"put after the listing"
        assert "new.bin" in [p.rsplit("/", 1)[-1] for p in fs.ls("/data/train", detail=False)]
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_an_attached_client_follows_its_owner_through_a_restart_over_a_new_state(s3, workdir, procs):
    """One process, one cache_dir, `silt up` stopped and started again over a state directory
    made anew (a fresh node's: a new secret, an empty cache, another size): the filesystems of
    this process are the new owner's, one made before the restart too. The process's client of
    the stopped owner was reused before, and answered the new cache's size and residency as
    empty (B4's sampler, one repetition after another, saw no cached sample)."""
    fill(s3)
    state = os.path.join(workdir, "state")
    mnt = os.path.join(workdir, "mnt")
    up, _, _ = silt_up(s3, workdir, procs, extra=["--disk-tiers", f"{state}/cache:16MiB"])
    before = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
    try:
        assert before.cache_space() == (16 << 20, 0)
        assert before.cat_file("/data/train/003.bin") == DATA["train/003.bin"]
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
    shutil.rmtree(state)
    os.rmdir(mnt)
    up, _, _ = silt_up(s3, workdir, procs, extra=["--disk-tiers", f"{state}/cache:32MiB"])
    try:
        after = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert after.cache_space() == (32 << 20, 0)
        assert after.residency(["/data/train/003.bin"]) == [0.0]
        assert after.cat_file("/data/train/003.bin") == DATA["train/003.bin"]
        assert after.residency(["/data/train/003.bin", "/data/train/004.bin"]) == [1.0, 0.0]
        assert before.cache_space()[0] == 32 << 20
        after.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_an_attached_recursive_sync_revalidates_the_owners_tree(s3, workdir, procs):
    """A recursive `sync` through an attached client revalidates the tree on the owner too
    (before, the top directory only): files put behind Silt's back two levels down are listed
    by the owner's mount when the call returns, under the default policy (an hour)."""
    s3.put("deep/a/b/old.bin", b"old")
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        below = os.path.join(mnt, "data", "deep", "a", "b")
        assert os.listdir(below) == ["old.bin"]  # listed: cached for an hour
        s3.put("deep/a/b/new.bin", b"put behind Silt's back")
        s3.put("deep/a/c/other.bin", b"a new directory too")
        assert os.listdir(below) == ["old.bin"]
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        fs.sync("/data/deep", recursive=True)
        assert sorted(os.listdir(below)) == ["new.bin", "old.bin"]
        assert sorted(os.listdir(os.path.join(mnt, "data", "deep", "a"))) == ["b", "c"]
        with open(os.path.join(below, "new.bin"), "rb") as f:
            assert f.read() == b"put behind Silt's back"
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_an_attached_client_of_a_stopped_owner_times_out_and_goes_on_once_it_resumes(s3, workdir, procs):
    """An owner that stops answering (SIGSTOP: a process frozen between two calls) fails its
    attached clients' calls with TimeoutError after the bound (at least 10 s), not a hang; once
    it resumes, the same client is served again."""
    fill(s3)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True, ufs_timeout="1s", ufs_retries=0)
        assert fs.cat_file("/data/train/001.bin") == DATA["train/001.bin"]
        s3.put("late/new.bin", b"asked while the owner is stopped")
        os.kill(up.p.pid, signal.SIGSTOP)
        try:
            with pytest.raises(TimeoutError):
                fs.info("/data/late/new.bin")
        finally:
            os.kill(up.p.pid, signal.SIGCONT)
        assert fs.cat_file("/data/late/new.bin") == b"asked while the owner is stopped"
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_cache_space_is_the_cache_holding_the_clients_data(s3, workdir, procs):
    """`fs.cache_space()`: a single node's own disk tiers, an attached client's owner's."""
    fill(s3)
    single = embedded(s3, workdir, disk_tiers=f"{os.path.join(workdir, 'cache', 'tier')}:64MiB")
    try:
        cap, used = single.cache_space()
        assert cap == 64 << 20 and used == 0, (cap, used)
        single.load("/data/train")
        cap2, used2 = single.cache_space()
        assert cap2 == cap and used2 >= sum(len(v) for v in DATA.values()), (cap2, used2)
    finally:
        single.close()
    up, state, mnt = silt_up(s3, os.path.join(workdir, "up"), procs, extra=["--disk-tiers", f"{workdir}/up-tier:32MiB"])
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert fs.cache_space()[0] == 32 << 20
        fs.load("/data/train/003.bin")
        assert fs.cache_space()[1] >= len(DATA["train/003.bin"])
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_an_attached_clients_own_memory_tier_is_small_unless_asked_for(s3, workdir, procs):
    """An attached client's data is in its owner's cache on this host: its own memory tier
    keeps 16 MiB by default (read-ahead room), not a second copy of everything it reads (at
    1 GiB a loader process faulted fresh pages for every read); an explicit
    `memory_capacity` is kept. A whole file read into `bytes` comes straight from the owner's
    cache file (no page kept here); reads of pieces of pages go through the client's pages."""
    big = os.urandom(40 << 20)
    s3.put("big.bin", big)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        with open(os.path.join(mnt, "data", "big.bin"), "rb") as f:
            assert f.read() == big  # whole in the owner's cache
        starts = [1 + (i << 20) for i in range(39)]  # each a piece of two pages
        ends = [s + (1 << 20) for s in starts]
        pieces = [big[s:e] for s, e in zip(starts, ends)]
        small = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert small.cat_file("/data/big.bin") == big
        assert small.client.stats()["bytes_cached"] == 0, small.client.stats()
        assert small.cat_ranges(["/data/big.bin"] * len(starts), starts, ends) == pieces
        assert 0 < small.client.stats()["bytes_cached"] <= 16 << 20, small.client.stats()
        asked = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True, memory_capacity="64MiB")
        assert asked.cat_ranges(["/data/big.bin"] * len(starts), starts, ends) == pieces
        assert asked.client.stats()["bytes_cached"] > 16 << 20, asked.client.stats()
        small.close()
        asked.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


ALLOC = """
import ctypes, silt
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
before = libc.mallinfo2().hblks
p = libc.malloc(2 << 20)
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.parametrize("env, mapped", [({}, "0"), ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, "1")])
def test_the_sdk_tunes_malloc_unless_the_process_chose_its_own(env, mapped):
    """Importing the SDK takes 2 MiB buffers from the heap (not a fresh mmap each); a process
    that set its own threshold keeps it (a 2 MiB buffer over its 64 KiB threshold is mapped)."""
    run = subprocess.run([sys.executable, "-c", ALLOC], capture_output=True, text=True,
                         env=dict({k: v for k, v in os.environ.items() if not k.startswith(("GLIBC_", "MALLOC_"))}, **env))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == mapped, (env, run.stdout)
