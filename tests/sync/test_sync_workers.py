"""Sync policies across worker processes (one launch, several policies per worker)."""

import json
import pathlib

import pytest

from tests.conftest import launch, read_worker_json

CHECKS = pathlib.Path(__file__).resolve().parent.parent / "workers" / "sync_checks.py"
STEPS = 24  # 2 epochs x 12 steps (sync_checks.py)

RUNS = [
    {"sync": "sync", "sleep": 0.05},
    {"sync": {"name": "stale_synchronous", "staleness": 2}, "sleep": 0.05},
    {"sync": {"name": "stale_synchronous", "staleness": 2}, "sleep": 0.0},
    {"sync": {"name": "local_sgd", "period": 3}, "sleep": 0.0},
    {"sync": {"name": "local_sgd", "period": 3}, "compression": "powersgd", "sleep": 0.0},
    {"sync": {"name": "diloco", "period": 3}, "sleep": 0.0},
    {"sync": {"name": "gossip"}, "sleep": 0.0},
    {"sync": {"name": "gossip", "mix_gradients": True}, "sleep": 0.0},
    {"sync": {"name": "delayed_averaging", "delay": 2}, "sleep": 0.0},
    {"sync": {"name": "model_averaging", "learners_per_device": 2}, "sleep": 0.0},
]


@pytest.mark.multiworker
def test_policies_on_two_workers(tmp_path):
    code, out, _ = launch(2, [CHECKS, tmp_path, *map(json.dumps, RUNS)], timeout=240)
    assert code == 0, out
    workers = read_worker_json(tmp_path, 2)
    for i, spec in enumerate(RUNS):
        runs = [w[i] for w in workers]
        name = runs[0]["policy"]
        assert name == (spec["sync"] if isinstance(spec["sync"], str) else spec["sync"]["name"])
        # One model on every worker after the final drain.
        assert runs[0]["sha"] == runs[1]["sha"], name
        assert runs[0]["loss"][-1] < runs[0]["loss"][0], (name, runs[0]["loss"])
        stats = [r["stats"] for r in runs]
        if name == "sync":
            assert all(s["reductions"] == STEPS for s in stats)
        elif name == "stale_synchronous":
            assert all(s["sync_rounds"] == STEPS for s in stats)
            # The lead over the slowest worker never exceeds s = 2 ...
            assert all(1 <= s["staleness_max"] <= 2 for s in stats), stats
            # ... and the pipeline was used (a worker ran ahead of a reduction).
            assert max(s["staleness_mean"] for s in stats) > 0, stats
        elif name == "local_sgd" and "compression" in spec:  # parameter changes, compressed
            assert all(s["sync_rounds"] == s["reductions"] == STEPS // 3 for s in stats)
            assert all(0 < s["bytes_sent"] < s["dense_bytes"] for s in stats), stats
        elif name == "local_sgd":
            assert all(s["sync_rounds"] == STEPS // 3 and s["reductions"] == 0 for s in stats)
        elif name == "gossip":  # one exchange with one peer per step, no all-reduce
            assert all(s["sync_rounds"] == s["reductions"] == STEPS for s in stats), stats
            # The whole model to one peer: what a ring all-reduce sends on 2 workers;
            # the gradients as well with mix_gradients.
            copies = 2 if spec["sync"].get("mix_gradients") else 1
            assert all(s["bytes_sent"] == copies * s["dense_bytes"] > 0 for s in stats), stats
            assert all(s["consensus_distance"] >= 0 for s in stats), stats
        elif name == "diloco":  # the outer gradients travel dense, counted
            assert all(s["sync_rounds"] == s["reductions"] == STEPS // 3 for s in stats)
            assert all(s["bytes_sent"] == s["dense_bytes"] > 0 for s in stats), stats
        else:
            assert all(s["sync_rounds"] == STEPS for s in stats), (name, stats)
