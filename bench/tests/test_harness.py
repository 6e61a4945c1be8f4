"""Checks of the benchmark harness itself (generators, statistics, reporting). No timing is
asserted: benchmarks report, tests check correctness. Small parameters: runs in seconds."""
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from silt_bench import generators as gen
from silt_bench import report, stats


def files_on_disk(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


SMALL = {
    "large": dict(count=2, size=3 * gen.MiB + 123, chunk=1 * gen.MiB),
    "imagenet_like": dict(files=300, dirs=7),
    "tree": dict(depth=3, fanout=4),
    "many_small": dict(files=250, per_dir=100, size=300),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_seed_same_manifest_and_bytes(tmp_path, name):
    f = getattr(gen, name)
    m1 = f(str(tmp_path / "a"), seed=42, **SMALL[name])
    m2 = f(str(tmp_path / "b"), seed=42, **SMALL[name])
    assert m1 == m2 and m1
    b1, b2 = files_on_disk(tmp_path / "a"), files_on_disk(tmp_path / "b")
    assert b1 == b2
    # The manifest describes exactly what is on disk.
    assert sorted(b1) == [p for p, _, _ in m1]
    for p, size, digest in m1:
        assert len(b1[p]) == size
        assert hashlib.blake2b(b1[p], digest_size=16).hexdigest() == digest


@pytest.mark.parametrize("name", sorted(SMALL))
def test_different_seed_different_bytes(tmp_path, name):
    f = getattr(gen, name)
    m1 = f(str(tmp_path / "a"), seed=1, **SMALL[name])
    m2 = f(str(tmp_path / "b"), seed=2, **SMALL[name])
    assert [d for _, _, d in m1] != [d for _, _, d in m2]
    # Every file differs, not just one.
    assert all(a[2] != b[2] for a, b in zip(m1, m2) if a[1] == b[1])


def test_files_within_a_run_differ(tmp_path):
    m = gen.large(str(tmp_path), count=3, size=2 * gen.MiB, seed=5, chunk=1 * gen.MiB)
    assert len({d for _, _, d in m}) == 3
    data = (tmp_path / "large/obj00.bin").read_bytes()
    assert data[:gen.MiB] != data[gen.MiB:]  # chunks of one file differ too
    m = gen.imagenet_like(str(tmp_path / "s"), files=200, dirs=4, seed=5)
    assert len({d for _, _, d in m}) == 200


def test_large_sizes_and_names(tmp_path):
    m = gen.large(str(tmp_path), count=3, size=5 * gen.MiB + 7, seed=0, chunk=2 * gen.MiB)
    assert [p for p, _, _ in m] == ["large/obj00.bin", "large/obj01.bin", "large/obj02.bin"]
    assert all(s == 5 * gen.MiB + 7 for _, s, _ in m)
    assert gen.total_bytes(m) == 3 * (5 * gen.MiB + 7)


def test_imagenet_like_sizes_counts_and_spread(tmp_path):
    m = gen.imagenet_like(str(tmp_path), files=2000, dirs=100, seed=3)
    assert len(m) == 2000
    sizes = sorted(s for _, s, _ in m)
    assert sizes[0] >= 4 * gen.KiB and sizes[-1] <= gen.MiB
    median = sizes[len(sizes) // 2]
    mean = sum(sizes) / len(sizes)
    assert 90_000 <= median <= 110_000
    assert 100_000 <= mean <= 120_000
    dirs = {os.path.dirname(p) for p, _, _ in m}
    assert len(dirs) == 100 and all(d.startswith("small/d") for d in dirs)
    assert len(set(sizes)) > 1000  # a spread, not a constant


def test_lognormal_clipping():
    import random
    rng = random.Random(0)
    s = [gen.lognormal_size(rng, median=100_000, sigma=3.0) for _ in range(2000)]
    assert min(s) == 4 * gen.KiB and max(s) == gen.MiB


def test_tree_shape_small(tmp_path):
    m = gen.tree(str(tmp_path), depth=3, fanout=4, seed=0, file_size=100)
    assert len(m) == 4 ** 3
    leaves = {os.path.dirname(p) for p, _, _ in m}
    assert len(leaves) == 4 ** 2
    assert all(p.count("/") == 3 for p, _, _ in m)  # tree/l0_xx/l1_xx/fxx
    all_dirs = [d for d, _, _ in os.walk(tmp_path)]
    assert len(all_dirs) == 1 + 1 + 4 + 16  # tmp root, tree/, level 0, level 1


def test_tree_default_is_ten_thousand_files_in_a_thousand_dirs(tmp_path):
    m = gen.tree(str(tmp_path), seed=0, file_size=16)
    assert len(m) == 10_000
    assert len({os.path.dirname(p) for p, _, _ in m}) == 1_000
    assert sum(len(n) for _, _, n in os.walk(tmp_path)) == 10_000


def test_median_min_max_and_ratio():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.min_max([3, 1, 2]) == (1, 3)
    s = stats.summary([1.0, 5.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 5.0, "runs": [1.0, 5.0, 2.0]}
    assert stats.ratio_of_medians([1, 2, 9], [4, 4, 100]) == pytest.approx(0.5)
    assert stats.ratio_of_medians(3.0, [1, 2, 3]) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        stats.median([])
    with pytest.raises(ZeroDivisionError):
        stats.ratio_of_medians([1], [0])


def test_goal_table_matches_brief():
    g = stats.GOALS_BY_ID
    assert (g["B1 warm"].goal, g["B1 warm"].direction) == (0.90, ">=")
    assert (g["B1 cold"].goal, g["B1 cold single"].goal) == (1.0, 4.0)
    assert (g["B2 warm"].goal, g["B2 cold"].goal) == (0.5, 1.0)
    assert (g["B3 second"].goal, g["B3 second"].direction) == (1.5, "<=")
    assert g["B3 first"].goal == 1.2
    assert (g["B4 cached"].goal, g["B4 hit ratio"].goal) == (0.97, 0.45)
    assert g["B5"].goal == 0.6 and g["B5 memory"].goal == pytest.approx(1.10)
    assert g["B6 per file"].goal == 300 and g["B6 rebalance"].goal == pytest.approx(0.25)
    assert len({x.id for x in stats.GOALS}) == len(stats.GOALS)


def test_gap_wording():
    assert stats.describe("B1 cold", 0.42) == "0.42 of best direct parallel reader, goal ≥ 1.0: gap 0.58"
    assert stats.describe("B1 warm", 0.97) == "0.97 of local page cache, goal ≥ 0.90: met (+0.07)"
    assert stats.describe("B3 second", 1.8) == "1.80 × local walk, goal ≤ 1.5: gap 0.30"
    assert stats.describe("B6 per file", 250) == "250 bytes of worker memory per cached file, goal ≤ 300: met (+50)"
    g = stats.GOALS_BY_ID["B1 cold"]
    assert g.gap(0.42) == pytest.approx(0.58) and g.gap(1.2) == 0 and g.met(1.0)
    lines = stats.gaps({"B2 cold": 1.38, "B1 warm": 0.46, "not a goal": 1})
    assert lines == [stats.describe("B1 warm", 0.46), stats.describe("B2 cold", 1.38)]


def sample_doc():
    return report.build({"b1_warm_1": [1.0, 1.2, 1.1], "b1_local_1": [2.0, 2.1, 2.2]},
                        {"B1 warm": 0.5, "B2 cold": 1.38, "B3 second": 1.8, "free ratio": 3.0},
                        "remote", {"quick": True}, units={"b1_warm_1": "GB/s"})


def test_json_round_trip(tmp_path):
    doc = sample_doc()
    p = report.write_json(doc, str(tmp_path / "r.json"))
    back = report.read_json(p)
    assert back == json.loads(json.dumps(doc))
    assert back["results"]["b1_warm_1"] == {"median": 1.1, "min": 1.0, "max": 1.2, "runs": [1.0, 1.2, 1.1], "unit": "GB/s"}
    m = back["machine"]
    assert m["cpus"] == os.cpu_count() and m["node"] and m["kernel"]
    assert back["profile"] == "remote" and "commit" in back
    assert back["goals"][0] == "0.50 of local page cache, goal ≥ 0.90: gap 0.40"


def test_table_mentions_every_figure():
    t = report.table(sample_doc())
    for k in ("b1_warm_1", "b1_local_1", "B1 warm", "free ratio", "gap 0.40", "met"):
        assert k in t


def test_svg_written_and_well_formed(tmp_path):
    doc = sample_doc()
    paths = report.write_all(doc, str(tmp_path), prefer_png=False)
    assert doc["picture"]["kind"] == "svg" and paths["picture"].endswith(".svg")
    root = ET.parse(paths["picture"]).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall("{http://www.w3.org/2000/svg}rect")) == 3  # one bar per goal ratio
    assert report.read_json(paths["json"])["picture"] == doc["picture"]


def test_picture_always_produced(tmp_path):
    doc = sample_doc()
    pic = report.picture(doc, str(tmp_path / "p"))
    assert pic["kind"] in ("png", "svg") and os.path.getsize(pic["path"]) > 0


def goal_doc():
    # "B1 warm" 0.97 meets ≥ 0.90 (green); "B3 second" 1.8 misses ≤ 1.5 (red); "free" has no goal.
    return report.build({"b1_warm_1": [1.0, 1.1]}, {"B1 warm": 0.97, "B3 second": 1.8, "free": 2.0}, "local")


def test_png_drawn_with_pillow_when_no_matplotlib(tmp_path, monkeypatch):
    Image = pytest.importorskip("PIL.Image")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" now raises ImportError
    doc = goal_doc()
    pic = report.picture(doc, str(tmp_path / "p"))
    assert pic == {"kind": "png", "path": str(tmp_path / "p.png"), "drawn_with": "pillow"}
    assert doc["picture"] is pic
    with Image.open(pic["path"]) as im:
        assert im.format == "PNG"
        assert 800 <= im.width <= 1000 and 60 <= im.height <= 400
        colours = {c for _, c in im.convert("RGB").getcolors(im.width * im.height)}
    assert (0x2e, 0x7d, 0x32) in colours and (0xc6, 0x28, 0x28) in colours  # met and missed bars
    assert (255, 255, 255) in colours and (0, 0, 0) in colours  # background, goal ticks


def test_png_pillow_without_goal_rows(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    doc = report.build({}, {"free": 2.0}, "local")
    p = report.png_pillow(doc, str(tmp_path / "empty.png"))
    with Image.open(p) as im:
        assert im.format == "PNG"
        colours = {c for _, c in im.convert("RGB").getcolors(im.width * im.height)}
    assert (0x2e, 0x7d, 0x32) not in colours and (0xc6, 0x28, 0x28) not in colours


def test_svg_fallback_when_png_not_preferred(tmp_path):
    doc = goal_doc()
    pic = report.picture(doc, str(tmp_path / "s"), prefer_png=False)
    assert pic == {"kind": "svg", "path": str(tmp_path / "s.svg")} and doc["picture"] is pic
    root = ET.parse(pic["path"]).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    fills = [r.get("fill") for r in root.findall("{http://www.w3.org/2000/svg}rect")]
    assert fills == ["#2e7d32", "#c62828"]


# ---------------------------------------------------------------- scenarios' own machinery

from silt_bench import mech, scenarios, train  # noqa: E402


class _Store:
    def __init__(self, local_dir):
        self.local_dir = local_dir

    def local(self, rel):
        return os.path.join(self.local_dir, rel)


def _ctx_with_data(tmp_path):
    src = str(tmp_path / "src")
    ctx = scenarios.Ctx(_Store(src), str(tmp_path / "work"), reps=1, quick=True)
    ctx.manifests["small"] = gen.imagenet_like(src, files=40, dirs=4, seed=1)
    ctx.manifests["tree"] = gen.tree(src, depth=2, fanout=3, seed=1, file_size=10)
    return src, ctx


def test_compare_mount_accepts_the_same_bytes_and_rejects_others(tmp_path):
    import shutil
    src, ctx = _ctx_with_data(tmp_path)
    peer = str(tmp_path / "peer")
    shutil.copytree(src, peer)
    ctx.compare = peer
    scenarios.check_compare_mount(ctx)  # identical copy: accepted
    rel, size, _ = ctx.manifests["small"][5]
    with open(os.path.join(peer, rel), "r+b") as f:  # same size, one byte differs
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ValueError, match="differs"):
        scenarios.check_compare_mount(ctx, sample=len(ctx.manifests["small"]))
    with open(os.path.join(peer, rel), "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="bytes, expected"):
        scenarios.check_compare_mount(ctx)
    os.remove(os.path.join(peer, rel))
    with pytest.raises(ValueError, match="missing"):
        scenarios.check_compare_mount(ctx)


def test_walk_counts_every_entry(tmp_path):
    gen.tree(str(tmp_path), depth=3, fanout=3, seed=0, file_size=8)
    n, secs = mech.walk(str(tmp_path / "tree"))
    assert n == 3 + 9 + 27 and secs >= 0


def test_b5_shape_budget_and_tool_arguments():
    full, quick = scenarios.b5_params(False), scenarios.b5_params(True)
    assert full["writers"] * full["partitions"] * full["part_size"] >= 2 << 30  # ≥ 2 GiB in all
    assert (full["writers"], full["partitions"], full["readers"]) == (32, 64, 32)
    assert full["write_memory"] < full["writers"] * full["partitions"] * full["part_size"]  # it spills
    assert quick["write_memory"] < quick["writers"] * quick["partitions"] * quick["part_size"]
    args = scenarios.shuffle_args(full)
    assert args[args.index("--part-size") + 1] == str(1 << 20)
    assert scenarios.upload_args(quick)[:2] == ["--files", "8"]
    assert scenarios.shuffle_gbps({"bytes": 10**9, "write_s": 1.0, "read_s": 1.0}) == pytest.approx(1.0)


def test_shuffle_tool_reports_its_error(monkeypatch):
    def run(cmd, **kw):
        assert cmd[1] == "shuffle" and kw["env"] is None
        return subprocess.CompletedProcess(cmd, 1, "", "noise\nsilt-bench: error: write /m/w000/p000: Read-only file system\n")
    monkeypatch.setattr(scenarios.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="Read-only file system"):
        scenarios.shuffle_tool(None, ["--mode", "dir"])
    ok = '{"bytes": 4, "write_s": 1, "read_s": 1}'
    monkeypatch.setattr(scenarios.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, ok + "\n", ""))
    assert scenarios.shuffle_tool(None, [])["bytes"] == 4


def test_b5_ratios():
    ctx = scenarios.Ctx(None, "/nonexistent", reps=3)
    for name, runs in {"b5_tmpfs": [1.0, 2.0, 3.0], "b5_mount": [0.5, 1.0, 1.5], "b5_client": [3, 3, 3],
                       "b5_mount_peak_rss_over_budget": [0.9, 1.2, 1.0],
                       "b5_client_peak_rss_over_budget": [0.5, 0.6, 0.4],
                       "b5_direct_upload": [0.2, 0.2, 0.2], "b5_through": [0.1, 0.15, 0.2],
                       "b5_back": [0.1, 0.1, 0.1], "b5_back_ack": [1.0, 1.0, 1.0]}.items():
        for v in runs:
            ctx.add(name, v, "x")
    r = scenarios.ratios(ctx)
    assert r["B5"] == pytest.approx(0.5) and r["B5 client"] == pytest.approx(1.5)
    assert r["B5 memory"] == pytest.approx(1.2)  # the worst repetition
    assert r["B5 client memory"] == pytest.approx(0.6)
    assert r["B5 through ÷ direct"] == pytest.approx(0.75)
    assert r["B5 back ÷ direct"] == pytest.approx(0.5)
    assert r["B5 back acknowledged ÷ direct"] == pytest.approx(5.0)
    assert stats.GOALS_BY_ID["B5 client"].goal == 0.6 and "B5 through ÷ direct" not in stats.GOALS_BY_ID
    # Nothing through the mount (the FUSE write path missing): no mount ratio is claimed.
    ctx = scenarios.Ctx(None, "/nonexistent", reps=1)
    ctx.add("b5_tmpfs", 1.0, "GB/s")
    ctx.add("b5_client", 0.7, "GB/s")
    r = scenarios.ratios(ctx)
    assert "B5" not in r and "B5 memory" not in r and r["B5 client"] == pytest.approx(0.7)


def test_training_loop_reads_every_sample_each_epoch(tmp_path):
    m = gen.imagenet_like(str(tmp_path), files=30, dirs=3, seed=2)
    items = [(str(tmp_path / p), s) for p, s, _ in m]
    seen = []
    epochs = train.run(items, epochs=2, batch_size=4, workers=2, prefetch=2, compute_s=0,
                       before_epoch=seen.append, after_epoch=seen.append)
    assert seen == [0, 0, 1, 1]
    assert [e["samples"] for e in epochs] == [30, 30]
    assert all(e["bytes"] == gen.total_bytes(m) for e in epochs)
    syn = train.run([(None, s) for _, s, _ in m], epochs=1, batch_size=4, workers=2, compute_s=0, synthetic=True)
    assert syn[0]["bytes"] == gen.total_bytes(m)
    # Shuffled differently per epoch, deterministically per seed.
    assert train.epoch_order(30, 0, 0) != train.epoch_order(30, 0, 1)
    assert train.epoch_order(30, 0, 1) == train.epoch_order(30, 0, 1)
    # The permutation CacheAwareSampler(seed=3) shuffles in its epoch 2 (see epoch_order).
    expected = list(range(30))
    random.Random(3 + 2).shuffle(expected)
    assert train.epoch_order(30, 3, 2) == expected


def test_training_loop_takes_a_samplers_indices_as_it_dispatches(tmp_path):
    m = gen.imagenet_like(str(tmp_path), files=30, dirs=3, seed=2)
    items = [(str(tmp_path / p), s) for p, s, _ in m]
    taken = []

    class Sampler:  # each epoch a permutation, handed out lazily
        def __iter__(self):
            for i in reversed(range(len(items))):
                taken.append(i)
                yield i

    epochs = train.run(items, epochs=2, batch_size=4, workers=2, prefetch=2, compute_s=0, sampler=Sampler())
    assert [e["bytes"] for e in epochs] == [gen.total_bytes(m)] * 2
    assert taken == list(reversed(range(30))) * 2


def test_parse_size():
    assert mech.parse_size("1GiB") == 1 << 30 and mech.parse_size("256MiB") == 256 << 20
    assert mech.parse_size("4096") == 4096


def test_silt_option_reads_the_budget_a_run_was_given():
    assert scenarios.silt_option([], "--buffer-memory", "256MiB") == "256MiB"
    assert scenarios.silt_option(["--buffer-memory", "1GiB"], "--buffer-memory", "x") == "1GiB"
    assert scenarios.silt_option(["--buffer-memory=64MiB", "--y"], "--buffer-memory", "x") == "64MiB"
    assert scenarios.silt_option(["--buffer-memory"], "--buffer-memory", "x") == "x"


def test_b1f_ratios_and_cpu_per_gb():
    ctx = scenarios.Ctx(None, "/nonexistent", reps=1)
    for k, v, u in [("b1f_direct_4", 2.0, "GB/s"), ("b1f_cold_4", 0.5, "GB/s"), ("b1f_direct_1", 1.0, "GB/s"),
                    ("b1f_cold_1", 0.25, "GB/s"), ("b1f_cold_4_cpu_per_gb", 3.5, "s/GB"),
                    ("b1f_cold_4_peak_rss_of_budget", 0.9, "×"), ("b1f_cold_4_peak_rss_of_budget", 1.2, "×"),
                    ("b1f_cold_direct_io_4", 1.0, "GB/s"), ("b1f_cold_direct_io_4_cpu_per_gb", 0.9, "s/GB"),
                    ("b1f_cold_direct_io_4_peak_rss_of_budget", 1.3, "×"), ("b1f_cold_open_fill_4", 1.5, "GB/s"),
                    ("b1f_cold_open_fill_4_cpu_per_gb", 0.7, "s/GB"), ("b1f_cold_open_fill_4_peak_rss_of_budget", 1.1, "×"),
                    ("b1f_cold_direct_both_4", 1.2, "GB/s"), ("b1f_cold_direct_both_4_cpu_per_gb", 0.6, "s/GB"),
                    ("b1f_cold_source_4", 1.8, "GB/s"), ("b1f_cold_source_4_cpu_per_gb", 0.4, "s/GB"),
                    ("b1f_cold_source_4_until_cached", 1.0, "GB/s")]:
        ctx.add(k, v, u)
    r = scenarios.ratios(ctx)
    assert r["B1F cold"] == pytest.approx(0.25) and r["B1F cold single"] == pytest.approx(0.25)
    assert r["B1F CPU per GB"] == pytest.approx(3.5)
    assert r["B1F cold, fuse_cold_direct_io"] == pytest.approx(0.5)
    assert r["B1F CPU per GB, fuse_cold_direct_io"] == pytest.approx(0.9)
    assert r["B1F cold, fuse_open_fill_max"] == pytest.approx(0.75)
    assert r["B1F CPU per GB, fuse_open_fill_max"] == pytest.approx(0.7)
    assert r["B1F cold, fuse_cold_direct_io + disk_direct_io"] == pytest.approx(0.6)
    assert r["B1F CPU per GB, fuse_cold_direct_io + disk_direct_io"] == pytest.approx(0.6)
    assert r["B1F cold, fuse_source_passthrough"] == pytest.approx(0.9)
    assert r["B1F cold until cached, fuse_source_passthrough"] == pytest.approx(0.5)
    assert r["B1F CPU per GB, fuse_source_passthrough"] == pytest.approx(0.4)
    assert "B1F cold until cached" not in r, "no until-cached figure where nothing was filled behind"
    assert r["B1F peak RSS ÷ budget, 4 readers"] == pytest.approx(1.3), "the worst run of any variant counts"
    lines = stats.gaps(r)
    assert any(line.startswith("3.50 daemon CPU seconds") and "gap 2.70" in line for line in lines), lines


def test_scenario_ratios_from_medians():
    ctx = scenarios.Ctx(None, "/nonexistent", reps=3)
    for name, runs in {"b1_warm_1": [9, 10, 11], "b1_local_1": [20, 20, 20], "b3_first": [3, 4, 5],
                       "b3_direct_list": [2, 2, 2], "b4_synthetic": [100, 100, 100],
                       "b4_full_e1": [10, 10, 10], "b4_full_e2": [96, 98, 90], "b4_full_e3": [98, 96, 92],
                       "b4_half_e2": [50, 50, 50], "b4_half_e3": [50, 50, 50],
                       "b4_half_hit_e2": [0.5, 0.4, 0.6], "b4_half_hit_e3": [0.3, 0.45, 0.4],
                       "b6_bytes_per_file_1000": [-50], "b6_bytes_per_file_100000": [250]}.items():
        for v in runs:
            ctx.add(name, v, "x")
    r = scenarios.ratios(ctx)
    assert r["B1 warm"] == pytest.approx(0.5)
    assert r["B3 first"] == pytest.approx(2.0)
    assert r["B4 cached"] == pytest.approx(0.97)  # medians of per-rep means of epochs 2-3: 97, 97, 91
    assert r["B4 cold epoch"] == pytest.approx(0.1)
    assert r["B4 hit ratio"] == pytest.approx(0.4)  # the worse of the two epochs' medians
    assert r["B6 per file"] == 250  # the largest file set
    assert "B2 warm" not in r and "B2 warm peer" not in r  # nothing measured, nothing claimed


def test_b3p_percentile_policy_names_and_sample(tmp_path):
    assert scenarios.percentile(list(range(1, 501)), 0.99) == 495  # nearest rank
    assert scenarios.percentile([3.0], 0.99) == 3.0
    assert scenarios.percentile([5, 1, 3], 0.5) == 3
    assert [scenarios.policy_key(p) for p in scenarios.B3P_POLICIES] == ["never", "interval_1h", "always"]
    assert "B3P" in scenarios.SCENARIOS
    _, ctx = _ctx_with_data(tmp_path)
    sample = scenarios.b3p_sample(ctx)
    files = {os.path.relpath(p, "tree") for p, _, _ in ctx.manifests["tree"]}
    # Quick: 100 files at most (this tree has 3 x 3 = 9); relative to the tree; same every call.
    assert len(sample) == min(100, len(files)) and set(sample) <= files
    assert sample == scenarios.b3p_sample(ctx)


def test_open_stat_times_every_path(tmp_path):
    gen.tree(str(tmp_path), depth=2, fanout=3, seed=0, file_size=8)
    paths = [str(tmp_path / "tree" / d / f) for d in sorted(os.listdir(tmp_path / "tree"))
             for f in sorted(os.listdir(tmp_path / "tree" / d))]
    lat = mech.open_stat(paths)
    assert len(lat) == 9 and all(x >= 0 for x in lat)
    with pytest.raises(FileNotFoundError):
        mech.open_stat([str(tmp_path / "missing")])


def test_b3p_figures_and_ratios(monkeypatch):
    ctx = scenarios.Ctx(None, "/nonexistent", reps=1)
    # 1..10 ms, shuffled: nearest-rank p50 is the 5th smallest (a median would say 5.5), p99 the
    # largest.
    lat = [x / 1000 for x in (7, 2, 10, 5, 1, 9, 3, 6, 4, 8)]
    monkeypatch.setattr(scenarios.mech, "open_stat", lambda paths: list(lat))
    assert scenarios._open_stat_figures(ctx, "local", ["p"] * 10) == lat
    assert ctx.units["b3p_local_p50_ms"] == "ms" and ctx.units["b3p_local_p99_ms"] == "ms"
    assert ctx.results["b3p_local_p50_ms"] == [pytest.approx(5.0)]
    assert ctx.results["b3p_local_p99_ms"] == [pytest.approx(10.0)]
    ctx.results["b3p_local_p50_ms"] = [0.01]
    ctx.add("b3p_always_p50_ms", 30.0, "ms")
    ctx.add("b3p_never_dropped_p50_ms", 0.05, "ms")
    r = scenarios.ratios(ctx)
    assert r["B3P open+stat p50, always ÷ local"] == pytest.approx(3000)
    assert r["B3P open+stat p50, never_dropped ÷ local"] == pytest.approx(5)
    assert "B3P open+stat p50, cold ÷ local" not in r  # not measured, not claimed
    assert not any(k in stats.GOALS_BY_ID for k in r if k.startswith("B3P"))  # no goal in the brief


def test_cluster_ratios_names_and_arithmetic():
    results = {"b1_cold_4": [0.2, 0.2, 0.2], "cluster_b1_cold_4": [0.1, 0.15, 0.2], "b1_direct_parallel": [0.3, 0.3, 0.3],
               "b1_warm_1": [2, 2, 2], "cluster_b1_warm_1": [0.4, 0.5, 0.6], "b1_local_1": [10, 10, 10],
               "b2_cold": [200, 250, 300], "cluster_b2_cold": [100, 100, 100], "b2_direct": [80, 80, 80],
               # a figure the cluster did not measure: no ratio claims it
               "b2_warm": [1000]}
    r = scenarios.cluster_ratios(results, 3)
    assert r["B1 cold ÷ direct parallel (cluster 3)"] == pytest.approx(0.5)
    assert r["B1 cold: cluster 3 ÷ single node"] == pytest.approx(0.75)
    assert r["B1 warm ÷ local page cache (cluster 3)"] == pytest.approx(0.05)
    assert r["B1 warm: cluster 3 ÷ single node"] == pytest.approx(0.25)
    assert r["B2 cold ÷ direct (cluster 3)"] == pytest.approx(1.25)
    assert r["B2 cold: cluster 3 ÷ single node"] == pytest.approx(0.4)
    assert len(r) == 6
    # Without the single node's figure or the baseline, only the ratio that can be computed.
    r = scenarios.cluster_ratios({"cluster_b2_warm": [50], "b2_local": [100]}, 2)
    assert r == {"B2 warm ÷ local (cluster 2)": pytest.approx(0.5)}
    # With every figure present: two ratios per pair, no two with the same name.
    every = {}
    for single, _, base, _ in scenarios.CLUSTER_PAIRS:
        every.update({single: [1.0], base: [2.0], scenarios.cluster_figure(single): [0.5]})
    r = scenarios.cluster_ratios(every, 3)
    assert len(r) == 2 * len(scenarios.CLUSTER_PAIRS)
    assert all(k.endswith("(cluster 3)") or "cluster 3 ÷ single node" in k for k in r)


def test_cluster_tls_ratios_need_both_variants():
    results = {"cluster_tcp_b1_cold_4": [0.4, 0.5, 0.6], "cluster_tls_b1_cold_4": [0.3, 0.4, 0.5],
               "cluster_tls_b1_warm_1": [1.0]}  # no plaintext figure: no ratio
    r = scenarios.cluster_ratios(results, 2)
    assert r == {"B1 cold: TLS ÷ plaintext TCP (cluster 2)": pytest.approx(0.8)}
    assert scenarios.cluster_figure("b1_warm_4", "tls") == "cluster_tls_b1_warm_4"
    assert scenarios.CLUSTER_VARIANTS["tls"][-2:] == ["--cluster-tls", "true"]
    assert "--cluster-tls" not in scenarios.CLUSTER_VARIANTS["tcp"]


def test_cluster_counters_per_worker_and_phase_names():
    assert scenarios._phase("cold", True, True) == "cold B1 4 readers + B2"
    assert scenarios._phase("warm", True, False) == "warm B1 4 readers"
    assert scenarios._phase("warm", False, True) == "warm B2"

    class FakeCluster:
        def report(self):
            mib = 2**20
            return {"cluster": {"workers": [
                        {"id": "w2", "live": True, "bytes_served": 5 * mib, "ufs_read_bytes": 1 * mib},
                        {"id": "w1", "live": False, "bytes_served": 3 * mib, "ufs_read_bytes": 2 * mib}]},
                    "metrics": {"silt_remote_reads_total": 7, scenarios.UFS_READ_BYTES: 4 * mib},
                    "opens": {"passthrough": 1, "daemon": 3}}

    ctx = scenarios.Ctx(None, "/nonexistent", reps=1)
    phase = scenarios._phase("warm", True, True)
    scenarios._cluster_counters(ctx, FakeCluster(), phase, {"silt_remote_reads_total": 2},
                                {"w1": {"bytes_served": 2**20}})
    c = {k: v[0] for k, v in ctx.counters.items()}
    p = "cluster warm B1 4 readers + B2:"
    # One counter per worker and key, named by the worker's id (not one list mixing workers).
    assert c[f"{p} worker w1 bytes_served (MiB)"] == 2 and c[f"{p} worker w2 bytes_served (MiB)"] == 5
    assert c[f"{p} worker w1 ufs_read_bytes (MiB)"] == 2 and c[f"{p} worker w2 ufs_read_bytes (MiB)"] == 1
    assert all(len(v) == 1 for v in ctx.counters.values())
    assert c[f"{p} live workers"] == 1
    assert c[f"{p} client silt_remote_reads_total"] == 5
    assert c[f"{p} client {scenarios.UFS_READ_BYTES} (MiB)"] == 4
    assert c[f"{p} client passthrough opens / all opens"] == pytest.approx(0.25)


def test_cluster_ratios_only_with_cluster_and_no_goal_row():
    ctx = scenarios.Ctx(None, "/nonexistent", reps=1)
    for name, v in {"b1_cold_4": 0.2, "b1_direct_parallel": 0.2, "cluster_b1_cold_4": 0.1}.items():
        ctx.add(name, v, "GB/s")
    assert not any("cluster" in k for k in scenarios.ratios(ctx))
    ctx.cluster = 4
    r = scenarios.ratios(ctx)
    assert r["B1 cold"] == pytest.approx(1.0)
    assert r["B1 cold ÷ direct parallel (cluster 4)"] == pytest.approx(0.5)
    # Cluster ratios are reported, not held against the single node's goals.
    assert not any(k in stats.GOALS_BY_ID for k in r if "cluster" in k)
    assert len(stats.gaps(r)) == 1


def test_wait_for_line_sees_the_ready_line_or_the_exit(tmp_path):
    import subprocess
    log = open(tmp_path / "log", "a")
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('starting', file=sys.stderr); "
                          "print('silt: serving as worker w1', file=sys.stderr)"], stderr=subprocess.PIPE, text=True)
    mech._wait_for_line(p, "silt: serving as worker", log, "w1")
    p.wait()
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('error: no', file=sys.stderr); sys.exit(3)"],
                         stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="did not come up"):
        mech._wait_for_line(p, "silt: serving", log, "client")
    p.wait()
    log.close()
    text = (tmp_path / "log").read_text()
    assert "starting" in text and "error: no" in text


