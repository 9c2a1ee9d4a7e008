"""ZeRO stage 1 (`Strategy(zero_stage=1)`) on logical CPU replicas (issue 49)."""

import keras
import numpy as np
import pytest

import tfdist_ext
from tfdist_ext import zero
from tfdist_ext.zero import Partition


@pytest.mark.parametrize("sizes,world", [([5, 0, 7], 3), ([1], 4), ([0], 2), ([10, 3], 1),
                                         ([829], 3), ([6, 6], 2)])
def test_shards_cover_every_weight_once(sizes, world):
    plan = Partition.of(sizes, world)
    owned = sum(plan.owned(r) for r in range(world))
    assert owned == plan.total == sum(sizes)
    covered = [i for r in range(world) for i in range(*plan.bounds(r))]
    assert covered == list(range(plan.padded)) and plan.padded >= plan.total
    # The pieces of every shard, in order, are the flattened weights, each element once.
    flat = [(w, e) for w, size in enumerate(sizes) for e in range(size)]
    assert [(w, e) for r in range(world) for w, lo, hi in plan.pieces(r)
            for e in range(lo, hi)] == flat
    assert [sum(hi - lo for _, lo, hi in plan.pieces(r)) for r in range(world)] == \
        [plan.owned(r) for r in range(world)]
    assert plan.shard == max(1, -(-sum(sizes) // world))


def test_bad_partitions_are_named():
    with pytest.raises(ValueError, match=r"world=0: must be >= 1"):
        Partition.of([3], 0)
    with pytest.raises(ValueError, match=r"rank=2: must be in \[0, 2\)"):
        Partition.of([3], 2).bounds(2)


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 20)).astype("float32")
    return x, (x[:, :4].sum(1) > 0).astype("int64") + (x[:, 4] > 0)


def _fit(strategy, make_optimizer):
    x, y = _data()
    keras.utils.set_random_seed(1)
    with strategy.scope():
        optimizer = make_optimizer()
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(33, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return model, optimizer, history.history


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
}


