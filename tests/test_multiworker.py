"""Keras fit across worker processes started by tfdist-run (TF_CONFIG, gRPC)."""

import pathlib

import pytest

from conftest import ROOT, launch, read_worker_json

pytestmark = pytest.mark.multiworker
CHECKS = ROOT / "tests" / "workers" / "multiworker_checks.py"


def test_stock_multi_worker_strategy_fails_where_ours_passes(tmp_path):
    code, out, _ = launch(2, [CHECKS, tmp_path, "stock"], timeout=180)
    assert code == 0, out
    for result in read_worker_json(tmp_path, 2):
        # The bugs this plugin repairs (keras-team/keras#20585).
        assert "Attempt to convert a value (PerReplica" in result["reduce_nest"]["error"]
        assert "Invalid reduction dimension 0 for input with 0 dimensions" in \
            result["reduce_scalar_axis0"]["error"]
        assert "Attempt to convert a value (PerReplica" in result["fit"]["error"]


@pytest.mark.parametrize("num_workers", [2, 3])
def test_fit_on_workers_ends_with_identical_weights(tmp_path, num_workers):
    code, out, _ = launch(num_workers, [CHECKS, tmp_path, "tfdist"], timeout=240)
    assert code == 0, out
    results = read_worker_json(tmp_path, num_workers)
    for result in results:
        assert result["workers"] == num_workers
        per_replica = 24 // num_workers  # the global batch of 24 is split
        assert result["reduce_nest"] == {"ok": True, "value": [[per_replica, 5], [per_replica, 1]]}
        assert result["reduce_scalar_axis0"]["value"] == pytest.approx((num_workers - 1) / 2)
        loss = result["fit"]["value"]["loss"]
        assert loss[-1] < 0.5 * loss[0], loss
    assert len({r["fit"]["value"]["sha"] for r in results}) == 1


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
