"""Ordinary Keras training features on two worker processes equal single-process training.

Gradient accumulation (keras-team/keras#20582), clipping, class and sample
weights, validation data and split, steps_per_execution, XLA (`jit_compile`),
synchronized batch normalization;
and mixed precision whose loss-scale overflows must not reach the
error-feedback residuals.
"""

import numpy as np
import pytest

from conftest import ROOT, launch, read_worker_json
from tests.workers import feature_checks


def _check(results):
    for name in feature_checks.FEATURES:
        run = results[name]
        np.testing.assert_allclose(run["loss"], run["reference_loss"], rtol=1e-5, err_msg=name)
        assert run["max_weight_difference"] < 1e-5, (name, run["max_weight_difference"])
        if run["reference_val_loss"] is not None:
            np.testing.assert_allclose(run["val_loss"], run["reference_val_loss"], rtol=1e-5,
                                       err_msg=name)
    mixed = results["mixed_float16"]
    assert mixed["residuals_finite"] and mixed["residuals"] > 0, mixed
    assert mixed["loss_scale"] < 2.0 ** 28, mixed  # overflows happened and were skipped
    assert mixed["applied_steps"] > 0, mixed
    assert np.all(np.isfinite(mixed["loss"])), mixed


@pytest.mark.multiworker
def test_features_on_two_workers(tmp_path):
    code, out, _ = launch(2, [ROOT / "tests" / "workers" / "feature_checks.py", tmp_path],
                          timeout=400)
    assert code == 0, out[-4000:]
    results = read_worker_json(tmp_path, 2)
    for result in results:
        _check(result)
    for name in [*feature_checks.FEATURES, "mixed_float16"]:
        assert results[0][name]["sha"] == results[1][name]["sha"], name
