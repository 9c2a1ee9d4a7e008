"""Sync policy configuration: names, defaults, bad input and the compressors each takes."""

import numpy as np
import pytest

import tfdist_ext
from tfdist_ext import sync
from tests.sync import reference
from tests.sync.harness import FEATURES, LR, fit


@pytest.mark.parametrize("name, cls", [
    ("sync", sync.Synchronous), ("local_sgd", sync.LocalSGD),
    ("stale_synchronous", sync.StaleSynchronous),
    ("delayed_averaging", sync.DelayedAveraging), ("model_averaging", sync.ModelAveraging)])
def test_every_policy_has_a_name_with_defaults(name, cls):
    policy = sync.get(name)
    assert isinstance(policy, cls) and policy.name == name
    assert sync.get({"name": name}) == policy


@pytest.mark.parametrize("policy, message", [
    (lambda: sync.LocalSGD(period=0), r"Argument `period` must be an integer >= 1; received 0"),
    (lambda: sync.LocalSGD(period=2.5), r"`period` must be an integer >= 1; received 2.5"),
    (lambda: sync.LocalSGD(warmup_steps=-1),
     r"`warmup_steps` must be an integer >= 0; received -1"),
    (lambda: sync.StaleSynchronous(staleness=0),
     r"`staleness` must be an integer >= 1; received 0"),
    (lambda: sync.DelayedAveraging(delay=-2), r"`delay` must be an integer >= 1; received -2"),
    (lambda: sync.ModelAveraging(learners_per_device=0),
     r"`learners_per_device` must be an integer >= 1; received 0"),
    (lambda: sync.ModelAveraging(alpha=1.5), r"`alpha` must be in \(0, 1\] or None"),
    (lambda: sync.ModelAveraging(momentum=1.0),
     r"`momentum` must be in \[0, 1\) or None \(0.9, or 0 with SGD \+ momentum\); received 1.0"),
    (lambda: sync.get({"name": "local_sgd", "periods": 3}), r"periods"),
])
def test_bad_policy_arguments_are_rejected(policy, message):
    with pytest.raises(ValueError, match=message):
        policy()


@pytest.mark.parametrize("compression", ["topk", "qsgd", "powersgd"])
@pytest.mark.parametrize("policy", ["stale_synchronous", "delayed_averaging"])
def test_in_flight_rounds_refuse_compressors_that_need_more_than_one_all_reduce(
        policy, compression):
    needs = "two all-reduces" if compression == "powersgd" else "an all-gather"
    with pytest.raises(ValueError, match=(
            rf"sync='{policy}' holds each step's gradient all-reduce in flight, which takes "
            rf"one-round reducible compressors \('fp16', 'bf16', 'randomk'\); "
            rf"compression='{compression}' needs {needs} per step")):
        tfdist_ext.Strategy(sync=policy, compression=compression, num_replicas=2)


# test_policies_replicas.py trains delayed averaging with fp16 and stale-synchronous
# training with random-k. The tolerances are about 4 times the compressors' error here.
@pytest.mark.parametrize("policy, compression, payload, atol", [
    ("stale_synchronous", "bf16", (FEATURES, "bfloat16"), 3e-3),
    ("delayed_averaging", {"name": "randomk", "ratio": 0.4}, (2, "float32"), 3e-2),
], ids=["stale_synchronous-bf16", "delayed_averaging-randomk"])
def test_in_flight_rounds_send_reducible_payloads_and_train_like_dense_rounds(
        policy, compression, payload, atol):
    steps, lag = 4, 2
    w0, _, final, strategy, rows = fit(policy, steps, compression=compression)
    stats = strategy.communication_stats()
    ops = strategy.extended.cross_device_ops
    assert stats["sync_rounds"] == stats["reductions"] == steps
    assert stats["bytes_sent"] == steps * ops.wire.dense(*payload)
    assert stats["dense_bytes"] == steps * ops.wire.dense(FEATURES, "float32")
    np.testing.assert_array_equal(final[0], final[1])
    _, dense = getattr(reference, policy)(w0, rows, steps, 2, LR, lag)
    np.testing.assert_allclose(final[0], dense, rtol=0, atol=atol)


@pytest.mark.parametrize("policy", ["model_averaging"])
@pytest.mark.parametrize("compression", ["topk", "qsgd", "fp16", "powersgd"])
def test_policies_that_do_not_reduce_gradients_each_step_refuse_compression(policy,
                                                                            compression):
    with pytest.raises(ValueError, match=(
            rf"Arguments `sync` and `compression` conflict: sync='{policy}' communicates "
            rf".*compression='{compression}'.*Use compression='none' with sync='{policy}', "
            rf"or sync='sync' with compression='{compression}'")):
        tfdist_ext.Strategy(sync=policy, compression=compression, num_replicas=2)


# topk: test_policies_replicas.py; powersgd: test_sync_workers.py (both train).
@pytest.mark.parametrize("compression, payload, atol", [
    ("fp16", (FEATURES, "float16"), 5e-4), ("qsgd", None, 0.15)], ids=["fp16", "qsgd"])
def test_local_sgd_rounds_send_compressed_changes_and_train_like_dense_rounds(
        compression, payload, atol):
    steps, period = 4, 2
    w0, history, final, strategy, rows = fit(sync.LocalSGD(period=period), steps,
                                             compression=compression)
    stats = strategy.communication_stats()
    ops = strategy.extended.cross_device_ops
    rounds = steps // period
    assert stats["sync_rounds"] == stats["reductions"] == rounds
    dense_bytes = rounds * ops.wire.dense(FEATURES, "float32")
    assert stats["dense_bytes"] == dense_bytes
    if payload:
        assert stats["bytes_sent"] == rounds * ops.wire.dense(*payload)
    assert 0 < stats["bytes_sent"] < dense_bytes
    for t in range(period - 1, steps, period):
        np.testing.assert_array_equal(history[t][0], history[t][1])
    dense = reference.local_sgd(w0, rows, steps, 2, LR, period)[-1][0]
    np.testing.assert_allclose(final[0], dense, rtol=0, atol=atol)
