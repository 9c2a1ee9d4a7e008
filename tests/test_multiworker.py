"""Keras fit across worker processes started by tfdist-run (TF_CONFIG, gRPC) or srun."""

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, launch, read_worker_json
from tfdist_ext import liveness

pytestmark = pytest.mark.multiworker
CHECKS = ROOT / "tests" / "workers" / "multiworker_checks.py"
SLURM = ROOT / "tests" / "slurm" / "local_cluster.sh"


def test_stock_multi_worker_strategy_fails_where_ours_passes(tmp_path):
    code, out, _ = launch(2, [CHECKS, tmp_path, "stock"], timeout=180)
    assert code == 0, out
    for result in read_worker_json(tmp_path, 2):
        # The bugs this plugin repairs (keras-team/keras#20585).
        assert "Attempt to convert a value (PerReplica" in result["reduce_nest"]["error"]
        assert "Invalid reduction dimension 0 for input with 0 dimensions" in \
            result["reduce_scalar_axis0"]["error"]
        assert "Attempt to convert a value (PerReplica" in result["fit"]["error"]


@pytest.fixture(scope="module", params=[2, 3])
def tfdist_run_fit(request, tmp_path_factory):
    """multiworker_checks.py under `tfdist-run -np N`: (N, each worker's results)."""
    out = tmp_path_factory.mktemp(f"tfdist{request.param}")
    code, text, _ = launch(request.param, [CHECKS, out, "tfdist"], timeout=240)
    assert code == 0, text
    return request.param, read_worker_json(out, request.param)


