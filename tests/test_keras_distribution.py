"""Keras 3's distribution API on TensorFlow through tfdist_ext (issue 50)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.distribution import backend
from tfdist_ext.launch import free_ports
from conftest import ROOT, launch

DL = keras.distribution
SCRIPT = ROOT / "tests" / "workers" / "keras_distribution_fit.py"


def _local_cpus():
    return len(tf.config.list_logical_devices("CPU"))


def test_one_process_lists_its_local_devices_numbered_as_jax_does():
    count = _local_cpus()
    assert DL.list_devices() == [f"cpu:{i}" for i in range(count)]
    assert DL.list_devices("cpu") == DL.list_devices()
    assert DL.get_device_count() == count
    assert (backend.num_processes(), backend.process_id()) == (1, 0)
    DL.initialize()  # one process: nothing to join


@pytest.mark.parametrize("arguments, message", [
    (("10.0.0.1:1,10.0.0.2:1", 3, 0),
     r"num_processes=3 but job_addresses='10\.0\.0\.1:1,10\.0\.0\.2:1' names 2 worker\(s\)"),
    (("10.0.0.1:1,10.0.0.2:1", 2, None), "process_id is missing"),
    ((None, 2, 1), "job_addresses is missing; on TensorFlow every worker's address"),
    (("10.0.0.1:1,10.0.0.2:1", 2, 2), r"process_id=2 is not in \[0, 2\)"),
])
def test_initialize_names_the_argument_that_is_wrong(arguments, message):
    with pytest.raises(ValueError, match=message):
        DL.initialize(*arguments)


def test_initialize_after_tensorflow_runs_says_to_call_it_first():
    tf.constant(1.0)  # TensorFlow runs
    with pytest.raises(RuntimeError, match="must run before TensorFlow runs any op"):
        DL.initialize("127.0.0.1:1,127.0.0.1:2", 2, 0)


def test_initialize_under_a_launcher_checks_its_arguments_against_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1}}))
    assert (backend.num_processes(), backend.process_id()) == (2, 1)
    assert DL.list_devices("cpu") == ["cpu:0", "cpu:1"]
    DL.initialize()
    DL.initialize("127.0.0.1:1,127.0.0.1:2", 2, 1)
    with pytest.raises(ValueError, match=r"process_id=0, but TF_CONFIG .* says 1"):
        DL.initialize(process_id=0)


def test_a_mesh_larger_than_the_job_is_refused_naming_both():
    devices = [f"cpu:{i}" for i in range(_local_cpus() + 2)]
    with pytest.raises(ValueError, match=(
            rf"DataParallel: its device mesh has {len(devices)} device\(s\).*but this job runs "
            rf"{len(devices) - 2} .*DataParallel\(devices=keras.distribution.list_devices\(\)\)")):
        DL.set_distribution(DL.DataParallel(devices=devices))
    assert DL.distribution() is None and not tf.distribute.has_strategy()


def _layout_map(devices, kernel_axes):
    mesh = DL.DeviceMesh((len(devices), 1), ["batch", "model"], devices)
    layout_map = DL.LayoutMap(mesh)
    layout_map["dense.*kernel"] = kernel_axes
    layout_map["dense.*bias"] = (None,)
    return layout_map


def test_model_parallel_sharding_a_variable_is_refused_naming_the_path_and_layout():
    devices = DL.list_devices()
    mesh = DL.DeviceMesh((1, len(devices)), ["batch", "model"], devices)
    layout_map = DL.LayoutMap(mesh)
    layout_map["dense.*kernel"] = (None, "model")
    distribution = DL.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    if len(devices) > 1:
        with pytest.raises(ValueError, match=r"shards 'dense\.\*kernel' with .*use DataParallel"):
            DL.set_distribution(distribution)
    with pytest.raises(ValueError, match="shards the tensor"):
        backend.distribute_tensor(tf.zeros((2, 2)), DL.TensorLayout(
            (None, "model"), DL.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])))


def _fit(data, build):
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, model.fit(data, epochs=2, verbose=0).history["loss"]


@pytest.mark.parametrize("kind", ["data", "replicated-model"])
def test_a_current_distribution_trains_under_a_tfdist_strategy_like_one_process(kind):
    devices = DL.list_devices()
    if kind == "data":
        distribution = DL.DataParallel(devices=devices)
    else:
        distribution = DL.ModelParallel(layout_map=_layout_map(devices, (None, None)),
                                        batch_dim_name="batch")
    x, y = (np.random.default_rng(0).normal(size=(100, 6)).astype("float32"),
            np.arange(100) % 3)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

    def build():
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu",
                                                                        name="dense_a"),
                                 keras.layers.Dense(3, name="dense_b")])

    keras.utils.set_random_seed(3)
    with distribution.scope():
        model, losses = _fit(data, build)
        assert isinstance(model.distribute_strategy, tfdist_ext.Strategy)
        assert model.distribute_strategy.num_replicas_in_sync == len(devices)
    assert not tf.distribute.has_strategy()  # left with the scope
    keras.utils.set_random_seed(3)
    reference, want = _fit(data, build)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)




# What a Kubernetes Indexed Job's pod 1 of 3 has (tfdist_ext/cluster_env/kubernetes.py)
# and what `srun -n 3` gives task 2 (tfdist_ext/cluster_env/slurm.py).
_SCHEDULERS = {
    "kubernetes": ({"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-1", "TFDIST_WORKERS": "3",
                    "TFDIST_SERVICE": "workers"}, 1),
    "slurm": ({"SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2", "SLURM_STEP_NODELIST": "n[1-3]",
               "SLURM_STEP_TASKS_PER_NODE": "1(x3)", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
               "SLURMD_NODENAME": "n3", "SLURM_LOCALID": "0", "SLURM_NTASKS": "3"}, 2),
}


@pytest.mark.parametrize("scheduler", sorted(_SCHEDULERS))
def test_initialize_takes_its_arguments_from_the_scheduler(scheduler):
    """`initialize()` without arguments where a scheduler started the process: the job
    TF_CONFIG derives from the scheduler's environment (a real srun: test_multiworker)."""
    variables, index = _SCHEDULERS[scheduler]
    env = {k: v for k, v in os.environ.items()
           if k != "TF_CONFIG" and not k.startswith(("SLURM_", "KERAS_DISTRIBUTION_"))}
    env.update(variables, PYTHONPATH=str(ROOT))
    code = ("import json, keras, tfdist_ext\n"
            "from tfdist_ext.distribution import backend\n"
            "keras.distribution.initialize()\n"
            "print(json.dumps([keras.distribution.list_devices(), backend.num_processes(), "
            "backend.process_id()]))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    devices, processes, process = json.loads(done.stdout.strip().splitlines()[-1])
    assert (devices, processes, process) == (["cpu:0", "cpu:1", "cpu:2"], 3, index)


@pytest.mark.multiworker
def test_installed_when_tfdists_own_compat_module_is_what_imports_keras():
    """Under tfdist-run, `import tfdist_ext` (before keras) runs `early.prepare`, whose
    `_compat` import is the first to import Keras: installing then found `_compat` half
    imported, warned and left keras.distribution on Keras' own TF backend."""
    code = ("import warnings; warnings.simplefilter('error')\n"
            "import tfdist_ext\n"
            "from tfdist_ext import _compat, distribution\n"
            "import keras\n"
            "assert distribution._installed == [True], distribution._installed\n"
            "from tfdist_ext.distribution import backend\n"
            "assert _compat.keras_tf_distribution_lib.list_devices is backend.list_devices\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_keras_distribution_script_at_two_workers_equals_one_process(tmp_path):
    """The same script under tfdist-run (2 workers, `with distribution.scope()`), started
    by hand with Keras' KERAS_DISTRIBUTION_* variables alone (`set_distribution`), and
    as one process: the same losses and weights."""
    code, out, _ = launch(2, [SCRIPT, tmp_path / "run{worker}.json", "scope"], timeout=240)
    assert code == 0, out[-3000:]
    addresses = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    procs = [subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, str(SCRIPT), str(tmp_path / "env{worker}.json"), "global"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict({k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
                 PYTHONPATH=str(ROOT), KERAS_DISTRIBUTION_JOB_ADDRESSES=addresses,
                 KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(i)))
        for i in range(2)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outputs]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "alone.json"), "scope"], cwd=ROOT,
        capture_output=True, text=True, timeout=240, check=False,
        env=dict({k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
                 PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    want = json.loads((tmp_path / "alone.json").read_text())
    assert want["devices"] == ["cpu:0"] and want["processes"] == 1
    for name in ("run0", "run1", "env0", "env1"):
        got = json.loads((tmp_path / f"{name}.json").read_text())
        assert got["devices"] == ["cpu:0", "cpu:1"] and got["processes"] == 2, name
        for model in ("mlp", "cnn"):
            assert got[model]["strategy"] == "Strategy" and got[model]["replicas"] == 2
            np.testing.assert_allclose(got[model]["loss"], want[model]["loss"], rtol=1e-5)
            np.testing.assert_allclose(got[model]["checksum"], want[model]["checksum"],
                                       rtol=1e-5)
            assert abs(got[model]["evaluate"]["accuracy"]
                       - want[model]["evaluate"]["accuracy"]) < 1e-6


@pytest.mark.multiworker
def test_auto_shard_dataset_false_takes_each_workers_dataset_as_its_own(tmp_path):
    """Each worker gives its contiguous part of every global batch (the last one
    uneven, 5 + 6 samples): the losses and weights of one process on the global
    batches. A per-worker dataset TF cannot count is refused, naming the counts."""
    env = dict({k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, PYTHONPATH=str(ROOT))
    code, out, _ = launch(2, [SCRIPT, tmp_path / "run{worker}.json", "local"], timeout=240)
    assert code == 0, out[-3000:]
    assert "differ in content or order" not in out  # each worker's own data, by design
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "alone.json"), "local"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
                          env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    want = json.loads((tmp_path / "alone.json").read_text())
    for worker in range(2):
        got = json.loads((tmp_path / f"run{worker}.json").read_text())
        assert got["processes"] == 2
        for model in ("mlp", "cnn"):
            np.testing.assert_allclose(got[model]["loss"], want[model]["loss"], rtol=1e-5)
            np.testing.assert_allclose(got[model]["checksum"], want[model]["checksum"],
                                       rtol=1e-5)
            np.testing.assert_allclose(got[model]["evaluate"]["loss"],
                                       want[model]["evaluate"]["loss"], rtol=1e-5)
    code, out, _ = launch(2, [SCRIPT, tmp_path / "bad{worker}.json", "local-filtered"],
                          timeout=240)
    assert code != 0
    assert ("DataParallel(auto_shard_dataset=False): each worker trains on its own dataset"
            in out and "have [-2, -2] batches" in out and "assert_cardinality" in out), out[-3000:]
