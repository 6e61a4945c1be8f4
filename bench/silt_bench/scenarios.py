"""Scenarios B1-B6 of shared/brief/benchmarks.md, B3P (open+stat latency per metadata sync
policy over B3's tree) and G (the S3 gateway, issue 19 §3). Each runs Silt and its baselines interleaved, repetition by repetition,
and records runs into a `Ctx`:

- `ctx.add(figure, value, unit)` one run of a figure (medians and min-max come later),
- `ctx.counter(name, value)` a measured count that is not a speed (requests per walk, RSS),
- `ctx.note(scenario, text)` what ran, with what, and what did not (e.g. "not yet supported").

Ratios are computed from the medians at the end (`ratios(ctx)`).

B5 and B6's rebalance need features that later issues bring. They are detected, not assumed:
- B5's mount part runs when `silt up --help` offers `--write-type` (issue 6): the shuffle is
  written through the mount with `--write-type cache-only` and compared with the same on a
  tmpfs; its client-library part and the upload comparison run `silt-bench shuffle`.
- B3P runs when `silt up --help` offers `--sync-policy` (issue 5).
- G runs when `silt up --help` offers `--gateway` (issue 19).
- B6 rebalance runs when `silt ring simulate --help` exists (issue 4). The contract:
  `silt ring simulate --workers 4 --join 1 --pages N --json` prints `{"moved_fraction": F}`.
"""
import hashlib
import json
import math
import os
import random
import secrets
import shutil
import statistics
import subprocess
import time

from . import generators, mech, sdk, stats, train

SCENARIOS = ("B1", "B1F", "B2", "B3", "B3P", "B4", "B5", "B6", "B7", "G", "SDK")
UFS_REQUESTS = "silt_ufs_requests_total"
META_SWEEPS = "silt_meta_sweeps_total"
UFS_READ_BYTES = "silt_ufs_read_bytes_total"


class Ctx:
    def __init__(self, store, work, reps=3, quick=False, seed=7, compare=None, silt_extra=(), b6_files=None,
                 cluster=0, cluster_tls=False):
        self.store, self.work, self.reps, self.quick, self.seed = store, work, reps, quick, seed
        self.compare = compare  # root of another mount over the same bucket layout, or None
        self.cluster = cluster  # --cluster N: B1 and B2 also through N workers and a client mount
        self.cluster_tls = cluster_tls  # --cluster-tls: B1 through them over TCP, without and with TLS
        self.silt_extra = list(silt_extra)
        self.b6_files = b6_files or ([1000] if quick else [10_000, 100_000])
        self.manifests = {}
        self.results, self.units, self.counters, self.notes = {}, {}, {}, {}

    def add(self, figure, value, unit):
        self.results.setdefault(figure, []).append(value)
        self.units[figure] = unit

    def counter(self, name, value):
        self.counters.setdefault(name, []).append(value)

    def note(self, scenario, text):
        self.notes.setdefault(scenario, []).append(text)

    def silt(self, state, **kw):
        kw.setdefault("extra", self.silt_extra)
        return mech.Silt(self.work, os.path.join(self.work, state), self.store, **kw)

    def silt_cluster(self, state, extra=()):
        return mech.Cluster(self.work, os.path.join(self.work, state), self.store, self.cluster,
                            extra=[*self.silt_extra, *extra])

    def fresh_state(self, name):
        path = os.path.join(self.work, name)
        shutil.rmtree(path, ignore_errors=True)
        return name

    def peer(self, rel):
        return os.path.join(self.compare, rel)


# ---------------------------------------------------------------- data

# --b1-files N: fewer (or more) B1 files of the same size, e.g. where the disk is short.
B1_FILES = None


def sizes(quick):
    """(large count, large size, small files, tree depth) for a full or quick run."""
    n_large, large_size, n_small, depth = (2, 64 << 20, 500, 3) if quick else (4, 1 << 30, 20_000, 4)
    return (B1_FILES or n_large), large_size, n_small, depth


def generate(ctx, wanted):
    n_large, large_size, n_small, depth = sizes(ctx.quick)
    root = ctx.store.local_dir
    if {"B1", "B1F", "B6", "G"} & wanted:
        ctx.manifests["large"] = generators.large(root, count=n_large, size=large_size, seed=ctx.seed)
    if {"B2", "B4", "G", "SDK"} & wanted:
        ctx.manifests["small"] = generators.imagenet_like(root, files=n_small, dirs=100, seed=ctx.seed)
    if "SDK" in wanted:
        sdk.generate(ctx)
    if {"B3", "B3P", "G"} & wanted:
        ctx.manifests["tree"] = generators.tree(root, depth=depth, fanout=10, seed=ctx.seed)
    if "B6" in wanted:
        for n in ctx.b6_files:
            ctx.manifests[f"b6-{n}"] = generators.many_small(root, files=n, prefix=f"b6/n{n}", seed=ctx.seed)


def check_compare_mount(ctx, sample=50):
    """The compare mount must hold the same bytes: every generated path with its size, and the
    digest of a sample of files. Raises ValueError naming the first difference."""
    for name, manifest in ctx.manifests.items():
        if name.startswith("b6-"):
            continue
        for rel, size, _ in manifest:
            p = ctx.peer(rel)
            if not os.path.exists(p):
                raise ValueError(f"--compare-mount: {p} is missing (the mount must show the bench bucket's layout)")
            if os.path.getsize(p) != size:
                raise ValueError(f"--compare-mount: {p} has {os.path.getsize(p)} bytes, expected {size}")
        for rel, _, digest in random.Random(0).sample(manifest, min(sample, len(manifest))):
            with open(ctx.peer(rel), "rb") as f:
                h = hashlib.blake2b(digest_size=16)
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            if h.hexdigest() != digest:
                raise ValueError(f"--compare-mount: {ctx.peer(rel)} differs from the generated data")


# ---------------------------------------------------------------- B1 and B2

