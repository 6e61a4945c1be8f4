"""The mechanics every scenario shares: timed parallel reads, a Silt instance started and stopped
around a phase, the direct (no cache) client, cache dropping and page-cache residency.

Binaries come from the release build (`scripts/bench.sh` builds them):
target/release/{silt, silt-bench, examples/direct_read}. $SILT_BENCH_SILT names another `silt`
binary (e.g. a debug build, to check the harness against code not yet built for release; its
timings are not the product's); the run's JSON records which one ran (params.silt_binary).
"""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SILT = os.environ.get("SILT_BENCH_SILT") or os.path.join(ROOT, "target/release/silt")
DIRECT = os.path.join(ROOT, "target/release/examples/direct_read")
SILT_BENCH = os.path.join(ROOT, "target/release/silt-bench")
CHUNK = 1 << 20
# The etcd of --cluster runs: $SILT_ETCD, else Debian's etcd-server, else etcd on PATH (as
# crates/silt-testkit's Etcd looks it up).
ETCD = os.environ.get("SILT_ETCD") or ("/usr/bin/etcd" if os.path.isfile("/usr/bin/etcd") else shutil.which("etcd"))
# The S3 server of scenario G's unshaped baseline: looked up as `silt-bench env` looks up the
# shaped store's ($SILT_VERSITYGW, the workspace's .deps/bin/versitygw, PATH).
_DEPS_VERSITYGW = os.path.join(ROOT, ".deps/bin/versitygw")
VERSITYGW = os.environ.get("SILT_VERSITYGW") or (
    _DEPS_VERSITYGW if os.path.isfile(_DEPS_VERSITYGW) else shutil.which("versitygw"))

# Every etcd, worker and client process a Cluster started and has not stopped yet, so that the
# run's clean-up (bench/run's `finally`) can stop what an exception left behind.
_LIVE = set()


def missing_binaries():
    return [b for b in (SILT, DIRECT, SILT_BENCH) if not os.path.exists(b)]


def drop_caches():
    """Write back dirty pages, then drop the kernel's page, dentry and inode caches."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def evict_file(path):
    """Drop one file's pages from the kernel page cache (through a FUSE mount this drops the
    mount's cached pages of that file, not any cache behind the file system)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(paths):
    """Fraction of the bytes of `paths` that sit in the kernel page cache (via mincore, by
    `fincore` from util-linux). None when fincore is not available."""
    paths = [p for p in paths if os.path.exists(p)]
    if not paths:
        return None
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE"] + paths,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    res = size = 0
    for line in out.splitlines():
        r, s = line.split()
        res, size = res + int(r), size + int(s)
    return res / size if size else None


def read_file(path):
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                return n
            n += len(b)
    finally:
        os.close(fd)


def timed_read(paths, threads):
    """(bytes, seconds) to read every path whole with `threads` readers, in the given order.
    Write-back of earlier phases (a cold read fills the disk tier) is finished first, so it does
    not land inside whichever measurement comes next."""
    os.sync()
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        total = sum(ex.map(read_file, paths))
    return total, time.perf_counter() - t


