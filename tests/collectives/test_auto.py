"""allreduce="auto": cost-model choices, calibration, its cache, and the benchmark."""

import argparse
import importlib.util
import json
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

import tfdist_ext
from tfdist_ext.ops import ucx as ucx_ops
from tfdist_ext.cluster import ClusterSpec
from tfdist_ext.collectives import auto, calibration, refine

import refine_cases  # noqa: E402  (tests/collectives is on sys.path: rootdir-less test dirs)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _calibration(native_per_byte=1 / 0.5e9, **overrides):
    values = dict(cluster_key="k", world_size=4, alpha=3e-4, beta=1 / 1e9, gamma=1 / 5e9,
                  lines=(("native", 1.5e-3, native_per_byte),))
    values.update(overrides)
    return auto.Calibration(**values)


def test_choice_follows_the_model():
    cal = _calibration()
    # Unprobed algorithms fall back to the alpha-beta-gamma schedule model.
    assert auto.choose(cal, 1024) == "butterfly"  # 2 messages beat native's 1.5 ms
    big = auto.choose(cal, 64 << 20)
    assert big in ("halving_doubling", "ring")
    assert auto.choose(_calibration(native_per_byte=1 / 50e9), 64 << 20) == "native"
    assert auto.choose(_calibration(world_size=1), 1 << 20) == "native"
    assert auto.choose(cal, 1024, candidates=["ring", "tree"]) == "tree"
    # A probed line wins over the schedule model.
    probed = _calibration(lines=(("native", 1.5e-3, 1e-9), ("ring", 1e-5, 1e-12)))
    assert auto.choose(probed, 1024) == "ring" and auto.choose(probed, 64 << 20) == "ring"
    # Measured points win over the line and are interpolated between probe sizes.
    sizes = auto.PROBE_BYTES
    assert sizes == (1 << 10, 1 << 20, 1 << 22)
    curved = _calibration(points=(("tree", (1e-4, 1e-3, 13e-3)), ("ring", (3e-4, 1.2e-3, 4e-3))),
                          lines=(("native", 1.5e-3, 1e-9), ("tree", 1e-4, 1e-13)))
    assert curved.predict("tree", sizes[1]) == pytest.approx(1e-3)
    assert curved.predict("tree", (sizes[1] + sizes[2]) // 2) == pytest.approx(7e-3)
    assert curved.predict("tree", 2 * sizes[2]) == pytest.approx(13e-3 + 4 * 4e-3)  # 4 ms/MB
    # Above the last probe, the steepest segment: 1 KB-1 MB here, not the flat top.
    flat_top = auto.interpolate(sizes, (1e-4, 3e-3, 4e-3), 2 * sizes[2])
    assert flat_top == pytest.approx(4e-3 + (3e-3 - 1e-4) / (sizes[1] - sizes[0]) * sizes[2])
    assert curved.predict("tree", 1) == pytest.approx(1e-4 - 9e-4 * 1023 / (sizes[1] - sizes[0]))
    assert auto.choose(curved, 1 << 20, candidates=["ring", "tree"]) == "tree"
    assert auto.choose(curved, 16 << 20, candidates=["ring", "tree"]) == "ring"
    assert auto.interpolate((1, 2, 3), (5.0, 3.0, 1.0), 100) == 1e-7  # never <= 0
    assert auto.interpolate((10, 20, 30), (5.0, 1.0, 1.0), 1) == pytest.approx(8.6)
    rows = auto.decision_table(cal)
    assert [r["bytes"] for r in rows] == list(auto.TABLE_SIZES)
    for row in rows:
        assert row["choice"] == min(row["modelled_ms"], key=row["modelled_ms"].get)
    assert "choice" in auto.format_table(cal, rows)


def test_shortlist_keeps_the_close_candidates_best_first():
    cal = _calibration(points=(("tree", (1e-4, 1e-3, 4e-3)), ("ring", (3e-4, 1.2e-3, 4e-3)),
                               ("native", (2e-4, 1.4e-3, 3e-3)),
                               ("butterfly", (1e-4, 1.6e-3, 5e-3))),
                       lines=())
    names = ["butterfly", "native", "ring", "tree"]
    # Native is always timed too: the probe once ranked it outside (4 replicas, 16 MB, 1.62x).
    assert auto.shortlist(cal, 1 << 10, candidates=names) == ("butterfly", "tree", "native")
    assert auto.shortlist(cal, 1 << 10, candidates=["butterfly", "tree"]) == ("butterfly", "tree")
    assert auto.shortlist(cal, 1 << 20, candidates=names) == ("tree", "ring", "native")
    assert auto.shortlist(cal, 1 << 20, candidates=names, margin=2, limit=4) == (
        "tree", "ring", "native", "butterfly")
    assert auto.shortlist(cal, 1 << 20, candidates=names, margin=1.1) == ("tree", "native")
    assert auto.shortlist(cal, 1 << 20, candidates=names, limit=2) == ("tree", "ring", "native")
    for size in (1 << 10, 1 << 20, 1 << 22, 3 << 20):
        assert auto.shortlist(cal, size, candidates=names)[0] == auto.choose(
            cal, size, candidates=names)
    assert auto.shortlist(_calibration(world_size=1), 1 << 20) == ("native",)
    assert auto.size_class(4000) == auto.size_class(4004) == 24
    assert auto.size_class(1 << 20) == 40 != auto.size_class(3 << 19)
    assert auto.size_class(0) == auto.size_class(1) == 0


def test_refinement_times_close_candidates_at_the_real_size_and_caches(tmp_path):
    cache = tmp_path / "cal.json"
    strategy = tfdist_ext.Strategy(num_replicas=3, allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    assert strategy.allreduce_refinements == []
    refine_cases.tie_refiner(strategy, str(cache))
    sums, ops = refine_cases.reduce_sizes(strategy)
    assert refine_cases.problems(strategy, sums, ops) == []
    decisions = strategy.allreduce_refinements
    assert [d["source"] for d in decisions] == ["timed", "timed"]
    for d in decisions:
        assert set(d["ms"]) == set(refine_cases.NAMES) and min(d["ms"].values()) > 0
        assert d["model"] == "butterfly"  # ties go to the first name
    cached = json.loads(cache.read_text())["clusters"][strategy.calibration.cluster_key]
    assert cached["refined"] == {str(auto.size_class(d["bytes"])): d["choice"] for d in decisions}

    again = tfdist_ext.Strategy(num_replicas=3, allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    refine_cases.tie_refiner(again, str(cache))
    sums, ops = refine_cases.reduce_sizes(again)
    assert refine_cases.problems(again, sums, ops) == []
    assert [(d["source"], d["choice"]) for d in again.allreduce_refinements] == [
        ("cache", d["choice"]) for d in decisions]

    limited = tfdist_ext.Strategy(num_replicas=2, allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    refine_cases.tie_refiner(limited, max_classes=1)
    sums, ops = refine_cases.reduce_sizes(limited)
    assert refine_cases.problems(limited, sums, ops) == []
    sources = {d["source"]: d["choice"] for d in limited.allreduce_refinements}
    assert sorted(sources) == ["model (max_classes reached)", "timed"]
    assert sources["model (max_classes reached)"] == "butterfly"

    untimed = tfdist_ext.Strategy(num_replicas=2, allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    refine_cases.tie_refiner(untimed, timing=False)
    sums, _ = refine_cases.reduce_sizes(untimed)
    assert all(s[0] == 3 for s in sums) and untimed.allreduce_refinements == []


def test_cache_keeps_one_entry_per_cluster_engine_and_transport(tmp_path, monkeypatch):
    spec = ClusterSpec({"worker": ["10.0.0.1:1", "10.0.0.2:2"]}, "worker", 0)
    devices = ["/job:worker/replica:0/task:0/device:CPU:0"]
    keys = {engine: calibration.cluster_key(spec, 2, devices, engine) for engine in ("tf", "ucx")}
    assert keys["tf"] != keys["ucx"]
    moved = ClusterSpec({"worker": ["10.0.0.1:7", "10.0.0.2:8"]}, "worker", 0)
    assert calibration.cluster_key(moved, 2, devices, "ucx") == keys["ucx"]  # ports only
    assert calibration.cluster_key(spec, 3, devices, "ucx") != keys["ucx"]
    monkeypatch.setenv("UCX_TLS", "tcp")
    assert calibration.cluster_key(spec, 2, devices, "ucx") != keys["ucx"]
    assert calibration.cluster_key(spec, 2, devices, "tf") == keys["tf"]  # gRPC either way

    path = tmp_path / "cal.json"
    calibration.write_cache(path, _calibration(cluster_key=keys["tf"]), {24: "native"})
    calibration.write_cache(path, _calibration(cluster_key=keys["ucx"], alpha=1e-6),
                            {24: "butterfly"})
    assert calibration.read_cache(path, keys["tf"]) == _calibration(cluster_key=keys["tf"])
    assert calibration.read_cache(path, keys["ucx"]).alpha == 1e-6
    assert calibration.read_refined(path, keys["tf"]) == {24: "native"}
    assert calibration.read_refined(path, keys["ucx"]) == {24: "butterfly"}
    assert calibration.read_cache(path, "xyz") is None
    assert calibration.read_refined(path, "xyz") == {}
    for n in range(calibration.MAX_ENTRIES + 2):
        calibration.write_cache(path, _calibration(cluster_key=f"k{n}"))
    assert len(json.loads(path.read_text())["clusters"]) == calibration.MAX_ENTRIES

    old = tmp_path / "old.json"  # the one-entry format of earlier versions
    old.write_text(json.dumps({"calibration": _calibration(cluster_key="abc").__dict__,
                               "refined": {"40": "ring"}}))
    assert calibration.read_cache(old, "abc") == _calibration(cluster_key="abc")
    assert calibration.read_refined(old, "abc") == {40: "ring"}
    old.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable calibration cache"):
        assert calibration.read_cache(old, "abc") is None
    assert calibration.read_cache(tmp_path / "missing.json", "abc") is None


def test_a_cached_calibration_of_the_other_engine_is_not_used(tmp_path):
    cache = str(tmp_path / "cal.json")
    tf_engine = tfdist_ext.Strategy(num_replicas=2, engine="tf", allreduce={
        "name": "auto", "calibration_cache": cache})
    assert tf_engine.calibration.measured
    if ucx_ops.problem() is not None:
        pytest.skip(ucx_ops.problem())
    ucx = tfdist_ext.Strategy(num_replicas=2, engine="ucx", allreduce={
        "name": "auto", "calibration_cache": cache})
    assert ucx.calibration.cluster_key != tf_engine.calibration.cluster_key
    assert ucx.calibration != tf_engine.calibration  # measured again, on UCX
    entries = json.loads(pathlib.Path(cache).read_text())["clusters"]
    assert set(entries) == {tf_engine.calibration.cluster_key, ucx.calibration.cluster_key}


def test_first_use_timing_replaces_a_pick_slower_than_the_engine_default(caplog):
    # The model claims the graph engine's ring is 10x faster than TF's fused native
    # all-reduce for 1 KB on 8 replicas; ring's 14 sequential messages take far longer.
    strategy = tfdist_ext.Strategy(num_replicas=8, engine="tf", allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    cross_ops = strategy.extended.cross_device_ops
    wrong = auto.Calibration("k", 8, 1e-4, 1e-9, 1e-10,
                             points=(("ring", (1e-5, 1e-4, 4e-4)),
                                     ("native", (1e-4, 1e-3, 4e-3))))
    refiner = refine.Refiner(cross_ops, wrong, ("native", "ring"), default="native")
    with caplog.at_level("WARNING", logger="tfdist_ext"):
        choice = refiner.choose(1024)
    (decision,) = refiner.decisions.values()
    assert decision["model"] == "ring" and decision["source"] == "timed", decision
    assert decision["ms"]["ring"] > 1.1 * decision["ms"]["native"], decision
    assert choice == "native"
    assert "the cost model's pick ring timed" in caplog.text
    assert "the engine's default native" in caplog.text and "replaced by native" in caplog.text


def test_the_engine_default_is_always_timed():
    if ucx_ops.problem() is not None:
        pytest.skip(ucx_ops.problem())
    strategy = tfdist_ext.Strategy(num_replicas=3, engine="ucx", allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    cross_ops = strategy.extended.cross_device_ops
    tree_best = auto.Calibration("k", 3, 1e-4, 1e-9, 1e-10, points=(
        ("tree", (1e-6, 1e-5, 4e-5)), ("ring", (1e-3, 1e-2, 4e-2)),
        ("native", (1e-3, 1e-2, 4e-2))))
    refiner = refine.Refiner(cross_ops, tree_best, ("native", "ring", "tree"), default="ring")
    choice = refiner.choose(4096)
    (decision,) = refiner.decisions.values()
    assert decision["candidates"] == ("tree", "native", "ring"), decision
    assert choice == min(decision["ms"], key=decision["ms"].get)
    # A default outside the user's candidates is not added.
    assert refine.Refiner(cross_ops, tree_best, ("native", "tree"), default="ring").default is None


def _fit(allreduce):
    strategy = tfdist_ext.Strategy(num_replicas=4, allreduce=allreduce)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 6)).astype("float32")
    y = rng.integers(0, 3, size=128).astype("int32")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(300, activation="tanh"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return strategy, model.get_weights()


def test_auto_calibrates_caches_and_trains_like_native(tmp_path):
    cache = str(tmp_path / "cal.json")
    strategy, weights = _fit({"name": "auto", "calibration_cache": cache})
    cal = strategy.calibration
    assert cal.measured and cal.world_size == 4
    for field in ("alpha", "beta", "gamma"):
        assert 0 < getattr(cal, field) < 1, field
    assert [line[0] for line in cal.lines] == list(auto.candidates_or_all(None))
    for _, latency, per_byte in cal.lines:
        assert 0 < latency < 1 and 0 < per_byte < 1e-6
    assert [p[0] for p in cal.points] == list(auto.candidates_or_all(None))
    for _, seconds in cal.points:
        assert len(seconds) == len(auto.PROBE_BYTES) and all(0 < t < 1 for t in seconds)
    entries = json.loads(open(cache, encoding="utf-8").read())["clusters"]
    assert entries[cal.cluster_key]["calibration"]["alpha"] == cal.alpha
    again = tfdist_ext.Strategy(num_replicas=4, allreduce={"name": "auto",
                                                           "calibration_cache": cache})
    assert again.calibration == cal  # from the cache, no new probe
    _, native = _fit("native")
    for ours, ref in zip(weights, native):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_size_ranges_may_delegate_to_auto_and_skipping_calibration_uses_defaults(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2, allreduce=tfdist_ext.collectives.AllReduce(
        by_size=((0, 65536, "butterfly"), (65536, float("inf"), "auto")),
        calibration_cache=str(tmp_path / "cal.json")))
    assert strategy.config.allreduce.algorithm_for(1024) == "butterfly"
    assert strategy.calibration is not None
    skipped = tfdist_ext.Strategy(num_replicas=2, allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    assert not skipped.calibration.measured


@pytest.mark.parametrize("sync", ["stale_synchronous", "delayed_averaging"])
def test_auto_with_background_reductions(sync):
    # These policies reduce on a background thread, through a second
    # CrossDeviceOps; it once lacked the calibration and raised at trace time.
    strategy = tfdist_ext.Strategy(num_replicas=2, sync=sync, allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x, x.sum(1, keepdims=True), batch_size=16, epochs=2, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    background = strategy.extended.background_cross_device_ops()
    assert background.choice.calibration is strategy.calibration


@pytest.mark.parametrize("options, message", [
    ({"name": "auto", "candidates": ["ring", "rign"]}, r"Unknown candidates algorithm 'rign'"),
    ({"name": "auto", "candidates": ["auto"]}, r"cannot contain 'auto' itself"),
    ({"name": "auto", "calibrate": "yes"}, r"Argument `calibrate` must be True or False"),
    ({"name": "auto", "refine": 1}, r"Argument `refine` must be True or False; received 1"),
])
def test_bad_auto_options(options, message):
    with pytest.raises(ValueError, match=message):
        tfdist_ext.Strategy(allreduce=options)


def test_tiny_benchmark_writes_every_field(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "allreduce.py"), "--replicas", "3", "--sizes",
         "1KB,256KB", "--algorithms", "native,ring,butterfly,auto", "--repeat", "2",
         "--no-cache", "--json", str(out), "--png", str(tmp_path / "bench.png")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    records = json.loads(out.read_text())
    # Exit 1 exactly when auto's choice is above --max-auto-ratio (1.10) somewhere.
    slow = [r for r in records if r["algorithm"] == "auto" and r["choice_vs_best_low"] > 1.10]
    assert result.returncode == (1 if slow else 0), result.stdout + result.stderr
    assert result.stdout.count("FAIL: ") == len(slow), result.stdout
    engines = {"tf", "ucx"} if ucx_ops.problem() is None else {"tf"}  # --engine all
    assert {r["engine"] for r in records} == engines
    assert len(records) == 8 * len(engines)
    for r in records:
        assert r["world"] == 3 and r["placement"] == "replicas"
        for key in ("algorithm", "bytes", "time_ms_min", "time_ms_median", "algbw_GBps",
                    "busbw_GBps", "vs_best_fixed"):
            assert key in r
        assert 0 < r["time_ms_min"] <= r["time_ms_median"]
        assert len(r["times_ms"]) == 2 and min(r["times_ms"]) == pytest.approx(r["time_ms_min"])
    assert {r["algorithm"] for r in records} == {"native", "ring", "butterfly", "auto"}
    assert (tmp_path / "bench.png").stat().st_size > 1000
    for r in records:
        if r["algorithm"] == "auto":
            assert r["choice_vs_best"] >= 1.0 and r["model_choice"] in ("native", "ring",
                                                                        "butterfly")
    check = [sys.executable, str(ROOT / "bench" / "allreduce_runs.py"), str(out)]
    loose = subprocess.run(check + ["--limit", "100"], capture_output=True, text=True,
                           timeout=60, check=False)
    cells = 2 * len(engines)
    assert loose.returncode == 0 and f"{cells} cells, 0 over 100.00x" in loose.stdout, \
        loose.stdout
    # No choice is 100x faster than the best fixed algorithm, so 0.01x must fail.
    strict = subprocess.run(check + ["--limit", "0.01"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert strict.returncode == 1 and f"{cells} cells, {cells} over 0.01x" in strict.stdout, \
        strict.stdout


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_allreduce",
                                                  ROOT / "bench" / "allreduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_fails_auto_only_beyond_the_noise(tmp_path):
    bench = _bench_module()
    rng = np.random.default_rng(1)
    floor = 0.03 + 0.05 * rng.random((3, 41)) ** 4  # a floor with jitter above it

    def rows(choice_scale):
        times = {"ring": floor[0], "tree": floor[1] * choice_scale,
                 "auto": floor[2] * choice_scale}
        return [{"engine": "ucx", "bytes": 1024, "algorithm": name,
                 "choice": "tree" if name == "auto" else name,
                 "time_ms_median": float(np.median(t)), "times_ms": list(t)}
                for name, t in times.items()]

    args = argparse.Namespace(json=str(tmp_path / "out.json"), png=None, max_auto_ratio=1.10)
    # The same distribution: whichever median is lower, not beyond the noise.
    assert bench.summarize(rows(1.0), args) == 0
    assert json.loads((tmp_path / "out.json").read_text())[2]["choice_vs_best_low"] < 1.10
    assert bench.summarize(rows(1.6), args) == 1  # clearly slower: fails
    low = bench.ratio_lower_bound(floor[1] * 1.6, floor[0])
    assert 1.10 < low < 1.6

