#!/usr/bin/env python3
"""First cut of B1 and B2 (shared/brief/benchmarks.md) on an unshaped loopback S3 server.

Runs Silt and its baselines interleaved in one run, several repetitions, and prints medians,
min-max and ratios. The shaped "remote" store and B3-B6 come with the benchmark issue.

    python3 bench/readpath.py [--quick] [--reps N] [--json OUT]

Needs root (FUSE, drop_caches), a release build (`cargo build --release -p silt --example
direct_read`) and scripts/install-deps.sh. Everything it starts is stopped on exit.
"""
import argparse, json, os, platform, random, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SILT = os.path.join(ROOT, "target/release/silt")
DIRECT = os.path.join(ROOT, "target/release/examples/direct_read")
VGW = os.path.join(ROOT, ".deps/bin/versitygw")
KEY, SECRET = "silt-bench", "silt-bench-secret"
CHUNK = 1 << 20


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


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
    # Let write-back of earlier phases (the disk tier fills during cold reads) finish first, so
    # it does not land inside whichever measurement comes next.
    os.sync()
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        total = sum(ex.map(read_file, paths))
    return total, time.perf_counter() - t


class Silt:
    extra = []

    def __init__(self, work, state, endpoint):
        self.mnt = os.path.join(work, "mnt"); os.makedirs(self.mnt, exist_ok=True)
        self.state = state
        self.log = open(os.path.join(work, "silt.log"), "a")
        env = dict(os.environ, SILT_S3_ACCESS_KEY_ID=KEY, SILT_S3_SECRET_ACCESS_KEY=SECRET, SILT_LOG="warn")
        self.p = subprocess.Popen([SILT, "up", "--mount", "/data=s3://bench", "--s3-endpoint", endpoint,
                                   "--mountpoint", self.mnt, "--state-dir", state, "--disk-tiers", f"{state}/cache:40GiB",
                                   "--memory-capacity", "1GiB"] + Silt.extra,
                                  stderr=subprocess.PIPE, text=True, env=env)
        for line in self.p.stderr:  # silt prints "silt: serving" once mounted
            self.log.write(line)
            if line.startswith("silt: serving"):
                break
        else:
            raise RuntimeError("silt did not come up; see silt.log")
        threading.Thread(target=lambda: [self.log.write(l) for l in self.p.stderr], daemon=True).start()

    def path(self, rel):
        return os.path.join(self.mnt, "data", rel)

    def report(self):
        return json.loads(subprocess.check_output([SILT, "report", "--json", "--state-dir", self.state]))

    def stop(self):
        subprocess.run([SILT, "down", "--state-dir", self.state], check=False)
        self.p.wait(timeout=60)


