"""TF_CONFIG from a Kubernetes Indexed Job's or a Slurm step's environment
(`tfdist_ext.cluster_env`), and from TF's cluster resolvers (`cluster.tf_config_from_resolver`).

The Slurm derivation against a real `srun`: tests/test_multiworker.py.
"""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from conftest import ROOT
from tfdist_ext import cluster, cluster_env
from tfdist_ext.cluster_env import ray as ray_env, slurm

POD = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-mnist-1", "TFDIST_WORKERS": "3",
       "TFDIST_SERVICE": "workers"}


def test_an_indexed_job_pod_gets_its_worker_task():
    config = json.loads(cluster_env.kubernetes_tf_config(POD))
    assert config == {"cluster": {"worker": ["train-mnist-0.workers:12345",
                                             "train-mnist-1.workers:12345",
                                             "train-mnist-2.workers:12345"]},
                      "task": {"type": "worker", "index": 1}}
    spec = cluster.parse_tf_config(json.dumps(config))  # what the strategy validates
    assert (spec.task_type, spec.task_index, spec.num_workers) == ("worker", 1, 3)
    other = json.loads(cluster_env.kubernetes_tf_config({**POD, "TFDIST_PORT": "2222"}))
    assert other["cluster"]["worker"][2] == "train-mnist-2.workers:2222"


def test_other_environments_are_left_alone():
    assert cluster_env.kubernetes_tf_config({}) is None
    assert cluster_env.kubernetes_tf_config({"JOB_COMPLETION_INDEX": "0"}) is None
    environ = {**POD, "TF_CONFIG": '{"cluster": {}}'}  # the user's TF_CONFIG wins
    assert not cluster_env.apply(environ) and environ["TF_CONFIG"] == '{"cluster": {}}'
    environ = dict(POD)
    assert cluster_env.apply(environ) and json.loads(environ["TF_CONFIG"])["task"]["index"] == 1