@pytest.mark.skipif(not mech.ETCD, reason="no etcd binary")
def test_etcd_starts_healthy_and_stops(tmp_path):
    e = mech.Etcd(str(tmp_path / "etcd"))
    try:
        assert mech.etcd_healthy(e.endpoint)
        assert e.p in mech._LIVE
    finally:
        mech.stop_all()  # the run's last-resort clean-up stops it too
    assert e.p.poll() is not None and e.p not in mech._LIVE
    assert not mech.etcd_healthy(e.endpoint)


# ---------------------------------------------------------------- G: the S3 gateway

def test_g_ratios_goals_and_nothing_unmeasured_claimed():
    ctx = scenarios.Ctx(None, "/nonexistent", reps=3)
    for name, runs in {"g_gateway_large": [1.0, 1.2, 1.1], "g_local_s3_large": [1.0, 1.0, 1.0],
                       "g_gateway_small": [900, 1000, 1100], "g_local_s3_small": [600, 600, 600],
                       "g_gateway_cold_large": [0.2, 0.2, 0.2], "g_direct_large": [0.25, 0.2, 0.15],
                       "g_gateway_list_first": [1.5, 1.5, 1.5], "g_gateway_list": [0.3, 0.3, 0.3],
                       "g_direct_list": [0.6, 0.6, 0.6], "g_local_s3_list": [0.1, 0.1, 0.1]}.items():
        for v in runs:
            ctx.add(name, v, "x")
    r = scenarios.ratios(ctx)
    assert r["G cached large"] == pytest.approx(1.1)
    assert r["G cached small"] == pytest.approx(1000 / 600)
    assert r["G cold ÷ direct GET"] == pytest.approx(1.0)
    assert r["G list ÷ direct list"] == pytest.approx(0.5)
    assert r["G first list ÷ direct list"] == pytest.approx(2.5)
    assert r["G list ÷ unshaped local list"] == pytest.approx(3.0)
    g = stats.GOALS_BY_ID
    assert (g["G cached large"].goal, g["G cached large"].direction) == (1.0, ">=")
    assert (g["G cached small"].goal, g["G cached small"].direction) == (2.0, ">=")
    # Goals on the cached reads only: the cold read and the listings are reported, not judged.
    assert [k for k in r if k in g] == ["G cached large", "G cached small"]
    lines = stats.gaps(r)
    assert "1.10 of unshaped local S3 (8 × 8 MiB ranged GETs), goal ≥ 1.0: met (+0.10)" in lines
    assert "1.67 × unshaped local S3 (objects/s, 8 threads), goal ≥ 2.0: gap 0.33" in lines
    # Only the gateway side measured (e.g. the baseline failed): no ratio is claimed.
    ctx = scenarios.Ctx(None, "/nonexistent", reps=1)
    ctx.add("g_gateway_large", 1.0, "GB/s")
    assert not any(k.startswith("G ") for k in scenarios.ratios(ctx))


