"""silt.torch: datasets, the cache-aware sampler, DataLoader-style workers under the fork,
spawn and forkserver start methods (a real DataLoader when torch is installed, else the same
processes made by multiprocessing), and the checkpoint helpers."""

import hashlib
import io
import multiprocessing as mp
import os
import random
import subprocess
import tarfile
import time

import pytest

import silt
import silt.torch as st
from test_modes import DATA, embedded, fill, owner_cache_file, silt_up

WORKERS = 4
# A worker that has not finished by then hangs (the failure this test exists for).
HANG = 180


def digest(b):
    return hashlib.sha256(b).hexdigest()


def _worker(ds, indices, q):
    # Under fork `ds` (and its filesystem, whose client the parent used) is inherited as is;
    # under spawn and forkserver it arrives pickled.
    try:
        q.put([(i, digest(ds[i])) for i in indices])
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(repr(e))


@pytest.mark.parametrize("mode", ["single", "attached"])
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_read_a_dataset_made_in_the_parent(s3, workdir, procs, method, mode):
    """Every start method, with the parent the single node owning the cache or attached to a
    `silt up`: the workers' clients attach to that cache."""
    fill(s3)
    up = None
    if mode == "single":
        fs = embedded(s3, workdir)
    else:
        up, state, mnt = silt_up(s3, workdir, procs)
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True, **s3.options())
        assert fs.client.mode == "attached"
    try:
        ds = st.FileDataset("/data/train", fs=fs)
        expected = {i: digest(DATA[f.removeprefix("/data/")]) for i, f in enumerate(ds.files)}
        # The parent reads first: its client runs (threads, connections) when workers start.
        assert digest(ds[0]) == expected[0]
        try:
            import torch.utils.data as tud
        except ImportError:
            tud = None
        if tud is not None:
            loader = tud.DataLoader(
                ds, batch_size=None, num_workers=WORKERS, multiprocessing_context=method,
                sampler=st.CacheAwareSampler(ds), timeout=HANG,
            )
            got = [digest(b) for b in loader]
            assert sorted(got) == sorted(expected.values())
        ctx = mp.get_context(method)
        q = ctx.Queue()
        indices = list(range(len(ds)))
        procs = [ctx.Process(target=_worker, args=(ds, indices[k::WORKERS], q)) for k in range(WORKERS)]
        for p in procs:
            p.start()
        try:
            results = [q.get(timeout=HANG) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=HANG)
                if p.is_alive():
                    p.kill()
        errors = [r for r in results if isinstance(r, str)]
        assert errors == []
        got = dict(pair for r in results for pair in r)
        assert got == expected
        # The workers attached to the parent's cache: what they read is cached for everyone.
        assert fs.residency(ds.files) == [1.0] * len(ds.files)
    finally:
        fs.close()
        if up is not None:
            up.stop()
            subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_cache_aware_sampler_yields_cached_samples_first_and_a_permutation(s3, workdir):
    fill(s3)
    fs = embedded(s3, workdir)
    try:
        ds = st.FileDataset("/data/train", fs=fs, transform=len)
        warm = {3, 7, 11, 20}
        for i in warm:
            assert ds[i] == len(DATA[ds.files[i].removeprefix("/data/")])
        # A loader reading what it takes (taking 512 ahead, the default, it would take all 24
        # at once: the shuffled order, see the spreading test below).
        sampler = st.CacheAwareSampler(ds, seed=1, loader_ahead=0)
        order = list(sampler)
        assert sorted(order) == list(range(len(ds)))
        assert set(order[: len(warm)]) == warm and sampler.last_cached == len(warm)
        # The rest is loaded in the background, in the order it will be read.
        deadline = time.monotonic() + HANG
        while fs.residency(ds.files) != [1.0] * len(ds):
            assert time.monotonic() < deadline, "prefetch never completed"
            time.sleep(0.05)  # polling for completion, not synchronising on time
        # Next epoch: everything cached, a different random order, still a permutation.
        order2 = list(sampler)
        assert sorted(order2) == list(range(len(ds))) and order2 != order
        assert sampler.last_cached == len(ds)
        # Unshuffled and nothing cached beyond: cached first, then the rest in order.
        plain = list(st.CacheAwareSampler(ds, shuffle=False, prefetch=False))
        assert plain == list(range(len(ds)))
    finally:
        fs.close()


