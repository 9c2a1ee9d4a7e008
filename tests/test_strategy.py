"""tfdist_ext.Strategy with logical-CPU replicas in this process."""

import copy
import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext import collectives, compression, frontends, sync

CPUS = [f"/device:CPU:{i}" for i in range(4)]


def _model():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def _fit(strategy, init_weights, x, y):
    with strategy.scope():
        model = _model()
        model.set_weights(init_weights)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


def test_is_a_multi_worker_mirrored_strategy_with_our_ops():
    strategy = tfdist_ext.Strategy(num_replicas=4)
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    assert strategy.num_replicas_in_sync == 4
    assert type(strategy.extended._cross_device_ops).__module__ == "tfdist_ext.cross_device_ops"
    assert strategy.cluster is None


def test_the_front_end_tells_our_strategy_from_tfs():
    """`frontends.our_strategy` is how `keras/` and the layers below the strategy
    recognize it (no attribute probing); the attributes they read have class defaults."""
    strategy = tfdist_ext.Strategy(num_replicas=2)
    assert frontends.our_strategy(strategy) is strategy
    assert (strategy.sync_runner, strategy.elastic) == (None, None)
    mirrored = tf.distribute.MirroredStrategy(CPUS[:2])
    multi_worker = tf.distribute.MultiWorkerMirroredStrategy()
    for other in (mirrored, multi_worker, tf.distribute.get_strategy(), None, object()):
        assert frontends.our_strategy(other) is None
    assert (tfdist_ext.Strategy.sync_runner, tfdist_ext.Strategy.allreduce_decisions) == (None, ())
    assert not tfdist_ext.Strategy.membership.changes


def test_fit_matches_mirrored_strategy_on_the_same_devices():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype("float32")
    y = rng.integers(0, 3, size=256).astype("int32")
    keras.utils.set_random_seed(1)
    init = _model().get_weights()
    ours, ours_loss = _fit(tfdist_ext.Strategy(num_replicas=4), init, x, y)
    reference, ref_loss = _fit(tf.distribute.MirroredStrategy(CPUS), init, x, y)
    assert ours_loss[-1] < ours_loss[0]
    np.testing.assert_allclose(ours_loss, ref_loss, rtol=1e-5)
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not all(np.array_equal(a, b) for a, b in zip(ours, init))


def test_two_strategies_on_the_same_devices_do_not_collide():
    first, second = tfdist_ext.Strategy(num_replicas=4), tfdist_ext.Strategy(num_replicas=4)
    lo1, hi1 = first.collective_key_range
    lo2, hi2 = second.collective_key_range
    assert hi1 <= lo2 or hi2 <= lo1
    assert lo1 > 1000 and lo2 > 1000  # clear of the stock strategies' keys (from 1)

    def all_reduce(strategy, dtype):
        fn = tf.function(lambda: strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones([5], dtype))))
        return strategy.experimental_local_results(fn())

    # A dtype change on colliding keys would abort the process-wide executor.
    for result in all_reduce(first, tf.float32) + all_reduce(second, tf.float64):
        np.testing.assert_array_equal(result.numpy(), np.full(5, 4.0))
    for result in all_reduce(first, tf.float64):
        np.testing.assert_array_equal(result.numpy(), np.full(5, 4.0))


def test_reduce_accepts_nests_and_per_replica_scalars():
    strategy = tfdist_ext.Strategy(num_replicas=2)
    per_replica = strategy.run(tf.function(lambda: (
        tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32),
        tf.ones([3]))))
    nest = strategy.reduce("SUM", per_replica, axis=None)
    assert float(nest[0]) == 1.0 and nest[1].numpy().tolist() == [2.0, 2.0, 2.0]
    assert float(strategy.reduce("MEAN", per_replica[0], axis=0)) == 0.5
    assert float(strategy.reduce("MEAN", per_replica[1], axis=0)) == 1.0


def test_a_deep_copy_keeps_the_choice_and_the_sparse_setting():
    # TF deep-copies a strategy's extended (with its cross-device ops) for tf.function
    # and Keras; the copy must reduce as the original does, "auto" included.
    strategy = tfdist_ext.Strategy(allreduce="auto", num_replicas=2, sparse_as_dense=True)
    copied = copy.deepcopy(strategy)
    ops = copied.extended._cross_device_ops
    assert ops is not strategy.extended._cross_device_ops
    assert ops.densify_sparse
    values = copied.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([1000], float(ctx.replica_id_in_sync_group + 1)))
    np.testing.assert_array_equal(copied.reduce("SUM", values, axis=None).numpy(),
                                  np.full(1000, 3.0, np.float32))


