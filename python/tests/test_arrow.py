"""pyarrow through silt:// (issue 42): Parquet read whole and by columns equals the local file,
cold and cached, attached to `silt up` with no store credentials and as the single node; the
zero-copy views (`read_buffer`, which pyarrow's Python files use) come from the cache file
itself, are checked page by page, and fall back to the client when a page was changed."""

import os
import subprocess

import pytest

import silt
from test_modes import embedded, owner_cache_file, silt_up

pa = pytest.importorskip("pyarrow", reason="pyarrow is installed by scripts/install-deps.sh")
pq = pytest.importorskip("pyarrow.parquet")


def parquet_bytes(rows=300_000, seed=5):
    """A Parquet file of several row groups and columns of different types (about 10 MB)."""
    import random

    rng = random.Random(seed)
    table = pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "x": pa.array([rng.random() for _ in range(rows)], pa.float64()),
        "label": pa.array([f"class-{rng.randrange(1000)}" for _ in range(rows)]),
        "flag": pa.array([rng.random() < 0.5 for _ in range(rows)]),
    })
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=50_000)
    return sink.getvalue().to_pybytes()


def local_copy(workdir, data):
    path = os.path.join(workdir, "local.parquet")
    with open(path, "wb") as f:
        f.write(data)
    return path


def check_reads(fs, path, local):
    whole = pq.read_table(path, filesystem=fs)
    assert whole.equals(pq.read_table(local))
    two = pq.read_table(path, filesystem=fs, columns=["x", "label"])
    assert two.equals(pq.read_table(local, columns=["x", "label"]))
    # A row-group filter reads a part of the file only.
    some = pq.read_table(path, filesystem=fs, filters=[("id", "<", 1000)])
    assert some.equals(pq.read_table(local, filters=[("id", "<", 1000)]))


def test_parquet_through_an_attached_client_equals_the_local_file(s3, workdir, procs, monkeypatch):
    data = parquet_bytes()
    s3.put("tables/t.parquet", data)
    local = local_copy(workdir, data)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        # No store endpoint or key in this process: the owner serves everything.
        for k in list(os.environ):
            if k.startswith(("AWS_", "SILT_S3_")):
                monkeypatch.delenv(k)
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        assert fs.client.mode == "attached"
        # Cold: nothing cached, the reads go through the client (and fill the owner's cache).
        check_reads(fs, "/data/tables/t.parquet", local)
        fs.load("/data/tables/t.parquet")
        assert fs.residency(["/data/tables/t.parquet"]) == [1.0]
        # Cached whole on this host: pyarrow is handed views of the owner's cache file.
        with fs.open("/data/tables/t.parquet", "rb") as f:
            v = f.read_buffer(4096)
            assert isinstance(v, memoryview) and bytes(v) == data[:4096]
        check_reads(fs, "/data/tables/t.parquet", local)
        # The same through the mount, for comparison with what pyarrow sees locally.
        assert pq.read_table(os.path.join(mnt, "data", "tables", "t.parquet")).equals(pq.read_table(local))
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_parquet_through_a_single_node_equals_the_local_file(s3, workdir):
    data = parquet_bytes(rows=120_000, seed=9)
    s3.put("t.parquet", data)
    local = local_copy(workdir, data)
    fs = embedded(s3, workdir)
    try:
        assert fs.client.mode == "single"
        check_reads(fs, "/data/t.parquet", local)
        fs.load("/data/t.parquet")
        with fs.open("/data/t.parquet", "rb") as f:
            assert isinstance(f.read_buffer(10), memoryview)
        check_reads(fs, "/data/t.parquet", local)
    finally:
        fs.close()


def test_views_are_checked_pinned_and_fall_back_when_a_page_changed(s3, workdir, procs):
    big = os.urandom((3 << 20) + 777)  # four 1 MiB pages, the last one short
    s3.put("big.bin", big)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        fs.load("/data/big.bin")
        f = fs.open("/data/big.bin", "rb")
        first = f.read_buffer(1 << 20)
        assert isinstance(first, memoryview) and first.readonly
        assert first == big[: 1 << 20]
        # Reads past the end stop at it, as read() does.
        f.seek(len(big) - 10)
        assert bytes(f.read_buffer(100)) == big[-10:]
        # A byte flipped in page 2 of the owner's cache file: that page is not handed out
        # as a view; its bytes come through the client, right.
        at = (2 << 20) + 5
        with open(owner_cache_file(state, len(big)), "r+b") as c:
            c.seek(at)
            b = c.read(1)
            c.seek(at)
            c.write(bytes([b[0] ^ 0xFF]))
        f.seek(2 << 20)
        got = f.read_buffer(1 << 20)
        assert not isinstance(got, memoryview)
        assert got == big[2 << 20 : 3 << 20]
        # And no more views from that file, even of a page that would check.
        f.seek(1 << 20)
        again = f.read_buffer(1 << 20)
        assert not isinstance(again, memoryview) and again == big[1 << 20 : 2 << 20]
        # The view given out before still holds the bytes it was checked with, after the file
        # is closed, its cached pages freed and forgotten on the owner, and the client closed
        # (the view keeps the map, and its pin).
        f.close()
        fs.free("/data/big.bin")
        fs.invalidate_cache("/data/big.bin")
        fs.close()
        assert first == big[: 1 << 20]
        with pytest.raises(TypeError):
            first[0] = 0  # read-only
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def test_a_file_not_whole_in_a_cache_reads_as_bytes(s3, workdir, procs):
    s3.put("cold.bin", b"abc" * 1000)
    up, state, mnt = silt_up(s3, workdir, procs)
    try:
        fs = silt.SiltFileSystem(cache_dir=state, skip_instance_cache=True)
        with fs.open("/data/cold.bin", "rb") as f:
            got = f.read_buffer(-1)
        assert bytes(got) == b"abc" * 1000
        fs.close()
    finally:
        up.stop()
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)



def test_a_single_nodes_views_are_not_of_a_cache_file_changed_on_disk(s3, workdir):
    """A single node's views are of its own cache file, trusted as its passthrough opens are:
    a byte flipped in that file since it was verified makes the next open read it back, so
    no view shows the flipped byte."""
    big = os.urandom((2 << 20) + 99)
    s3.put("big.bin", big)
    fs = embedded(s3, workdir)
    try:
        fs.load("/data/big.bin")
        with fs.open("/data/big.bin", "rb") as f:
            assert bytes(f.read_buffer(len(big))) == big
        cache = os.path.join(workdir, "cache")
        files = [os.path.join(d, n) for d, _, ns in os.walk(cache) for n in ns if n.endswith(".data")]
        found = [p for p in files if os.path.getsize(p) == len(big)]
        assert len(found) == 1, files
        with open(found[0], "r+b") as c:
            c.seek(1 << 20)
            b = c.read(1)
            c.seek(1 << 20)
            c.write(bytes([b[0] ^ 0xFF]))
        with fs.open("/data/big.bin", "rb") as f:
            assert bytes(f.read_buffer(len(big))) == big
    finally:
        fs.close()
