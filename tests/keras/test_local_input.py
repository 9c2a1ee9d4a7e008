"""Keras iterates one replica's data with a plain tf.data iterator (`keras.local_input`).

Across workers (auto-sharded data, and the user's own shards of known and unknown
length): tests/keras/test_uneven.py's three-worker launch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext

# 100 samples in batches of 16: a partial last batch, and 20 for validation_split.
X = np.random.default_rng(0).normal(size=(100, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int64")


class IteratorKinds(keras.callbacks.Callback):
    """Records the type of what Keras passes to its train and test functions."""

    def __init__(self):
        super().__init__()
        self.kinds = set()

    def _probe(self, name):
        function = getattr(self.model, name)

        def probed(iterator):
            self.kinds.add(type(iterator).__name__)
            return function(iterator)

        setattr(self.model, name, probed)

    def on_train_begin(self, logs=None):
        self._probe("train_function")

    def on_test_begin(self, logs=None):
        self._probe("test_function")


def _train(strategy, data=None, epochs=2, steps_per_execution=1):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    probe = IteratorKinds()
    if data is None:
        history = model.fit(X, Y, batch_size=16, epochs=epochs, validation_split=0.2,
                            verbose=0, callbacks=[probe])
    else:
        history = model.fit(data, epochs=epochs, verbose=0, callbacks=[probe])
    return model, history.history, probe.kinds


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_one_replica_reads_a_plain_iterator_and_equals_plain_keras(steps_per_execution):
    model, history, kinds = _train(tfdist_ext.Strategy(),
                                   steps_per_execution=steps_per_execution)
    assert kinds == {"OwnedIterator"}  # train and validation steps
    reference, want, plain_kinds = _train(tf.distribute.get_strategy(),
                                          steps_per_execution=steps_per_execution)
    assert plain_kinds == {"OwnedIterator"}
    assert history == want
    for ours, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    assert model.evaluate(X, Y, batch_size=16, verbose=0) == reference.evaluate(
        X, Y, batch_size=16, verbose=0)
    np.testing.assert_array_equal(model.predict(X, batch_size=16, verbose=0),
                                  reference.predict(X, batch_size=16, verbose=0))


def test_several_replicas_in_a_process_keep_the_distributed_iterator():
    *_, kinds = _train(tfdist_ext.Strategy(num_replicas=2), epochs=1)
    assert kinds == {"DistributedIterator"}


def test_a_distributed_dataset_the_user_made_is_iterated_as_it_is():
    strategy = tfdist_ext.Strategy()
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(16))
    _, history, kinds = _train(strategy, data, epochs=1)
    assert kinds == {"DistributedIterator"}
    assert np.isfinite(history["loss"]).all()


@pytest.mark.parametrize("workers", [2, 3])
def test_split_batches_gives_each_worker_a_contiguous_part_of_every_batch(workers):
    from tfdist_ext.keras.local_input import split_batches  # pylint: disable=import-outside-toplevel
    values = np.arange(67 * 2, dtype="float32").reshape(67, 2)
    elements = {  # the element structures Keras' adapters make
        "tuple": tf.data.Dataset.from_tensor_slices((values, values[:, 0])).batch(32),
        "one-tuple": tf.data.Dataset.from_tensor_slices((values,)).batch(32),
        "tensor": tf.data.Dataset.from_tensor_slices(values).batch(32),
        "dict": tf.data.Dataset.from_tensor_slices({"a": values}).batch(32),
    }
    for name, dataset in elements.items():
        parts = [list(split_batches(dataset, i, workers)) for i in range(workers)]
        assert all(split_batches(dataset, i, workers).element_spec == dataset.element_spec
                   for i in range(workers)), name
        for batch, pieces in zip(dataset, zip(*parts)):  # 32, 32, 3 samples
            whole = tf.nest.flatten(batch)[0].numpy()
            sizes = [len(tf.nest.flatten(p)[0]) for p in pieces]
            assert max(sizes) - min(sizes) <= 1, (name, sizes)
            joined = np.concatenate([tf.nest.flatten(p)[0].numpy() for p in pieces])
            np.testing.assert_array_equal(joined, whole, err_msg=name)
        assert all(len(p) == 3 for p in parts), name  # one part of each batch, empty or not


def test_the_epoch_iterator_after_start_at_begins_that_many_batches_in_once():
    """An elastic replacement's first epoch: tf.data skips the batches the members ran
    (`start_at`), and the replacement's calls for them are told not to pull them."""
    from tfdist_ext import _compat  # pylint: disable=import-outside-toplevel
    from tfdist_ext.keras import local_input  # pylint: disable=import-outside-toplevel
    strategy = tfdist_ext.Strategy()
    epochs = _compat.TFEpochIterator(x=X, y=Y, batch_size=16, shuffle=False,
                                     distribute_strategy=strategy)

    def epoch(asking):
        """One epoch as Keras runs it: the first `asking` calls pass over their batch."""
        told, pulled = [], []
        for step, _, iterator in epochs.enumerate_epoch():
            if step < asking:
                told.append(local_input.skipped_in_input(strategy))
                if told[-1]:
                    continue
            pulled.append(next(iterator)[0].numpy())
        return told, pulled

    local_input.start_at(strategy, 3)
    told, pulled = epoch(asking=3)
    assert told == [True, True, True]
    assert len(pulled) == 4  # of 7 batches (the last a partial one of 4)
    np.testing.assert_array_equal(pulled[0], X[48:64])
    np.testing.assert_array_equal(pulled[-1], X[96:])
    told, pulled = epoch(asking=0)  # the next epoch is whole
    np.testing.assert_array_equal(pulled[0], X[:16])
    assert len(pulled) == 7

    # A call asking before any iterator was made since `start_at` pulls, and no
    # later iterator skips.
    local_input.start_at(strategy, 2)
    assert not local_input.skipped_in_input(strategy)
    told, pulled = epoch(asking=2)
    assert told == [False, False] and len(pulled) == 7
    np.testing.assert_array_equal(pulled[0], X[:16])
    # start_at(0), as a replacement's fit ends: nothing left to skip.
    local_input.start_at(strategy, 2)
    local_input.start_at(strategy, 0)
    np.testing.assert_array_equal(epoch(asking=0)[1][0], X[:16])