def _gb(nbytes_secs):
    b, t = nbytes_secs
    return b / t / 1e9


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def silt_option(args, flag, default):
    """The value `args` (silt command-line arguments) give `flag`, as `--flag V` or
    `--flag=V` (the last one counts), else `default`."""
    value = default
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def _children_cpu():
    """CPU seconds of this process's waited-for children (the direct reader runs as one)."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def b1_b2(ctx, want):
    """B1 (large files: cold, warm, hot; 1 and 4 readers) and B2 (small files, 8 threads, cold and
    warm) share Silt instances, so they run together; `want` says which are reported."""
    b1, b2 = "B1" in want, "B2" in want
    large = [p for p, _, _ in ctx.manifests.get("large", [])] if b1 else []
    small = [p for p, _, _ in ctx.manifests.get("small", [])] if b2 else []
    local = ctx.store.local
    for rep in range(ctx.reps):
        order = small[:]
        random.Random(rep).shuffle(order)
        # Local: the same files from the store's directory, page cache warm (read once first),
        # and for B1 also from the disk with the file's pages dropped.
        if b1:
            mech.timed_read([local(k) for k in large], 4)
            ctx.add("b1_local_1", _gb(mech.timed_read([local(k) for k in large], 1)), "GB/s")
            ctx.add("b1_local_4", _gb(mech.timed_read([local(k) for k in large], 4)), "GB/s")
            for k in large:
                mech.evict_file(local(k))
            ctx.add("b1_local_disk_1", _gb(mech.timed_read([local(k) for k in large], 1)), "GB/s")
        if b2:
            mech.timed_read([local(k) for k in small], 8)
            ctx.add("b2_local", len(order) / mech.timed_read([local(k) for k in order], 8)[1], "files/s")
        # Direct: the same objects from the store, no cache, same concurrency.
        if b1:
            size = os.path.getsize(local(large[0]))
            ctx.add("b1_direct_single", _gb(mech.direct(ctx.store, ["large", "1", str(size), large[0]])), "GB/s")
            cpu = _children_cpu()
            got = mech.direct(ctx.store, ["large", "8", "8MiB"] + large)
            ctx.add("b1_direct_parallel", _gb(got), "GB/s")
            ctx.add("b1_direct_parallel_cpu_per_gb", (_children_cpu() - cpu) / (got[0] / 1e9), "s/GB")
        if b2:
            ctx.add("b2_direct", len(order) / mech.direct(ctx.store, ["small", "8"] + order)[1], "files/s")
        if ctx.compare:
            _peer_reads(ctx, rep, large, order)
        if ctx.cluster:
            _cluster_reads(ctx, large, order)
        if ctx.cluster_tls and b1:
            # Plaintext and TLS over TCP, in alternating order from one repetition to the next.
            for variant in (("tcp", "tls") if rep % 2 == 0 else ("tls", "tcp")):
                _cluster_reads(ctx, large, [], variant)

        # Silt cold: a fresh state dir. One reader, then (fresh again) four readers and B2.
        if b1:
            with ctx.silt(ctx.fresh_state("b1-cold-1")) as s:
                # As timed_read(paths, 1), with the daemon's CPU also taken after the first
                # file: a fresh daemon's first GiB or so lands in new memory (its memory tier
                # filling; first touches are dear on a VM that hands freed memory back), the
                # files after it in page buffers the full tier gives back.
                os.sync()
                t = time.perf_counter()
                cpu = _cpu_seconds(s.p.pid)
                first = mech.read_file(s.path(large[0]))
                cpu_first = _cpu_seconds(s.p.pid)
                rest = sum(mech.read_file(s.path(k)) for k in large[1:])
                got = (first + rest, time.perf_counter() - t)
                cpu_end = _cpu_seconds(s.p.pid)
                ctx.add("b1_cold_1", _gb(got), "GB/s")
                ctx.add("b1_cold_1_cpu_per_gb", (cpu_end - cpu) / (got[0] / 1e9), "s/GB")
                if rest and first >= mech.parse_size(s.memory):
                    ctx.add("b1_cold_1_tier_full_cpu_per_gb", (cpu_end - cpu_first) / (rest / 1e9), "s/GB")
            # Removed at once: its 4 GiB of pages would otherwise sit in the page cache beside
            # the state measured warm below and push that out of memory.
            shutil.rmtree(os.path.join(ctx.work, "b1-cold-1"), ignore_errors=True)
        state = ctx.fresh_state("b12-cold")
        with ctx.silt(state) as s:
            if b1:
                cpu = _cpu_seconds(s.p.pid)
                nbytes, secs = mech.timed_read([s.path(k) for k in large], 4)
                ctx.add("b1_cold_4", nbytes / secs / 1e9, "GB/s")
                ctx.add("b1_cold_4_cpu_per_gb", (_cpu_seconds(s.p.pid) - cpu) / (nbytes / 1e9), "s/GB")
            if b2:
                ctx.add("b2_cold", len(order) / mech.timed_read([s.path(k) for k in order], 8)[1], "files/s")
            ctx.counter("peak RSS of the mount after cold B1+B2 (MiB)", s.report()["peak_rss_bytes"] / 2**20)
        # Silt warm: restart on that state (disk tier warm; new mount, so the kernel's cache of
        # the mount is cold). Then hot: the same files again in the same mount.
        if b1:
            with ctx.silt(state) as s:
                # Counter for the warm-read investigation: how much of the disk tier's files the
                # kernel still holds in its page cache when the warm read starts.
                res = mech.resident_fraction(s.data_files())
                if res is not None:
                    ctx.counter("b1_warm_1 disk-tier bytes resident in page cache", res)
                req = s.metric(UFS_REQUESTS)
                ctx.add("b1_warm_1", _gb(mech.timed_read([s.path(k) for k in large], 1)), "GB/s")
                ctx.counter("b1_warm_1 store requests", s.metric(UFS_REQUESTS) - req)
                ctx.add("b1_hot_1", _gb(mech.timed_read([s.path(k) for k in large], 1)), "GB/s")
            # The same after the disk tier's files were read once, as the local baseline's
            # files are: both sides then read from the page cache, which this machine's
            # proactive reclaim (DAMON pageout of pages idle ~1 min) may have emptied of the
            # disk tier meanwhile. Once after a clean restart, once after SIGKILL.
            with ctx.silt(state) as s:
                mech.timed_read(s.data_files(), 4)
                ctx.add("b1_warm_resident_1", _gb(mech.timed_read([s.path(k) for k in large], 1)), "GB/s")
                s.crash()
            with ctx.silt(state) as s:
                mech.timed_read(s.data_files(), 4)
                ctx.add("b1_warm_crash_1", _gb(mech.timed_read([s.path(k) for k in large], 1)), "GB/s")
                ctx.counter("b1_warm_crash_1 store requests", s.metric(UFS_REQUESTS))
        with ctx.silt(state) as s:
            if b1:
                ctx.add("b1_warm_4", _gb(mech.timed_read([s.path(k) for k in large], 4)), "GB/s")
            if b2:
                req = s.metric(UFS_REQUESTS)
                ctx.add("b2_warm", len(order) / mech.timed_read([s.path(k) for k in order], 8)[1], "files/s")
                r = s.report()
                ctx.counter("b2_warm store requests", r["metrics"][UFS_REQUESTS] - req)
                ctx.counter("b2_warm passthrough opens / all opens",
                            r["opens"]["passthrough"] / max(1, r["opens"]["passthrough"] + r["opens"]["daemon"]))
        if b2:
            with ctx.silt(state) as s:
                _latency_and_open_files(ctx, s, order)
        shutil.rmtree(os.path.join(ctx.work, state), ignore_errors=True)
        print(f"B1/B2 rep {rep + 1}/{ctx.reps} done", flush=True)


# B1F's runs besides the configured one: figure-name suffix -> (option named in the ratios, its
# arguments). Off by default all: the first open past the mount's page cache, that with the disk
# tier written with O_DIRECT too (no user-space copy is made past the store's read and the FUSE
# reply), a cold open fetching the whole file to pass it through (above B1's 1 GiB files), and
# a cold open passing the store's own file through while the cache is filled behind it, with the
# disk tier written through the page cache and with O_DIRECT. The CPU of a variant counts until
# its fills behind the reader have ended; "until cached" is the same bytes over that time.
B1F_VARIANTS = {
    "": (None, []),
    "_direct_io": ("fuse_cold_direct_io", ["--fuse-cold-direct-io", "true"]),
    "_direct_both": ("fuse_cold_direct_io + disk_direct_io",
                     ["--fuse-cold-direct-io", "true", "--disk-direct-io", "true"]),
    "_open_fill": ("fuse_open_fill_max", ["--fuse-open-fill-max", "2GiB"]),
    "_source": ("fuse_source_passthrough", ["--fuse-source-passthrough", "true"]),
    "_source_direct": ("fuse_source_passthrough + disk_direct_io",
                       ["--fuse-source-passthrough", "true", "--disk-direct-io", "true"]),
}


def b1f(ctx):
    """B1F, the NFS-like case: B1's large files from a `file://` store (the bucket's directory,
    its bytes in the page cache), read cold through Silt (a fresh state each, 1 and 4 readers)
    and directly from the source files (1 and 4 readers), with the CPU seconds each spends
    per GB: the daemon's from /proc, the direct reader's (this process) from getrusage."""
    import resource
    large = ctx.manifests["large"]
    local = ctx.store.local
    nbytes = sum(size for _, size, _ in large)
    mounts = {"/f": f"file://{ctx.store.local_dir}"}

    def own_cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    for rep in range(ctx.reps):
        mech.timed_read([local(k) for k, _, _ in large], 4)  # the source in the page cache
        for n in (1, 4):
            cpu = own_cpu()
            ctx.add(f"b1f_direct_{n}", _gb(mech.timed_read([local(k) for k, _, _ in large], n)), "GB/s")
            ctx.add(f"b1f_direct_{n}_cpu_per_gb", (own_cpu() - cpu) / (nbytes / 1e9), "s/GB")
            # As configured, then each B1F_VARIANTS option, side by side.
            for tag, (_, extra) in B1F_VARIANTS.items():
                name = f"b1f_cold{tag}_{n}"
                with ctx.silt(ctx.fresh_state(name), mounts=mounts, extra=[*ctx.silt_extra, *extra]) as s:
                    cpu = _cpu_seconds(s.p.pid)
                    got = mech.timed_read([s.ns("/f/" + k) for k, _, _ in large], n)
                    ctx.add(name, _gb(got), "GB/s")
                    filled = s.wait_fills_behind()
                    ctx.add(f"{name}_cpu_per_gb", (_cpu_seconds(s.p.pid) - cpu) / (got[0] / 1e9), "s/GB")
                    if filled is not None:
                        ctx.add(f"{name}_until_cached", got[0] / (got[1] + filled) / 1e9, "GB/s")
                    # Peak RSS against what the configuration bounds: the memory tier plus the
                    # fetch buffers in flight (buffer_memory: 256 MiB unless --silt-arg sets it).
                    budget = mech.parse_size(s.memory) + mech.parse_size(
                        silt_option(ctx.silt_extra, "--buffer-memory", "256MiB"))
                    ctx.add(f"{name}_peak_rss_of_budget", s.report()["peak_rss_bytes"] / budget, "×")
                shutil.rmtree(os.path.join(ctx.work, name), ignore_errors=True)
        print(f"B1F rep {rep + 1}/{ctx.reps} done", flush=True)


# --cluster-tls variants: every worker link over TCP (the client does not use the workers' Unix
# sockets, which TLS never covers), in the clear or in TLS.
CLUSTER_VARIANTS = {
    None: [],
    "tcp": ["--cluster-unix-socket", "false"],
    "tls": ["--cluster-unix-socket", "false", "--cluster-tls", "true"],
}


def _cluster_reads(ctx, large, order, variant=None):
    """B1 and B2 through a client mount backed by ctx.cluster workers (mech.Cluster), the same
    phases as the single node: cold 1 reader on a fresh cluster; fresh again, cold 4 readers and
    cold B2; then warm: every process restarted on that state (workers' disk tiers warm; the
    client's near cache, every memory tier and the kernel's cache of the mount cold), 1 reader
    and hot; restarted again, 4 readers and warm B2. Figures are named cluster_<single node's>,
    or cluster_<variant>_<single node's> for a CLUSTER_VARIANTS variant."""
    b1, b2 = bool(large), bool(order)
    extra = CLUSTER_VARIANTS[variant]
    tag = f"{variant} " if variant else ""

    def f(single):
        return cluster_figure(single, variant)

    if b1:
        with ctx.silt_cluster(ctx.fresh_state("c-b1-cold-1"), extra) as c:
            ctx.add(f("b1_cold_1"), _gb(mech.timed_read([c.path(k) for k in large], 1)), "GB/s")
        shutil.rmtree(os.path.join(ctx.work, "c-b1-cold-1"), ignore_errors=True)
    state = ctx.fresh_state("c-b12-cold")
    with ctx.silt_cluster(state, extra) as c:
        if b1:
            cpu = sum(_cpu_seconds(pid) for pid in c.pids())
            nbytes, secs = mech.timed_read([c.path(k) for k in large], 4)
            ctx.add(f("b1_cold_4"), nbytes / secs / 1e9, "GB/s")
            ctx.counter(f"cluster {tag}b1_cold_4 CPU s per GB (client + workers)",
                        (sum(_cpu_seconds(pid) for pid in c.pids()) - cpu) / (nbytes / 1e9))
        if b2:
            ctx.add(f("b2_cold"), len(order) / mech.timed_read([c.path(k) for k in order], 8)[1], "files/s")
        _cluster_counters(ctx, c, tag + _phase("cold", b1, b2), {}, {})
    if b1:
        with ctx.silt_cluster(state, extra) as c:
            before, w0 = c.report()["metrics"], c.worker_stats()
            ctx.add(f("b1_warm_1"), _gb(mech.timed_read([c.path(k) for k in large], 1)), "GB/s")
            _cluster_counters(ctx, c, tag + "warm B1 1 reader", before, w0)
            ctx.add(f("b1_hot_1"), _gb(mech.timed_read([c.path(k) for k in large], 1)), "GB/s")
    with ctx.silt_cluster(state, extra) as c:
        before, w0 = c.report()["metrics"], c.worker_stats()
        if b1:
            ctx.add(f("b1_warm_4"), _gb(mech.timed_read([c.path(k) for k in large], 4)), "GB/s")
        if b2:
            ctx.add(f("b2_warm"), len(order) / mech.timed_read([c.path(k) for k in order], 8)[1], "files/s")
        _cluster_counters(ctx, c, tag + _phase("warm", b1, b2), before, w0)
    shutil.rmtree(os.path.join(ctx.work, state), ignore_errors=True)


