"""Tiny runs of the multi-worker benchmarks, to keep them working (not timings)."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT


def _run(script, *args, timeout=300):
    result = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                            capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.multiworker
def test_straggler_benchmark_tiny(tmp_path):
    out = tmp_path / "s.json"
    stdout = _run("straggler.py", "--workers", "2", "--configs", "sync,ssp", "--modes",
                  "transient", "--steps", "6", "--sleep", "0.01", "--repeats", "1",
                  "--hidden", "16", "--json", str(out), "--png", str(tmp_path / "s.png"))
    assert "x sync" in stdout
    data = json.loads(out.read_text())
    rows = {row["config"]: row for row in data["summary"]}
    assert rows["sync"]["ratio_vs_sync_median"] == 1.0
    assert rows["ssp"]["samples_per_s_median"] > 0 and rows["ssp"]["staleness_max"] <= 2
    assert (tmp_path / "s.png").stat().st_size > 0


@pytest.mark.multiworker
def test_bucketing_benchmark_tiny(tmp_path):
    out = tmp_path / "b.json"
    _run("bucketing.py", "--workers", "2", "--models", "cnn", "--planners", "none,mgwfbp",
         "--steps", "3", "--warmup", "6", "--repeats", "1", "--json", str(out))
    data = json.loads(out.read_text())
    rows = {row["planner"]: row for row in data["summary"]}
    assert set(rows) == {"none", "mgwfbp"}
    assert rows["none"]["vs_none"] == 1.0 and rows["mgwfbp"]["step_ms_median"] > 0


@pytest.mark.multiworker
# Out of CI (~70 s each): the mode has its own worker test; run by hand before results.
@pytest.mark.bench
def test_compression_accuracy_benchmark_tiny(tmp_path):
    out = tmp_path / "c.json"
    stdout = _run("compression_accuracy.py", "--workers", "2", "--seeds", "0", "--configs",
                  "dense,topk_dgc", "--epochs", "1", "--json", str(out))
    assert "vs dense" in stdout
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["runs"]] == ["dense", "topk_dgc"]
    summary = data["summary"]
    assert summary["dense"]["points_vs_dense"] == 0.0
    assert summary["dense"]["compression_ratio"] == 1.0
    assert summary["topk_dgc"]["compression_ratio"] > 20
    assert 0 < summary["topk_dgc"]["accuracy_mean"] <= 1


def test_warmup_benchmark_tiny(tmp_path):
    out = tmp_path / "w.json"
    stdout = _run("warmup.py", "--replicas", "2", "--seeds", "0", "--epochs", "2", "--k", "4",
                  "--configs", "large_scaled,large_scaled_warmup", "--warmup-epochs", "1",
                  "--train-samples", "1024",
                  "--json", str(out), "--png", str(tmp_path / "w.png"))
    assert "large_scaled_warmup" in stdout
    data = json.loads(out.read_text())
    assert set(data["summary"]) == {"large_scaled", "large_scaled_warmup"}
    assert data["summary"]["large_scaled"]["lr"] == pytest.approx(0.2)  # 0.05 x 4
    assert [len(run["test_accuracy"]) for run in data["runs"]] == [2, 2]
    assert (tmp_path / "w.png").stat().st_size > 0


@pytest.mark.multiworker
def test_scaling_benchmark_tiny(tmp_path):
    out = tmp_path / "sc.json"
    stdout = _run("scaling.py", "--workers", "1,2", "--configs", "sync,powersgd", "--steps",
                  "3", "--warmup", "2", "--batch", "8", "--json", str(out), "--png",
                  str(tmp_path / "sc.png"))
    assert "efficiency" in stdout
    rows = {(r["config"], r["workers"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("sync", 1), ("sync", 2), ("powersgd", 1), ("powersgd", 2)}
    assert rows[("sync", 1)]["efficiency"] == 1.0 and rows[("sync", 1)]["overhead_ms"] == 0.0
    assert rows[("sync", 1)]["bytes_sent"] == 0 < rows[("powersgd", 2)]["bytes_sent"] \
        < rows[("sync", 2)]["bytes_sent"]
    assert (tmp_path / "sc.png").stat().st_size > 0


@pytest.mark.multiworker
# Out of CI (~70 s each): the mode has its own worker test; run by hand before results.
@pytest.mark.bench
def test_adaptive_benchmark_tiny(tmp_path):
    out = tmp_path / "a.json"
    _run("adaptive.py", "--links", "none", "--configs", "sync,adaptive", "--repeats", "1",
         "--epochs", "2", "--json", str(out))
    data = json.loads(out.read_text())
    rows = {row["config"]: row for row in data["rows"]}
    assert set(rows) == {"sync", "adaptive"}
    assert len(rows["adaptive"]["step_ms_epochs"]) == 1 and rows["adaptive"]["step_ms"] > 0
    assert rows["adaptive"]["choices"]  # it probed and decided in epoch 1
    summary = {row["config"]: row for row in data["summary"]}
    assert summary["sync"]["vs_dense"] == 1.0


@pytest.mark.multiworker
def test_sync_accuracy_benchmark_tiny(tmp_path):
    first = tmp_path / "a.json"
    _run("sync_accuracy.py", "--workers", "2", "--seeds", "0", "--configs", "gossip",
         "--epochs", "1", "--json", str(first))
    run = json.loads(first.read_text())
    assert run["records"][0]["optimizer"] == "sgd" and run["records"][0]["mb_sent"] > 0
    # Summarizing earlier files: recipes kept apart, duplicates skipped, a PNG drawn.
    earlier = tmp_path / "b.json"
    earlier.write_text(json.dumps({"records": [
        {"config": c, "seed": s, "accuracy": a, "mb_sent": 1.0, "optimizer": "sgd"}
        for c, s, a in (("sync", 0, 0.80), ("sync", 1, 0.90), ("gossip", 1, 0.70))]}))
    out, plot = tmp_path / "c.json", tmp_path / "c.png"
    _run("sync_accuracy.py", "--records", f"{earlier},{first}", "--json", str(out),
         "--plot", str(plot), "--configs", "sync,gossip")
    rows = {row["config"]: row for row in json.loads(out.read_text())["summary"]}
    assert rows["sync"]["accuracy_runs"] == [0.80, 0.90]
    assert rows["gossip"]["seeds"] == [1, 0]  # seed 1 from b.json, seed 0 from a.json
    expected = 100 * (np.mean([0.70, run["records"][0]["accuracy"]]) - 0.85)
    assert rows["gossip"]["points_vs_sync"] == pytest.approx(expected)
    assert plot.stat().st_size > 0


@pytest.mark.multiworker
def test_step_benchmark_tiny(tmp_path):
    out = tmp_path / "step.json"
    stdout = _run("step.py", "--systems", "keras,tfdist", "--models", "cnn", "--workers", "1,2",
                  "--steps", "3", "--skip", "1", "--warmup", "2", "--repeats", "1",
                  "--rounds", "1", "--json", str(out), "--png", str(tmp_path / "step.png"))
    assert "x_keras_same_process" in stdout
    rows = {(r["system"], r["workers"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("keras", 1), ("tfdist", 1), ("keras_with_tfdist", 1), ("tfdist", 2)}
    assert all(r["ms_median"] > 0 for r in rows.values())
    assert rows[("tfdist", 1)]["x_keras_same_process"] > 0
    assert (tmp_path / "step.png").stat().st_size > 0


def test_modes_matrix_summarizes_marks_warnings_and_fails_unwarned_losses(tmp_path):
    def record(mode, seed, accuracy, optimizer="momentum", warning=None, error=None):
        return {"dataset": "digits", "optimizer": optimizer, "world": 2, "mode": mode,
                "seed": seed, "accuracy": accuracy, "error": error, "warning": warning,
                "mb_sent": 1.5, "fit_seconds": 1.0}

    records = [record("sync", 0, 0.90), record("sync", 1, 0.80),
               record("gossip", 0, 0.89), record("gossip", 1, 0.80),   # -0.5: fine
               record("topk", 0, 0.80, warning="w"), record("topk", 1, 0.70, warning="w"),
               record("sync", 0, 0.90, "adam"), record("local_sgd", 0, None, "adam",
                                                        error="DivergenceError: ...")]
    source, out, plot = tmp_path / "in.json", tmp_path / "out.json", tmp_path / "m.png"
    source.write_text(json.dumps({"records": records}))
    rerun = tmp_path / "rerun.json"  # gossip again: its runs replace the first file's
    rerun.write_text(json.dumps({"records": [record("gossip", 0, 0.91),
                                             record("gossip", 1, 0.81)]}))
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "modes_matrix.py"),
                             "--records", f"{source},{rerun}", "--json", str(out),
                             "--plot", str(plot)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert result.returncode == 1, result.stdout + result.stderr  # the diverged cell
    rows = {(r["optimizer"], r["mode"]): r for r in json.loads(out.read_text())["summary"]}
    assert rows["momentum", "gossip"]["points_vs_sync"] == pytest.approx(1.0)
    assert rows["momentum", "gossip"]["seeds"] == 2
    assert rows["momentum", "topk"]["points_vs_sync"] == pytest.approx(-10.0)
    assert rows["momentum", "topk"]["warned"] and not rows["momentum", "gossip"]["warned"]
    assert rows["adam", "local_sgd"]["errors"]
    failed = json.loads(out.read_text())["not_within_2_points_unwarned"]
    assert [(r["optimizer"], r["mode"]) for r in failed] == [("adam", "local_sgd")]
    assert "1 unwarned cells more than 2 points below sync (or diverged)" in result.stdout
    assert plot.stat().st_size > 0


def test_step_benchmark_records_a_launch_that_fails_twice_and_goes_on(monkeypatch):
    spec = importlib.util.spec_from_file_location("step_bench", ROOT / "bench" / "step.py")
    step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step)
    calls = []

    def crash(args, system, workers, out_dir):
        calls.append((system, workers))
        raise RuntimeError(f"{system} at {workers} workers failed:\nterminate called")

    monkeypatch.setattr(step, "launch", crash)
    failures = {}
    assert step._launch_twice(None, "torch_ddp", 4, failures) == {}  # pylint: disable=protected-access
    assert calls == [("torch_ddp", 4)] * 2
    assert failures == {"torch_ddp@4": ["torch_ddp at 4 workers failed:\nterminate called"] * 2}


def test_engines_benchmark_tiny(tmp_path):
    out = tmp_path / "engines.json"
    _run("engines.py", "--replicas", "2", "--sizes", "1KB,64KB", "--ucx", "", "--ucx-schedules",
         "", "--tf", "native", "--repeat", "2", "--json", str(out))
    records = json.loads(out.read_text())
    assert {(r["row"], r["bytes"]) for r in records} == {("tf:native", 1024),
                                                         ("tf:native", 65536)}
    for r in records:
        assert r["memcpy_GBps"] == max(r["memcpy_GBps_start"], r["memcpy_GBps_end"]) > 0
        assert r["algbw_over_memcpy"] == pytest.approx(r["algbw_GBps"] / r["memcpy_GBps"])
        assert r["memcpy_concurrent_GBps"] is None  # one process: nobody copies beside it


@pytest.mark.multiworker
def test_sparse_benchmark_tiny(tmp_path):
    out = tmp_path / "sparse.json"
    stdout = _run("sparse.py", "--workers", "2", "--vocab", "300", "--seq", "8", "--steps", "3",
                  "--warmup", "2", "--rounds", "1", "--json", str(out),
                  "--configs", "ucx_all_gather,dense_layer,frozen_embedding,"
                  "dense_layer_one_process", "--png", str(tmp_path / "sparse.png"))
    assert "x the frozen embedding" in stdout and "x the dense layer" in stdout
    result = json.loads(out.read_text())
    rows = {row["config"]: row for row in result["rows"]}
    assert set(rows) == {"ucx_all_gather", "dense_layer", "frozen_embedding",
                         "dense_layer_one_process"}
    assert rows["frozen_embedding"]["x_frozen_embedding"] == 1.0
    assert rows["dense_layer"]["x_dense_layer"] == 1.0 and len(result["commit"]) == 40
    assert all(row["median_ms"] > 0 for row in rows.values())
    assert (tmp_path / "sparse.png").stat().st_size > 0


@pytest.mark.multiworker
def test_zero_benchmark_tiny(tmp_path):
    out = tmp_path / "z.json"
    _run("zero.py", "--workers", "2", "--input", "16", "--hidden", "16", "--layers", "1",
         "--steps", "2", "--warmup", "1", "--json", str(out), "--png", str(tmp_path / "z.png"))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["workers"], r["stage"]) for r in rows] == [(2, 0), (2, 1), (2, 2)]
    # 16*16+16 + 16*10+10 = 442 weights, Adam's two float32 slots; stages 1-2: shards of 221.
    assert [r["state_mb"] * (1 << 20) for r in rows] == [442 * 8, 221 * 8, 221 * 8]
    assert [r["summed_gradient_mb"] * (1 << 20) for r in rows] == [442 * 4, 442 * 4, 221 * 4]
    assert [r["loss"] for r in rows] == pytest.approx([rows[0]["loss"]] * 3, rel=1e-5)
    assert (tmp_path / "z.png").stat().st_size > 0


def test_step_models_run_and_match_their_pytorch_twins():
    """bench/step.py's ResNet-20, Transformer and GRU: each answers its data with one row
    of logits per sample, and (where torch is installed) the PyTorch twin has the same
    trainable parameter count. (bench/step.py trains them; CI time.)"""
    import keras  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, str(ROOT / "bench"))
    import step_models  # pylint: disable=import-outside-toplevel
    counts = {"resnet20": 272_474, "transformer": 1_355_266, "gru": 63_498}  # by hand
    for name, count in counts.items():
        model = step_models.keras_model(keras, name)
        x, _ = step_models.data(name, samples=2)
        logits = np.asarray(model(x))
        assert logits.shape == (2, step_models.CLASSES.get(name, 10)), (name, logits.shape)
        assert np.isfinite(logits).all()
        trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        assert trainable == count, (name, trainable)
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return
    import step_torch  # pylint: disable=import-outside-toplevel
    for name, count in counts.items():
        assert sum(p.numel() for p in step_torch.build(torch, name).parameters()) == count, name


@pytest.mark.multiworker
def test_startup_benchmark_tiny(tmp_path):
    out = tmp_path / "startup.json"
    _run("startup.py", "--workers", "2", "--repeats", "1", "--json", str(out), "--png",
         str(tmp_path / "startup.png"))
    data = json.loads(out.read_text())
    for mode in ("executed", "preload"):
        row = data["rows"][mode]["2"]
        assert 0 < row["imported"]["median"] < row["wall"]["median"] < 300
        assert row["cpu"]["median"] > 0
    assert set(data["preload_over_executed"]["2"]) == {"wall", "cpu", "imported"}
    assert data["commit"] and (tmp_path / "startup.png").stat().st_size > 0
