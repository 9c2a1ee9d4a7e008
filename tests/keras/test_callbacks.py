"""CommunicationStats: fit under tfdist_ext.Strategy, read the event files back."""

import collections
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import tfdist_ext

EPOCHS, STEPS = 2, 4


def _data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(32 * STEPS, 6)).astype("float32"),
            rng.integers(0, 3, size=32 * STEPS).astype("int32"))


def _fit(strategy, callback):
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(64, activation="tanh"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    model.fit(x, y, batch_size=32, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[callback])


def _events(log_dir):
    """{tag: [(step, value)]} of every scalar and text summary under log_dir."""
    accumulator = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    events = collections.defaultdict(list)
    for tag in accumulator.Tags()["tensors"]:
        for event in accumulator.Tensors(tag):
            value = tf.make_ndarray(event.tensor_proto)
            value = value.item() if value.dtype != object else value.item().decode()
            events[tag].append((event.step, value))
    return events


def _values(events, tag):
    return [value for _, value in events[tag]]


def test_epoch_scalars_and_config(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2)
    _fit(strategy, tfdist_ext.keras.CommunicationStats(tmp_path))
    events = _events(tmp_path)
    for key in ("bytes_sent", "dense_bytes", "reductions", "compression_ratio",
                "seconds_per_step", "bytes_sent_total", "compression_ratio_total"):
        assert [step for step, _ in events[f"tfdist/{key}"]] == list(range(EPOCHS)), key
    sent, dense = _values(events, "tfdist/bytes_sent"), _values(events, "tfdist/dense_bytes")
    assert all(s > 0 for s in sent)
    assert sent[0] == sent[1]  # same steps, same bytes each epoch
    ratios = _values(events, "tfdist/compression_ratio")
    np.testing.assert_allclose(ratios, np.array(dense) / np.array(sent), rtol=1e-6)
    assert ratios == pytest.approx([1.0, 1.0])  # no compression
    assert _values(events, "tfdist/reductions")[0] >= STEPS
    totals = strategy.communication_stats()
    assert _values(events, "tfdist/bytes_sent_total")[-1] == totals["bytes_sent"]
    assert sum(sent) == totals["bytes_sent"]
    assert all(0 < s < 60 for s in _values(events, "tfdist/seconds_per_step"))
    assert _values(events, "tfdist/config") == [strategy.config.describe()]
    assert not any(tag.startswith("tfdist/batch/") for tag in events)


def test_topk_ratio_and_batch_updates(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2, compression="topk")
    _fit(strategy, tfdist_ext.keras.CommunicationStats(tmp_path, update_freq=2))
    events = _events(tmp_path)
    assert min(_values(events, "tfdist/compression_ratio")) > 10
    steps = [step for step, _ in events["tfdist/batch/bytes_sent"]]
    assert steps == list(range(2, EPOCHS * STEPS + 1, 2))
    assert sum(_values(events, "tfdist/batch/bytes_sent")) == \
        strategy.communication_stats()["bytes_sent"]
    assert "topk" in _values(events, "tfdist/config")[0].lower()


def test_auto_decision_table_is_logged(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2, allreduce={
        "name": "auto", "calibrate": False, "calibration_cache": None})
    _fit(strategy, tfdist_ext.keras.CommunicationStats(tmp_path))
    (table,) = _values(_events(tmp_path), "tfdist/allreduce_decisions")
    assert "allreduce='auto' on 2 replicas" in table and "choice" in table


def test_extra_numeric_keys_are_logged(tmp_path, monkeypatch):
    strategy = tfdist_ext.Strategy(num_replicas=2)
    stats = strategy.communication_stats
    monkeypatch.setattr(strategy, "communication_stats",
                        lambda: dict(stats(), staleness=3, note="text"))
    _fit(strategy, tfdist_ext.keras.CommunicationStats(tmp_path))
    events = _events(tmp_path)
    assert _values(events, "tfdist/staleness") == [3] * EPOCHS
    assert "tfdist/note" not in events


def test_non_tfdist_strategy_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match="needs a model built and compiled under a "
                                         "tfdist_ext.Strategy scope; .*MirroredStrategy"):
        _fit(tf.distribute.MirroredStrategy(["/cpu:0"]),
             tfdist_ext.keras.CommunicationStats(tmp_path))
    assert not list(pathlib.Path(tmp_path).iterdir())


def test_non_chief_writes_nothing(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2)
    strategy.extended.step_down()  # as a replacement joining an elastic job is
    _fit(strategy, tfdist_ext.keras.CommunicationStats(tmp_path))
    assert not list(pathlib.Path(tmp_path).iterdir())


@pytest.mark.parametrize("update_freq", ["step", 0, -3, True, 1.5])
def test_bad_update_freq(update_freq):
    with pytest.raises(ValueError, match=r"`update_freq` must be 'epoch', 'batch' or an "
                                         f"integer >= 1; received {update_freq!r}"):
        tfdist_ext.keras.CommunicationStats("logs", update_freq=update_freq)


def test_sync_policy_counters_are_logged(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2, sync={"name": "stale_synchronous",
                                                         "staleness": 2})
    _fit(strategy, tfdist_ext.keras.CommunicationStats(tmp_path))
    events = _events(tmp_path)
    assert _values(events, "tfdist/sync_rounds") == [STEPS] * EPOCHS
    assert _values(events, "tfdist/sync_rounds_total")[-1] == STEPS * EPOCHS
    assert all(0 <= v <= 2 for v in _values(events, "tfdist/staleness_max"))
    assert len(_values(events, "tfdist/staleness_mean")) == EPOCHS
    # One dense all-reduce of the 643 parameters' gradients per step, applied late.
    per_step = strategy.extended.cross_device_ops.wire.dense(643, "float32")
    assert _values(events, "tfdist/bytes_sent") == [STEPS * per_step] * EPOCHS


def test_bucket_plan_is_logged(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2, bucketing="wfbp")
    _fit(strategy, tfdist_ext.keras.CommunicationStats(tmp_path))
    events = _events(tmp_path)
    assert _values(events, "tfdist/buckets") == [4] * EPOCHS
    table = _values(events, "tfdist/bucket_plan")[0].splitlines()
    assert len(table) == 4  # two Dense layers: kernel and bias each, backward order
    algorithm = strategy.config.allreduce.algorithm  # the engine's default
    assert "b0" in table[0] and "12 B" in table[0] and algorithm in table[0]  # bias of 3