def test_image_folder_dataset_paths_and_the_sampler_over_wrappers(s3, workdir):
    files = {
        "imgs/cat/2.jpg": b"cat two",
        "imgs/cat/1.JPG": b"cat one",
        "imgs/dog/a.jpg": b"dog a",
        "imgs/dog/notes.txt": b"not an image",
        "imgs/eel/deep/x.jpg": b"eel x",
    }
    for k, v in files.items():
        s3.put(k, v)
    fs = embedded(s3, workdir)
    try:
        ds = st.ImageFolderDataset("silt:///data/imgs", extensions=[".jpg"], fs=fs, target_transform=lambda t: t * 10)
        assert ds.classes == ["cat", "dog", "eel"]
        assert ds.class_to_idx == {"cat": 0, "dog": 1, "eel": 2}
        assert ds.samples == [
            ("/data/imgs/cat/1.JPG", 0),
            ("/data/imgs/cat/2.jpg", 0),
            ("/data/imgs/dog/a.jpg", 1),
            ("/data/imgs/eel/deep/x.jpg", 2),
        ]
        assert [ds[i] for i in range(len(ds))] == [(b"cat one", 0), (b"cat two", 0), (b"dog a", 10), (b"eel x", 20)]
        loaded = st.ImageFolderDataset("/data/imgs", loader=len, fs=fs)
        assert loaded[3] == (len(b"not an image"), 1)
        # A file dataset that says which file each sample is.
        fd = st.FileDataset("/data/imgs/dog", return_path=True, transform=bytes.upper, fs=fs)
        assert [fd[i] for i in range(len(fd))] == [("/data/imgs/dog/a.jpg", b"DOG A"), ("/data/imgs/dog/notes.txt", b"NOT AN IMAGE")]
        # A batch at once (a DataLoader's automatic batching calls __getitems__): the same
        # samples as one by one, in the order asked, repeats included.
        assert ds.__getitems__([3, 0, 3, 2]) == [ds[3], ds[0], ds[3], ds[2]]
        assert fd.__getitems__([1, 0]) == [fd[1], fd[0]]
        assert fd.__getitems__([]) == []

        # The sampler over a subset (torch's Subset keeps .dataset and .indices).
        class Subset:
            def __init__(self, dataset, indices):
                self.dataset, self.indices = dataset, indices

            def __len__(self):
                return len(self.indices)

        sub = Subset(ds, [3, 1])
        fs.free(ds.files[1])  # ds[3] stays cached: the subset's index 0 comes first
        order = list(st.CacheAwareSampler(sub, seed=2, prefetch=False))
        assert order[0] == 0 and sorted(order) == [0, 1]
        with pytest.raises(TypeError, match="not a Silt dataset"):
            st.CacheAwareSampler([b"a", b"b"]).order()
        # A batch with a file gone fails with its error, not with a short batch.
        os.remove(s3.path("imgs/dog/a.jpg"))
        fs.invalidate_cache("/data/imgs/dog")
        with pytest.raises(FileNotFoundError):
            fd.__getitems__([1, 0])
    finally:
        fs.close()


def _single_in_child(options, q):
    try:
        silt.SiltFileSystem(skip_instance_cache=True, mode="single", **options).ls("/data")
        q.put("connected")
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(f"{type(e).__name__}: {e}")


