"""Sync policies in Keras `fit` on logical-CPU replicas, against numpy references.

The model is a bias-free linear layer with MSE loss (a quadratic) trained with
plain SGD (the harness); `reference.py` implements each paper's update rule
independently. Gossip has its own file.
"""

import dataclasses

import keras
import numpy as np
import pytest

import tfdist_ext
from tfdist_ext import sync
from tests.sync import reference
from tests.sync.harness import FEATURES, LR, PER_REPLICA, close, data, fit


def test_synchronous_reference_matches_fit():
    # Checks the harness itself (row layout, loss scaling) against Keras' own path.
    w0, history, final, _, rows = fit("sync")
    expected = reference.synchronous(w0, rows, 6, 2, LR)
    close(final, expected)


@pytest.mark.parametrize("warmup", [0, 2])
def test_local_sgd_differs_between_and_is_equal_after_averaging(warmup):
    steps, period = 9, 3
    w0, history, final, strategy, rows = fit(sync.LocalSGD(period=period,
                                                           warmup_steps=warmup), steps)
    expected = reference.local_sgd(w0, rows, steps, 2, LR, period, warmup)
    for t in range(steps):
        close(history[t], expected[t])
        averaged = t < warmup or (t + 1) % period == 0
        if averaged:  # exactly equal, not just close
            np.testing.assert_array_equal(history[t][0], history[t][1])
        else:
            assert np.abs(history[t][0] - history[t][1]).max() > 1e-4, t
    rounds = strategy.communication_stats()["sync_rounds"]
    assert rounds == len([t for t in range(warmup, steps) if (t + 1) % period == 0])
    np.testing.assert_array_equal(final[0], final[1])


def test_local_sgd_communicates_one_round_per_period():
    steps, period = 12, 3
    *_, synchronous, _ = fit("sync", steps)
    *_, local, _ = fit(sync.LocalSGD(period=period), steps)
    sync_rounds = synchronous.communication_stats()["reductions"]
    local_stats = local.communication_stats()
    assert sync_rounds == steps
    assert local_stats["reductions"] == 0  # no gradient all-reduce at all
    assert local_stats["sync_rounds"] * period == sync_rounds
    per_round = local.extended.cross_device_ops.wire.dense(5, "float32")
    assert local_stats["bytes_sent"] == local_stats["sync_rounds"] * per_round > 0


ENGINES = ["ucx", "tf"]  # start/wait tickets; background thread


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("delay", [1, 2])
def test_delayed_averaging_follows_the_paper(delay, engine):
    steps = 7
    w0, history, final, strategy, rows = fit(sync.DelayedAveraging(delay=delay), steps,
                                             engine=engine)
    expected, drained = reference.delayed_averaging(w0, rows, steps, 2, LR, delay)
    for t in range(steps):
        close(history[t], expected[t])
    assert np.abs(history[-1][0] - history[-1][1]).max() > 1e-4  # replicas differ ...
    close(final, [drained, drained])  # ... until the drain
    np.testing.assert_array_equal(final[0], final[1])
    stats = strategy.communication_stats()
    assert stats["sync_rounds"] == stats["reductions"] == steps
    dense = strategy.extended.cross_device_ops.wire.dense(FEATURES, "float32")
    assert stats["bytes_sent"] == stats["dense_bytes"] == steps * dense > 0


def _float16(vector, residual):
    sent = (vector + residual).astype(np.float16).astype(np.float64)
    _float16.inputs.append(vector + residual)
    return sent, np.zeros_like(residual)


_float16.inputs = []


def _tie_margin(values):
    """Smallest distance of `values` to a float16 rounding tie, relative to each value.

    The step computes in float32 and the reference in float64: both round a value to
    the same float16 only if it is further from a tie than their difference (~1e-7
    relative for these few float32 steps).
    """
    values = np.abs(np.asarray(values, np.float64)).ravel()
    values = values[values > 0]
    spacing = 2.0 ** np.maximum(np.floor(np.log2(values)) - 10, -24)  # float16's, at values
    low = np.floor(values / spacing) * spacing
    return float(np.min(np.abs(values - (low + spacing / 2)) / values))


def _float16_sum(vectors):  # the all-reduce adds float16 payloads in float16
    return np.sum(np.asarray(vectors, np.float16), axis=0, dtype=np.float16).astype(np.float64)


