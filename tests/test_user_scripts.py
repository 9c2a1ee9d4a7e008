"""Other people's scripts, run unchanged on 3 workers, the tutorial also on 2 (issue 34).

Copies (offline data, smaller models) of keras-io's text classifier, its
custom train_step examples and TF's multi-worker tutorial, plus the ways
scripts shuffle before `fit`; see tests/workers/user_scripts/.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, launch, read_worker_json

SCRIPTS = ROOT / "tests" / "workers" / "user_scripts"
# 3 workers: an odd world, and the one where the chief's saves and the coordination
# service's end raced; 2 more only for the tutorial (CI time: ~25 s per launch).
WORKERS = [3]


def run(script, num_workers, out):
    code, text, _ = launch(num_workers, [SCRIPTS / script, out], timeout=360)
    assert code == 0, text[-4000:]
    return read_worker_json(out, num_workers), text


@pytest.mark.multiworker
@pytest.mark.parametrize("num_workers", WORKERS)
def test_text_classifier_adapts_before_the_strategy(tmp_path, num_workers):
    results, text = run("text_classifier.py", num_workers, tmp_path)
    assert "Collective ops must be configured" not in text
    first = results[0]
    assert len(first["vocabulary"]) == 12 and len(first["scores"]) == 4
    for other in results[1:]:
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
@pytest.mark.parametrize("num_workers", WORKERS)
def test_custom_train_steps_log_what_one_process_logs(tmp_path, num_workers,
                                                      one_process_custom_steps):
    """A custom step's own loss tracker (it was 1/N of this) and a GAN without call()."""
    results, _ = run("custom_steps.py", num_workers, tmp_path)
    one = one_process_custom_steps
    for result in results:
        np.testing.assert_allclose(result["loss"], one["loss"], rtol=1e-4)
        np.testing.assert_allclose(result["mae"], one["mae"], rtol=1e-4)
        np.testing.assert_allclose(result["weights"], one["weights"], rtol=1e-4)
        assert len(result["gan"]["d_loss"]) == 2
        # The GAN's noise differs per replica, so its values are compared across
        # workers, and its losses are near one process's (BCE of a fresh model).
        np.testing.assert_allclose(result["gan"]["d_loss"], results[0]["gan"]["d_loss"])
        np.testing.assert_allclose(result["gan_weights"], results[0]["gan_weights"])
        np.testing.assert_allclose(result["gan"]["d_loss"], one["gan"]["d_loss"], rtol=0.05)


@pytest.mark.multiworker
@pytest.mark.parametrize("num_workers", [2, 3])
def test_tutorial_loads_what_the_chief_saved(tmp_path, num_workers):
    results, _ = run("tutorial.py", num_workers, tmp_path)
    for result in results:
        assert result["latest_checkpoint"] == str(tmp_path / "ckpt" / "ckpt-1")
        assert result["note"] == "written by the chief"
        np.testing.assert_allclose(result["loaded_weights"], results[0]["loaded_weights"])
    assert (tmp_path / "keras-model.keras").exists()


@pytest.mark.multiworker
@pytest.mark.parametrize("num_workers", WORKERS)
def test_unseeded_shuffles_are_reported_and_keras_shuffles_agree(tmp_path, num_workers):
    results, _ = run("unseeded_shuffle.py", num_workers, tmp_path)
    for result in results:
        for name in ("unseeded_dataset", "permuted_arrays"):
            assert len(result[name]) == 1, result
            assert "differ in content or order" in result[name][0]
            assert "seed every shuffle made before fit" in result[name][0]
        assert result["seeded_dataset"] == [] and result["keras_shuffle"] == []
        # One TF global seed on every worker: Keras' own shuffle of arrays agrees.
        assert result["global_seed"] == results[0]["global_seed"]


@pytest.mark.multiworker
def test_workers_finishing_after_the_chief_keep_its_coordination_service(tmp_path):
    """The chief's process hosts TF's coordination service: it must exit last."""
    script = tmp_path / "late_finish.py"
    script.write_text(
        "import time, tfdist_ext, keras, numpy as np\n"
        "s = tfdist_ext.Strategy()\n"
        "with s.scope():\n"
        "    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])\n"
        "    m.compile('sgd', 'mse')\n"
        "m.fit(np.ones((60, 3)), np.ones((60, 1)), batch_size=12, epochs=1, verbose=0)\n"
        "if s.worker_index:\n"
        "    time.sleep(4)  # e.g. a slow input pipeline's teardown\n"
        "print('finished', s.worker_index, time.time(), flush=True)\n")
    code, text, _ = launch(3, [script], timeout=120, options=["--output", "all"])
    assert code == 0, text[-3000:]
    assert "StartAbort" not in text and "coordination service" not in text, text[-3000:]
    assert sum(line.startswith(f"[{i}] finished") for i in range(3)
               for line in text.splitlines()) == 3