def _phase(temperature, b1, b2):
    """A cluster phase's name from what it read: "cold B1 4 readers + B2", "warm B2", ..."""
    read = (["B1 4 readers"] if b1 else []) + (["B2"] if b2 else [])
    return f"{temperature} {' + '.join(read)}"


CLUSTER_CLIENT_METRICS = ("silt_remote_reads_total", "silt_remote_fd_reads_total", "silt_failovers_total",
                          UFS_READ_BYTES)


def _cluster_counters(ctx, c, phase, before, workers_before):
    """What the client and each worker did during `phase` (deltas from `before`, the client's
    metrics, and `workers_before`, the workers' entries of an earlier report; empty: since start).
    Per worker (its id in the counter's name): MiB served over RPC (fd-passed reads not counted)
    and MiB read from the store; from the client: reads sent to workers, of which fd-passed, failovers, and MiB
    the client itself read from the store (falling back to it)."""
    r = c.report()
    ctx.counter(f"cluster {phase}: live workers", sum(1 for w in r["cluster"]["workers"] if w.get("live")))
    workers = sorted(r["cluster"]["workers"], key=lambda w: w["id"])
    for key in ("bytes_served", "ufs_read_bytes"):
        for w in workers:
            base = workers_before.get(w["id"], {}).get(key) or 0
            ctx.counter(f"cluster {phase}: worker {w['id']} {key} (MiB)", ((w.get(key) or 0) - base) / 2**20)
    for name in CLUSTER_CLIENT_METRICS:
        v = r["metrics"].get(name, 0) - before.get(name, 0)
        ctx.counter(f"cluster {phase}: client {name}" + (" (MiB)" if name == UFS_READ_BYTES else ""),
                    v / 2**20 if name == UFS_READ_BYTES else v)
    opens = r.get("opens", {})
    if "passthrough" in opens:  # since the client started (it is restarted for each warm phase)
        ctx.counter(f"cluster {phase}: client passthrough opens / all opens",
                    opens["passthrough"] / max(1, opens["passthrough"] + opens.get("daemon", 0)))


def _latency_and_open_files(ctx, s, order, n=1000):
    """p50/p99 of a cached ~110 KB read (open, read whole, keep open) one at a time, and the
    mount's RSS while 1,000 files are open."""
    fds, lat = [], []
    try:
        for k in order[:n]:
            t = time.perf_counter()
            fd = os.open(s.path(k), os.O_RDONLY)
            while os.read(fd, mech.CHUNK):
                pass
            lat.append(time.perf_counter() - t)
            fds.append(fd)
        ctx.add("b2_cached_read_p50_ms", percentile(lat, 0.5) * 1e3, "ms")
        ctx.add("b2_cached_read_p99_ms", percentile(lat, 0.99) * 1e3, "ms")
        ctx.counter(f"RSS of the mount with {len(fds)} files open (MiB)", s.rss() / 2**20)
    finally:
        for fd in fds:
            os.close(fd)


def _peer_reads(ctx, rep, large, order):
    """The same reads on the compare mount, 4 readers for B1 and 8 for B2. Its own cache cannot
    be emptied from outside, so its 'cold' figures come from the first repetition only (the first
    read through it in this run); 'warm' drops the kernel's pages of its files first (its own
    cache stays), 'hot' reads again."""
    peer_large = [ctx.peer(k) for k in large]
    peer_small = [ctx.peer(k) for k in order]
    for phase in (["cold"] if rep == 0 else []) + ["warm", "hot"]:
        if phase == "warm":
            for p in peer_large + peer_small:
                mech.evict_file(p)
        if large:
            ctx.add(f"peer_b1_{phase}_4", _gb(mech.timed_read(peer_large, 4)), "GB/s")
        if order:
            ctx.add(f"peer_b2_{phase}", len(order) / mech.timed_read(peer_small, 8)[1], "files/s")


# ---------------------------------------------------------------- B3 and B3P

B3_MOUNT = "/b3"


def b3_mounts(ctx):
    """B3's tree is a mount of its own (the bucket's tree/ prefix at /b3), so a walk of it lists
    exactly that prefix, as the direct client's one recursive listing does. Walked as /data/tree,
    the first lookup of "tree" would list the mount root, i.e. the whole bucket: every other
    scenario's data too (in a full run over 10^5 objects), which is not B3's prefix."""
    return {B3_MOUNT: f"s3://{ctx.store.bucket}/tree"}