def direct(endpoint, args):
    os.sync()
    env = dict(os.environ, SILT_S3_ENDPOINT=endpoint, SILT_S3_ACCESS_KEY_ID=KEY, SILT_S3_SECRET_ACCESS_KEY=SECRET)
    out = subprocess.check_output([DIRECT, "s3://bench"] + args, env=env)
    r = json.loads(out)
    return r["bytes"], r["seconds"]


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 x 256 MiB and 2,000 small files")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--silt-arg", action="append", default=[], help="extra argument for silt up (repeatable)")
    a = ap.parse_args()
    Silt.extra = a.silt_arg
    for b in (SILT, DIRECT, VGW):
        if not os.path.exists(b):
            sys.exit(f"missing {b}: run scripts/install-deps.sh and cargo build --release -p silt --bin silt --example direct_read")
    n_large, large_size = (2, 256 << 20) if a.quick else (4, 1 << 30)
    n_small = 2000 if a.quick else 20000

    work = tempfile.mkdtemp(prefix="silt-bench-")
    procs = []
    try:
        bucket = os.path.join(work, "s3", "bench")
        rng = random.Random(7)
        large = [f"large/obj{i}.bin" for i in range(n_large)]
        os.makedirs(os.path.join(bucket, "large"))
        for k in large:
            with open(os.path.join(bucket, k), "wb") as f:
                for _ in range(large_size // (64 << 20)):
                    f.write(rng.randbytes(64 << 20))
        small = []
        for i in range(n_small):
            k = f"small/d{i % 100:03}/img{i:06}.jpg"
            os.makedirs(os.path.dirname(os.path.join(bucket, k)), exist_ok=True)
            size = max(4096, int(rng.lognormvariate(11.5, 0.45)))  # median ~99 KB, mean ~110 KB
            with open(os.path.join(bucket, k), "wb") as f:
                f.write(rng.randbytes(size))
            small.append(k)
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        vgw = subprocess.Popen([VGW, "--access", KEY, "--secret", SECRET, "--port", f"127.0.0.1:{port}", "posix", os.path.join(work, "s3")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(vgw)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close(); break
            except OSError:
                time.sleep(0.05)

        res = {k: [] for k in ["b1_local_1", "b1_local_4", "b1_direct_single", "b1_direct_parallel",
                               "b1_cold_1", "b1_cold_4", "b1_warm_1", "b1_warm_4", "b1_hot_1",
                               "b2_local", "b2_direct", "b2_cold", "b2_warm"]}
        rss = []
        opens = {}
        gb = lambda b, t: b / t / 1e9
        local_large = [os.path.join(bucket, k) for k in large]
        local_small = [os.path.join(bucket, k) for k in small]
        for rep in range(a.reps):
            order = small[:]; random.Random(rep).shuffle(order)
            # Baselines: the local page cache (read once to warm it), then direct from the store.
            timed_read(local_large, 4); timed_read(local_small, 8)
            res["b1_local_1"].append(gb(*timed_read(local_large, 1)))
            res["b1_local_4"].append(gb(*timed_read(local_large, 4)))
            res["b2_local"].append(n_small / timed_read([os.path.join(bucket, k) for k in order], 8)[1])
            res["b1_direct_single"].append(gb(*direct(endpoint, ["large", "1", str(large_size)] + large[:1])))
            res["b1_direct_parallel"].append(gb(*direct(endpoint, ["large", "8", "8MiB"] + large)))
            res["b2_direct"].append(n_small / direct(endpoint, ["small", "8"] + order)[1])

            # Cold: a fresh state dir, nothing cached. First one reader, then (fresh again) four.
            for readers, key in ((1, "b1_cold_1"), (4, "b1_cold_4")):
                state = os.path.join(work, f"state-cold-{rep}-{readers}")
                s = Silt(work, state, endpoint)
                res[key].append(gb(*timed_read([s.path(k) for k in large], readers)))
                if readers == 4:
                    res["b2_cold"].append(n_small / timed_read([s.path(k) for k in order], 8)[1])
                rss.append(s.report()["peak_rss_bytes"]); s.stop()
                if readers == 1:
                    shutil.rmtree(state)
            # Warm: restart on the same state (disk tier warm, new mount so the kernel's FUSE
            # page cache is cold); then hot: read again.
            s = Silt(work, state, endpoint)
            res["b1_warm_1"].append(gb(*timed_read([s.path(k) for k in large], 1)))
            res["b1_hot_1"].append(gb(*timed_read([s.path(k) for k in large], 1)))
            s.stop()
            s = Silt(work, state, endpoint)
            res["b1_warm_4"].append(gb(*timed_read([s.path(k) for k in large], 4)))
            res["b2_warm"].append(n_small / timed_read([s.path(k) for k in order], 8)[1])
            r = s.report(); rss.append(r["peak_rss_bytes"]); opens = r["passthrough"] | {"opens": {k: r["opens"][k] for k in ("passthrough", "daemon")}}
            s.stop()
            shutil.rmtree(state)
            print(f"rep {rep + 1}/{a.reps} done", file=sys.stderr)

        S = {k: summary(v) for k, v in res.items()}
        m = lambda k: S[k]["median"]
        ratios = {
            "b1_warm_1 / local_1": m("b1_warm_1") / m("b1_local_1"),
            "b1_warm_4 / local_4": m("b1_warm_4") / m("b1_local_4"),
            "b1_hot_1 / local_1": m("b1_hot_1") / m("b1_local_1"),
            "b1_cold_4 / direct_parallel": m("b1_cold_4") / m("b1_direct_parallel"),
            "b1_cold_1 / direct_single": m("b1_cold_1") / m("b1_direct_single"),
            "b2_cold / direct": m("b2_cold") / m("b2_direct"),
            "b2_warm / local": m("b2_warm") / m("b2_local"),
        }
        out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{platform.node()} {os.cpu_count()} cores",
               "kernel": platform.release(), "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
               "profile": "unshaped loopback versitygw", "silt_args": a.silt_arg, "large": f"{n_large} x {large_size >> 20} MiB", "small": n_small,
               "reps": a.reps, "results": S, "ratios": ratios, "peak_rss_bytes": max(rss), "passthrough": opens}
        unit = lambda k: "files/s" if k.startswith("b2") else "GB/s"
        for k, v in S.items():
            print(f"{k:22} median {v['median']:10.2f} {unit(k):8} (min {v['min']:.2f}, max {v['max']:.2f})")
        for k, v in ratios.items():
            print(f"{k:30} {v:6.2f}")
        print(f"peak RSS of the mount process: {max(rss) / 2**20:.0f} MiB; passthrough: {opens}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM); p.wait()
        for mp in [os.path.join(work, "mnt")]:
            if os.path.ismount(mp):
                subprocess.run(["fusermount3", "-uz", mp])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