def test_an_explicit_single_node_in_a_worker_says_to_leave_mode_auto(s3, workdir):
    fill(s3)
    fs = embedded(s3, workdir)
    try:
        fs.ls("/data")
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        options = dict(mounts={"/data": f"s3://{s3.bucket}"}, cache_dir=os.path.join(workdir, "cache"), **s3.options())
        p = ctx.Process(target=_single_in_child, args=(options, q))
        p.start()
        try:
            got = q.get(timeout=HANG)
        finally:
            p.join(timeout=HANG)
        assert "in use by another silt process" in got and "leave mode auto" in got, got
    finally:
        fs.close()


class FakeFs:
    """What a sampler asks of a filesystem, recorded: `cached` says which files are cached,
    `room` how many 100-byte files the cache's free room holds (None: no `cache_space`)."""

    def __init__(self, cached, room=None):
        self.cached, self.asked, self.freed = cached, [], []
        self.taken = lambda: 0  # a test sets how many indices the loader has taken
        if room is not None:
            self.cache_space = lambda: (1000, 900 - room * 100)  # room below 90 % of 1000
            self.info = lambda path: {"size": 100}

    def residency(self, files):
        return [1.0 if self.cached(int(f[1:])) else 0.0 for f in files]

    def prefetch(self, paths):
        self.asked += paths

    def free(self, paths):
        """Records which files were freed and how many indices the sampler had given then."""
        self.freed.append((list(paths), self.taken()))


class FakeFiles:
    """A Silt-like dataset of 40 files `f0`..`f39` over `fs`."""

    def __init__(self, fs):
        self.fs, self.files = fs, [f"f{i}" for i in range(40)]

    def __len__(self):
        return len(self.files)


def test_cache_aware_sampler_prefetches_only_a_window_ahead_of_the_loader():
    # Files 0, 5, 9 are cached.
    ds = FakeFiles(FakeFs(lambda i: i in (0, 5, 9)))
    # A loader that reads each index as it takes it.
    sampler = st.CacheAwareSampler(ds, seed=3, lookahead=8, loader_ahead=0)
    it = iter(sampler)
    assert ds.fs.asked == []  # nothing before the loader takes an index
    taken = []
    for i in it:
        taken.append(i)
        # Never more than `lookahead` samples past the one just taken.
        assert len(ds.fs.asked) <= max(0, len(taken) - 1 + 8 - 3)
    assert sorted(taken) == list(range(40)) and set(taken[:3]) == {0, 5, 9}
    # Every uncached file asked for once, in the order it is read.
    assert ds.fs.asked == [f"f{i}" for i in taken[3:]]
    with pytest.raises(ValueError):
        st.CacheAwareSampler(ds, lookahead=0)


def test_cache_aware_sampler_keeps_its_prefetch_out_of_cached_samples_still_to_be_read():
    """A loader takes indices ahead of its reads: until it has read the cached part, only what
    the cache's free room holds is prefetched (here two files' worth); then a window."""

    # f0..f9 cached; free room for two files.
    ds = FakeFiles(FakeFs(lambda i: i < 10, room=2))
    sampler = st.CacheAwareSampler(ds, seed=5, lookahead=4, loader_ahead=16)
    taken = []
    for i in sampler:
        taken.append(i)
        read_to = len(taken) - 16  # what the loader has read, at most
        if read_to <= 10:
            assert len(ds.fs.asked) <= 2, (len(taken), ds.fs.asked)
    assert sorted(taken) == list(range(40)) and set(taken[:10]) == set(range(10))
    # Each uncached file asked for at most once, in the order it is read.
    assert ds.fs.asked == [f"f{i}" for i in taken[10 : 10 + len(ds.fs.asked)]]
    assert len(ds.fs.asked) > 2
    # The cached part is too short to free samples already read before the uncached come.
    assert ds.fs.freed == []