@pytest.mark.parametrize("engine", ENGINES)
def test_delayed_averaging_sends_compressed_rounds(engine):
    """fp16 rounds: the update uses the decompressed sum and own contribution d
    steps late; half the bytes; random-k keeps its residual across rounds."""
    steps, delay = 7, 2
    w0, history, final, strategy, rows = fit(sync.DelayedAveraging(delay=delay), steps,
                                             engine=engine, compression="fp16")
    _float16.inputs.clear()
    expected, drained = reference.delayed_averaging_compressed(w0, rows, steps, 2, LR, delay,
                                                               _float16, _float16_sum)
    assert _tie_margin(_float16.inputs) > 1e-6, "the data puts a value at a float16 tie"
    for t in range(steps):
        np.testing.assert_allclose(history[t], expected[t], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(final, [drained, drained], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(final[0], final[1])
    stats = strategy.communication_stats()
    ops = strategy.extended.cross_device_ops
    assert stats["bytes_sent"] == steps * ops.wire.dense(FEATURES, "float16")
    assert stats["dense_bytes"] == steps * ops.wire.dense(FEATURES, "float32")
    # The rounding is visible: not the dense reference's weights.
    dense, _ = reference.delayed_averaging(w0, rows, steps, 2, LR, delay)
    assert np.abs(np.asarray(history[-1]) - np.asarray(dense[-1])).max() > 1e-7


def test_stale_synchronous_with_random_k_keeps_residuals():
    *_, strategy, _ = fit(sync.StaleSynchronous(staleness=1), 6, num=2,
                          compression={"name": "randomk", "ratio": 0.4})
    residuals = strategy.state.buffers_ending("_float32_5")
    assert list(residuals) == ["inflight_b0_float32_5"]
    assert all(np.abs(v.numpy()).max() > 0 for v in residuals["inflight_b0_float32_5"])
    stats = strategy.communication_stats()
    assert stats["bytes_sent"] < stats["dense_bytes"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("staleness", [1, 2])
def test_stale_synchronous_follows_ssp(staleness, engine):
    steps = 7
    w0, history, final, strategy, rows = fit(sync.StaleSynchronous(staleness=staleness),
                                             steps, num=3, engine=engine)
    expected, drained = reference.stale_synchronous(w0, rows, steps, 3, LR, staleness)
    for t in range(steps):
        close(history[t], expected[t])
    close(final, [drained] * 3)
    inflight = type(strategy.sync_runner.inflight).__name__
    assert inflight == {"ucx": "InflightTickets", "tf": "InflightReductions"}[engine]
    stats = strategy.communication_stats()
    assert 1 <= stats["staleness_max"] <= staleness
    assert stats["sync_rounds"] == stats["reductions"] == steps
    dense = strategy.extended.cross_device_ops.wire.dense(FEATURES, "float32")
    assert stats["bytes_sent"] == steps * dense > 0


@pytest.mark.parametrize("compensation", [True, False])
def test_stale_synchronous_compensates_sgd_momentum(compensation):
    steps, num, staleness, momentum = 7, 3, 2, 0.9
    policy = sync.StaleSynchronous(staleness=staleness, momentum_compensation=compensation)
    w0, history, final, strategy, rows = fit(policy, steps, num=num, momentum=momentum)
    # 1 - (1 - m)(1 + s (N - 1) / N): the mean staleness 4/3 acts as extra momentum.
    used = 1 - (1 - momentum) * (1 + staleness * (num - 1) / num) if compensation else momentum
    expected, drained = reference.stale_synchronous(w0, rows, steps, num, LR, staleness, used)
    for t in range(steps):
        close(history[t], expected[t])
    close(final, [drained] * num)
    assert strategy.sync_runner.mean_staleness == (4 / 3 if compensation else 0.0)


def test_model_averaging_follows_crossbow():
    steps, learners, momentum = 6, 2, 0.5
    policy = sync.ModelAveraging(learners_per_device=learners, momentum=momentum)
    w0, history, final, strategy, rows = fit(policy, steps)
    expected = reference.model_averaging(w0, rows, steps, 2, LR, learners,
                                         1.0 / (2 * learners), momentum)
    for t in range(steps):
        close(history[t], [expected[t]] * 2)
    assert strategy.communication_stats()["sync_rounds"] == steps


@pytest.mark.parametrize("engine", ENGINES)
def test_drain_at_every_epoch_keeps_training_consistent(engine):
    # Two epochs: the drain at the end of the first resets the pipeline.
    steps = 4
    _, _, final, strategy, _ = fit(sync.DelayedAveraging(delay=2), steps, epochs=2,
                                   engine=engine)
    np.testing.assert_array_equal(final[0], final[1])
    assert strategy.communication_stats()["sync_rounds"] == 2 * steps


@pytest.mark.parametrize("average_slots", [True, False])
def test_local_sgd_averages_optimizer_slots_when_asked(average_slots):
    x, y = data(6, 2)
    strategy = tfdist_ext.Strategy(sync=sync.LocalSGD(period=3, average_slots=average_slots),
                                   num_replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(1, use_bias=False)])
        model.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.9), loss="mse")
    model.fit(x.astype("float32"), y.astype("float32"), batch_size=2 * PER_REPLICA,
              epochs=1, shuffle=False, verbose=0)  # 6 steps: averaged after steps 3 and 6
    momentum = [v for v in model.optimizer.variables if "momentum" in v.path][0]
    first, second = (c.numpy() for c in momentum.value.values)
    assert np.array_equal(first, second) == average_slots