def test_fit_on_workers_ends_with_identical_weights(tfdist_run_fit):
    num_workers, results = tfdist_run_fit
    for result in results:
        assert result["workers"] == num_workers
        per_replica = 24 // num_workers  # the global batch of 24 is split
        assert result["reduce_nest"] == {"ok": True, "value": [[per_replica, 5], [per_replica, 1]]}
        assert result["reduce_scalar_axis0"]["value"] == pytest.approx((num_workers - 1) / 2)
        loss = result["fit"]["value"]["loss"]
        assert loss[-1] < 0.5 * loss[0], loss
        # The dead-peer watcher runs: TF's coordination heartbeat only backs it up.
        assert result["heartbeat_ms"] == liveness.WATCHED_HEARTBEAT_MS
    assert len({r["fit"]["value"]["sha"] for r in results}) == 1


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory):
    """A one-node Slurm cluster on this machine (tests/slurm/local_cluster.sh)."""
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "srun")
               if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"a local Slurm cluster needs root and {', '.join(missing) or 'Slurm'} "
                    "(apt-get install slurm-wlm munge; .ci/run installs them)")
    directory = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(["bash", SLURM, "start", directory], capture_output=True,
                             text=True, timeout=60, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    yield started.stdout.strip()
    subprocess.run(["bash", SLURM, "stop", directory], timeout=60, check=False)


@pytest.mark.parametrize("how", ["environment", "resolver"])
def test_srun_fits_like_tfdist_run_without_a_tf_config(tfdist_run_fit, slurm_conf, tmp_path,
                                                       how):
    # `srun -n N python train.py`: each task derives TF_CONFIG from Slurm's environment
    # (tfdist_ext/cluster_env/slurm.py), or the script passes TF's SlurmClusterResolver
    # to the strategy, and the job trains as under tfdist-run.
    num_workers, reference = tfdist_run_fit
    if how == "resolver" and num_workers != 2:
        pytest.skip("CI time: the resolver once, on 2 workers")
    env = dict(os.environ, PYTHONPATH=str(ROOT), SLURM_CONF=slurm_conf,
               TFDIST_SLURM="1" if how == "environment" else "0")
    env.pop("TF_CONFIG", None)
    mode = "tfdist" if how == "environment" else f"resolver:{random.randrange(20000, 29000)}"
    result = subprocess.run(
        ["srun", "-n", str(num_workers), "--kill-on-bad-exit=1", "--time=5",
         sys.executable, CHECKS, tmp_path, mode],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=280, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    results = read_worker_json(tmp_path, num_workers)
    workers = results[0]["tf_config"]["cluster"]["worker"]
    ports = [int(address.rsplit(":", 1)[1]) for address in workers]
    assert ports == list(range(ports[0], ports[0] + num_workers)) and 10000 <= ports[0] < 30000
    assert [r["tf_config"]["task"]["index"] for r in results] == list(range(num_workers))
    assert len({r["fit"]["value"]["sha"] for r in results}) == 1
    for ours, theirs in zip(results, reference):
        assert ours["reduce_nest"] == theirs["reduce_nest"]
        np.testing.assert_allclose(ours["fit"]["value"]["loss"],
                                   theirs["fit"]["value"]["loss"], rtol=1e-6)


def test_srun_runs_a_keras_distribution_script(slurm_conf, tmp_path):
    # `srun -n 2 python train.py` with Keras' distribution API: `initialize()` takes the
    # job from Slurm's environment, and the losses equal one process's.
    script = ROOT / "tests" / "workers" / "keras_distribution_fit.py"
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), SLURM_CONF=slurm_conf)
    result = subprocess.run(
        ["srun", "-n", "2", "--kill-on-bad-exit=1", "--time=5", sys.executable, str(script),
         str(tmp_path / "srun{worker}.json"), "global"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=280, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    alone = subprocess.run([sys.executable, str(script), str(tmp_path / "alone.json"), "scope"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
                           check=False)
    assert alone.returncode == 0, alone.stderr[-3000:]
    want = json.loads((tmp_path / "alone.json").read_text())
    for worker in range(2):
        got = json.loads((tmp_path / f"srun{worker}.json").read_text())
        assert got["processes"] == 2 and got["devices"] == ["cpu:0", "cpu:1"]
        for model in ("mlp", "cnn"):
            np.testing.assert_allclose(got[model]["loss"], want[model]["loss"], rtol=1e-5)


def _ray_processes():
    names = ("raylet", "gcs_server", "ray::", "default_worker.py")
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    return [line for line in listing if any(name in line for name in names)]


def test_ray_train_fits_like_tfdist_run(tfdist_run_fit, tmp_path):
    # Ray Train's TensorflowTrainer writes each worker's TF_CONFIG (and TF_USE_LEGACY_KERAS=1,
    # which `import tfdist_ext` removes); the job trains as under tfdist-run and reports
    # metrics and checkpoints through Ray's own Keras callback.
    num_workers, reference = tfdist_run_fit
    if num_workers != 2:
        pytest.skip("CI time: Ray Train on 2 workers")
    pytest.importorskip("ray.train.tensorflow")
    assert not _ray_processes(), "a Ray instance is already running here"
    try:
        result = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "ray_train.py"),
                                 str(tmp_path), "2"], capture_output=True, text=True, cwd=ROOT,
                                timeout=240, check=False)
    finally:
        if _ray_processes():  # the driver timed out or failed before ray.shutdown()
            subprocess.run(["ray", "stop", "--force"], capture_output=True, timeout=60,
                           check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    results = read_worker_json(tmp_path, 2)
    assert len({r["fit"]["value"]["sha"] for r in results}) == 1
    for ours, theirs in zip(results, reference):
        assert ours["legacy_keras"] is None and ours["tf_keras_is_keras_3"]
        assert ours["reduce_nest"] == theirs["reduce_nest"]
        np.testing.assert_allclose(ours["fit"]["value"]["loss"],
                                   theirs["fit"]["value"]["loss"], rtol=1e-6)
    trainer = json.loads((tmp_path / "result.json").read_text())
    assert trainer["error"] is None
    assert trainer["metrics"]["loss"] == pytest.approx(results[0]["fit"]["value"]["loss"][-1])
    assert (pathlib.Path(trainer["checkpoint"]) / "model.keras").is_file()
    deadline = time.monotonic() + 20
    while _ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ray_processes(), _ray_processes()


def test_mnist1d_example_reaches_85_percent_on_two_workers(tmp_path):
    code, out, seconds = launch(
        2, [ROOT / "examples" / "keras_fit.py", "--verbose", "0", "--json",
            pathlib.Path(tmp_path) / "w{worker}.json"], timeout=300)
    assert code == 0, out
    results = read_worker_json(tmp_path, 2)
    assert len({r["weights_sha"] for r in results}) == 1
    assert results[0]["test_accuracy"] >= 0.85, results[0]
    assert results[0]["loss"][-1] < results[0]["loss"][0]
    assert seconds < 180, f"took {seconds:.0f} s"
