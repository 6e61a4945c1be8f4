"""PyTorch helpers over Silt: datasets, a cache-aware sampler, checkpoint load/save.

Importable without torch: the datasets and the sampler are plain Python (a DataLoader takes any
object with ``__len__``/``__getitem__``, or an ``IterableDataset``, whose base class is used
when torch is installed); only ``load``/``save`` need torch itself.

Every helper takes ``fs=`` (a ``SiltFileSystem``) or the keyword arguments of one; with
neither it attaches to the local ``silt up``.  The filesystem goes to DataLoader workers with
the dataset: forked or spawned, each worker makes its own client (attached to this process's
cache when this process owns one).
"""

import io
import random
import tarfile

from silt.fs import SiltFileSystem

try:  # a DataLoader recognises iterable datasets by their base class
    from torch.utils.data import IterableDataset as _IterableBase
except ImportError:  # torch is optional
    _IterableBase = object


def _fs(fs, fs_options):
    if fs is not None:
        return fs
    return SiltFileSystem(**fs_options)


class FileDataset:
    """Map-style: sample ``i`` is the bytes of the ``i``-th file (sorted) below ``root``, or
    of ``files[i]``, passed through ``transform`` (a loader: bytes in, sample out); with
    ``return_path=True`` the sample is ``(path, sample)``."""

    def __init__(self, root=None, files=None, transform=None, return_path=False, fs=None, **fs_options):
        if (root is None) == (files is None):
            raise ValueError("give root= (a directory) or files= (a list of paths), not both")
        self.fs = _fs(fs, fs_options)
        if files is None:
            files = sorted(self.fs.find(root))
        self.files = [self.fs._strip_protocol(f) for f in files]
        self.transform = transform
        self.return_path = return_path

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self._sample(i, self.fs.cat_file(self.files[i]))

    def __getitems__(self, indices):
        """A batch's samples, their files read side by side in one call (a DataLoader with
        automatic batching asks for a batch this way)."""
        return [self._sample(i, data) for i, data in zip(indices, _read_all(self.fs, [self.files[i] for i in indices]))]

    def _sample(self, i, data):
        sample = self.transform(data) if self.transform is not None else data
        return (self.files[i], sample) if self.return_path else sample


class ImageFolderDataset:
    """torchvision's ``ImageFolder`` layout over Silt: ``root/CLASS/.../FILE``; sample ``i`` is
    ``(loader(bytes), class_index)`` (``transform``/``target_transform`` applied as there),
    classes sorted by name (``classes``, ``class_to_idx``), files sorted within each
    (``samples``: ``(path, class_index)``). ``extensions`` keeps only files ending so (any
    case); ``loader`` defaults to the bytes themselves (e.g. ``lambda b:
    PIL.Image.open(io.BytesIO(b)).convert("RGB")``)."""

    def __init__(
        self,
        root,
        loader=None,
        transform=None,
        target_transform=None,
        extensions=None,
        fs=None,
        **fs_options,
    ):
        self.fs = _fs(fs, fs_options)
        root = self.fs._strip_protocol(root).rstrip("/")
        self.classes = sorted(
            e["name"].rstrip("/").rsplit("/", 1)[-1]
            for e in self.fs.ls(root, detail=True)
            if e["type"] == "directory"
        )
        if not self.classes:
            raise FileNotFoundError(f"no class directories in {root}")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        exts = tuple(e.lower() for e in extensions) if extensions else None
        self.samples = []
        for c in self.classes:
            for f in sorted(self.fs.find(f"{root}/{c}")):
                f = self.fs._strip_protocol(f)
                if exts is None or f.lower().endswith(exts):
                    self.samples.append((f, self.class_to_idx[c]))
        self.targets = [t for _, t in self.samples]
        self.files = [f for f, _ in self.samples]
        self.loader = loader
        self.transform = transform
        self.target_transform = target_transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self._sample(i, self.fs.cat_file(self.samples[i][0]))

    def __getitems__(self, indices):
        """A batch's samples, their files read side by side in one call (as ``FileDataset``)."""
        return [self._sample(i, data) for i, data in zip(indices, _read_all(self.fs, [self.files[i] for i in indices]))]

    def _sample(self, i, data):
        target = self.samples[i][1]
        sample = self.loader(data) if self.loader is not None else data
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target


