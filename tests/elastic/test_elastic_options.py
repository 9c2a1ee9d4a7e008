"""Elastic training's options, checked in process: bad values, the choices it cannot run
with, the environment that turns it on (the jobs themselves: test_elastic.py)."""

import json

import pytest

import tfdist_ext
from elastic_jobs import NO_UCX
from tfdist_ext import cluster
from tfdist_ext.elastic import Elastic
from tfdist_ext.elastic import options as elastic_options
from tfdist_ext.strategy_config import StrategyConfig


@pytest.mark.parametrize("value, message", [
    ("yes", r"Argument `elastic` must be True, False, a dict of options"),
    ({"min_worker": 2}, r"Argument `elastic` has unknown option\(s\) \['min_worker'\]"),
    ({"min_workers": 0}, r"`min_workers` of Elastic must be an integer >= 1; received 0"),
    ({"recover_seconds": float("inf")}, r"`recover_seconds` of Elastic must be a finite"),
    ({"join_seconds": 0}, r"`join_seconds` of Elastic must be a finite number > 0; received 0"),
])
def test_bad_options_name_the_argument(value, message):
    with pytest.raises(ValueError, match=message):
        tfdist_ext.Strategy(elastic=value, num_replicas=2)


@NO_UCX
@pytest.mark.parametrize("kwargs, conflict", [
    ({"engine": "tf"}, "engine='tf' (needs 'ucx'"),
    ({"sync": "local_sgd"}, "sync='local_sgd' (needs 'sync')"),
    ({"allreduce": "auto"}, "(needs a fixed algorithm such as 'ring')"),
    ({"compression": "topk"}, "compression='topk' (needs 'none')"),
])
def test_options_it_cannot_run_with_are_refused(kwargs, conflict):
    with pytest.raises(ValueError) as info:
        tfdist_ext.Strategy(elastic=True, num_replicas=2, **kwargs)
    assert "Argument `elastic` cannot be combined with" in str(info.value)
    assert conflict in str(info.value)


def test_elastic_without_the_ucx_library_says_why_the_engine_fell_back(monkeypatch):
    from tfdist_ext.ops import ucx as ucx_ops

    monkeypatch.setattr(ucx_ops, "_library_path", lambda: None)
    monkeypatch.setenv(elastic_options.VARIABLE, "1")
    with pytest.warns(UserWarning, match="Using TF's collectives"), \
            pytest.raises(ValueError) as info:
        tfdist_ext.Strategy(num_replicas=2)
    message = str(info.value)
    assert "engine='tf' (needs 'ucx', whose communicators can be rebuilt; the UCX engine " \
           "is unavailable: the tfdist_ext UCX op library is not available" in message
    assert "pip install 'libucx-cu12>=1.22,<1.23'" in message
    assert "the environment has TFDIST_ELASTIC=1" in message


def test_one_process_has_nothing_to_survive():
    strategy = tfdist_ext.Strategy(elastic={"min_workers": 1}, num_replicas=2)
    assert strategy.elastic is None


@NO_UCX
def test_a_conflict_from_the_environment_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv("TFDIST_ELASTIC", "1")
    with pytest.raises(ValueError) as info:
        tfdist_ext.Strategy(compression="topk", num_replicas=2)
    assert "compression='topk' (needs 'none')" in str(info.value)
    assert "the environment has TFDIST_ELASTIC=1, e.g. from `tfdist-run --elastic`" in \
        str(info.value)


def test_the_environment_turns_it_on_for_an_unchanged_script():
    assert elastic_options.get(None, {}) is None
    assert elastic_options.get(None, {"TFDIST_ELASTIC": "1"}) == Elastic()
    assert elastic_options.get(False, {"TFDIST_ELASTIC": "1"}) is None
    with pytest.raises(ValueError, match=r"Environment variable TFDIST_ELASTIC='yes' must be"):
        elastic_options.get(None, {"TFDIST_ELASTIC": "yes"})


def test_a_cluster_with_a_chief_job_is_refused():
    spec = cluster.parse_tf_config(json.dumps({
        "cluster": {"chief": ["127.0.0.1:1000"], "worker": ["127.0.0.1:1001"]},
        "task": {"type": "worker", "index": 0}}))
    config = StrategyConfig.from_args(engine="tf")
    with pytest.raises(ValueError) as info:
        Elastic().check(config, spec)
    assert "a TF_CONFIG cluster with jobs ['chief', 'worker'] (needs 'worker' tasks only" \
        in str(info.value)