@pytest.mark.parametrize("change, message", [
    ({"TFDIST_WORKERS": "three"}, r"TFDIST_WORKERS='three' must be an integer in \[1, "),
    ({"TFDIST_WORKERS": "0"}, r"TFDIST_WORKERS='0' must be an integer in \[1, "),
    ({"JOB_COMPLETION_INDEX": "3"}, r"JOB_COMPLETION_INDEX='3' must be an integer in \[0, 2\]"),
    ({"TFDIST_PORT": "70000"}, r"TFDIST_PORT='70000' must be an integer in \[1, 65535\]"),
    ({"TFDIST_SERVICE": ""}, r"TFDIST_WORKERS='3' is set but TFDIST_SERVICE is not"),
    ({"JOB_COMPLETION_INDEX": None}, r"is set but JOB_COMPLETION_INDEX is not"),
    ({"HOSTNAME": "trainer"}, r"HOSTNAME='trainer' does not end in -1 \(JOB_COMPLETION_INDEX\)"),
    ({"HOSTNAME": "-1"}, r"HOSTNAME='-1' does not end in -1"),
])
def test_a_malformed_pod_environment_is_named(change, message):
    env = {k: v for k, v in {**POD, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        cluster_env.kubernetes_tf_config(env)


def test_import_sets_tf_config():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(POD, TFDIST_WORKERS="1", JOB_COMPLETION_INDEX="0", HOSTNAME="train-0",
               PYTHONPATH=str(ROOT))
    code = "import os, tfdist_ext; print(os.environ['TF_CONFIG'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout.split("\n")
    assert json.loads(out[0])["cluster"]["worker"] == ["train-0.workers:12345"]


# What `srun -n 5 -N 3` gives task 3 (of 2+2+1 tasks on gpu07, gpu08 and gpu10).
STEP = {"SLURM_STEP_NUM_TASKS": "5", "SLURM_PROCID": "3", "SLURM_STEP_NODELIST": "gpu[07-08,10]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1",
        "SLURMD_NODENAME": "gpu08", "SLURM_LOCALID": "1", "SLURM_NTASKS": "5"}


def test_slurm_host_lists_and_task_counts_expand():
    assert slurm.expand_hostlist("gpu[07-08,10],cpu1,a[1-2]b[08-09]") == [
        "gpu07", "gpu08", "gpu10", "cpu1", "a1b08", "a1b09", "a2b08", "a2b09"]
    assert slurm.expand_hostlist("node9") == ["node9"]
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.layout([2, 2, 1], "block") == [0, 0, 1, 1, 2]
    assert slurm.layout([2, 2, 1], "cyclic:block") == [0, 1, 2, 0, 1]
    assert slurm.layout([3, 1, 3], "plane=2") == [0, 0, 1, 2, 2, 0, 2]


def test_a_slurm_task_gets_its_worker_and_port():
    config = json.loads(slurm.slurm_tf_config(STEP))
    base = 10000 + (4242 * 16 + 1) % 1000 * 20
    assert config == {"cluster": {"worker": [
        f"gpu07:{base}", f"gpu07:{base + 1}", f"gpu08:{base}", f"gpu08:{base + 1}",
        f"gpu10:{base}"]}, "task": {"type": "worker", "index": 3}}
    assert cluster.parse_tf_config(json.dumps(config)).num_workers == 5
    cyclic = json.loads(slurm.slurm_tf_config({**STEP, "SLURM_DISTRIBUTION": "cyclic",
                                               "SLURMD_NODENAME": "gpu07", "TFDIST_PORT": "2000",
                                               "SLURM_LOCALID": "1"}))
    assert cyclic["cluster"]["worker"] == ["gpu07:2000", "gpu08:2000", "gpu10:2000",
                                           "gpu07:2001", "gpu08:2001"]


def test_slurm_environments_that_are_no_cluster_are_left_alone():
    batch = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP_")}
    assert slurm.slurm_tf_config(batch) is None  # sbatch's script, salloc's shell
    one = {**STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}
    assert slurm.slurm_tf_config(one) is None  # srun -n 1
    assert slurm.slurm_tf_config({**STEP, "TFDIST_SLURM": "0"}) is None
    environ = dict(STEP)
    assert cluster_env.apply(environ) and json.loads(environ["TF_CONFIG"])["task"]["index"] == 3


@pytest.mark.parametrize("change, message", [
    ({"SLURM_PROCID": "5"}, r"SLURM_PROCID='5' is not an integer in \[0, 4\]"),
    ({"SLURM_STEP_NODELIST": "gpu[07-08"}, r"SLURM_STEP_NODELIST='gpu\[07-08' has unbalanced"),
    ({"SLURM_STEP_NODELIST": "gpu[08-07]"}, r"has a decreasing range '08-07'"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, r"does not match SLURM_STEP_NODELIST="),
    ({"SLURM_STEP_TASKS_PER_NODE": "2x3"}, r"'2x3' is not a list like 2\(x3\),1"),
    ({"SLURM_DISTRIBUTION": "arbitrary"}, r"'arbitrary' does not say on which node each task"),
    ({"SLURM_LOCALID": "0"}, r"SLURM_LOCALID='0' is not where the block distribution puts "
                             r"task 3 \(SLURM_LOCALID 1\)"),
    ({"SLURMD_NODENAME": "gpu10"}, r"SLURMD_NODENAME='gpu10' is not where"),
    ({"TFDIST_PORT": "65535"}, r"TFDIST_PORT='65535' is not an integer in \[1, 65534\]"),
])
def test_a_malformed_slurm_step_is_named(change, message):
    with pytest.raises(ValueError, match=message) as err:
        slurm.slurm_tf_config({**STEP, **change})
    assert "TFDIST_SLURM=0" in str(err.value)


def test_a_cluster_resolver_becomes_tf_config():
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": {0: "a:1", 1: "b:2"}}), task_type="worker", task_id=1)
    config = json.loads(cluster.tf_config_from_resolver(resolver))
    assert config == {"cluster": {"worker": ["a:1", "b:2"]},
                      "task": {"type": "worker", "index": 1}}
    with pytest.raises(ValueError, match=r"Argument `cluster_resolver` must be a "
                                         r"tf.distribute.cluster_resolver.ClusterResolver"):
        cluster.tf_config_from_resolver("worker:0")
    lost = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["a:1"]}), task_type="worker", task_id=4)
    with pytest.raises(ValueError, match=r"`cluster_resolver` \(SimpleClusterResolver\) does "
                                         r"not describe this task: .*task index 4 is out of"):
        cluster.tf_config_from_resolver(lost)


@pytest.mark.parametrize("value, removed", [("1", True), ("True", True), ("true", True),
                                            ("0", False), ("", False), (None, False)])
def test_ray_trainers_legacy_keras_setting_is_removed(value, removed, caplog):
    environ = {"RAY_RAYLET_PID": "1"} if value is None else {
        "TF_USE_LEGACY_KERAS": value, "RAY_RAYLET_PID": "1"}
    with caplog.at_level("INFO", logger="tfdist_ext"):
        assert ray_env.keep_keras_3(environ) is removed
    assert ("TF_USE_LEGACY_KERAS" in environ) is (value is not None and not removed)
    if removed:
        assert (f"TF_USE_LEGACY_KERAS={value} removed (Ray Train's TensorflowTrainer sets it): "
                "tfdist_ext trains Keras 3 models") in caplog.text


def test_import_after_tensorflow_still_gives_keras_3_to_tf_keras():
    # As in a Ray Train worker: TF_CONFIG and TF_USE_LEGACY_KERAS=1 set (tf_keras is not
    # installed, so tf.keras would fail), tensorflow imported before tfdist_ext.
    code = ("import tensorflow as tf, keras, tfdist_ext, os; "
            "assert 'TF_USE_LEGACY_KERAS' not in os.environ; "
            "assert tf.keras.layers.Dense is keras.layers.Dense; print('ok')")
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=str(ROOT))
    env.pop("TF_CONFIG", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