def _read_all(fs, paths):
    """The bytes of each path, read side by side; the first failure is raised."""
    n = len(paths)
    return fs.cat_ranges(list(paths), [0] * n, [None] * n, on_error="raise")


def _files_of(dataset):
    """``(fs, files)`` of a Silt dataset, seen through wrappers that keep it as ``.dataset``
    (``torch.utils.data.Subset`` also maps ``.indices``)."""
    d, pick = dataset, None
    while not (hasattr(d, "files") and hasattr(d, "fs")):
        inner = getattr(d, "dataset", None)
        if inner is None:
            raise TypeError(
                f"{type(dataset).__name__} is not a Silt dataset (FileDataset, ImageFolderDataset, or one "
                "wrapped as .dataset, e.g. torch's Subset)"
            )
        indices = getattr(d, "indices", None)
        if indices is not None:
            pick = list(indices) if pick is None else [indices[i] for i in pick]
        d = inner
    files = d.files if pick is None else [d.files[i] for i in pick]
    return d.fs, files


class ShardDataset(_IterableBase):
    """Iterable over tar shards (WebDataset layout: members ``KEY.EXT`` grouped by key):
    yields ``{"__key__": KEY, EXT: bytes, ...}`` per sample, through ``decode`` if given.
    Shards are split between DataLoader workers (and, with ``shuffle``, visited in a new order
    each epoch); each shard is read sequentially, so Silt's read-ahead streams it, and the next
    one is opened while one is walked."""

    def __init__(self, shards, decode=None, shuffle=False, seed=0, fs=None, **fs_options):
        self.fs = _fs(fs, fs_options)
        if isinstance(shards, str):
            shards = sorted(p for p in self.fs.find(shards) if p.endswith(".tar"))
        self.shards = [self.fs._strip_protocol(s) for s in shards]
        self.decode = decode
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _my_shards(self):
        shards = list(self.shards)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(shards)
        try:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
        except ImportError:
            info = None
        if info is not None:
            shards = shards[info.id :: info.num_workers]
        return shards

    def __iter__(self):
        shards = self._my_shards()
        ahead = None
        try:
            for i, shard in enumerate(shards):
                f, pending = ahead if ahead is not None else self._open(shard)
                if f is None:
                    ahead = None
                    raise pending
                # The next shard's cache file is mapped and checked on Silt's threads while
                # this one is walked.
                ahead = self._open(shards[i + 1]) if i + 1 < len(shards) else None
                with f:
                    yield from self._walk(_whole(f, pending))
        finally:
            if ahead is not None and ahead[0] is not None:
                ahead[0].close()  # left early (the loader stopped): not read

    def _open(self, shard):
        """``(file, its map_ahead())``; a shard that fails to open gives ``(None, error)``,
        raised when the walk reaches it (after the shards before it are yielded)."""
        try:
            f = self.fs.open(shard, "rb")
        except OSError as e:
            return None, e
        reader = getattr(f, "_reader", None)
        return f, (reader.map_ahead() if reader is not None else None)

    def _walk(self, src):
        with tarfile.open(fileobj=src, mode="r|") as tar:
            sample, key = {}, None
            for m in tar:
                if not m.isfile():
                    continue
                base = m.name.rsplit("/", 1)[-1]
                k, _, ext = base.partition(".")
                prefix = m.name[: len(m.name) - len(base)]
                k = prefix + k
                if key is not None and k != key:
                    yield self._out(key, sample)
                    sample = {}
                key = k
                sample[ext] = tar.extractfile(m).read()
            if key is not None:
                yield self._out(key, sample)

    def _out(self, key, sample):
        sample["__key__"] = key
        return self.decode(sample) if self.decode is not None else sample


