"""ZeRO stages 1 and 2 (`Strategy(zero_stage=1)`, `2`) on logical CPU replicas (issue 49)."""

import keras
import numpy as np
import pytest

import tfdist_ext
from tfdist_ext import zero
from tfdist_ext.zero import Partition


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
    "nadam": lambda: keras.optimizers.Nadam(0.01),
}


@pytest.mark.parametrize("replicas,name,stage", [
    (2, "sgd_momentum", 1), (3, "adam", 1), (3, "adamw", 1), (2, "nadam", 1),
    (3, "sgd_momentum", 2), (2, "adam", 2), (3, "adamw", 2), (3, "nadam", 2)])
def test_sharded_state_trains_like_the_unsharded_and_holds_one_shard_each(replicas, name,
                                                                          stage):
    model, optimizer, history = _fit(
        tfdist_ext.Strategy(num_replicas=replicas, zero_stage=stage), OPTIMIZERS[name])
    full, full_optimizer, full_history = _fit(tfdist_ext.Strategy(num_replicas=replicas),
                                              OPTIMIZERS[name])
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["accuracy"], full_history["accuracy"])
    for mine, theirs in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    # 795 weights, a block of each weight per replica (a shard within 4 elements of
    # 795 / replicas); the model's optimizer keeps no slot of its own.
    slot_bytes = sum(np.asarray(v).nbytes for v in full_optimizer.variables
                     if v.name not in ("iteration", "learning_rate"))
    shard = Partition.of([w.size for w in full.get_weights()], replicas).shard
    assert 0 <= shard - 795 / replicas < 4
    per_weight, scalars = divmod(slot_bytes, 795)  # scalars: Nadam's u_product
    assert zero.state_bytes(optimizer) == {r: per_weight * shard + scalars
                                           for r in range(replicas)}
    assert sum(np.asarray(v).nbytes for v in optimizer.variables
               if v.name not in ("iteration", "learning_rate")) == scalars
    assert int(optimizer.iterations.numpy()) == int(full_optimizer.iterations.numpy()) == 10


def _decaying(rate):
    return keras.optimizers.schedules.ExponentialDecay(rate, decay_steps=3, decay_rate=0.7)


ELEMENT_WISE = {
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(_decaying(0.01), momentum=0.5,
                                                         centered=True),
    "adagrad": lambda: keras.optimizers.Adagrad(_decaying(0.1)),
    "adamax": lambda: keras.optimizers.Adamax(_decaying(0.01)),
    "adadelta": lambda: keras.optimizers.Adadelta(_decaying(1.0)),
    "ftrl": lambda: keras.optimizers.Ftrl(_decaying(0.1), l1_regularization_strength=0.001,
                                          l2_shrinkage_regularization_strength=0.01),
    "lion": lambda: keras.optimizers.Lion(_decaying(0.001)),
    "sgd_nesterov": lambda: keras.optimizers.SGD(_decaying(0.05), momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("name", sorted(ELEMENT_WISE))
def test_every_element_wise_optimizer_with_a_schedule_trains_evaluates_and_predicts_alike(
        name):
    """The issue's "any Keras optimizer" with a learning-rate schedule, at stage 2 and 3
    replicas; `evaluate` and `predict` after `fit` as unsharded."""
    x, _ = _data()
    model, _, history = _fit(tfdist_ext.Strategy(num_replicas=3, zero_stage=2),
                             ELEMENT_WISE[name])
    full, _, full_history = _fit(tfdist_ext.Strategy(num_replicas=3), ELEMENT_WISE[name])
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)
    assert history["loss"][0] != history["loss"][-1]  # it trains
    for mine, theirs in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.evaluate(x, _data()[1], verbose=0),
                               full.evaluate(x, _data()[1], verbose=0), rtol=1e-5)
    np.testing.assert_allclose(model.predict(x, verbose=0), full.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stage,engine", [(1, "tf"), (1, "ucx"), (2, "ucx")])
def test_many_buckets_and_tf_collectives_train_like_the_unsharded(monkeypatch, stage, engine):
    """Buckets of at most 120 elements (the kernels and first bias alone, the second
    kernel with its bias) and, at stage 1, TF's collectives in place of the engine."""
    from tfdist_ext.zero import blocks  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(blocks, "BUCKET_ELEMENTS", 120)
    assert Partition.of([660, 33, 99, 3], 3).buckets(120) == [[0], [1], [2, 3]]
    model, _, history = _fit(tfdist_ext.Strategy(num_replicas=3, zero_stage=stage,
                                                 engine=engine), OPTIMIZERS["adam"])
    full, _, full_history = _fit(tfdist_ext.Strategy(num_replicas=3), OPTIMIZERS["adam"])
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)
    for mine, theirs in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value,message", [
    (3, r"Argument `zero_stage` must be one of \[0, 1, 2\]; received 3\. 0 keeps"),
    (True, r"Argument `zero_stage` must be one of \[0, 1, 2\]; received True"),
    ("1", r"Argument `zero_stage` must be one of \[0, 1, 2\]; received '1'"),
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
    ({"zero_stage": 2, "engine": "tf"},
     r"`zero_stage`=2 cannot be combined with engine='tf' \(needs 'ucx', which "
     r"reduce-scatters\) yet"),
])
def test_combinations_not_supported_yet_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tfdist_ext.Strategy(num_replicas=2, **{"zero_stage": 1, **kwargs})