def test_cache_aware_sampler_makes_room_for_the_first_uncached_samples_before_they_are_read():
    """A full cache (no free room) and a loader taking 4 ahead of its reads: before the
    loader reaches the first uncached sample, the samples it takes before the window starts
    are prefetched, into room made by freeing cached samples it has read (never one still
    to be read)."""

    ds = FakeFiles(FakeFs(lambda i: i < 30, room=0))
    sampler = st.CacheAwareSampler(ds, seed=7, lookahead=4, loader_ahead=4)
    taken = []
    ds.fs.taken = lambda: len(taken)
    asked_when = {}
    for i in sampler:
        for f in ds.fs.asked:
            asked_when.setdefault(f, len(taken))
        taken.append(i)
    assert sorted(taken) == list(range(40)) and set(taken[:30]) == set(range(30))
    [(freed, at)] = ds.fs.freed
    # loader_ahead + lookahead samples' room, from the first cached samples given, each read
    # (at least loader_ahead behind the takes) when freed.
    assert freed == [f"f{i}" for i in taken[:8]]
    assert at - 4 > 8
    # The first uncached samples were asked for before the loader read the first of them
    # (taken at 30, read when 34 are taken), after the room was made.
    first = [f"f{i}" for i in taken[30:38]]
    assert ds.fs.asked[:8] == first
    assert all(asked_when[f] >= at and asked_when[f] < 30 for f in first), (asked_when, at)
    # Every uncached file asked for once, in the order it is read.
    assert ds.fs.asked == [f"f{i}" for i in taken[30:]]


def test_cache_aware_sampler_spreads_the_uncached_samples_when_the_loader_takes_them_all_at_once():
    """A loader taking more indices ahead than the uncached samples that follow the cached ones
    (here 16 ahead of 10): none may be prefetched but the free room's, and left to the end they
    would be read by the last batch's worker alone. The shuffled order is given instead."""

    ds = FakeFiles(FakeFs(lambda i: i < 30, room=2))
    sampler = st.CacheAwareSampler(ds, seed=11, lookahead=4, loader_ahead=16)
    taken = list(sampler)
    shuffled = list(range(40))
    random.Random(11).shuffle(shuffled)
    assert taken == shuffled and sampler.last_cached == 30
    # Only the free room's worth asked for: the first two uncached samples of the order.
    assert ds.fs.asked == [f"f{i}" for i in taken if i >= 30][:2] and ds.fs.freed == []
    # Without prefetching it is the plain reorder, cached first.
    plain = list(st.CacheAwareSampler(ds, seed=11, prefetch=False, loader_ahead=16))
    assert set(plain[:30]) == set(range(30))


def shard(samples):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_shard_dataset_groups_members_by_key(s3, workdir):
    samples = [(f"s{i:04d}", {"jpg": os.urandom(1000 + i), "cls": str(i % 7).encode()}) for i in range(30)]
    s3.put("shards/a-000.tar", shard(samples[:17]))
    s3.put("shards/a-001.tar", shard(samples[17:]))
    s3.put("shards/notes.txt", b"not a shard")
    fs = embedded(s3, workdir)
    try:
        ds = st.ShardDataset("/data/shards", fs=fs)
        assert ds.shards == ["/data/shards/a-000.tar", "/data/shards/a-001.tar"]
        got = list(ds)
        assert [s["__key__"] for s in got] == [k for k, _ in samples]
        assert all(s["jpg"] == f["jpg"] and s["cls"] == f["cls"] for s, (_, f) in zip(got, samples))
        decoded = list(st.ShardDataset("/data/shards", fs=fs, decode=lambda s: int(s["cls"])))
        assert decoded == [i % 7 for i in range(30)]
        # A shard that is not there fails when the walk reaches it (the next shard is opened
        # ahead), after every sample of the shards before it.
        it = iter(st.ShardDataset(["/data/shards/a-000.tar", "/data/shards/gone.tar"], fs=fs))
        assert [next(it)["__key__"] for _ in range(17)] == [k for k, _ in samples[:17]]
        with pytest.raises(FileNotFoundError):
            next(it)
        # Left early: the shard opened ahead is closed with the iterator.
        it = iter(st.ShardDataset("/data/shards", fs=fs))
        assert next(it)["__key__"] == samples[0][0]
        it.close()
    finally:
        fs.close()


