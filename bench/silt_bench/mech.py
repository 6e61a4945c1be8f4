"""The mechanics every scenario shares: timed parallel reads, a Silt instance started and stopped
around a phase, the direct (no cache) client, cache dropping and page-cache residency.

Binaries come from the release build (`scripts/bench.sh` builds them):
target/release/{silt, silt-bench, examples/direct_read}.
"""
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SILT = os.path.join(ROOT, "target/release/silt")
DIRECT = os.path.join(ROOT, "target/release/examples/direct_read")
SILT_BENCH = os.path.join(ROOT, "target/release/silt-bench")
CHUNK = 1 << 20


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


def direct(store, args):
    """The direct baseline (crates/silt/examples/direct_read): (bytes or entries, seconds)."""
    os.sync()
    r = json.loads(subprocess.check_output([DIRECT, f"s3://{store.bucket}"] + args, env=store.env()))
    return r.get("bytes", r.get("entries")), r["seconds"]


class Silt:
    """`silt up` over the store's bucket, mounted at WORK/mnt; `path(rel)` is rel through the
    mount. Started on `state`: a fresh dir is cold, the dir a stopped instance left is warm."""

    def __init__(self, work, state, store, memory="1GiB", disk="40GiB", extra=()):
        self.mnt = os.path.join(work, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        self.state = state
        self.cache_dir = os.path.join(state, "cache")
        self.log = open(os.path.join(work, "silt.log"), "a")
        env = dict(store.env(), SILT_LOG="warn")
        cmd = [SILT, "up", "--mount", f"/data=s3://{store.bucket}", "--mountpoint", self.mnt,
               "--state-dir", state, "--disk-tiers", f"{self.cache_dir}:{disk}", "--memory-capacity", memory, *extra]
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        for line in self.p.stderr:  # silt prints "silt: serving" once mounted
            self.log.write(line)
            if line.startswith("silt: serving"):
                break
        else:
            self.p.wait()
            raise RuntimeError(f"silt did not come up (exit {self.p.returncode}); see {self.log.name}")
        threading.Thread(target=lambda: [self.log.write(l) for l in self.p.stderr], daemon=True).start()

    def path(self, rel):
        return os.path.join(self.mnt, "data", rel)

    def report(self):
        return json.loads(subprocess.check_output([SILT, "report", "--json", "--state-dir", self.state]))

    def metric(self, name):
        return self.report()["metrics"][name]

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

    def stop(self):
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