@pytest.mark.parametrize("replicas,name", [(2, "sgd_momentum"), (3, "adam"), (3, "adamw")])
def test_sharded_state_trains_like_the_unsharded_and_holds_one_shard_each(replicas, name):
    model, optimizer, history = _fit(tfdist_ext.Strategy(num_replicas=replicas, zero_stage=1),
                                     OPTIMIZERS[name])
    full, full_optimizer, full_history = _fit(tfdist_ext.Strategy(num_replicas=replicas),
                                              OPTIMIZERS[name])
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["accuracy"], full_history["accuracy"])
    for mine, theirs in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    # 795 weights in `replicas` shards; the model's optimizer keeps no slot of its own.
    slot_bytes = sum(np.asarray(v).nbytes for v in full_optimizer.variables
                     if v.name not in ("iteration", "learning_rate"))
    shard = -(-795 // replicas)
    assert zero.state_bytes(optimizer) == {r: slot_bytes // 795 * shard for r in range(replicas)}
    assert sum(np.asarray(v).nbytes for v in optimizer.variables
               if v.name not in ("iteration", "learning_rate")) == 0
    assert int(optimizer.iterations.numpy()) == int(full_optimizer.iterations.numpy()) == 10


@pytest.mark.parametrize("value,message", [
    (2, r"zero_stage=2 \(gradients sharded too\) is not available yet; use zero_stage=1"),
    (3, r"Argument `zero_stage` must be one of \[0, 1\]; received 3"),
    (True, r"Argument `zero_stage` must be one of \[0, 1\]; received True"),
    ("1", r"Argument `zero_stage` must be one of \[0, 1\]; received '1'"),
])
def test_a_bad_stage_is_named(value, message):
    with pytest.raises(ValueError, match=message):
        tfdist_ext.Strategy(num_replicas=2, zero_stage=value)


@pytest.mark.parametrize("kwargs,message", [
    ({"compression": "int8"}, r"`zero_stage`=1 cannot be combined with compression='int8' "
                              r"\(needs 'none'\) yet\. Drop those arguments, or pass "
                              r"zero_stage=0"),
    ({"sync": "local_sgd"}, r"sync='local_sgd' \(needs 'sync'\)"),
    ({"bucketing": "mgwfbp"}, r"bucketing=.* \(needs None\)"),
    ({"elastic": True, "engine": "ucx", "allreduce": "ring"},
     r"Argument `elastic` cannot be combined with zero_stage=1 \(needs 0"),
])
def test_combinations_not_supported_yet_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tfdist_ext.Strategy(num_replicas=2, zero_stage=1, **kwargs)


@pytest.mark.parametrize("make,message", [
    (lambda: keras.optimizers.Adam(0.01, clipnorm=1.0),
     r"zero_stage=1 does not support the optimizer's `clipnorm` \(clipnorm=1\.0\) yet"),
    (lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
     r"`gradient_accumulation_steps` \(gradient_accumulation_steps=2\)"),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
     r"zero_stage=1 does not support LossScaleOptimizer \(mixed precision\) yet"),
])
def test_optimizer_options_not_supported_yet_stop_fit_before_the_first_step(make, message):
    with pytest.raises(ValueError, match=message):
        _fit(tfdist_ext.Strategy(num_replicas=2, zero_stage=1), make)


@pytest.mark.parametrize("make", [
    lambda path: keras.callbacks.ModelCheckpoint(str(path / "m.keras")),
    lambda path: keras.callbacks.ModelCheckpoint(str(path / "m.weights.h5"),
                                                 save_weights_only=True),
    lambda path: keras.callbacks.BackupAndRestore(str(path / "backup")),
])
def test_a_callback_that_would_save_the_optimizer_stops_fit_before_the_first_step(tmp_path, make):
    strategy = tfdist_ext.Strategy(num_replicas=2, zero_stage=1)
    x, y = _data()
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(3)])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match=r"which saves the optimizer; with zero_stage=1"):
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[make(tmp_path)])
    assert int(model.optimizer.iterations.numpy()) == 0


def test_saving_the_sharded_state_is_refused_not_silently_partial(tmp_path):
    model, _, _ = _fit(tfdist_ext.Strategy(num_replicas=2, zero_stage=1), OPTIMIZERS["adam"])
    for save in (lambda: model.save(tmp_path / "m.keras"),
                 lambda: model.save_weights(tmp_path / "m.weights.h5")):
        with pytest.raises(ValueError, match=r"Saving the optimizer of a model trained with "
                                             r"zero_stage=1 is not available yet"):
            save()


def test_embedding_gradients_are_reduced_dense_as_with_sparse_as_dense():
    tokens = np.random.default_rng(0).integers(0, 200, size=(120, 6))
    labels = (tokens[:, 0] % 3).astype("int64")

    def fit(**options):
        keras.utils.set_random_seed(1)
        with tfdist_ext.Strategy(num_replicas=2, **options).scope():
            model = keras.Sequential([keras.Input((6,), dtype="int32"),
                                      keras.layers.Embedding(200, 8),
                                      keras.layers.GlobalAveragePooling1D(),
                                      keras.layers.Dense(3)])
            model.compile(optimizer=keras.optimizers.Adam(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model.fit(tokens, labels, batch_size=40, epochs=2, verbose=0).history["loss"]

    np.testing.assert_allclose(fit(zero_stage=1), fit(sparse_as_dense=True), rtol=1e-6)


def test_one_replica_keeps_the_whole_state_as_without_sharding():
    _, optimizer, history = _fit(tfdist_ext.Strategy(num_replicas=1, zero_stage=1),
                                 OPTIMIZERS["adam"])
    _, plain, plain_history = _fit(tfdist_ext.Strategy(num_replicas=1), OPTIMIZERS["adam"])
    assert zero.state_bytes(optimizer) == {}
    assert [v.shape for v in optimizer.variables] == [v.shape for v in plain.variables]
    np.testing.assert_allclose(history["loss"], plain_history["loss"], rtol=1e-6)
