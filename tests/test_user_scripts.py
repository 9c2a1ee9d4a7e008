"""Other people's scripts, run unchanged on 2 and 3 workers (issue 34).

Copies (offline data, smaller models) of keras-io's text classifier, its
custom train_step examples and TF's multi-worker tutorial, plus the ways
scripts shuffle before `fit`, Keras' stopping and learning-rate callbacks with
a PyDataset, and a script whose workers end after the chief; see
tests/workers/user_scripts/. They run
one after another in one launch per worker count (tests/workers/run_scripts.py),
the text classifier first: it adapts a layer before any strategy exists.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, launch, read_worker_json

SCRIPTS = ROOT / "tests" / "workers" / "user_scripts"
DRIVER = ROOT / "tests" / "workers" / "run_scripts.py"
# late_finish last: its non-chief workers end 4 s after the chief.
ORDER = ["text_classifier", "unseeded_shuffle", "custom_steps", "tutorial",
         "callbacks_and_schedules", "late_finish"]


@pytest.fixture(scope="module", params=[2, 3], ids=["2workers", "3workers"])
def job(request, tmp_path_factory):
    """One launch of every script on 2 (then 3) workers: {"workers", "out", "text"}."""
    out = tmp_path_factory.mktemp(f"scripts{request.param}")
    scripts = [SCRIPTS / f"{name}.py" for name in ORDER]
    code, text, _ = launch(request.param, [DRIVER, out, *scripts], timeout=600)
    assert code == 0, text[-4000:]
    return {"workers": request.param, "out": out, "text": text}


def results(job, script):
    return read_worker_json(job["out"] / script, job["workers"])


@pytest.mark.multiworker
def test_text_classifier_adapts_before_the_strategy(job):
    workers = results(job, "text_classifier")
    assert "Collective ops must be configured" not in job["text"]
    first = workers[0]
    assert len(first["vocabulary"]) == 12 and len(first["scores"]) == 4
    for other in workers[1:]:
        assert other["vocabulary"] == first["vocabulary"]
        np.testing.assert_allclose(other["loss"], first["loss"], rtol=1e-6)
        np.testing.assert_allclose(other["weights"], first["weights"], rtol=1e-6)
        np.testing.assert_allclose(other["scores"], first["scores"], rtol=1e-5)


@pytest.fixture(scope="module")
def one_process_custom_steps(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TF_CONFIG", None)
    subprocess.run([sys.executable, SCRIPTS / "custom_steps.py", out], env=env, cwd=ROOT,
                   check=True, capture_output=True, timeout=240)
    return read_worker_json(out, 1)[0]


@pytest.mark.multiworker
def test_custom_train_steps_log_what_one_process_logs(job, one_process_custom_steps):
    """A custom step's own loss tracker (it was 1/N of this) and a GAN without call()."""
    workers = results(job, "custom_steps")
    one = one_process_custom_steps
    for result in workers:
        np.testing.assert_allclose(result["loss"], one["loss"], rtol=1e-4)
        np.testing.assert_allclose(result["mae"], one["mae"], rtol=1e-4)
        np.testing.assert_allclose(result["weights"], one["weights"], rtol=1e-4)
        assert len(result["gan"]["d_loss"]) == 2
        # The GAN's noise differs per replica, so its values are compared across
        # workers, and its losses are near one process's (BCE of a fresh model).
        np.testing.assert_allclose(result["gan"]["d_loss"], workers[0]["gan"]["d_loss"])
        np.testing.assert_allclose(result["gan_weights"], workers[0]["gan_weights"])
        np.testing.assert_allclose(result["gan"]["d_loss"], one["gan"]["d_loss"], rtol=0.05)


@pytest.mark.multiworker
def test_tutorial_loads_what_the_chief_saved(job):
    workers, out = results(job, "tutorial"), job["out"] / "tutorial"
    for result in workers:
        assert result["latest_checkpoint"] == str(out / "ckpt" / "ckpt-1")
        assert result["note"] == "written by the chief"
        np.testing.assert_allclose(result["loaded_weights"], workers[0]["loaded_weights"])
    assert (out / "keras-model.keras").exists()


@pytest.mark.multiworker
def test_unseeded_shuffles_are_reported_and_keras_shuffles_agree(job):
    workers = results(job, "unseeded_shuffle")
    for result in workers:
        for name in ("unseeded_dataset", "permuted_arrays"):
            assert len(result[name]) == 1, result
            assert "differ in content or order" in result[name][0]
            assert "seed every shuffle made before fit" in result[name][0]
        assert result["seeded_dataset"] == [] and result["keras_shuffle"] == []
        # One TF global seed on every worker: Keras' own shuffle of arrays agrees.
        assert result["global_seed"] == workers[0]["global_seed"]


@pytest.mark.multiworker
def test_stopping_and_learning_rate_callbacks_act_alike_on_every_worker(job):
    """A worker stopping at another epoch, or with another rate, would hang or fork the job."""
    workers = results(job, "callbacks_and_schedules")
    for result in workers[1:]:
        assert result == workers[0]  # epochs, rates, losses and weights alike
    first = workers[0]
    stopped = first["first_epochs"]
    assert 2 <= stopped < 30, first  # EarlyStopping ended the first fit
    assert len(first["val_loss"]) == stopped // 2  # validation_freq=2
    assert 0.025 in np.float32(first["rates"][:stopped]), first  # ReduceLROnPlateau halved it
    assert first["second_epochs"] == [stopped, stopped + 1]  # initial_epoch, PyDataset input
    np.testing.assert_allclose(first["rates"][stopped:],
                               [0.01 / (1 + e) for e in first["second_epochs"]], rtol=1e-6)
    assert np.all(np.isfinite(first["second_loss"] + first["train_on_batch"]))


@pytest.mark.multiworker
def test_workers_finishing_after_the_chief_keep_its_coordination_service(job):
    """The chief's process hosts TF's coordination service: it must exit last."""
    text = job["text"]
    assert "StartAbort" not in text and "coordination service" not in text, text[-3000:]
    assert sum(line.startswith(f"[{i}] finished") for i in range(job["workers"])
               for line in text.splitlines()) == job["workers"]