def test_a_cached_shard_is_walked_in_its_cache_file_and_a_flipped_byte_is_never_read(s3, workdir, procs):
    """An attached client walks a shard whole in the owner's cache through the cache file's
    map (checked whole first); a byte flipped in that file since makes the walk read through
    the client, which gives the store's bytes."""
    samples = [(f"s{i:04d}", {"jpg": os.urandom(60_000 + i), "cls": str(i % 5).encode()}) for i in range(40)]
    data = shard(samples)
    assert len(data) > 2 << 20  # several pages
    s3.put("shards/a.tar", data)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert fs.client.mode == "attached"

        def walk():
            got = list(st.ShardDataset(["/data/shards/a.tar"], fs=fs))
            assert [s["__key__"] for s in got] == [k for k, _ in samples]
            assert all(s["jpg"] == f["jpg"] and s["cls"] == f["cls"] for s, (_, f) in zip(got, samples))

        with fs.open("/data/shards/a.tar", "rb") as f:
            assert st._whole(f) is f  # not cached yet: read through the client
        walk()
        fs.load("/data/shards/a.tar")
        with fs.open("/data/shards/a.tar", "rb") as f:
            whole = st._whole(f)
            assert whole is not f and whole.read(len(data)) == data
            # Read as a binary file: at the end, nothing; seeks from each end; no negative place.
            assert whole.read(5) == b"" and whole.tell() == len(data)
            assert whole.seek(-7, 2) == len(data) - 7 and whole.read() == data[-7:]
            whole.seek(3)
            assert whole.read(4) == data[3:7] and whole.seek(2, 1) == 9
            with pytest.raises(ValueError):
                whole.seek(-1)
        walk()
        at = len(data) // 2
        with open(owner_cache_file(state, len(data)), "r+b") as c:
            c.seek(at)
            b = c.read(1)
            c.seek(at)
            c.write(bytes([b[0] ^ 0xFF]))
        with fs.open("/data/shards/a.tar", "rb") as f:
            assert st._whole(f) is f
            # The map read as a stream checks what it reads: the flipped page is refused.
            m = f._reader.map()
            assert m.read(1000) == data[:1000]
            with pytest.raises(OSError):
                m.read()
        walk()
        fs.close()
    finally:
        up.stop()


def test_checkpoint_buffer_and_torch_helpers(s3, workdir):
    fs = embedded(s3, workdir)
    try:
        blob = os.urandom(5 << 20)
        fs.pipe_file("/data/ckpt/raw.bin", blob)
        assert st.read_buffer("/data/ckpt/raw.bin", fs=fs) == blob
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            state = {"w": torch.arange(1000, dtype=torch.float32), "step": 7}
            st.save(state, "/data/ckpt/model.pt", fs=fs)
            back = st.load("/data/ckpt/model.pt", fs=fs)
            assert back["step"] == 7 and torch.equal(back["w"], state["w"])
        try:
            from safetensors.torch import load as st_load, save as st_save
        except ImportError:
            st_load = None
        if st_load is not None and torch is not None:
            fs.pipe_file("/data/ckpt/m.safetensors", st_save({"a": torch.ones(3)}))
            assert torch.equal(st_load(st.read_buffer("/data/ckpt/m.safetensors", fs=fs))["a"], torch.ones(3))
    finally:
        fs.close()


def test_silt_torch_imports_without_torch():
    # The parts that need no torch work in an interpreter where importing torch fails.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import silt.torch as st\n"
        "assert st._IterableBase is object and callable(st.CacheAwareSampler)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert silt.torch is st