def _whole(f, pending=None):
    """What a tar walk reads ``f`` through: where the file is whole in a cache on this host,
    the cache file's map read as a stream (``Mapping.read``, C speed, where tarfile's 10 KB
    reads through fsspec's buffer were Python), every page mapped at once and checked before
    the walk begins (the map keeps the cache file's pages pinned while it lives); else ``f``.
    ``pending``: ``f``'s ``Reader.map_ahead()``, made earlier."""
    if pending is None:
        reader = getattr(f, "_reader", None)
        if reader is None:
            return f
        pending = reader.map_ahead()
    try:
        mapped = pending.wait()
    except OSError:
        return f  # the map could not be made: the client reads it
    return f if mapped is None else mapped


class CacheAwareSampler:
    """Yields every index of a Silt map-style dataset (``FileDataset``, ``ImageFolderDataset``,
    or one wrapped as ``.dataset``, e.g. torch's ``Subset``) once per epoch: first, in a random
    order, the samples whose files Silt already holds whole (one batched residency question),
    then the rest in a random order.  The epoch stays a permutation; which samples come early
    depends on the cache, so this trades a little randomness for reading from cache while the
    rest arrives.

    With ``prefetch``, Silt is asked to fetch the uncached files ahead of the loader
    (``fs.prefetch``: fetched from the store in parallel, kept until read), never so early that
    they evict cached samples the loader has still to read, which would make the epoch worse
    than a random order:

    - while the loader is still reading the cached part, only as many bytes as the cache holds
      free (``fs.cache_space()``, below 0.9 of it: under the default eviction watermark) are asked for;
    - before the loader reaches the first uncached sample, the ones it will have taken by the
      time the window below starts (``loader_ahead + lookahead``) are asked for, their room made
      by freeing as many cached samples the loader read first this epoch (the cache would
      evict those next anyway; a cache full of samples still to be read would lose those
      instead).  Without it, the loader reads those samples from the store one by one;
    - once it has read past the cached part, ``lookahead`` samples ahead of where indices are
      taken.

    A loader takes indices ahead of what it has read (a DataLoader: ``num_workers ×
    prefetch_factor × batch_size``); ``loader_ahead`` is that lead (default 512, a DataLoader
    of 4 workers, prefetch factor 2, batches of 64; give yours), so the read position is
    taken as ``loader_ahead`` behind the last index taken.  ``last_cached`` says how many
    samples were cached at the start of the last epoch.

    On a data set so small that the loader takes every uncached sample before it has read a
    cached one (``last_cached + loader_ahead`` ≥ the data set), nothing beyond the free room can
    be prefetched without evicting cached samples still to be read; the epoch is then the
    shuffled order itself, its uncached samples spread through it as a random order has them
    (a few in each batch, read by every worker) rather than left to the last batches, which
    fewer workers read."""

    # Eviction starts at this fraction of a tier's quota (`high_watermark`'s default, 0.95),
    # with some margin: the free room a prefetch may fill without evicting.
    ROOM = 0.9

    def __init__(self, dataset, shuffle=True, seed=0, prefetch=True, lookahead=256, loader_ahead=512):
        if lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, got {lookahead}")
        if loader_ahead < 0:
            raise ValueError(f"loader_ahead must be at least 0, got {loader_ahead}")
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.prefetch = prefetch
        self.lookahead = lookahead
        self.loader_ahead = loader_ahead
        self.epoch = 0
        self.last_cached = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.dataset)

    def order(self):
        """This epoch's order (cached first, but see the class on small data sets); sets
        ``last_cached``.  Prefetches nothing."""
        return self._plan()[0]

    def _plan(self):
        """``(order, spread)``: this epoch's order, and its uncached samples when it is the
        shuffled order itself (a loader that takes them all before reading a cached one), else
        None; sets ``last_cached``."""
        n = len(self.dataset)
        order = list(range(n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        fs, files = _files_of(self.dataset)
        resident = fs.residency(files)
        cached = [i for i in order if (resident[i] or 0.0) >= 1.0]
        rest = [i for i in order if (resident[i] or 0.0) < 1.0]
        self.last_cached = len(cached)
        if self.prefetch and cached and rest and len(cached) + self.loader_ahead >= n:
            return order, rest
        return cached + rest, None

    def __iter__(self):
        order, spread = self._plan()
        self.epoch += 1
        if spread is not None:
            return self._take_spread(order, spread)
        return self._take(order, self.last_cached)

    def _take_spread(self, order, uncached):
        """The shuffled order, the first uncached samples the free room holds asked for."""
        fs, files = _files_of(self.dataset)
        early = self._free_samples(fs, files, uncached)
        if early:
            fs.prefetch([files[k] for k in uncached[:early]])
        yield from order

    def _free_samples(self, fs, files, uncached):
        """How many uncached samples fit in the cache's free room (0 if it cannot be told)."""
        try:
            capacity, used = fs.cache_space()
        except Exception:  # noqa: BLE001 - an SDK without it: no room assumed
            return 0
        room = max(0, int(capacity * self.ROOM) - used)
        if room == 0 or not uncached:
            return 0
        probe = uncached[:: max(1, len(uncached) // 16)][:16]
        sizes = [fs.info(files[i]).get("size") or 0 for i in probe]
        mean = max(1, sum(sizes) // max(1, len(sizes)))
        return room // mean

    def _bridge(self, fs, n, first_rest, early):
        """``(take index, count)``: when to free the first ``count`` samples of the order and
        prefetch as many uncached ones after the ``early`` ones; ``(None, 0)`` for none.  The
        freed samples must be read by then (``loader_ahead`` and half as much again behind the
        take), and the bridge starts ``2 × loader_ahead`` before the first uncached sample is
        taken where it can, at the latest when it is taken; a smaller cached part makes it
        shorter."""
        ahead = self.loader_ahead
        count = min(n - first_rest, ahead + self.lookahead) - early
        start = max(count + ahead + ahead // 2 + 1, first_rest - 2 * ahead)
        if start > first_rest:
            count -= start - first_rest
            start = first_rest
        return (start, count) if count > 0 else (None, 0)

    def _take(self, order, first_rest):
        fs, files = _files_of(self.dataset)
        n = len(order)
        step = max(1, self.lookahead // 4)  # ask in a few calls per window, not one per sample
        asked = first_rest  # order[first_rest:asked] has been asked for
        early = self._free_samples(fs, files, order[first_rest:]) if self.prefetch else 0
        bridge_at, bridge = self._bridge(fs, n, first_rest, early) if self.prefetch else (None, 0)
        for j, i in enumerate(order):
            if self.prefetch:
                if j == bridge_at:
                    # Room first (read long ago), then what the loader takes next.
                    try:
                        fs.free([files[k] for k in order[:bridge]])
                    except Exception:  # noqa: BLE001 - a hint: the loader reads them anyway
                        pass
                    due = max(asked, first_rest + early + bridge)
                    fs.prefetch([files[k] for k in order[asked:due]])
                    asked = due
                if j - self.loader_ahead >= first_rest:
                    # The loader has read the cached part: a window ahead of the takes.
                    due = min(n, j + self.lookahead)
                else:
                    # Cached samples still to be read: only what the free room holds.
                    due = min(n, first_rest + early)
                if due > asked and (due - asked >= step or due == n or due == first_rest + early):
                    fs.prefetch([files[k] for k in order[asked:due]])
                    asked = due
            yield i


def read_buffer(path, fs=None, **fs_options):
    """The whole file as ``bytes`` in one read (for ``safetensors.torch.load``, which takes
    bytes: no mmap over FUSE, no page-by-page reads)."""
    return _fs(fs, fs_options).cat_file(path)


def load(path, fs=None, map_location=None, weights_only=True, **fs_options):
    """``torch.load`` of a checkpoint in Silt, read in one request into memory."""
    import torch

    data = read_buffer(path, fs=fs, **fs_options)
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)


def save(obj, path, fs=None, **fs_options):
    """``torch.save`` into Silt: serialised in memory, then written in one call (the file
    is the store's, per its write type, when this returns)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    _fs(fs, fs_options).pipe_file(path, buf.getvalue())