def _listed(names):
    """The "Valid names: ..." text of an unknown-name error (registered names, in order)."""
    return re.escape(", ".join(repr(n) for n in names))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"allreduce": "rign"}, ValueError, r"Unknown allreduce algorithm 'rign'. Valid names: "
     r"'native', 'all_to_all', 'butterfly', .*'ring', .*'auto', 'hierarchical'\."),
    ({"allreduce": "rign"}, ValueError, _listed(collectives.available_algorithms())),
    ({"compression": "topkk"}, ValueError,
     r"Unknown compression 'topkk'. Valid names: 'adaptive', 'bf16', .*'topk'"),
    ({"compression": "topkk"}, ValueError, _listed(compression.COMPRESSORS.names())),
    ({"sync": "asynch"}, ValueError,
     r"Unknown sync 'asynch'. Valid names: 'async', 'delayed_averaging', .*'sync'"),
    ({"sync": "asynch"}, ValueError, _listed(sync.SYNC_POLICIES.names())),
    ({"bucketing": "mgwfpb"}, ValueError, r"Unknown bucketing 'mgwfpb'. Valid names: 'fixed', 'mgwfbp', 'wfbp'"),
    ({"bucketing": {"name": "mgwfbp", "profile_steps": 0}}, ValueError,
     r"Argument `profile_steps` must be an integer >= 1; received 0"),
    ({"bucketing": {"name": "mgwfbp", "backward_times": [0.1, -1]}}, ValueError,
     r"Argument `backward_times` must hold finite seconds >= 0; entry 1 is -1"),
    ({"bucketing": {"name": "fixed", "bytes_per_bucket": 0}}, ValueError,
     r"Argument `bytes_per_bucket` must be an integer >= 1; received 0"),
    ({"allreduce": {"name": "native", "colour": 1}}, ValueError, r"unknown option\(s\) \['colour'\]"),
    ({"allreduce": 3}, TypeError, r"Argument `allreduce` must be a name, a dict or an AllReduce; received 3"),
    ({"num_replicas": 0}, ValueError, r"Argument `num_replicas` must be an integer >= 1; received 0"),
    ({"num_replicas": -2}, ValueError, r"received -2"),
])
def test_bad_options_are_rejected_with_the_valid_values(kwargs, error, message):
    with pytest.raises(error, match=message):
        tfdist_ext.Strategy(**kwargs)


@pytest.mark.parametrize("spec, message", [
    ({"<64KB": "native", ">64KB": "native"}, r"leave sizes 65536..65536 uncovered"),
    ({"<64KB": "native", "<=1MB": "native", ">=32KB": "native"}, r"overlap"),
    ({"<64KB": "native"}, r"leave sizes >= 65536 bytes uncovered"),
    ({"about 64KB": "native"}, r"cannot read the size range 'about 64KB'"),
    ({"<64KB": "ring?", ">=64KB": "native"}, r"Unknown allreduce\['<64KB'\] algorithm 'ring\?'"),
])
def test_malformed_size_ranges_are_rejected_with_the_reason(spec, message):
    with pytest.raises(ValueError, match=message):
        tfdist_ext.Strategy(allreduce=spec)


def test_size_ranges_pick_per_size():
    config = collectives.options.get({"<64KB": "native", ">=64KB": "native"})
    assert config.by_size == ((0, 65536, "native"), (65536, float("inf"), "native"))
    assert collectives.options.parse_size("1.5MB") == 3 << 19


def test_tf_config_problems_surface_from_the_strategy(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": 3}')
    with pytest.raises(ValueError, match=r'TF_CONFIG is invalid: "task" with "type" and "index"'):
        tfdist_ext.Strategy()
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}))
    with pytest.raises(ValueError, match=r"`num_replicas` \(2\) cannot be combined with TF_CONFIG"):
        tfdist_ext.Strategy(num_replicas=2)


def test_iterating_distributed_datasets_inside_functions_does_not_deadlock():
    """TF's MultiDeviceIterator, made and dropped inside a tf.function, tears down with
    blocking calls on the inter-op pool: with 2 threads it hung within 1-5 calls (also
    under MirroredStrategy); `cluster.local_devices` now sizes the pool."""
    strategy = tfdist_ext.Strategy(num_replicas=2)

    @tf.function
    def squares(dataset):
        iterator = iter(dataset)
        return [strategy.experimental_local_results(strategy.run(tf.square,
                                                                 args=(next(iterator),)))
                for _ in range(2)]

    assert tf.config.threading.get_inter_op_parallelism_threads() >= 4
    for _ in range(20):
        dataset = tf.data.Dataset.from_tensor_slices([5.0, 6.0, 7.0, 8.0]).batch(2)
        results = squares(strategy.experimental_distribute_dataset(dataset))
        assert [[float(v) for part in step for v in tf.reshape(part, [-1])]
                for step in results] == [[25.0, 36.0], [49.0, 64.0]]