def test_g_sides_swap_every_other_repetition_and_data_is_generated():
    assert scenarios._sides(0, "a", "b") == ("a", "b")
    assert scenarios._sides(1, "a", "b") == ("b", "a")
    assert scenarios._sides(2, "a", "b") == ("a", "b")
    assert "G" in scenarios.SCENARIOS


def test_g_generates_b1_b2_and_b3_data(tmp_path, monkeypatch):
    calls = []
    for name in ("large", "imagenet_like", "tree"):
        monkeypatch.setattr(scenarios.generators, name, lambda root, _n=name, **kw: calls.append(_n) or [])
    ctx = scenarios.Ctx(_Store(str(tmp_path)), str(tmp_path), quick=True)
    scenarios.generate(ctx, {"G"})
    assert sorted(calls) == ["imagenet_like", "large", "tree"]
    assert set(ctx.manifests) == {"large", "small", "tree"}


def _fake_silt(tmp_path, gateway_line=True):
    """A stand-in `silt` that prints what `silt up --gateway` prints, then waits to be killed."""
    script = tmp_path / "silt"
    script.write_text(f"""#!{sys.executable}
import os, sys, time
print("args: " + " ".join(sys.argv[1:]), file=sys.stderr)
print("key: " + os.environ.get("SILT_GATEWAY_ACCESS_KEY", "-"), file=sys.stderr)
if {gateway_line!r}:
    print("silt: S3 gateway at http://127.0.0.1:4321", file=sys.stderr)
print("silt: serving /data=s3://bench at /mnt", file=sys.stderr, flush=True)
if sys.argv[1] == "up" and {gateway_line!r}:
    time.sleep(60)
""")
    script.chmod(0o755)
    return str(script)


