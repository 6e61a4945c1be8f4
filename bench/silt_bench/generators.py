"""Deterministic benchmark data, written straight into a bucket directory (versitygw serves
the top-level directories of its data dir as buckets, so no upload is needed).

Every generator takes a seed and returns a manifest: a list of (relative path, size, digest)
sorted by path, where digest is blake2b(digest_size=16) hex of the file's bytes. The bytes
depend only on (generator, parameters, seed): content comes from random.Random streams, never
os.urandom, so the same call on any machine writes the same files.

Speed: drawing every byte from the RNG would be slow for 4 GiB (B1) and 2.2 GB of small files
(B2). Instead each generator draws ONE pool block from its seeded RNG (64 MiB, or less when the
data set is smaller) and derives every file from it cheaply:

- large files: chunk c of file i is the pool rotated by an offset drawn from the RNG, with a
  32-byte stamp (file index, chunk index, seed digest) over its first bytes, so no two chunks
  or files are equal (defeats dedup or accidental caching by content) yet cost only a copy;
- small files: file i is a slice of the pool at an offset drawn from the RNG, with a 32-byte
  stamp at its start (file index, seed digest).

The pool is still random data, so it does not compress.
"""
import hashlib
import math
import os
import random
import struct

POOL = 64 << 20
STAMP = 32
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _rng(seed, name):
    # String seeds are hashed with SHA-512 by random.Random: stable across runs and versions.
    return random.Random(f"silt-bench:{name}:{seed}")


def _pool(rng, size):
    return rng.randbytes(size)


def _stamp(seed, *ints):
    tag = hashlib.blake2b(repr(seed).encode(), digest_size=8).digest()
    head = struct.pack("<" + "Q" * len(ints), *ints) + tag
    return head.ljust(STAMP, b"\0")[:STAMP]


def _write(root, rel, parts):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    h = hashlib.blake2b(digest_size=16)
    n = 0
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)
            h.update(p)
            n += len(p)
    return (rel, n, h.hexdigest())


def large(root, count=4, size=1 << 30, seed=0, chunk=POOL):
    """B1: `count` objects of `size` bytes at large/objNN.bin."""
    rng = _rng(seed, "large")
    pool = _pool(rng, min(chunk, max(size, STAMP)))
    plen = len(pool)
    doubled = pool + pool  # rotation = one slice of the doubled pool
    out = []
    for i in range(count):
        def parts(i=i):
            left, c = size, 0
            while left > 0:
                n = min(plen, left)
                off = rng.randrange(plen)
                block = doubled[off:off + n]
                s = _stamp(seed, i, c)[:n]
                yield s + block[len(s):]
                left -= n
                c += 1
        out.append(_write(root, f"large/obj{i:02}.bin", parts()))
    return sorted(out)


def lognormal_size(rng, median=100_000, sigma=0.44, lo=4 * KiB, hi=1 * MiB):
    """A file size like ImageNet JPEGs: log-normal, median ~100 KB, mean ~110 KB, clipped."""
    return int(min(hi, max(lo, rng.lognormvariate(math.log(median), sigma))))


def imagenet_like(root, files=20000, dirs=100, seed=0, median=100_000, sigma=0.44, lo=4 * KiB, hi=1 * MiB):
    """B2/B4: `files` objects in `dirs` directories, small/dNNN/imgNNNNNN.jpg, sizes log-normal."""
    rng = _rng(seed, "imagenet")
    sizes = [lognormal_size(rng, median, sigma, lo, hi) for _ in range(files)]
    pool = _pool(rng, min(POOL, max(sizes, default=STAMP) * 4 + STAMP))
    plen = len(pool)
    doubled = pool + pool
    out = []
    for i, size in enumerate(sizes):
        off = rng.randrange(plen)
        body = doubled[off:off + size]
        s = _stamp(seed, i)[:size]
        out.append(_write(root, f"small/d{i % dirs:03}/img{i:06}.jpg", [s + body[len(s):]]))
    return sorted(out)


def tree(root, depth=4, fanout=10, seed=0, file_size=1 * KiB):
    """B3: directories `depth - 1` levels deep with `fanout` entries each, and `fanout` files in
    every leaf directory: depth=4, fanout=10 gives 10 x 10 x 10 dirs and 10,000 files."""
    if depth < 1:
        raise ValueError("depth must be >= 1")
    rng = _rng(seed, "tree")
    pool = _pool(rng, max(file_size, STAMP) * 2)
    plen = len(pool)
    doubled = pool + pool
    out = []

    def walk(prefix, level):
        if level == depth - 1:
            for j in range(fanout):
                idx = len(out)
                off = rng.randrange(plen)
                body = doubled[off:off + file_size]
                s = _stamp(seed, idx)[:file_size]
                out.append(_write(root, os.path.join(prefix, f"f{j:02}"), [s + body[len(s):]]))
            return
        for j in range(fanout):
            walk(os.path.join(prefix, f"l{level}_{j:02}"), level + 1)

    walk("tree", 0)
    return sorted(out)


def many_small(root, files=10_000, per_dir=1000, size=512, prefix="many", seed=0):
    """B6: `files` objects of `size` bytes, `per_dir` to a directory: PREFIX/dNNNN/fNNNNNNN."""
    rng = _rng(seed, f"many:{prefix}")
    pool = _pool(rng, max(size, STAMP) * 4)
    plen = len(pool)
    doubled = pool + pool
    out = []
    for i in range(files):
        off = rng.randrange(plen)
        s = _stamp(seed, i)[:size]
        body = doubled[off:off + size]
        out.append(_write(root, f"{prefix}/d{i // per_dir:04}/f{i:07}", [s + body[len(s):]]))
    return sorted(out)


def total_bytes(manifest):
    return sum(size for _, size, _ in manifest)
