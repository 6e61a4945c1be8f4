"""Scenario SDK (issue 42 §2): the Python SDK beside the mount and the local disk, in one run.

Per repetition, each from a fresh cache (`silt up` over the bench store):

- **epoch**: B2's files read whole (bytes only) by 4 loader processes in B4's loop (batch 64,
  no compute, new loader processes each epoch): epoch 1 is cold, the median of the next
  `WARM_EPOCHS` warm, and the median of warm epochs read by loader processes kept across
  epochs (`persistent_workers=True`); through the SDK
  (`silt://`, an attached client in each loader process, no store options) and through the
  mount, and from the store's own directory (the local disk, page cache warm);
- **parquet**: `pyarrow.parquet.read_table` of one Parquet file, whole and two of its eight
  columns, through `silt://` (fsspec), the mount and the local disk, each read once before
  the timed reads (cached; kernel caches warm);
- **shards**: B2's files packed in tar shards, read sequentially by `silt.torch.ShardDataset`
  and by the same tar walk over the mount and the local disk (cached).

Needs the SDK in the project's venv (`scripts/python-wheel.sh --release`) and pyarrow there
(scripts/install-deps.sh); what is missing is noted, not measured.
"""
import glob
import json
import os
import statistics
import sys
import tarfile
import time

from . import generators, mech, train

WARM_EPOCHS = 3
PARQUET_COLUMNS = 8
TWO_COLUMNS = ["c1", "c5"]


def venv_modules():
    """Puts the project's venv's site-packages on sys.path (the SDK and pyarrow live there)."""
    for site in glob.glob(os.path.join(mech.ROOT, ".deps/pyvenv/lib/python3*/site-packages")):
        if site not in sys.path:
            sys.path.append(site)


# ---------------------------------------------------------------- data