def test_silt_reads_the_gateway_address_and_passes_the_key_by_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(mech, "SILT", _fake_silt(tmp_path))
    store = mech.Store("http://198.18.11.2:9000", "k", "s", "bench", None)
    s = mech.Silt(str(tmp_path / "w"), str(tmp_path / "state"), store, gateway=("AKGW", "gateway-secret"))
    try:
        assert s.gateway == "http://127.0.0.1:4321"
    finally:
        s.crash()
    s.log.close()
    log = (tmp_path / "w" / "silt.log").read_text()
    assert "--gateway 127.0.0.1:0" in log and "key: AKGW" in log
    assert "gateway-secret" not in log  # not on the command line
    # Without --gateway asked for, no address and no key.
    s = mech.Silt(str(tmp_path / "w2"), str(tmp_path / "state2"), store)
    try:
        assert s.gateway is None
    finally:
        s.crash()


def test_silt_without_a_gateway_line_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(mech, "SILT", _fake_silt(tmp_path, gateway_line=False))
    store = mech.Store("http://198.18.11.2:9000", "k", "s", "bench", None)
    with pytest.raises(RuntimeError, match="no gateway address"):
        mech.Silt(str(tmp_path / "w"), str(tmp_path / "state"), store, gateway=("AKGW", "x"))


@pytest.mark.skipif(not mech.VERSITYGW, reason="no versitygw binary")
def test_local_s3_serves_on_loopback_and_stops(tmp_path):
    (tmp_path / "data" / "bench").mkdir(parents=True)
    server = mech.LocalS3(str(tmp_path / "data"), "silt-bench-access", "silt-bench-secret", str(tmp_path / "vgw.log"))
    try:
        port = int(server.endpoint.rsplit(":", 1)[1])
        assert server.endpoint.startswith("http://127.0.0.1:") and mech.versitygw_answers(port)
        assert server.p in mech._LIVE
    finally:
        mech.stop_all()
    assert server.p.poll() is not None and server.p not in mech._LIVE
    assert not mech.versitygw_answers(port)