def b3(ctx):
    """find-style walk with lstat of the 10^4-file tree: first pass on a fresh Silt, second pass
    in the same mount; baselines: one recursive listing by the direct client, and the same walk
    on the store's directory (page cache warm). Store requests per walk from
    silt_ufs_requests_total (each page of a listing is one request), and the recursive
    listings (bulk sweeps) Silt ran during each walk."""
    for rep in range(ctx.reps):
        mech.walk(ctx.store.local("tree"))
        ctx.add("b3_local_walk", mech.walk(ctx.store.local("tree"))[1], "s")
        entries, secs = mech.direct(ctx.store, ["list", "tree/"])
        ctx.add("b3_direct_list", secs, "s")
        ctx.counter("b3 direct listing: entries returned (one recursive listing, paginated)", entries)
        if ctx.compare:
            if rep == 0:
                ctx.add("peer_b3_first", mech.walk(ctx.peer("tree"))[1], "s")
            ctx.add("peer_b3_second", mech.walk(ctx.peer("tree"))[1], "s")
        with ctx.silt(ctx.fresh_state("b3"), mounts=b3_mounts(ctx)) as s:
            root = s.ns(B3_MOUNT)
            m0 = s.report()["metrics"]
            n, secs = mech.walk(root)
            ctx.add("b3_first", secs, "s")
            m1 = s.report()["metrics"]
            ctx.add("b3_second", mech.walk(root)[1], "s")
            m2 = s.report()["metrics"]
            ctx.counter("b3 entries walked", n)
            ctx.counter("b3 store requests, first walk", m1[UFS_REQUESTS] - m0[UFS_REQUESTS])
            ctx.counter("b3 store requests, second walk", m2[UFS_REQUESTS] - m1[UFS_REQUESTS])
            if META_SWEEPS in m0:
                ctx.counter("b3 bulk sweeps, first walk", m1[META_SWEEPS] - m0[META_SWEEPS])
                ctx.counter("b3 bulk sweeps, second walk", m2[META_SWEEPS] - m1[META_SWEEPS])
        print(f"B3 rep {rep + 1}/{ctx.reps} done", flush=True)


B3P_POLICIES = ("never", "interval=1h", "always")


def policy_key(policy):
    """A policy as part of a figure name: "interval=1h" -> "interval_1h"."""
    return policy.replace("=", "_")


def silt_has_sync_policy():
    out = subprocess.run([mech.SILT, "up", "--help"], capture_output=True, text=True).stdout
    return "--sync-policy" in out


def percentile(values, q):
    """Nearest-rank percentile (q in 0..1) of a non-empty list: p99 of 500 values is the 495th
    smallest."""
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)]


def b3p_sample(ctx):
    """The files whose open+stat is timed: a fixed random sample of the tree's files (the same
    for every policy and repetition, from the run's seed), relative to the tree's root."""
    files = sorted(rel for rel, _, _ in ctx.manifests["tree"])
    n = min(100 if ctx.quick else 500, len(files))
    return [os.path.relpath(rel, "tree") for rel in random.Random(ctx.seed).sample(files, n)]


def _open_stat_figures(ctx, label, paths, s=None):
    """Times open+fstat+close of every path (mech.open_stat); adds b3p_<label>_p50_ms and
    _p99_ms, and, through Silt `s`, counts store requests per open (silt_ufs_requests_total
    before and after, read over the control socket outside the timed calls). Returns the
    latencies (s)."""
    r0 = s.metric(UFS_REQUESTS) if s else None
    lat = mech.open_stat(paths)
    if s:
        ctx.counter(f"b3p {label}: store requests per open+stat", (s.metric(UFS_REQUESTS) - r0) / len(paths))
    ctx.add(f"b3p_{label}_p50_ms", percentile(lat, 0.5) * 1e3, "ms")
    ctx.add(f"b3p_{label}_p99_ms", percentile(lat, 0.99) * 1e3, "ms")
    return lat


def b3p(ctx):
    """Latency of os.open(O_RDONLY) + os.fstat + os.close, one file at a time, over a fixed
    sample of B3's tree (b3p_sample), per metadata sync policy. For each policy in B3P_POLICIES:
    a fresh Silt with `--sync-policy P` (B3's mount of the tree), one untimed walk of the tree to
    learn its metadata, then the sample timed twice: as the walk left the kernel's caches
    (figures b3p_<policy>_p50_ms/_p99_ms: dentries and attributes cached in the kernel for up to
    the policy's trust, capped by --entry-ttl/--attr-ttl), and again after dropping the kernel's
    dentry and inode caches (b3p_<policy>_dropped_*: every path lookup reaches Silt, which
    answers from its own metadata cache). Under `always` the walk and the drop are skipped:
    nothing is trusted there (kernel TTLs 0, every open, lookup and stat asks the store), so
    neither changes what the opens do, while the walk would ask the store about every entry.
    Then cold: a fresh Silt with the default policy, no walk, the same sample (the first lookups
    load the tree); b3p_cold_first_ms is the first open of the sample. Baseline: the same
    open+stat on the store's directory (b3p_local_*). Store requests per open are counters."""
    if not silt_has_sync_policy():
        ctx.note("B3P", "not yet supported: `silt up` has no --sync-policy (metadata sync policies: issue 5)")
        return
    sample = b3p_sample(ctx)
    ctx.note("B3P", f"os.open(O_RDONLY) + os.fstat + os.close, one at a time, of {len(sample)} files of B3's tree "
                    f"(a fixed sample, seed {ctx.seed}); per policy a fresh Silt, one untimed walk first (not under "
                    f"`always`); *_dropped_*: after dropping the kernel's dentry and inode caches; cold: default "
                    f"policy, no walk first")
    local = [os.path.join(ctx.store.local("tree"), rel) for rel in sample]
    for rep in range(ctx.reps):
        mech.open_stat(local)
        _open_stat_figures(ctx, "local", local)
        for policy in B3P_POLICIES:
            key = policy_key(policy)
            extra = ctx.silt_extra + ["--sync-policy", policy]
            with ctx.silt(ctx.fresh_state("b3p"), mounts=b3_mounts(ctx), extra=extra) as s:
                paths = [s.ns(os.path.join(B3_MOUNT, rel)) for rel in sample]
                if policy != "always":
                    r0 = s.metric(UFS_REQUESTS)
                    mech.walk(s.ns(B3_MOUNT))
                    ctx.counter(f"b3p {key}: store requests of the untimed walk", s.metric(UFS_REQUESTS) - r0)
                _open_stat_figures(ctx, key, paths, s)
                if policy != "always":
                    mech.drop_dentries()
                    _open_stat_figures(ctx, f"{key}_dropped", paths, s)
        with ctx.silt(ctx.fresh_state("b3p"), mounts=b3_mounts(ctx)) as s:
            lat = _open_stat_figures(ctx, "cold", [s.ns(os.path.join(B3_MOUNT, rel)) for rel in sample], s)
            ctx.add("b3p_cold_first_ms", lat[0] * 1e3, "ms")
        shutil.rmtree(os.path.join(ctx.work, "b3p"), ignore_errors=True)
        print(f"B3P rep {rep + 1}/{ctx.reps} done", flush=True)


# ---------------------------------------------------------------- B4

def b4_params(quick):
    return dict(epochs=3, batch_size=64, workers=4, prefetch=2, compute_s=0.02 if quick else 0.05)