def parquet_file(root, size, seed, rel="parquet/table.parquet"):
    """One Parquet file of about `size` bytes: 8 columns (int64 and float64, alternating) of
    bytes from a seeded pool (random, so nearly incompressible), 1 Mi rows per row group,
    pyarrow's default compression. Returns the manifest [(rel, size, digest)]."""
    venv_modules()
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = generators._rng(seed, "parquet")
    pool = generators._pool(rng, 16 << 20)
    doubled = pool + pool
    rows_per_group = 1 << 20
    groups = max(1, size // (rows_per_group * 8 * PARQUET_COLUMNS))
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fields = [pa.field(f"c{i}", pa.int64() if i % 2 == 0 else pa.float64()) for i in range(PARQUET_COLUMNS)]
    schema = pa.schema(fields)
    with pq.ParquetWriter(path, schema) as w:
        for _ in range(groups):
            cols = []
            for f in fields:
                off = rng.randrange(len(pool))
                buf = pa.py_buffer(doubled[off:off + rows_per_group * 8])
                cols.append(pa.Array.from_buffers(f.type, rows_per_group, [None, buf]))
            w.write_table(pa.Table.from_arrays(cols, schema=schema))
    return [_digest(root, rel)]


def tar_shards(root, small, count=16, prefix="shards"):
    """B2's files (`small`, their manifest) packed in order into `count` tar shards
    (WebDataset layout: one member per sample, KEY.jpg). Returns the shards' manifest."""
    per = -(-len(small) // count)
    out = []
    for s in range(count):
        part = small[s * per:(s + 1) * per]
        if not part:
            break
        rel = f"{prefix}/shard-{s:04}.tar"
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, (name, _, _) in enumerate(part):
                tar.add(os.path.join(root, name), arcname=f"{s:04}{i:06}.jpg")
        out.append(_digest(root, rel))
    return out


def _digest(root, rel):
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    n = 0
    with open(os.path.join(root, rel), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            n += len(block)
    return (rel, n, h.hexdigest())


def generate(ctx):
    """The Parquet file (1 GiB; 256 MiB quick) and the shards, when pyarrow imports."""
    root = ctx.store.local_dir
    try:
        ctx.manifests["parquet"] = parquet_file(root, (256 << 20) if ctx.quick else (1 << 30), ctx.seed)
    except ImportError as e:
        ctx.note("SDK", f"Parquet reads skipped: pyarrow does not import ({e})")
    ctx.manifests["shards"] = tar_shards(root, ctx.manifests["small"])


# ---------------------------------------------------------------- reads

def _epochs(items, seed):
    """(cold, warm) MB/s: the first epoch and the median of the next ones. Each epoch starts
    its loader processes anew, as a DataLoader does by default (no persistent workers): what
    a loader process kept of its own does not carry over."""
    p = dict(epochs=1, batch_size=64, workers=4, prefetch=2, compute_s=0.0)
    mb = []
    for e in range(1 + WARM_EPOCHS):
        r = train.run(items, seed=seed * 100 + e, **p)[0]
        mb.append(r["bytes"] / r["seconds"] / 1e6)
    return mb[0], statistics.median(mb[1:])


def _persistent(items, seed):
    """MB/s of a warm epoch read by loader processes kept from the epoch before (a DataLoader
    with `persistent_workers=True`): the median of `WARM_EPOCHS` epochs after the first, in one
    pool."""
    p = dict(epochs=1 + WARM_EPOCHS, batch_size=64, workers=4, prefetch=2, compute_s=0.0)
    runs = train.run(items, seed=seed * 100 + 50, **p)
    return statistics.median(r["bytes"] / r["seconds"] / 1e6 for r in runs[1:])


def _tar_walk(path):
    """ShardDataset's walk over one shard, opened as a local file (stream mode, every member
    read): bytes read."""
    n = 0
    with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
        for m in tar:
            if m.isfile():
                n += len(tar.extractfile(m).read())
    return n


def _timed(fn):
    t = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t


def sdk(ctx):
    venv_modules()
    try:
        import silt
        import silt.torch
    except ImportError as e:
        ctx.note("SDK", f"not measured: the SDK does not import ({e}); scripts/python-wheel.sh --release")
        return
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    small = ctx.manifests["small"]
    shards = ctx.manifests["shards"]
    parquet = ctx.manifests.get("parquet")
    root = ctx.store.local_dir
    ctx.note("SDK", f"epochs: {len(small)} files, {generators.total_bytes(small) / 1e6:.0f} MB, "
                    f"4 loader processes ({train.LOADER}), batch 64, no compute; 1 cold + "
                    f"{WARM_EPOCHS} warm epochs per cache; shards: {len(shards)} tar files; "
                    + (f"Parquet: {parquet[0][1] / 1e6:.0f} MB, {PARQUET_COLUMNS} columns" if parquet else "no Parquet"))

    def mbps(fig, nbytes_secs):
        n, secs = nbytes_secs
        ctx.add(fig, n / secs / 1e6, "MB/s")

    def parquet_reads(label, path, fs=None):
        if not parquet:
            return
        pq.read_table(path, filesystem=fs)  # cached, and pyarrow's own first-use costs paid
        mbps(f"sdk_parquet_{label}", _timed(lambda: (pq.read_table(path, filesystem=fs), parquet[0][1])[1]))
        t = _timed(lambda: pq.read_table(path, columns=TWO_COLUMNS, filesystem=fs).nbytes)
        ctx.add(f"sdk_parquet2_{label}", t[1], "s")

    def shard_reads(label, walk):
        walk()
        mbps(f"sdk_shards_{label}", _timed(walk))

    for rep in range(ctx.reps):
        local = [(os.path.join(root, rel), size) for rel, size, _ in small]
        _epochs(local, rep)  # page cache warm
        ctx.add("sdk_epoch_local", _epochs(local, rep)[1], "MB/s")
        parquet_reads("local", os.path.join(root, parquet[0][0]) if parquet else None)
        shard_reads("local", lambda: sum(_tar_walk(os.path.join(root, rel)) for rel, _, _ in shards))

        with ctx.silt(ctx.fresh_state("sdk-sdk")) as s:
            # No store endpoint or key: an attached client is served by its owner.
            options = {"cache_dir": s.state, "mode": "attach"}
            os.environ["SILT_BENCH_SDK"] = json.dumps(options)
            cold, warm = _epochs([("silt://data/" + rel, size) for rel, size, _ in small], rep)
            ctx.add("sdk_epoch_sdk_cold", cold, "MB/s")
            ctx.add("sdk_epoch_sdk_warm", warm, "MB/s")
            ctx.add("sdk_epoch_sdk_persistent", _persistent([("silt://data/" + rel, size) for rel, size, _ in small], rep), "MB/s")
            fs = silt.SiltFileSystem(skip_instance_cache=True, **options)
            try:
                parquet_reads("sdk", "/data/" + parquet[0][0] if parquet else None, fs)

                def walk():
                    ds = silt.torch.ShardDataset(["/data/" + rel for rel, _, _ in shards], fs=fs)
                    return sum(len(v) for sample in ds for k, v in sample.items() if k != "__key__")

                shard_reads("sdk", walk)
            finally:
                fs.close()

        with ctx.silt(ctx.fresh_state("sdk-mount")) as s:
            cold, warm = _epochs([(s.path(rel), size) for rel, size, _ in small], rep)
            ctx.add("sdk_epoch_mount_cold", cold, "MB/s")
            ctx.add("sdk_epoch_mount_warm", warm, "MB/s")
            ctx.add("sdk_epoch_mount_persistent", _persistent([(s.path(rel), size) for rel, size, _ in small], rep), "MB/s")
            parquet_reads("mount", s.path(parquet[0][0]) if parquet else None)
            shard_reads("mount", lambda: sum(_tar_walk(s.path(rel)) for rel, _, _ in shards))
        print(f"SDK rep {rep + 1}/{ctx.reps} done", flush=True)


def ratios(r):
    """The SDK scenario's ratios (issue 42's goals), through scenarios.ratios' `r(name, a, b)`."""
    r("SDK epoch warm ÷ mount", "sdk_epoch_sdk_warm", "sdk_epoch_mount_warm")
    r("SDK epoch warm ÷ local", "sdk_epoch_sdk_warm", "sdk_epoch_local")
    r("SDK mount epoch warm ÷ local", "sdk_epoch_mount_warm", "sdk_epoch_local")
    r("SDK epoch warm, persistent loaders ÷ mount", "sdk_epoch_sdk_persistent", "sdk_epoch_mount_persistent")
    r("SDK epoch warm, persistent loaders ÷ local", "sdk_epoch_sdk_persistent", "sdk_epoch_local")
    r("SDK epoch cold ÷ mount", "sdk_epoch_sdk_cold", "sdk_epoch_mount_cold")
    r("SDK Parquet read_table ÷ mount", "sdk_parquet_sdk", "sdk_parquet_mount")
    r("SDK Parquet read_table ÷ local", "sdk_parquet_sdk", "sdk_parquet_local")
    # Two columns are timed (seconds): the mount's time over the SDK's is "SDK ÷ mount" speed.
    r("SDK Parquet two columns ÷ mount", "sdk_parquet2_mount", "sdk_parquet2_sdk")
    r("SDK shards ÷ mount", "sdk_shards_sdk", "sdk_shards_mount")
    r("SDK shards ÷ local", "sdk_shards_sdk", "sdk_shards_local")
