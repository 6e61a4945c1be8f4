#!/usr/bin/env python3
"""The Python SDK beside the mount (issue 16), side by side in one run:

- B2 through the SDK (attached to a `silt up`, `fs.cat_file` from 8 threads) and through the
  mount (open + read from 8 threads): cold (fresh state each) and warm, files/s, and the local
  read of the same files (page cache warm) for "÷ local";
- a cached 1 GiB file read through fsspec (`fs.open(...).read`, 4 MiB reads) and through the
  native reader, ÷ the local read of the same file (page cache warm);
- B4 (bench/silt_bench/train.py: 3 epochs, batch 64, 4 loader processes, 50 ms compute per
  batch, kernel caches dropped before each epoch) reading through the SDK and through the mount,
  each from a fresh cache, ÷ the synthetic loop.

The store is versitygw on loopback, not shaped (the full suite's shaped store lives in
`bench/run`): cold figures here measure Silt's own cost over a fast store, not a remote one.
Needs root (drop_caches, FUSE), `target/release/silt` and the release wheel
(`scripts/python-wheel.sh --release`). Run with the venv's python:

    .deps/pyvenv/bin/python bench/sdk.py --reps 3 --out bench/results-DATE-sdk.json
"""
import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from silt_bench import mech, train  # noqa: E402

import silt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SILT = os.path.join(ROOT, "target/release/silt")
VERSITYGW = os.environ.get("SILT_VERSITYGW") or os.path.join(ROOT, ".deps/bin/versitygw")
ACCESS, SECRET = "bench-access", "bench-secret-not-for-use"
CHUNK = 4 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")


def generate(bucket, n, seed=1):
    rng = random.Random(seed)
    files = []
    for i in range(n):
        # Log-normal, median ~100 KB (B2's distribution).
        size = max(1024, min(int(rng.lognormvariate(11.5, 0.45)), 4 << 20))
        rel = f"small/d{i % 100:03d}/f{i:06d}.bin"
        p = os.path.join(bucket, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(rng.randbytes(size))
        files.append((rel, size))
    big = os.path.join(bucket, "large/one-gib.bin")
    os.makedirs(os.path.dirname(big), exist_ok=True)
    with open(big, "wb") as f:
        block = rng.randbytes(CHUNK)
        for _ in range((1 << 30) // CHUNK):
            f.write(block)
    return files


class Up:
    """`silt up` over the bucket with a fresh state dir, and an attached SDK filesystem."""

    def __init__(self, work, name, endpoint):
        self.state = os.path.join(work, f"state-{name}")
        self.mnt = os.path.join(work, f"mnt-{name}")
        shutil.rmtree(self.state, ignore_errors=True)
        os.makedirs(self.mnt, exist_ok=True)
        self.p = subprocess.Popen(
            [SILT, "up", "--mount", "/data=s3://bucket", "--mountpoint", self.mnt, "--state-dir", self.state,
             "--s3-endpoint", endpoint, "--s3-access-key-id", ACCESS, "--s3-secret-access-key", SECRET,
             "--memory-capacity", "1GiB", "--disk-tiers", f"{self.state}/cache:8GiB"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        log = []
        for line in self.p.stderr:
            log.append(line)
            if line.startswith("silt: serving"):
                break
        else:
            self.p.kill()
            subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True)
            raise RuntimeError("silt up did not start:\n" + "".join(log))
        # Keep reading its log so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.p.stderr], daemon=True).start()
        self.options = {"cache_dir": self.state, "mode": "attach", "s3_endpoint": endpoint,
                        "s3_access_key_id": ACCESS, "s3_secret_access_key": SECRET}
        try:
            self.fs = silt.SiltFileSystem(skip_instance_cache=True, **self.options)
        except BaseException:
            self.p.kill()
            self.p.wait()
            subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True)
            raise

    def stop(self):
        self.fs.close()
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=60)
        subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True)
        shutil.rmtree(self.state, ignore_errors=True)


def files_per_s(read, paths, threads=8):
    os.sync()
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        n = sum(1 for _ in ex.map(read, paths))
    return n / (time.perf_counter() - t)


def gb_per_s(read_all):
    t = time.perf_counter()
    nbytes = read_all()
    return nbytes / (time.perf_counter() - t) / 1e9