def B4_CACHES(data_bytes):
    """(label, disk tier size, eviction policy) of each B4 run: a cache larger than the
    dataset, the curve at 1/4, 1/2, 3/4 of it with the default policy, LRU at 1/2, and the
    default at 1/4, 1/2 and 3/4 with silt.torch's CacheAwareSampler ordering each epoch."""
    every = (("full", str(2 * data_bytes), "tinylfu"),
             ("quarter", str(data_bytes // 4), "tinylfu"),
             ("half", str(data_bytes // 2), "tinylfu"),
             ("threeq", str(data_bytes * 3 // 4), "tinylfu"),
             ("half_lru", str(data_bytes // 2), "lru"),
             ("quarter_sampler", str(data_bytes // 4), "tinylfu"),
             ("half_sampler", str(data_bytes // 2), "tinylfu"),
             ("threeq_sampler", str(data_bytes * 3 // 4), "tinylfu"))
    # SILT_B4_CACHES=half,half_lru runs only those (a shorter run).
    wanted = os.environ.get("SILT_B4_CACHES")
    return tuple(c for c in every if not wanted or c[0] in wanted.split(","))


B4_CURVE = (("quarter", 0.25), ("half", 0.5), ("threeq", 0.75))


def b4_plot(R):
    """A text plot of B4's hit ratio (epochs 2-3) against cache size, one bar per cache."""
    lines = []
    for label, frac in B4_CURVE + (("half_lru", 0.5),):
        keys = [f"b4_{label}_hit_e2", f"b4_{label}_hit_e3"]
        if not all(k in R for k in keys):
            continue
        h = min(statistics.median(R[k]) for k in keys)
        name = f"{frac:.2f} of the data{' (lru)' if label.endswith('lru') else ''}"
        lines.append(f"  {name:<22} {'#' * round(h * 50):<50} {h:.3f} (best possible {frac:.2f})")
    return "\n".join(lines)


def cache_aware_sampler(ctx, s, small, memory, seed):
    """silt.torch.CacheAwareSampler over B4's files, through an SDK client attached to `s`
    (residency and prefetch go to its cache; the loader still reads through the mount), its
    look-ahead half the memory tier. None, with a note, when the SDK does not import (it is
    built into the project's venv by scripts/python-wheel.sh --release)."""
    import glob
    import sys
    for site in glob.glob(os.path.join(mech.ROOT, ".deps/pyvenv/lib/python3*/site-packages")):
        if site not in sys.path:
            sys.path.append(site)
    try:
        import silt
        import silt.torch
    except ImportError as e:
        ctx.note("B4", f"CacheAwareSampler run skipped: the SDK does not import ({e})")
        return None
    store = ctx.store
    fs = silt.SiltFileSystem(skip_instance_cache=True, cache_dir=s.state, mode="attach",
                             s3_endpoint=store.endpoint, s3_access_key_id=store.key,
                             s3_secret_access_key=store.secret)

    class Files:
        def __init__(self):
            self.fs, self.files = fs, ["/data/" + k for k, _, _ in small]

        def __len__(self):
            return len(self.files)

    mean = max(1, generators.total_bytes(small) // len(small))
    lookahead = max(64, memory // 2 // mean)
    ctx.note("B4 sampler", f"CacheAwareSampler look-ahead {lookahead} samples "
                           f"({lookahead * mean / 2**20:.0f} MiB of a {memory / 2**20:.0f} MiB memory tier)")
    return silt.torch.CacheAwareSampler(Files(), seed=seed, lookahead=lookahead)


def b4(ctx):
    """Training loop over B2's files, 3 epochs: synthetic (no I/O), Silt with a cache larger than
    the dataset, Silt with a cache of half the dataset. The kernel's caches are dropped before
    every epoch, as on a node whose memory cannot hold the dataset, so every epoch reads through
    Silt and the hit ratio is Silt's own: 1 - (bytes fetched from the store / bytes read)."""
    small = ctx.manifests["small"]
    data_bytes = generators.total_bytes(small)
    p = b4_params(ctx.quick)
    ctx.note("B4", f"loader: {train.LOADER}; batch {p['batch_size']}, {p['workers']} workers, "
                   f"{p['compute_s'] * 1e3:.0f} ms simulated compute per batch, {p['epochs']} epochs; "
                   f"dataset {len(small)} files, {data_bytes / 1e9:.2f} GB")
    # An even number of repetitions, half of them running the caches the other way round: a
    # cache run later in a repetition ran 4-8 % slower than the same run earlier (the random
    # order in both, measured: issue 42's fifth pass), so a pair compared in one order only
    # carried that bias (a single repetition, `--quick`'s default, always did).
    reps = ctx.reps + ctx.reps % 2
    ctx.note("B4", f"{reps} repetitions, every other one running the caches in reverse order")
    for rep in range(reps):
        syn = train.run([(None, s) for _, s, _ in small], seed=rep, synthetic=True, **p)
        ctx.add("b4_synthetic", statistics.median(e["samples_per_s"] for e in syn), "samples/s")
        # The memory tier (a copy of hot disk-tier pages) is kept well under either cache size.
        memory = str(min(64 << 20, data_bytes // 8))
        caches = B4_CACHES(data_bytes)
        for label, disk, policy in caches if rep % 2 == 0 else caches[::-1]:
            extra = [*ctx.silt_extra, "--eviction-policy", policy]
            with ctx.silt(ctx.fresh_state(f"b4-{label}"), memory=memory, disk=disk, extra=extra) as s:
                items = [(s.path(k), size) for k, size, _ in small]
                before = {}

                def drop(e):
                    mech.drop_caches()
                    r = s.report()
                    before[e] = (r["metrics"][UFS_READ_BYTES], r["opens"])

                def hits(e):
                    r = s.report()
                    fetched = r["metrics"][UFS_READ_BYTES] - before[e][0]
                    ctx.add(f"b4_{label}_hit_e{e + 1}", max(0.0, 1 - fetched / data_bytes), "ratio")
                    # How the hits were served: files opened in passthrough (read by the kernel
                    # from a cache file) or through the daemon.
                    opened = {k: r["opens"].get(k, 0) - before[e][1].get(k, 0) for k in ("passthrough", "daemon")}
                    ctx.counter(f"b4 {label} e{e + 1} passthrough opens / all opens",
                                opened["passthrough"] / max(1, sum(opened.values())))

                sampler = None
                if label.endswith("sampler"):
                    sampler = cache_aware_sampler(ctx, s, small, int(memory), seed=rep)
                    if sampler is None:
                        continue
                epochs = train.run(items, seed=rep, before_epoch=drop, after_epoch=hits,
                                   sampler=sampler, **p)
                for e, r in enumerate(epochs):
                    ctx.add(f"b4_{label}_e{e + 1}", r["samples_per_s"], "samples/s")
        print(f"B4 rep {rep + 1}/{reps} done", flush=True)
    plot = b4_plot(ctx.results)
    print("B4 hit ratio by cache size, epochs 2-3:\n" + plot, flush=True)
    ctx.note("B4 curve", "hit ratio by cache size, epochs 2-3:\n" + plot)


# ---------------------------------------------------------------- B5

def silt_supports_writes():
    out = subprocess.run([mech.SILT, "up", "--help"], capture_output=True, text=True).stdout
    return "--write-type" in out


def b5_params(quick):
    """The shuffle's shape, the memory budget and the upload comparison's files. Full: 32
    writers x 64 partitions x 1 MiB = 2 GiB written with 1 GiB of write memory (half of it
    spills), read by 32 readers; quick: 8 x 16 x 1 MiB = 128 MiB with 64 MiB. Uploads: 16 x
    16 MiB (quick 8 x 8 MiB), 8 at a time (Silt uploads `back` files 8 at a time): kept small
    because the project's VM has ~1.6 GB of free disk, which the store, the write-ahead log and
    the disk tier share."""
    if quick:
        return dict(writers=8, partitions=16, part_size=1 << 20, readers=8, write_memory=64 << 20,
                    read_cache=64 << 20, files=8, file_size=8 << 20, concurrency=8)
    return dict(writers=32, partitions=64, part_size=1 << 20, readers=32, write_memory=1 << 30,
                read_cache=256 << 20, files=16, file_size=16 << 20, concurrency=8)


def shuffle_args(p):
    return ["--writers", str(p["writers"]), "--partitions", str(p["partitions"]),
            "--part-size", str(p["part_size"]), "--readers", str(p["readers"])]


def upload_args(p):
    return ["--files", str(p["files"]), "--file-size", str(p["file_size"]),
            "--concurrency", str(p["concurrency"])]


def shuffle_tool(store, args):
    """Runs `silt-bench shuffle ARGS` (crates/silt-bench/src/shuffle.rs) with the store's
    endpoint and keys; its JSON. Raises RuntimeError with the tool's last error line."""
    os.sync()  # earlier phases' write-back does not land inside this measurement
    r = subprocess.run([mech.SILT_BENCH, "shuffle", *args], capture_output=True, text=True,
                       env=store.env() if store and store.endpoint else None)
    if r.returncode != 0:
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        raise RuntimeError(lines[-1] if lines else f"silt-bench shuffle exited {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def shuffle_gbps(r):
    """A shuffle's GB/s: every byte written and read back, over write + read time."""
    return 2 * r["bytes"] / (r["write_s"] + r["read_s"]) / 1e9


def _tmpfs_shuffle(p, root):
    size = p["writers"] * p["partitions"] * p["part_size"] * 2
    os.makedirs(root, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", root], check=True)
    try:
        return shuffle_tool(None, ["--mode", "dir", "--dir", os.path.join(root, "s"), *shuffle_args(p)])
    finally:
        subprocess.run(["umount", root], check=False)


def b5(ctx):
    """B5, the shuffle (32 writers x 64 partitions x 1 MiB, then 32 readers reading partition
    columns, every byte checked), timed by `silt-bench shuffle` (the same Rust code for all):
    - tmpfs: plain file I/O on a fresh tmpfs, a thread per writer and reader (b5_tmpfs);
    - mount: the same I/O through `silt up --write-type cache-only --write-memory BUDGET
      --memory-capacity READ_CACHE` (b5_mount);
    - client: the same shuffle in-process through silt_client, set up as `silt up` sets up its
      client with the same options (b5_client);
    GB/s = 2 x bytes / (write + read seconds). Memory: peak RSS (VmHWM) of `silt up`, and of the
    client's process, / (write memory + memory tier), and the write arena's own peak / write
    memory. Then the write-throughput comparison on the run's store, files of one size, 8 at a
    time: direct multipart uploads (UnderStore::write_from, 8 MiB parts: b5_direct_upload),
    `through` writes through silt_client (done when every close returned: b5_through), `back`
    writes (acknowledged when every close returned: b5_back_ack; done when `persist` of the
    directory returned: b5_back). Their order rotates per repetition."""
    p = b5_params(ctx.quick)
    budget = p["write_memory"] + p["read_cache"]
    ctx.note("B5", f"shuffle {p['writers']} writers x {p['partitions']} partitions x {p['part_size'] >> 20} MiB = "
                   f"{p['writers'] * p['partitions'] * p['part_size'] / 2**30:.2f} GiB, {p['readers']} readers "
                   f"reading partition columns, every byte checked; GB/s = 2 x bytes / (write s + read s). "
                   f"Memory budget = write memory {p['write_memory'] >> 20} MiB (files being written and "
                   f"cache-only files; past it they spill to the disk tier) + memory tier {p['read_cache'] >> 20} "
                   f"MiB (the read cache); fetch buffers (--buffer-memory) are not counted: cache-only reads "
                   f"never fetch from the store. Uploads: {p['files']} x {p['file_size'] >> 20} MiB, "
                   f"{p['concurrency']} at a time, to the run's store")
    mount_ok = silt_supports_writes()
    if not mount_ok:
        ctx.note("B5", "mount: not yet supported: `silt up` has no --write-type (writes arrive with issue 6)")
    store_uri = f"s3://{ctx.store.bucket}/b5"
    os.makedirs(ctx.store.local_dir, exist_ok=True)  # the bucket (versitygw's posix backend), if no data made it
    for rep in range(ctx.reps):
        r = _tmpfs_shuffle(p, os.path.join(ctx.work, "tmpfs"))
        ctx.add("b5_tmpfs", shuffle_gbps(r), "GB/s")
        ctx.counter("b5 tmpfs: write GB/s", r["write_gbps"])
        ctx.counter("b5 tmpfs: read GB/s", r["read_gbps"])
        if mount_ok:
            mount_ok = _b5_mount(ctx, p, rep, budget)
        state = os.path.join(ctx.work, ctx.fresh_state("b5-client"))
        common = ["--store", store_uri, "--state-dir", state, "--write-memory", str(p["write_memory"]),
                  "--memory-capacity", str(p["read_cache"])]
        r = shuffle_tool(ctx.store, ["--mode", "client", "--write-type", "cache-only", "--prefix", f"shuffle-{rep}",
                                     *common, *shuffle_args(p)])
        shutil.rmtree(state, ignore_errors=True)
        ctx.add("b5_client", shuffle_gbps(r), "GB/s")
        ctx.add("b5_client_peak_rss_over_budget", r["peak_rss"] / budget, "ratio")
        ctx.counter("b5 client: write memory peak / write memory", r["memory_peak"] / p["write_memory"])
        ctx.counter("b5 client: spilled (MiB)", r["spilled"] / 2**20)
        ctx.counter("b5 client: read cache used at the end (MiB)", (r.get("read_cache_used") or 0) / 2**20)
        ctx.counter("b5 client: store requests", r["store_requests"])
        ctx.counter("b5 client: write GB/s", r["write_gbps"])
        ctx.counter("b5 client: read GB/s", r["read_gbps"])
        _phase_counters(ctx, "client", r)
        runs = {"direct": ["--mode", "direct", "--store", store_uri],
                "through": ["--mode", "client", "--write-type", "through"] + common,
                "back": ["--mode", "client", "--write-type", "back"] + common}
        order = list(runs)
        for name in order[rep % 3:] + order[:rep % 3]:
            r = shuffle_tool(ctx.store, runs[name] + ["--prefix", f"up-{name}-{rep}", *upload_args(p)])
            shutil.rmtree(state, ignore_errors=True)
            ctx.add("b5_direct_upload" if name == "direct" else f"b5_{name}", r["gbps"], "GB/s")
            ctx.counter(f"b5 {name}: store requests", r["store_requests"])
            _phase_counters(ctx, name, r)
            if name == "back":
                ctx.add("b5_back_ack", r["ack_gbps"], "GB/s")
                # A failed attempt waits 1 s, 2 s, ... before its retry: it shows in b5_back.
                ctx.counter("b5 back: failed upload attempts", r.get("persist_failures", 0))
        print(f"B5 rep {rep + 1}/{ctx.reps} done", flush=True)


def _phase_counters(ctx, name, r):
    """Where a client run's writers spent their time: seconds in create (with mkdir),
    write_at and commit, summed over the writer tasks."""
    for phase, secs in (r.get("write_phases") or {}).items():
        ctx.counter(f"b5 {name}: task-seconds in {phase}", secs)


def _b5_mount(ctx, p, rep, budget):
    """One shuffle through the mount; False (with a note) if the mount could not run it."""
    extra = ctx.silt_extra + ["--write-type", "cache-only", "--write-memory", str(p["write_memory"])]
    with ctx.silt(ctx.fresh_state("b5"), memory=str(p["read_cache"]), extra=extra) as s:
        req = s.metric(UFS_REQUESTS)
        try:
            r = shuffle_tool(None, ["--mode", "dir", "--dir", s.path(f"b5-shuffle-{rep}"), *shuffle_args(p)])
        except RuntimeError as e:
            ctx.note("B5", f"mount: the shuffle failed through the mount, not measured: {e}")
            r = None
        if r:
            rep_ = s.report()
    shutil.rmtree(os.path.join(ctx.work, "b5"), ignore_errors=True)
    if not r:
        return False
    ctx.counter("b5 mount: store requests", rep_["metrics"][UFS_REQUESTS] - req)
    ctx.add("b5_mount", shuffle_gbps(r), "GB/s")
    ctx.add("b5_mount_peak_rss_over_budget", rep_["peak_rss_bytes"] / budget, "ratio")
    w = rep_.get("memory", {}).get("write", {})
    if w:
        ctx.counter("b5 mount: write memory peak / write memory", w["peak"] / p["write_memory"])
        ctx.counter("b5 mount: spilled at the end (MiB)", w["spilled"] / 2**20)
    cache = rep_.get("memory", {}).get("cache", {})
    if "used" in cache:
        ctx.counter("b5 mount: read cache used at the end (MiB)", cache["used"] / 2**20)
    ctx.counter("b5 mount: write GB/s", r["write_gbps"])
    ctx.counter("b5 mount: read GB/s", r["read_gbps"])
    return True


# ---------------------------------------------------------------- B6

def silt_has_ring():
    return subprocess.run([mech.SILT, "ring", "simulate", "--help"], capture_output=True).returncode == 0


def b6(ctx):
    """Worker memory per cached file and per cached GiB, on one worker with the memory tier off
    so that only bookkeeping counts. One instance; the smallest file set is loaded first as a
    warm-up (runtime, connection pool and allocator reach their working size on small requests,
    without the large fetch buffers a big object needs, whose release moves RSS by tens of MiB),
    then each larger set: RSS growth across its load / its file count. Last, one large object:
    RSS growth / GiB. Measured once (not per repetition)."""
    sets = sorted(ctx.b6_files)
    warm, measured = (sets[:1], sets[1:]) if len(sets) > 1 else ([], sets)
    ctx.note("B6", "RSS growth of `silt up` (memory tier off) across `silt load` of N files, / N"
                   + (f", after a warm-up load of the {warm[0]}-file set" if warm else ", no warm-up"))
    large = ctx.manifests["large"]
    with ctx.silt(ctx.fresh_state("b6"), memory="0") as s:
        for n in warm:
            s.load(f"b6/n{n}")
        for n in measured:
            before = s.rss()
            s.load(f"b6/n{n}")
            ctx.add(f"b6_bytes_per_file_{n}", (s.rss() - before) / n, "bytes")
        before = s.rss()
        s.load(large[-1][0])
        ctx.add("b6_bytes_per_cached_gib", (s.rss() - before) / (large[-1][1] / 2**30), "bytes")
    if silt_has_ring():
        out = subprocess.check_output([mech.SILT, "ring", "simulate", "--workers", "4", "--join", "1",
                                       "--pages", "1000000", "--json"], text=True)
        ctx.add("b6_moved_fraction", json.loads(out)["moved_fraction"], "ratio")
    else:
        ctx.note("B6", "rebalance: not yet supported: no `silt ring` (the worker ring arrives with issue 4)")


# ---------------------------------------------------------------- B7

def b7_sizes(quick):
    """(directories, files per directory) of each B7 walk: 10^5 entries quick, 10^6 and 10^7
    full (issue 44 asks for 10^7 and 10^8; 10^8 needs the bounded metadata it asks for)."""
    return [(100, 1000)] if quick else [(1000, 1000), (10_000, 1000)]


def b7(ctx):
    """A client's metadata at scale (issue 44): `silt-bench meta` (crates/silt-bench/src/meta.rs)
    builds the single-node client `silt up` builds over a synthetic store (names, sizes, times
    and ETags computed from a seed, nothing stored), walks it as `find` does (each directory
    listed, each entry stat'ed) and stats a seeded sample of files again. Per walk: RSS growth
    of the process / entries, the walk's time / the store's own listing of every directory (an
    in-process store: this is a CPU ratio, not B3's network-bound one), stat p50 and p99 of
    the sample (answered from memory); the restart as it is (the whole metadata snapshot
    saved, then read back by a new client: bytes per entry on disk, seconds). Measured once
    (not per repetition)."""
    ctx.note("B7", "in process, synthetic store; RSS growth across a find-style walk / entries")
    for dirs, files in b7_sizes(ctx.quick):
        n = dirs * (files + 1)
        state = os.path.join(ctx.work, ctx.fresh_state(f"b7-{n}"))
        try:
            r = subprocess.run([mech.SILT_BENCH, "meta", "--dirs", str(dirs), "--files-per-dir", str(files),
                                "--seed", str(ctx.seed), "--state-dir", state],
                               capture_output=True, text=True)
        finally:
            shutil.rmtree(state, ignore_errors=True)
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"silt-bench meta exited {r.returncode}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        ctx.add(f"b7_bytes_per_entry_{n}", out["rss_bytes_per_entry"], "bytes")
        ctx.add(f"b7_walk_over_store_list_{n}", out["walk_over_store_list"], "ratio")
        ctx.add(f"b7_stat_p50_memory_{n}", out["stat_p50_us"], "µs")
        ctx.add(f"b7_stat_p99_memory_{n}", out["stat_p99_us"], "µs")
        ctx.add(f"b7_snapshot_bytes_per_entry_{n}", out["snapshot_bytes_per_entry"], "bytes")
        ctx.add(f"b7_snapshot_restore_{n}", out["snapshot_restore_seconds"], "s")
        ctx.counter(f"b7 {n} entries: snapshot save seconds", out["snapshot_save_seconds"])
        ctx.counter(f"b7 {n} entries: RSS after the walk (MiB)", out["rss_after_bytes"] / 2**20)
        ctx.counter(f"b7 {n} entries: walk seconds", out["walk_seconds"])


# ---------------------------------------------------------------- G: the S3 gateway

# B3's tree as a mount of its own, so that it is a bucket of its own (`tree`) whose listing
# is exactly the tree (see b3_mounts; "b3" is too short for an S3 bucket name).
G_TREE = "/tree"
# B1's direct parallel reader: each object by 8 ranged GETs of 8 MiB at a time.
G_LARGE = ["large", "8", "8MiB"]
G_SMALL = ["small", "8"]


def silt_has_gateway():
    out = subprocess.run([mech.SILT, "up", "--help"], capture_output=True, text=True).stdout
    return "--gateway" in out


def _sides(rep, *sides):
    """The sides of a comparison, their order reversed every other repetition."""
    return sides if rep % 2 == 0 else sides[::-1]


def _g_list(ctx, store, prefix, figure):
    r = mech.direct_json(store, ["list", prefix])
    ctx.add(figure, r["seconds"], "s")
    ctx.counter(f"g {figure}: keys listed", r["files"])


def g(ctx):
    """G, the S3 gateway (issue 19 §3), on the run's shaped store: `silt up --gateway` (a fresh
    state each repetition) read by the direct client (crates/silt/examples/direct_read, one S3
    client for every side) pointed at the gateway, beside the same client on the shaped store
    and on an unshaped versitygw serving the same directory on loopback (mech.LocalS3). Each
    repetition:
    - list: one recursive ListObjectsV2 listing (pages of 1,000 keys; the client's first
      request, no opening check) of B3's tree (10^4 keys; quick 10^3), mounted as the bucket
      `tree`: through the gateway first (Silt lists the store: g_gateway_list_first) and again
      (metadata cached: g_gateway_list); the store's tree/ prefix, shaped (g_direct_list) and
      unshaped (g_local_s3_list);
    - cold: B1's files, 8 ranged GETs of 8 MiB at a time, through the gateway of the fresh Silt
      (g_gateway_cold_large) and from the shaped store (g_direct_large); the client's opening
      check (a one-key listing, before its clock) has loaded the bucket's top-level metadata;
    - B1's and B2's files loaded (`silt load`, untimed), then cached: B1's files the same way
      (g_gateway_large, g_local_s3_large) and B2's, HEAD + GET each, 8 at a time
      (g_gateway_small, g_local_s3_small), each side read once untimed first.
    The sides of each comparison swap order from one repetition to the next. Counters: keys
    listed per side; store requests Silt made during each gateway listing and during the cached
    reads (0 when the cache served them all)."""
    if not silt_has_gateway():
        ctx.note("G", "not yet supported: `silt up` has no --gateway (the S3 gateway arrives with issue 19)")
        return
    large = [k for k, _, _ in ctx.manifests["large"]]
    small = [k for k, _, _ in ctx.manifests["small"]]
    shaped = ctx.store
    # A fresh key per run; the gateway takes it from its environment, the client from its own.
    key, secret = "SILTBENCHG" + secrets.token_hex(5).upper(), secrets.token_hex(20)
    mounts = {G_TREE: f"s3://{shaped.bucket}/tree"}
    ctx.note("G", f"client: direct_read (OpenDAL S3) for every side; large: {len(large)} objects of B1, "
                  f"{' x '.join(G_LARGE[1:])} ranged GETs at a time; small: {len(small)} objects of B2, "
                  f"HEAD + GET each, 8 at a time; list: {len(ctx.manifests['tree'])} keys of B3's tree, "
                  f"recursive, pages of 1,000. Gateway: `silt up --gateway` (memory tier 1GiB, disk tier "
                  f"40GiB, plus --silt-arg), fresh state each repetition; cached figures after `silt load` and one untimed "
                  f"pass per side. Unshaped baseline: versitygw (posix, --keep-alive) on loopback over the "
                  f"shaped store's directory")
    log = os.path.join(ctx.work, "versitygw-local.log")
    with mech.LocalS3(os.path.dirname(shaped.local_dir), shaped.key, shaped.secret, log) as server:
        local = mech.Store(server.endpoint, shaped.key, shaped.secret, shaped.bucket, shaped.local_dir)
        for rep in range(ctx.reps):
            with ctx.silt(ctx.fresh_state("g"), mounts=mounts, gateway=(key, secret)) as s:
                gw = mech.Store(s.gateway, key, secret, "data", None)
                gw_tree = mech.Store(s.gateway, key, secret, G_TREE.strip("/"), None)
                for figure in ("g_gateway_list_first", "g_gateway_list"):
                    req = s.metric(UFS_REQUESTS)
                    _g_list(ctx, gw_tree, "", figure)
                    ctx.counter(f"g {figure}: store requests Silt made", s.metric(UFS_REQUESTS) - req)
                for figure, store in _sides(rep, ("g_direct_list", shaped), ("g_local_s3_list", local)):
                    _g_list(ctx, store, "tree/", figure)
                for figure, store in _sides(rep, ("g_gateway_cold_large", gw), ("g_direct_large", shaped)):
                    ctx.add(figure, _gb(mech.direct(store, G_LARGE + large)), "GB/s")
                s.load("large")
                s.load("small")
                req = s.metric(UFS_REQUESTS)
                for figure, store in _sides(rep, ("g_gateway_large", gw), ("g_local_s3_large", local)):
                    mech.direct(store, G_LARGE + large)
                    ctx.add(figure, _gb(mech.direct(store, G_LARGE + large)), "GB/s")
                for figure, store in _sides(rep, ("g_gateway_small", gw), ("g_local_s3_small", local)):
                    mech.direct(store, G_SMALL + small)
                    ctx.add(figure, len(small) / mech.direct(store, G_SMALL + small)[1], "objects/s")
                ctx.counter("g: store requests during the cached reads", s.metric(UFS_REQUESTS) - req)
            shutil.rmtree(os.path.join(ctx.work, "g"), ignore_errors=True)
            print(f"G rep {rep + 1}/{ctx.reps} done", flush=True)


# ---------------------------------------------------------------- ratios

# The --cluster figures: (single node's figure, what it is, its baseline figure, the baseline).
CLUSTER_PAIRS = (
    ("b1_cold_4", "B1 cold", "b1_direct_parallel", "direct parallel"),
    ("b1_cold_1", "B1 cold 1 reader", "b1_direct_single", "single GET stream"),
    ("b1_warm_1", "B1 warm", "b1_local_1", "local page cache"),
    ("b1_warm_4", "B1 warm 4 readers", "b1_local_4", "local page cache"),
    ("b1_hot_1", "B1 hot", "b1_local_1", "local page cache"),
    ("b2_cold", "B2 cold", "b2_direct", "direct"),
    ("b2_warm", "B2 warm", "b2_local", "local"),
)


def cluster_figure(single, variant=None):
    """The cluster's figure for one of the single node's, e.g. b1_cold_4 -> cluster_b1_cold_4,
    or cluster_tls_b1_cold_4 for variant "tls"."""
    return "cluster_" + (f"{variant}_" if variant else "") + single


def cluster_ratios(results, n):
    """{name: value} for the --cluster N figures present in `results` ({figure: runs}): each
    against the single node's baseline, e.g. "B1 cold ÷ direct parallel (cluster 3)", and against
    the single node, e.g. "B1 cold: cluster 3 ÷ single node". Ratios of medians."""
    out = {}
    for single, label, base, base_label in CLUSTER_PAIRS:
        c = cluster_figure(single)
        if c not in results:
            continue
        if base in results:
            out[f"{label} ÷ {base_label} (cluster {n})"] = stats.ratio_of_medians(results[c], results[base])
        if single in results:
            out[f"{label}: cluster {n} ÷ single node"] = stats.ratio_of_medians(results[c], results[single])
    for single, label, _, _ in CLUSTER_PAIRS:
        tcp, tls = cluster_figure(single, "tcp"), cluster_figure(single, "tls")
        if tcp in results and tls in results:
            out[f"{label}: TLS ÷ plaintext TCP (cluster {n})"] = stats.ratio_of_medians(results[tls], results[tcp])
    return out


def ratios(ctx):
    """{ratio id: value} from the medians; ids with a goal match stats.GOALS."""
    R = ctx.results
    out = {}

    def r(name, a, b):
        if a in R and b in R:
            out[name] = stats.ratio_of_medians(R[a], R[b])

    r("B1 warm", "b1_warm_1", "b1_local_1")
    r("B1 warm 4 readers", "b1_warm_4", "b1_local_4")
    r("B1 warm ÷ local disk", "b1_warm_1", "b1_local_disk_1")
    r("B1 warm, disk tier resident", "b1_warm_resident_1", "b1_local_1")
    r("B1 warm after a crash, disk tier resident", "b1_warm_crash_1", "b1_local_1")
    r("B1 hot", "b1_hot_1", "b1_local_1")
    r("B1 cold", "b1_cold_4", "b1_direct_parallel")
    r("B1 cold single", "b1_cold_1", "b1_direct_single")
    r("B1F cold", "b1f_cold_4", "b1f_direct_4")
    r("B1F cold single", "b1f_cold_1", "b1f_direct_1")
    for tag, (option, _) in B1F_VARIANTS.items():
        label = f", {option}" if option else ""
        r(f"B1F cold{label}", f"b1f_cold{tag}_4", "b1f_direct_4")
        if f"b1f_cold{tag}_4_cpu_per_gb" in R:
            out[f"B1F CPU per GB{label}"] = stats.median(R[f"b1f_cold{tag}_4_cpu_per_gb"])
        r(f"B1F cold until cached{label}", f"b1f_cold{tag}_4_until_cached", "b1f_direct_4")
    if "b1_cold_4_cpu_per_gb" in R:
        out["B1 cold CPU per GB"] = stats.median(R["b1_cold_4_cpu_per_gb"])
    if "b1_cold_1_tier_full_cpu_per_gb" in R:
        out["B1 cold CPU per GB, 1 reader, files after the first (memory tier full)"] = stats.median(
            R["b1_cold_1_tier_full_cpu_per_gb"])
    for n in (1, 4):
        if f"b1f_cold_{n}_peak_rss_of_budget" in R:
            out[f"B1F peak RSS ÷ budget, {n} reader{'s' if n > 1 else ''}"] = max(
                x for tag in B1F_VARIANTS for x in R.get(f"b1f_cold{tag}_{n}_peak_rss_of_budget", []))
    r("B2 cold", "b2_cold", "b2_direct")
    r("B2 warm", "b2_warm", "b2_local")
    r("B3 first", "b3_first", "b3_direct_list")
    r("B3 second", "b3_second", "b3_local_walk")
    for label in [policy_key(p) for p in B3P_POLICIES] + [policy_key(p) + "_dropped" for p in B3P_POLICIES] + ["cold"]:
        r(f"B3P open+stat p50, {label} ÷ local", f"b3p_{label}_p50_ms", "b3p_local_p50_ms")
    def epochs23(label):
        return [statistics.mean(x) for x in zip(R[f"b4_{label}_e2"], R[f"b4_{label}_e3"])]

    if "b4_full_e2" in R and "b4_synthetic" in R:
        out["B4 cached"] = stats.ratio_of_medians(epochs23("full"), R["b4_synthetic"])
        out["B4 cold epoch"] = stats.ratio_of_medians(R["b4_full_e1"], R["b4_synthetic"])
    if "b4_half_hit_e2" in R:
        out["B4 hit ratio"] = min(stats.median(R["b4_half_hit_e2"]), stats.median(R["b4_half_hit_e3"]))
    if "b4_half_e2" in R and "b4_half_sampler_e2" in R:
        out["B4 sampler"] = stats.ratio_of_medians(epochs23("half_sampler"), epochs23("half"))
    for label, _ in B4_CURVE:
        # The sampler against the seeded random order at each cache size (issue 42: never
        # worse): samples/s of epochs 2-3, and the hit ratio's difference.
        if f"b4_{label}_e2" in R and f"b4_{label}_sampler_e2" in R:
            out[f"B4 sampler ÷ random, cache {label}"] = stats.ratio_of_medians(
                epochs23(f"{label}_sampler"), epochs23(label))
            hit = lambda lb: min(stats.median(R[f"b4_{lb}_hit_e2"]), stats.median(R[f"b4_{lb}_hit_e3"]))
            out[f"B4 sampler hit ratio − random, cache {label}"] = hit(f"{label}_sampler") - hit(label)
    for label, frac in B4_CURVE + (("half_lru", 0.5), ("quarter_sampler", 0.25), ("half_sampler", 0.5),
                                   ("threeq_sampler", 0.75)):
        if f"b4_{label}_hit_e2" in R:
            out[f"B4 hit ratio, cache {label}"] = min(
                stats.median(R[f"b4_{label}_hit_e2"]), stats.median(R[f"b4_{label}_hit_e3"]))
            if "b4_synthetic" in R:
                out[f"B4 cache {label} epochs 2-3"] = stats.ratio_of_medians(
                    epochs23(label), R["b4_synthetic"])
    r("B5", "b5_mount", "b5_tmpfs")
    r("B5 client", "b5_client", "b5_tmpfs")
    if "b5_mount_peak_rss_over_budget" in R:
        out["B5 memory"] = max(R["b5_mount_peak_rss_over_budget"])  # the worst run
    if "b5_client_peak_rss_over_budget" in R:
        out["B5 client memory"] = max(R["b5_client_peak_rss_over_budget"])
    r("B5 through ÷ direct", "b5_through", "b5_direct_upload")
    r("B5 back ÷ direct", "b5_back", "b5_direct_upload")
    r("B5 back acknowledged ÷ direct", "b5_back_ack", "b5_direct_upload")
    per_file = [k for k in R if k.startswith("b6_bytes_per_file_")]
    if per_file:
        # The largest set: RSS moves by a few MiB on its own, which only many files average out.
        out["B6 per file"] = stats.median(R[max(per_file, key=lambda k: int(k.rsplit("_", 1)[1]))])
    if "b6_moved_fraction" in R:
        out["B6 rebalance"] = stats.median(R["b6_moved_fraction"])
    per_entry = [k for k in R if k.startswith("b7_bytes_per_entry_")]
    if per_entry:
        out["B7 per entry"] = stats.median(R[max(per_entry, key=lambda k: int(k.rsplit("_", 1)[1]))])
    # G: goals on the cached reads (issue 19 §3); the cold read and the listings are reported.
    r("G cached large", "g_gateway_large", "g_local_s3_large")
    r("G cached small", "g_gateway_small", "g_local_s3_small")
    r("G cold ÷ direct GET", "g_gateway_cold_large", "g_direct_large")
    r("G list ÷ direct list", "g_gateway_list", "g_direct_list")
    r("G first list ÷ direct list", "g_gateway_list_first", "g_direct_list")
    r("G list ÷ unshaped local list", "g_gateway_list", "g_local_s3_list")
    sdk.ratios(r)
    if ctx.compare:
        r("B2 warm peer", "b2_warm", "peer_b2_warm")
        r("B1 warm ÷ peer warm", "b1_warm_4", "peer_b1_warm_4")
        r("B1 cold ÷ peer cold", "b1_cold_4", "peer_b1_cold_4")
        r("B2 cold ÷ peer cold", "b2_cold", "peer_b2_cold")
        r("B3 second ÷ peer second", "b3_second", "peer_b3_second")
    if ctx.cluster:
        out.update(cluster_ratios(R, ctx.cluster))
    return out
