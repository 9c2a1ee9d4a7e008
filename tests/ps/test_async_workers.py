"""sync='async' across worker processes and parameter servers (tfdist-run --ps)."""

import json
import pathlib

import numpy as np
import pytest

from tests.conftest import launch, read_worker_json
from tfdist_ext import cluster
from tfdist_ext.ops import ucx as ucx_ops
from tfdist_ext.strategy import Strategy
from tfdist_ext.sync import Asynchronous

CHECKS = pathlib.Path(__file__).resolve().parent.parent / "workers" / "async_checks.py"
STEPS = 24  # async_checks.py: 2 epochs x 12 steps
needs_ucx = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")


@needs_ucx
@pytest.mark.multiworker
@pytest.mark.alone
def test_async_sessions_on_three_workers_and_two_servers(tmp_path):
    code, out, _ = launch(3, [CHECKS, tmp_path, "train"], timeout=300, options=("--ps", "2"))
    assert code == 0, out
    workers = read_worker_json(tmp_path, 3)
    unbounded, bounded, restored, batchnorm = zip(*workers)
    for runs in (unbounded, bounded):
        assert len({r["sha"] for r in runs}) == 1, "one model after the barrier"
        for r in runs:
            assert r["stats"]["async_steps"] == STEPS
            assert sum(r["stats"]["staleness_histogram"]) == STEPS
            # Each step sends the gradient once (161 float32 parameters).
            assert r["stats"]["bytes_sent"] == STEPS * 161 * 4
            assert r["loss"][-1] < r["loss"][0], r["loss"]
    # The slow worker's gradients arrive late without a bound...
    assert unbounded[2]["stats"]["staleness_max"] > 2, unbounded[2]["stats"]
    assert unbounded[2]["stats"]["staleness_mean"] > unbounded[0]["stats"]["staleness_mean"]
    # ... and never older than the bound (workers - 1) with it.
    for r in bounded:
        assert r["stats"]["staleness_max"] <= 2, r["stats"]
        assert r["stats"]["async_refused"] == 0
        # Momentum compensation (on there): 1 - (1 - 0.5) x 3 workers < 0, so the servers
        # ran plain SGD and sent back no momentum.
        assert not any(np.abs(np.asarray(m)).max() > 0 for m in r["slots"]), r["slots"]
    # Validation ran during fit (the workers pause on the servers meanwhile).
    assert all(len(r["val_loss"]) == 2 for r in unbounded)
    # Every worker ends with the servers' momentum (what checkpoints save).
    assert unbounded[0]["slots"] == unbounded[1]["slots"] == unbounded[2]["slots"]
    assert any(np.abs(np.asarray(m)).max() > 0 for m in unbounded[0]["slots"])
    # Session 3 seeds the servers with weights and momentum restored from session 1's
    # checkpoint; at learning rate 0 each of the 3 updates adds the decayed momentum:
    # w + (0.5 + 0.25 + 0.125) m (a lost momentum would leave w unchanged).
    start = restored[0]["restored"]
    assert any(np.abs(np.asarray(m)).max() > 0 for m in start["slots"])
    for r in restored:
        for got, w, m in zip(r["weights"], start["weights"], start["slots"]):
            np.testing.assert_allclose(got, np.asarray(w) + 0.875 * np.asarray(m),
                                       rtol=1e-5, atol=1e-6)
    # BatchNorm statistics stay per worker during fit and are averaged when it returns.
    assert len({r["sha"] for r in batchnorm}) == 1, batchnorm
    assert np.abs(np.asarray(batchnorm[0]["moving_mean"])).max() > 0, batchnorm
    assert "parameter server 0, session 0:" in out and "worker 2:" in out
    assert "every worker has left; exiting" in out


@needs_ucx
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_dead_parameter_server_stops_the_job_naming_it(tmp_path):
    code, out, seconds = launch(2, [CHECKS, tmp_path, "kill_server"], timeout=120,
                                options=("--ps", "1"))
    assert code != 0, out
    assert "parameter server 0 (pid" in out and "was killed by SIGKILL" in out, out
    assert "the parameter server at 127.0.0.1:" in out  # what the workers said
    assert seconds < 60, out


def _spec(jobs, task=("worker", 0)):
    return cluster.ClusterSpec(jobs=jobs, task_type=task[0], task_index=task[1])


def test_async_without_servers_names_the_fix():
    with pytest.raises(ValueError, match=r"sync='async' needs parameter servers, but "
                                         r"TF_CONFIG is not set.*tfdist-run -np N --ps M"):
        Asynchronous().check_servers(None, 1)
    with pytest.raises(ValueError, match=r"TF_CONFIG's cluster has jobs \['worker'\] and no "
                                         r"'ps' job"):
        Asynchronous().check_servers(_spec({"worker": ["a:1", "b:2"]}), 2)
    with pytest.raises(ValueError, match=r"needs parameter servers"):
        Strategy(sync="async", num_replicas=2)


def test_staleness_bound_below_workers_minus_one_is_refused():
    spec = _spec({"worker": ["a:1", "b:2", "c:3"], "ps": ["d:4"]})
    assert Asynchronous(staleness_bound=2).check_servers(spec, 3) == ["d:4"]
    with pytest.raises(ValueError, match=r"`staleness_bound` \(1\) must be at least the "
                                         r"number of replicas minus one \(2\)"):
        Asynchronous(staleness_bound=1).check_servers(spec, 3)


@pytest.mark.parametrize("kwargs,match", [
    ({"staleness_bound": -1}, r"`staleness_bound` must be None or an integer >= 0; "
                              r"received -1"),
    ({"staleness_bound": 1.5}, r"received 1.5"),
    ({"delay_compensation": -0.1}, r"`delay_compensation` must be a finite number >= 0"),
    ({"timeout_seconds": float("nan")}, r"`timeout_seconds` must be a finite number")])
def test_async_options_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Asynchronous(**kwargs)


def test_a_ps_job_needs_sync_async(monkeypatch):
    from tfdist_ext.ps import roles  # pylint: disable=import-outside-toplevel

    cluster = {"worker": ["a:1"], "ps": ["b:2", "c:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    with pytest.raises(ValueError, match=r"TF_CONFIG has a 'ps' job \(2 task\(s\)\), which "
                                         r"only sync='async' uses; this strategy has "
                                         r"sync='local_sgd'"):
        Strategy(sync="local_sgd")
    resolver = roles.serve_or_resolver(_spec(cluster), Asynchronous())
    assert resolver.cluster_spec().as_dict() == {"worker": ["a:1"]}


def test_async_by_name_and_dict():
    from tfdist_ext import sync  # pylint: disable=import-outside-toplevel

    assert isinstance(sync.get("async"), Asynchronous)
    policy = sync.get({"name": "async", "staleness_bound": 3, "delay_compensation": 0.1})
    assert (policy.staleness_bound, policy.delay_compensation) == (3, 0.1)
    assert json.dumps(policy.communicates)