def test_compressed_local_sgd_averages_slots_exactly_and_counts_them():
    """Momentum is averaged uncompressed (error feedback on momentum diverges)."""
    x, y = data(6, 2)
    strategy = tfdist_ext.Strategy(sync=sync.LocalSGD(period=3), num_replicas=2,
                                   compression={"name": "topk", "ratio": 0.4})
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(1, use_bias=False)])
        model.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.9), loss="mse")
    slots = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            momentum = [v for v in model.optimizer.variables if "momentum" in v.path][0]
            slots.append([c.numpy() for c in momentum.value.values])

    model.fit(x.astype("float32"), y.astype("float32"), batch_size=2 * PER_REPLICA,
              epochs=1, shuffle=False, verbose=0, callbacks=[Record()])
    assert not np.array_equal(*slots[1])
    np.testing.assert_array_equal(*slots[2])  # averaged after step 3
    # Only the 5 weights' changes are compressed (a bucket of 10 would hold the momentum).
    assert [k for k in strategy.state.residuals if k.startswith("delta_b")] == \
        ["delta_b0_float32_5"]
    stats = strategy.communication_stats()
    # Per round: top-k of the 5 weights gathered (2 values + 2 indices from the other
    # replica) and the 5 momentum values all-reduced densely.
    dense_slots = strategy.extended.cross_device_ops.wire.dense(5, "float32")
    assert stats["bytes_sent"] == 2 * (16 + dense_slots)
    assert stats["reductions"] == 2


@pytest.mark.parametrize("warmup", [0, 2])
def test_local_sgd_sends_compressed_parameter_changes(warmup):
    steps, period, num = 10, 3, 3
    compressor = {"name": "topk", "ratio": 0.4}  # 2 of the 5 weights, error feedback
    w0, history, final, strategy, rows = fit(
        sync.LocalSGD(period=period, warmup_steps=warmup), steps, num=num,
        compression=compressor)
    expected = reference.local_sgd_compressed(
        w0, rows, steps, num, LR, period, reference.top_k_feedback(2), warmup)
    for t in range(steps):
        close(history[t], expected[t])
    plain = reference.local_sgd(w0, rows, steps, num, LR, period, warmup)
    assert np.abs(np.asarray(expected[-1]) - np.asarray(plain[-1])).max() > 1e-3
    residuals = strategy.state.residuals
    assert any(key.startswith("delta_b0") for key in residuals)
    stats = strategy.communication_stats()
    assert stats["sync_rounds"] == len([t for t in range(warmup, steps)
                                        if (t + 1) % period == 0])
    assert stats["reductions"] == warmup + stats["sync_rounds"]
    # Each reduction all-gathers 2 values and 2 int32 indices from the 2 others.
    assert stats["bytes_sent"] == stats["reductions"] * 2 * (2 * 4 + 2 * 4)


def test_compressed_local_sgd_re_anchors_at_the_epoch_drain():
    steps, period, num = 5, 3, 2  # the epoch ends mid-period: the drain averages
    w0, history, final, _, rows = fit(sync.LocalSGD(period=period), steps, num=num, epochs=2,
                                      compression={"name": "topk", "ratio": 0.4})
    expected = reference.local_sgd_compressed(
        w0, lambda t, i: rows(t % steps, i), 2 * steps, num, LR, period,
        reference.top_k_feedback(2), drain_every=steps)
    for t in range(2 * steps):
        close(history[t], expected[t])
    close(final, [np.mean(expected[-1], axis=0)] * num)