def read_local(path):
    with open(path, "rb") as f:
        return len(f.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--small", type=int, default=5000)
    ap.add_argument("--work", default="/var/tmp/silt-sdk-bench")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    root = os.path.join(a.work, "s3")
    bucket = os.path.join(root, "bucket")
    os.makedirs(bucket)
    files = generate(bucket, a.small)
    port = free_port()
    gw = subprocess.Popen([VERSITYGW, "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}", "posix", root],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    figures = {}

    def add(name, v):
        figures.setdefault(name, []).append(v)
        print(f"{name}: {v:.4g}", flush=True)

    try:
        wait_port(port, gw, "versitygw")
        for rep in range(a.reps):
            order = [rel for rel, _ in files]
            random.Random(rep).shuffle(order)
            local = [os.path.join(bucket, r) for r in order]
            files_per_s(read_local, local)
            add("b2_local", files_per_s(read_local, local))
            # SDK: cold then warm (attached to a fresh `silt up`).
            up = Up(a.work, "sdk", endpoint)
            try:
                add("b2_sdk_cold", files_per_s(lambda r: up.fs.cat_file("/data/" + r), order))
                add("b2_sdk_warm", files_per_s(lambda r: up.fs.cat_file("/data/" + r), order))
                add("b2_mount_warm_same_daemon", files_per_s(lambda r: read_local(os.path.join(up.mnt, "data", r)), order))
            finally:
                up.stop()
            # Mount: cold then warm (fresh state), then the 1 GiB file.
            up = Up(a.work, "mount", endpoint)
            try:
                add("b2_mount_cold", files_per_s(lambda r: read_local(os.path.join(up.mnt, "data", r)), order))
                add("b2_mount_warm", files_per_s(lambda r: read_local(os.path.join(up.mnt, "data", r)), order))
                add("b2_sdk_warm_same_daemon", files_per_s(lambda r: up.fs.cat_file("/data/" + r), order))
                big_local = os.path.join(bucket, "large/one-gib.bin")
                read_local(os.path.join(up.mnt, "data/large/one-gib.bin"))  # cache it whole
                read_local(big_local)  # page cache warm

                def chunks_local():
                    n = 0
                    with open(big_local, "rb", buffering=0) as f:
                        while b := f.read(CHUNK):
                            n += len(b)
                    return n

                def chunks_fsspec():
                    n = 0
                    with up.fs.open("/data/large/one-gib.bin", "rb", block_size=CHUNK) as f:
                        while b := f.read(CHUNK):
                            n += len(b)
                    return n

                def chunks_native():
                    r = up.fs.client.open("/data/large/one-gib.bin")
                    return sum(len(r.read(off, CHUNK)) for off in range(0, r.size, CHUNK))

                def chunks_mount():
                    n = 0
                    with open(os.path.join(up.mnt, "data/large/one-gib.bin"), "rb", buffering=0) as f:
                        while b := f.read(CHUNK):
                            n += len(b)
                    return n

                chunks_fsspec()
                for name, fn in (("local", chunks_local), ("fsspec", chunks_fsspec), ("native", chunks_native), ("mount", chunks_mount)):
                    add(f"gib_{name}", gb_per_s(fn))
            finally:
                up.stop()
            # B4 through the SDK and through the mount, each from a fresh cache.
            p = train.b4_params(False) if hasattr(train, "b4_params") else dict(epochs=3, batch_size=64, workers=4, prefetch=2, compute_s=0.05)
            sizes = dict(files)
            syn = train.run([(None, sizes[r]) for r in order], seed=rep, synthetic=True, **p)
            add("b4_synthetic", statistics.median(e["samples_per_s"] for e in syn))
            for label in ("sdk", "mount"):
                up = Up(a.work, f"b4-{label}", endpoint)
                try:
                    if label == "sdk":
                        os.environ["SILT_BENCH_SDK"] = json.dumps(up.options)
                        items = [("silt://data/" + r, sizes[r]) for r in order]
                    else:
                        items = [(os.path.join(up.mnt, "data", r), sizes[r]) for r in order]
                    epochs = train.run(items, seed=rep, before_epoch=lambda e: mech.drop_caches(), **p)
                    for e, r in enumerate(epochs):
                        add(f"b4_{label}_e{e + 1}", r["samples_per_s"])
                finally:
                    up.stop()
            print(f"rep {rep + 1}/{a.reps} done", flush=True)
    finally:
        gw.kill()
        gw.wait()
        shutil.rmtree(a.work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in figures.items()}
    syn = med["b4_synthetic"]
    ratios = {
        "B2 SDK cold ÷ mount cold": med["b2_sdk_cold"] / med["b2_mount_cold"],
        "B2 SDK warm ÷ mount warm": med["b2_sdk_warm"] / med["b2_mount_warm"],
        "B2 SDK warm ÷ local": med["b2_sdk_warm"] / med["b2_local"],
        "B2 mount warm ÷ local": med["b2_mount_warm"] / med["b2_local"],
        "1 GiB cached: fsspec ÷ local": med["gib_fsspec"] / med["gib_local"],
        "1 GiB cached: native reader ÷ local": med["gib_native"] / med["gib_local"],
        "1 GiB cached: mount ÷ local": med["gib_mount"] / med["gib_local"],
        "B4 SDK epochs 2–3 ÷ synthetic": statistics.mean([med["b4_sdk_e2"], med["b4_sdk_e3"]]) / syn,
        "B4 mount epochs 2–3 ÷ synthetic": statistics.mean([med["b4_mount_e2"], med["b4_mount_e3"]]) / syn,
        "B4 SDK epoch 1 ÷ synthetic": med["b4_sdk_e1"] / syn,
        "B4 mount epoch 1 ÷ synthetic": med["b4_mount_e1"] / syn,
    }
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    out = {
        "command": " ".join([os.path.relpath(sys.executable, ROOT), "bench/sdk.py"] + sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.platform()}",
        "loader": train.LOADER,
        "params": {"reps": a.reps, "small_files": a.small, "small_bytes": sum(s for _, s in files)},
        "figures": figures,
        "medians": med,
        "ratios": ratios,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