def drop_dentries():
    """Drop the kernel's dentry and inode caches (not the page cache): through a FUSE mount, the
    next path lookup goes to the daemon again (its own metadata cache is untouched)."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")


def open_stat(paths):
    """Seconds of os.open(O_RDONLY) + os.fstat + os.close for each path, one at a time, in order:
    every call goes through the kernel (path lookup, FUSE open/getattr/release)."""
    lat = []
    for p in paths:
        t = time.perf_counter()
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fstat(fd)
        finally:
            os.close(fd)
        lat.append(time.perf_counter() - t)
    return lat


def walk(root):
    """A `find -ls`-style walk: every directory listed, every entry lstat'ed. Returns
    (entries, seconds)."""
    t = time.perf_counter()
    n = 0
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                st = os.lstat(e.path)
                n += 1
                if (st.st_mode & 0o170000) == 0o040000:
                    stack.append(e.path)
    return n, time.perf_counter() - t


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Store:
    """Where the benchmark data lives: an S3 endpoint, its keys, the bucket, and the bucket's
    directory on this machine (versitygw's posix backend), which the local baselines read."""

    def __init__(self, endpoint, key, secret, bucket, local_dir):
        self.endpoint, self.key, self.secret, self.bucket, self.local_dir = endpoint, key, secret, bucket, local_dir

    def env(self):
        return dict(os.environ, SILT_S3_ENDPOINT=self.endpoint, SILT_S3_ACCESS_KEY_ID=self.key,
                    SILT_S3_SECRET_ACCESS_KEY=self.secret)

    def local(self, rel):
        return os.path.join(self.local_dir, rel)


def parse_size(text):
    """Bytes in a size as silt takes it ("1GiB", "256MiB", "4096")."""
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    for unit, mult in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def direct_json(store, args):
    """The direct baseline (crates/silt/examples/direct_read) over `store`: its JSON."""
    os.sync()
    return json.loads(subprocess.check_output([DIRECT, f"s3://{store.bucket}"] + args, env=store.env()))


def direct(store, args):
    """The direct baseline: (bytes or entries, seconds)."""
    r = direct_json(store, args)
    return r.get("bytes", r.get("entries")), r["seconds"]


class Silt:
    """`silt up` over the store's bucket, mounted at WORK/mnt; `path(rel)` is rel through the
    mount. Started on `state`: a fresh dir is cold, the dir a stopped instance left is warm.
    The bucket is the namespace's /data; `mounts` adds entries {namespace path: URI} beside it
    (e.g. {"/b3": "s3://bench/tree"}), reached with `ns(path)`."""

    GATEWAY_LINE = "silt: S3 gateway at "

    def __init__(self, work, state, store, memory="1GiB", disk="40GiB", extra=(), mounts=None, gateway=None):
        self.memory = memory
        self.gateway = None  # with `gateway` (an access key and its secret): the S3 gateway's URL
        self.mnt = os.path.join(work, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        self.state = state
        self.cache_dir = os.path.join(state, "cache")
        self.log = open(os.path.join(work, "silt.log"), "a")
        env = dict(store.env(), SILT_LOG="warn")
        table = ",".join([f"/data=s3://{store.bucket}"] + [f"{k}={v}" for k, v in (mounts or {}).items()])
        cmd = [SILT, "up", "--mount", table, "--mountpoint", self.mnt,
               "--state-dir", state, "--disk-tiers", f"{self.cache_dir}:{disk}", "--memory-capacity", memory, *extra]
        if gateway:
            # A free loopback port; the key goes by the environment, not the command line.
            cmd += ["--gateway", "127.0.0.1:0"]
            env.update(SILT_GATEWAY_ACCESS_KEY=gateway[0], SILT_GATEWAY_SECRET_KEY=gateway[1])
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        for line in self.p.stderr:  # silt prints "silt: serving" once mounted (the gateway's line before it)
            self.log.write(line)
            if gateway and line.startswith(self.GATEWAY_LINE):
                self.gateway = line[len(self.GATEWAY_LINE):].strip()
            if line.startswith("silt: serving"):
                break
        else:
            self.p.wait()
            raise RuntimeError(f"silt did not come up (exit {self.p.returncode}); see {self.log.name}")
        threading.Thread(target=lambda: [self.log.write(l) for l in self.p.stderr], daemon=True).start()
        if gateway and not self.gateway:
            self.stop()
            raise RuntimeError(f"silt printed no gateway address; see {self.log.name}")

    def path(self, rel):
        return os.path.join(self.mnt, "data", rel)

    def ns(self, path):
        """A namespace path (e.g. "/b3/x") through the mount."""
        return os.path.join(self.mnt, path.lstrip("/"))

    def report(self):
        return json.loads(subprocess.check_output([SILT, "report", "--json", "--state-dir", self.state]))

    def metric(self, name):
        return self.report()["metrics"][name]

    def wait_fills_behind(self, timeout=900):
        """Waits until no fill behind a reader of the store's own file is in flight
        (`fuse_source_passthrough`); returns the seconds waited, or None if none was started."""
        t0 = time.monotonic()
        while True:
            m = self.report()["metrics"]
            started, done = m.get("silt_fills_behind_started_total", 0), m.get("silt_fills_behind_finished_total", 0)
            if started == done:
                return time.monotonic() - t0 if started else None
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"fills behind the reader still running after {timeout} s")
            time.sleep(0.05)

    def load(self, rel):
        subprocess.run([SILT, "load", "--state-dir", self.state, "/data/" + rel], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss(self):
        return rss_bytes(self.p.pid)

    def data_files(self):
        """The disk tier's data files (one sparse file per cached object)."""
        out = []
        for d, _, names in os.walk(os.path.join(self.cache_dir, "objects")):
            out += [os.path.join(d, n) for n in names if n.endswith(".data")]
        return out

    def crash(self):
        """SIGKILL: no clean-up by silt; the next start on the same mountpoint and state must
        cope (take the mount over or detach it)."""
        self.p.kill()
        self.p.wait()

    def stop(self):
        if self.p.poll() is not None:
            # Crashed on purpose: its mount is the next start's to take over or detach.
            return
        subprocess.run([SILT, "down", "--state-dir", self.state], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-uz", self.mnt], check=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------- cluster (bench/run --cluster N)

def _terminate(p, timeout=60):
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    _LIVE.discard(p)


def stop_all():
    """Stops every process a Cluster started and still runs (the run's last clean-up)."""
    for p in list(_LIVE):
        _terminate(p, timeout=20)


def free_port(ip="127.0.0.1"):
    """A TCP port on `ip` that was free a moment ago."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def etcd_healthy(endpoint):
    """Whether etcd answers GET /health with {"health":"true"} (it has a leader)."""
    try:
        with urllib.request.urlopen(endpoint + "/health", timeout=2) as r:
            return r.status == 200 and json.loads(r.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


def _wait_for_line(p, prefix, log, what, timeout=60):
    """Copies p's stderr into `log` until a line starts with `prefix`, then keeps copying in the
    background. Raises if p exits first or `timeout` seconds pass."""
    seen, done = [], threading.Event()

    def pump():
        for line in p.stderr:
            log.write(line)
            if not seen and line.startswith(prefix):
                seen.append(line)
                log.flush()
                done.set()
        done.set()  # stderr closed: p exited

    threading.Thread(target=pump, daemon=True).start()
    done.wait(timeout)
    if not seen:
        log.flush()
        raise RuntimeError(f"{what} did not come up (exit {p.poll()}); see {log.name}")


class Etcd:
    """A one-member etcd on loopback (free ports, its own data dir), for the cluster's
    membership and mount table; ready once /health reports a leader. Started like
    crates/silt-testkit's Etcd; a port taken between picking and binding means a retry."""

    def __init__(self, data_dir, attempts=5, timeout=30):
        if not ETCD:
            raise RuntimeError("etcd not found ($SILT_ETCD, /usr/bin/etcd, PATH): apt-get install etcd-server")
        self.dir = data_dir
        os.makedirs(data_dir, exist_ok=True)
        self.log_path = os.path.join(data_dir, "etcd.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        for _ in range(attempts):
            client, peer = free_port(), free_port()
            if client == peer:
                continue
            self.endpoint = f"http://127.0.0.1:{client}"
            peer_url = f"http://127.0.0.1:{peer}"
            shutil.rmtree(os.path.join(data_dir, "data"), ignore_errors=True)
            with open(self.log_path, "a") as log:
                self.p = subprocess.Popen(
                    [ETCD, "--name", "silt-bench", "--data-dir", os.path.join(data_dir, "data"),
                     "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                     "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                     "--initial-cluster", f"silt-bench={peer_url}", "--initial-cluster-state", "new",
                     "--initial-cluster-token", f"silt-bench-{client}", "--logger", "zap",
                     "--log-outputs", "stderr"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
            _LIVE.add(self.p)
            deadline = time.monotonic() + timeout
            while self.p.poll() is None and time.monotonic() < deadline:
                if etcd_healthy(self.endpoint):
                    return
                time.sleep(0.05)  # polling for readiness
            _terminate(self.p, timeout=5)
            with open(self.log_path) as f:
                if "address already in use" not in f.read():
                    break
        raise RuntimeError(f"etcd did not become healthy; see {self.log_path}")

    def stop(self):
        _terminate(self.p, timeout=10)


def versitygw_answers(port, ip="127.0.0.1"):
    """Whether versitygw answers HTTP on ip:port (any status: an unsigned request is refused;
    its Server header tells it from another program on the port), as `silt-bench env` checks."""
    try:
        with socket.create_connection((ip, port), timeout=0.5) as s:
            s.settimeout(2)
            s.sendall(f"GET / HTTP/1.1\r\nHost: {ip}:{port}\r\nConnection: close\r\n\r\n".encode())
            got = b""
            while len(got) < 64 * 1024:
                b = s.recv(64 * 1024)
                if not b:
                    break
                got += b
    except OSError:
        return False
    head = got.decode("latin-1").lower()
    return head.startswith("http/1.") and "server: versitygw" in head


class LocalS3:
    """versitygw over `data_dir` (its top-level directories are buckets) on loopback, with no
    shaping: scenario G's "unshaped local S3 server of the same bytes". Started as the shaped
    store's versitygw (`silt-bench env`: posix backend, no VGW_* settings), plus --keep-alive
    (the shaped store's server closes every connection: its clients pay a connect per request,
    which this baseline should not). A port taken between picking and binding means a retry."""

    def __init__(self, data_dir, key, secret, log_path, attempts=5, timeout=30):
        if not VERSITYGW:
            raise RuntimeError("versitygw not found ($SILT_VERSITYGW, .deps/bin/versitygw, PATH)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGW_")}
        for _ in range(attempts):
            port = free_port()
            self.endpoint = f"http://127.0.0.1:{port}"
            with open(log_path, "a") as log:
                self.p = subprocess.Popen([VERSITYGW, "--access", key, "--secret", secret, "--port",
                                           f"127.0.0.1:{port}", "--keep-alive", "posix", data_dir],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
            _LIVE.add(self.p)
            deadline = time.monotonic() + timeout
            while self.p.poll() is None and time.monotonic() < deadline:
                if versitygw_answers(port):
                    return
                time.sleep(0.05)  # polling for readiness
            _terminate(self.p, timeout=5)
            with open(log_path) as f:
                if "address already in use" not in f.read():
                    break
        raise RuntimeError(f"versitygw did not answer on loopback; see {log_path}")

    def stop(self):
        _terminate(self.p, timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Cluster:
    """N `silt worker`s on this host (loopback, each its own state dir, RPC port and Unix
    socket), registered in one fresh etcd, and a client-only `silt mount` at WORK/cmnt whose
    namespace is the workers' mount table; `path(rel)` is rel through the mount, as for Silt.

    `state` holds STATE/w1..wN (workers: disk tier STATE/wI/cache, memory tier `memory`) and
    STATE/client (the client: memory-only near cache of `client_memory`, and its metadata
    snapshot). A fresh `state` is cold everywhere; the `state` a stopped Cluster left is warm in
    the workers' disk tiers and the client's metadata, while every memory tier (workers' and the
    client's near cache) and the kernel's cache of the mount start empty, as for a restarted
    `silt up`. etcd is fresh each time (membership and the mount table are re-published)."""

    def __init__(self, work, state, store, workers, memory="1GiB", disk="40GiB", client_memory="1GiB", extra=()):
        self.mnt = os.path.join(work, "cmnt")
        os.makedirs(self.mnt, exist_ok=True)
        self.state = state
        self.client_state = os.path.join(state, "client")
        self.worker_states = [os.path.join(state, f"w{i + 1}") for i in range(workers)]
        self.log = open(os.path.join(work, "cluster.log"), "a")
        self.etcd = self.client = None
        self.workers = []
        # Every member proves it holds one cluster secret (docs/SECURITY.md); a fresh one per run.
        env = dict(store.env(), SILT_LOG="warn", SILT_CLUSTER_SECRET=secrets.token_urlsafe(32))
        try:
            self.etcd = Etcd(os.path.join(work, "etcd"))
            common = ["--etcd", self.etcd.endpoint, "--memory-capacity", memory, *extra]
            for i, ws in enumerate(self.worker_states):
                os.makedirs(ws, exist_ok=True)
                cmd = [SILT, "worker", "--mount", f"/data=s3://{store.bucket}", "--listen", "127.0.0.1:0",
                       "--worker-id", f"w{i + 1}", "--state-dir", ws,
                       "--disk-tiers", f"{os.path.join(ws, 'cache')}:{disk}", *common]
                p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
                _LIVE.add(p)
                self.workers.append(p)
            for i, p in enumerate(self.workers):  # they start side by side
                _wait_for_line(p, "silt: serving as worker", self.log, f"silt worker w{i + 1}")
            os.makedirs(self.client_state, exist_ok=True)
            cmd = [SILT, "mount", self.mnt, "--etcd", self.etcd.endpoint, "--state-dir", self.client_state,
                   "--memory-capacity", client_memory, *extra]
            self.client = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
            _LIVE.add(self.client)
            _wait_for_line(self.client, "silt: serving", self.log, "the cluster client (silt mount)")
            self._wait_for_workers(workers)
        except BaseException:
            self.stop()
            raise

    def _wait_for_workers(self, n, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            live = [w for w in self.report().get("cluster", {}).get("workers", []) if w.get("live")]
            if len(live) >= n:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster client sees {len(live)} live workers of {n}; see {self.log.name}")
            time.sleep(0.1)  # polling the client's view of the membership

    def path(self, rel):
        return os.path.join(self.mnt, "data", rel)

    def report(self):
        """The client's report: its own metrics and tiers, and cluster.workers[] (per worker:
        id, live, bytes_served, ufs_read_bytes, hit_ratio, ...)."""
        return json.loads(subprocess.check_output([SILT, "report", "--json", "--state-dir", self.client_state]))

    def metric(self, name):
        return self.report()["metrics"][name]

    def worker_stats(self):
        """{worker id: its entry in the client's cluster report}."""
        return {w["id"]: w for w in self.report()["cluster"]["workers"]}

    def pids(self):
        return [p.pid for p in self.workers + [self.client] if p is not None and p.poll() is None]

    def load(self, rel):
        subprocess.run([SILT, "load", "--state-dir", self.client_state, "/data/" + rel], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        """Client first (unmounted, metadata saved), then the workers, then etcd."""
        if self.client is not None:
            if self.client.poll() is None:
                subprocess.run([SILT, "down", "--state-dir", self.client_state], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    self.client.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    pass
            _terminate(self.client)
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-uz", self.mnt], check=False)
        for p in self.workers:  # all asked at once, then waited for
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.workers:
            _terminate(p)
        if self.etcd is not None:
            self.etcd.stop()
            shutil.rmtree(self.etcd.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