def test_local_sgd_with_a_lossless_compressor_is_plain_local_sgd():
    steps, period = 9, 3
    w0, history, _, _, rows = fit(sync.LocalSGD(period=period), steps, num=3,
                                  compression={"name": "topk", "ratio": 1.0})
    expected = reference.local_sgd(w0, rows, steps, 3, LR, period)
    for t in range(steps):
        close(history[t], expected[t])


def test_local_sgd_refuses_dgc_momentum_correction():
    with pytest.raises(ValueError, match=r"sync='local_sgd' sends parameter changes, to which "
                                         r"DGC momentum correction \(compression momentum=0\.9\)"):
        tfdist_ext.Strategy(sync="local_sgd", num_replicas=2,
                            compression={"name": "topk", "momentum": 0.9})


@pytest.mark.parametrize("policy, kind, outer_lr, momentum", [
    ("diloco", "nesterov", 0.7, 0.9),
    ({"name": "local_sgd", "outer_optimizer": "sgd", "outer_momentum": 0.5,
      "outer_learning_rate": 0.8}, "sgd", 0.8, 0.5),
    ({"name": "local_sgd", "outer_optimizer": "nesterov", "outer_learning_rate": 1.0},
     "nesterov", 1.0, 0.0),
])
def test_outer_optimizers_follow_diloco(policy, kind, outer_lr, momentum):
    steps, num = 10, 3
    policy = sync.get(policy)
    policy = dataclasses.replace(policy, period=3)
    w0, history, final, strategy, rows = fit(policy, steps, num=num)
    expected = reference.local_sgd_compressed(
        w0, rows, steps, num, LR, 3, reference.exact,
        outer=reference.outer_step(kind, outer_lr, momentum))
    for t in range(steps):
        close(history[t], expected[t])
    if momentum == 0 and outer_lr == 1.0:  # no momentum, rate 1: the plain average
        plain = reference.local_sgd(w0, rows, steps, num, LR, 3)
        for t in range(steps):
            close(history[t], plain[t])
    close(final, [np.mean(history[-1], axis=0)] * num)  # the drain at the end of fit
    velocity = strategy.state.residuals["local_sgd_outer_0"]
    assert len(velocity) == num and np.abs(velocity[0].numpy()).max() > 0


def test_diloco_state_in_checkpoints(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    steps, num = 9, 2
    policy = sync.DiLoCo(period=3)
    *_, strategy, _ = fit(policy, steps, num=num)
    path = tf.train.Checkpoint(tfdist=strategy.state).save(str(tmp_path / "ckpt"))
    fresh = tfdist_ext.Strategy(sync=policy, num_replicas=num).state
    keys = ("local_sgd_outer_0", "local_sgd_anchor_0")
    for key in keys:
        for replica in range(num):
            fresh.buffer(key, replica, 5, tf.float32)
    tf.train.Checkpoint(tfdist=fresh).restore(path).assert_existing_objects_matched()
    for key in keys:
        for old, new in zip(strategy.state.residuals[key], fresh.residuals[key]):
            assert np.abs(old.numpy()).max() > 0
            np.testing.assert_array_equal(old.numpy(), new.numpy())


def test_diloco_refuses_a_compressor():
    with pytest.raises(ValueError, match=r"compressing the outer gradients of sync='diloco' "
                                         r"\(outer_optimizer='nesterov'\) is not supported yet"):
        tfdist_ext.Strategy(sync="diloco", compression="powersgd", num_replicas=2)


@pytest.mark.parametrize("options, message", [
    ({"outer_optimizer": "adam"},
     r"Argument `outer_optimizer` must be one of 'none', 'sgd', 'nesterov'; received 'adam'"),
    ({"outer_learning_rate": 0}, r"Argument `outer_learning_rate` must be a number > 0 \(or "
                                 r"None: chosen from the optimizer\); received 0\. DiLoCo uses "
                                 r"0\.7; 1\.0 with outer_momentum=0"),
    ({"outer_momentum": 1.0}, r"Argument `outer_momentum` must be in \[0, 1\) \(or None: "
                              r"chosen from the optimizer\); received 1\.0"),
])
def test_outer_optimizer_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        sync.get({"name": "diloco", **options})
