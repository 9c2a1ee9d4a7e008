"""TF_CONFIG from a Kubernetes Indexed Job's environment (`tfdist_ext.cluster_env`)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from tfdist_ext import cluster, cluster_env

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
