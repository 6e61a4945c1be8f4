"""B4's training loop: a data loader reading files in shuffled batches while the main process
"trains" on each batch for a fixed simulated compute time (a sleep: the GPU step).

With `torch` importable the loader is PyTorch's `DataLoader` (CPU, `num_workers` processes);
otherwise a pool of worker processes with the same access pattern: the same shuffled order,
whole batches per worker, at most `workers * prefetch` batches in flight, results consumed in
order. `LOADER` says which one runs. Either way the loader processes of one `run` are kept
across its epochs (the pool's; the DataLoader's with `persistent_workers`).

Synthetic (`synthetic=True`): the same loop, the same sample sizes, no I/O (each sample is a
buffer of the file's size made in memory): the upper bound of the loop.
"""
import itertools
import multiprocessing as mp
import random
import time

try:  # the real DataLoader when PyTorch is installed
    import torch
    from torch.utils.data import DataLoader, Dataset
    LOADER = "torch.utils.data.DataLoader"
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    LOADER = "multiprocessing pool (torch not importable)"


_SDK = None


def _sdk():
    """This process's Silt filesystem for `silt://` paths (bench/sdk.py): made in the loader
    process itself from $SILT_BENCH_SDK, the SDK's keyword arguments as JSON."""
    global _SDK
    if _SDK is None:
        import json
        import os

        import silt
        _SDK = silt.SiltFileSystem(**json.loads(os.environ["SILT_BENCH_SDK"]))
    return _SDK


def _batched():
    """Whether the SDK's datasets read a batch at once (`__getitems__`, issue 42): a loader
    over an SDK without it read sample by sample, as this one then does."""
    import silt.torch
    return hasattr(silt.torch.FileDataset, "__getitems__")


def load_sample(path, size, synthetic):
    if synthetic:
        return bytearray(size)
    if path.startswith("silt://"):
        return _sdk().cat_file(path)
    with open(path, "rb") as f:
        return f.read()


def _batch_bytes(batch):
    return sum(len(b) for b in batch)


def _read_batch(items, synthetic):
    """A batch's samples, every one held until the batch is whole, as a DataLoader's fetcher
    holds them for its collate function (each loader pays for a batch's memory)."""
    if not synthetic and items and items[0][0].startswith("silt://") and _batched():
        # A batch at once, as silt.torch's datasets give a DataLoader (`__getitems__`).
        paths = [p for p, _ in items]
        return _sdk().cat_ranges(paths, [0] * len(paths), [None] * len(paths), on_error="raise")
    return [load_sample(p, s, synthetic) for p, s in items]


def _load_batch(args):
    return _batch_bytes(_read_batch(*args))


def epoch_order(n, seed, epoch):
    """Epoch `epoch`'s random order: the permutation silt.torch.CacheAwareSampler(seed=seed)
    starts from in that epoch (its shuffled order, before it moves cached samples first), so
    B4 compares the sampler with the random order on the same permutations. With a seed of its
    own each, one permutation leaves a few more files whole in the cache than another, and a
    single repetition's comparison at ¾ of a cache came out 0.91-0.95 every time from that
    alone (a sampler giving the shuffled order itself, as it does there, measured the same
    with its prefetch turned off)."""
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    return order


def batches(items, order, batch_size):
    return [[items[i] for i in order[k:k + batch_size]] for k in range(0, len(order), batch_size)]


if torch is not None:  # pragma: no cover - depends on the machine
    class _Files(Dataset):
        def __init__(self, items, synthetic):
            self.items, self.synthetic = items, synthetic

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            p, s = self.items[i]
            return load_sample(p, s, self.synthetic)

        def __getitems__(self, indices):
            # A batch at once, as silt.torch's datasets give a DataLoader.
            return _read_batch([self.items[i] for i in indices], self.synthetic)

    class _Order(torch.utils.data.Sampler):
        def __init__(self, order):
            self.order = order

        def __iter__(self):
            return iter(self.order)

        def __len__(self):
            return len(self.order)


def _torch_loader(items, batch_size, workers, prefetch, synthetic):
    """One DataLoader for a run, its workers kept across the run's epochs (as the pool's are);
    each epoch sets the order its sampler gives."""
    sampler = _Order([])
    dl = DataLoader(_Files(items, synthetic), batch_size=batch_size, sampler=sampler,
                    num_workers=workers, prefetch_factor=prefetch, collate_fn=_batch_bytes,
                    persistent_workers=workers > 0)
    return dl, sampler


def _epoch_torch(loader, order, compute_s):
    dl, sampler = loader
    sampler.order = order
    total = 0
    for nbytes in dl:
        total += nbytes
        time.sleep(compute_s)
    return total


def _epoch_pool(pool, items, order, batch_size, workers, prefetch, compute_s, synthetic):
    # Batches are cut from the order as they are dispatched, as a DataLoader takes indices
    # from its sampler (a sampler may act on how far the loader has got).
    indices = iter(order)
    in_flight, total, more = [], 0, True
    while more or in_flight:
        while more and len(in_flight) < workers * prefetch:
            batch = [items[i] for i in itertools.islice(indices, batch_size)]
            if not batch:
                more = False
                break
            in_flight.append(pool.apply_async(_load_batch, ((batch, synthetic),)))
        if in_flight:
            total += in_flight.pop(0).get()
            time.sleep(compute_s)
    return total


class _Lazy:
    """One epoch of a sampler: iterated once, with the dataset's length."""

    def __init__(self, sampler, n):
        self.sampler, self.n = sampler, n

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self):
        return self.n


def run(items, epochs=3, batch_size=64, workers=4, prefetch=2, compute_s=0.05, seed=0,
        synthetic=False, before_epoch=None, after_epoch=None, sampler=None):
    """items: [(path, size)]. Returns one dict per epoch: samples, bytes, seconds, samples_per_s.
    before_epoch(e) / after_epoch(e) run outside the timed part (cache drops, counters).
    `sampler`: an iterable giving each epoch's indices (e.g. silt.torch.CacheAwareSampler),
    iterated inside the timed part; the default is a seeded random permutation per epoch."""
    out = []
    pool = None if torch is not None else mp.get_context("fork").Pool(workers)
    loader = _torch_loader(items, batch_size, workers, prefetch, synthetic) if pool is None else None
    done = False
    try:
        for e in range(epochs):
            if before_epoch:
                before_epoch(e)
            t = time.perf_counter()
            order = epoch_order(len(items), seed, e) if sampler is None else _Lazy(sampler, len(items))
            if pool is None:
                nbytes = _epoch_torch(loader, order, compute_s)
            else:
                nbytes = _epoch_pool(pool, items, order, batch_size, workers, prefetch, compute_s, synthetic)
            secs = time.perf_counter() - t
            if after_epoch:
                after_epoch(e)
            out.append({"samples": len(items), "bytes": nbytes, "seconds": secs, "samples_per_s": len(items) / secs})
        done = True
    finally:
        del loader  # a persistent DataLoader's workers stop with it
        if pool is not None:
            # Every batch answered: the workers are told to stop and exit on their own.
            # `terminate` (kept for a failed run) kills them wherever they are, and one killed
            # while holding the task queue's lock left a sibling blocked on it for ever (a
            # stall seen at the end of an epoch).
            if done:
                pool.close()
            else:
                pool.terminate()
            pool.join()
    return out