@pytest.mark.parametrize("make,message", [
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1, use_ema=True)),
     r"`use_ema` \(use_ema=True\)"),
    (lambda: keras.optimizers.Lamb(0.01),
     r"zero_stage=1 does not support keras.optimizers.Lamb: its update reads whole weights"),
    (lambda: keras.optimizers.Adafactor(0.01),
     r"does not support keras.optimizers.Adafactor: .* Use an element-wise optimizer"),
])
def test_optimizer_options_not_supported_yet_stop_fit_before_the_first_step(make, message):
    with pytest.raises(ValueError, match=message):
        _fit(tfdist_ext.Strategy(num_replicas=2, zero_stage=1), make)


def test_stage_2_reduce_scatters_gradients_without_a_static_length():
    """The corpus' Transformer under zero_stage=2 at 2 workers had a densified embedding
    gradient of unknown length; the engine needs static lengths."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfdist_ext.zero import summed  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(num_replicas=2, zero_stage=2)
    plan = Partition.of([5, 2], 2)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(unknown):
        def replica():
            context = tf.distribute.get_replica_context()
            scale = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
            return summed.gradient_blocks(context, optimizer, [unknown * scale, tf.ones([2])],
                                          plan, tf.float32, stage=2)
        return strategy.experimental_local_results(strategy.run(replica))

    first, second = step(tf.range(5, dtype=tf.float32))
    # Sums over replicas (scales 1 and 2): [0, 3, 6, 9, 12] and [2, 2], in blocks of 3 and 1.
    assert [b.numpy().tolist() for b in first] == [[0, 3, 6], [2]]
    assert [b.numpy().tolist() for b in second] == [[9, 12, 0], [2]]


def test_weights_of_two_dtypes_are_refused_with_the_dtypes():
    x, y = _data()
    with tfdist_ext.Strategy(num_replicas=2, zero_stage=1).scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(8, dtype="float64"),
                                  keras.layers.Dense(3, dtype="float32")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match=r"zero_stage=1 moves the weights in buckets of one "
                                         r"dtype; this model's trainable weights have "
                                         r"dtypes \['float32', 'float64'\]"):
        model.fit(x, y, batch_size=64, epochs=1, verbose=0)


@pytest.mark.parametrize("make,stage", [
    (lambda: keras.optimizers.SGD(0.05, momentum=0.9, clipnorm=0.05), 1),
    (lambda: keras.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=0.1), 1),
    (lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05, clipvalue=0.002), 1),
    (lambda: keras.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=0.1), 2),
    (lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05, clipvalue=0.002), 2),
    (lambda: keras.optimizers.Adam(0.01, clipnorm=0.05), 2),
])
def test_clipping_applies_to_the_summed_gradients_as_without_sharding(make, stage):
    strategy = tfdist_ext.Strategy(num_replicas=3, zero_stage=stage)
    model, _, history = _fit(strategy, make)
    full, _, full_history = _fit(tfdist_ext.Strategy(num_replicas=3), make)
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)
    for mine, theirs in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    config = {k: v for k, v in make().get_config().items()
              if k not in ("clipnorm", "global_clipnorm", "clipvalue")}
    _, _, plain_history = _fit(tfdist_ext.Strategy(num_replicas=3, zero_stage=stage),
                               lambda: type(make()).from_config(config))
    assert abs(plain_history["loss"][-1] - history["loss"][-1]) > 1e-4  # the clip bites


@pytest.mark.parametrize("make,stage", [
    (lambda: keras.optimizers.SGD(0.05, momentum=0.9, gradient_accumulation_steps=3), 1),
    (lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2, global_clipnorm=0.5), 2),
    (lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.AdamW(0.01, gradient_accumulation_steps=2)), 1),
])
def test_gradient_accumulation_applies_every_kth_step_as_without_sharding(make, stage):
    model, optimizer, history = _fit(tfdist_ext.Strategy(num_replicas=3, zero_stage=stage),
                                     make)
    full, full_optimizer, full_history = _fit(tfdist_ext.Strategy(num_replicas=3), make)
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)
    for mine, theirs in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    # 10 steps: 3 or 5 updates; the replicas' optimizers hold shards, the accumulators
    # stay whole.
    assert int(optimizer.iterations.numpy()) == int(full_optimizer.iterations.numpy()) in (3, 5)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    assert sorted(zero.state_bytes(inner)) == [0, 1, 2]


def test_mixed_precision_loss_scaling_skips_overflowed_steps_as_without_sharding(tmp_path):
    def make():
        # 2**21 overflows float16 in the first two steps: both skipped, the scale halved.
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                                   initial_scale=2.0 ** 21)

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, optimizer, history = _fit(tfdist_ext.Strategy(num_replicas=3, zero_stage=1),
                                         make)
        full, full_optimizer, full_history = _fit(tfdist_ext.Strategy(num_replicas=3), make)
        model.save(tmp_path / "m.keras")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)
    for mine, theirs in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert int(optimizer.iterations.numpy()) == int(full_optimizer.iterations.numpy()) == 8
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** 19
    assert sorted(zero.state_bytes(optimizer.inner_optimizer)) == [0, 1, 2]
    loaded = keras.models.load_model(tmp_path / "m.keras")
    for mine, theirs in zip(loaded.optimizer.variables, full_optimizer.variables):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("replicas,name", [(2, "sgd_momentum"), (3, "adam"), (3, "nadam")])
def test_model_save_writes_the_whole_state_and_plain_keras_loads_it(tmp_path, replicas, name):
    model, _, _ = _fit(tfdist_ext.Strategy(num_replicas=replicas, zero_stage=1),
                       OPTIMIZERS[name])
    _, full_optimizer, _ = _fit(tfdist_ext.Strategy(num_replicas=replicas), OPTIMIZERS[name])
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")  # plain Keras, no strategy
    expected, got = full_optimizer.variables, loaded.optimizer.variables
    assert [tuple(v.shape) for v in got] == [tuple(v.shape) for v in expected]
    assert sum(np.asarray(v).size for v in got) > 795
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-5, atol=1e-7,
                                   err_msg=theirs.name)


def _continue(model, epochs=1):
    x, y = _data()
    return model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False,
                     verbose=0).history["loss"]


def _fresh(strategy, name):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(33, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=OPTIMIZERS[name](),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("name", ["adam", "sgd_momentum"])
def test_a_checkpoint_of_3_replicas_reloads_at_other_counts_and_stages(tmp_path, name):
    """Written at stage 2, read at stage 2, 1 and 0 and in one replica."""
    x, y = _data()
    saved = _fresh(tfdist_ext.Strategy(num_replicas=3, zero_stage=2), name)
    path = str(tmp_path / "ckpt.weights.h5")
    saved.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    going_on = _continue(saved, 2)
    for options in ({"num_replicas": 3, "zero_stage": 2}, {"num_replicas": 2, "zero_stage": 1},
                    {"num_replicas": 2}, {"num_replicas": 1, "zero_stage": 1}):
        # Loaded before the first step: kept until the replicas' optimizers exist.
        model = _fresh(tfdist_ext.Strategy(**options), name)
        model.load_weights(path)
        np.testing.assert_allclose(_continue(model, 2), going_on, rtol=1e-5, err_msg=options)
    # Loaded into replicas' optimizers that exist already (a trained model).
    model = _fresh(tfdist_ext.Strategy(num_replicas=2, zero_stage=1), name)
    _continue(model)
    model.load_weights(path)
    np.testing.assert_allclose(_continue(model, 2), going_on, rtol=1e-5)


def test_backup_and_restore_resumes_a_sharded_run_at_another_count(tmp_path):
    x, y = _data()
    backup = str(tmp_path / "backup")

    def fit(replicas, epochs):
        model = _fresh(tfdist_ext.Strategy(num_replicas=replicas, zero_stage=1), "adam")
        return model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0,
                         callbacks=[keras.callbacks.BackupAndRestore(
                             backup, delete_checkpoint=False)]).history["loss"]

    straight = _continue(_fresh(tfdist_ext.Strategy(num_replicas=3, zero_stage=1), "adam"), 3)
    fit(3, 2)
    np.testing.assert_allclose(fit(2, 3), straight[2:], rtol=1e-5)


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

    dense = fit(sparse_as_dense=True)
    np.testing.assert_allclose(fit(zero_stage=1), dense, rtol=1e-6)
    np.testing.assert_allclose(fit(zero_stage=2), dense, rtol=1e-6)


def test_one_replica_keeps_the_whole_state_as_without_sharding():
    _, optimizer, history = _fit(tfdist_ext.Strategy(num_replicas=1, zero_stage=1),
                                 OPTIMIZERS["adam"])
    _, plain, plain_history = _fit(tfdist_ext.Strategy(num_replicas=1), OPTIMIZERS["adam"])
    assert zero.state_bytes(optimizer) == {}
    assert [v.shape for v in optimizer.variables] == [v.shape for v in plain.variables]
    np.testing.assert_allclose(history["loss"], plain_history["loss"], rtol=1e-6)
