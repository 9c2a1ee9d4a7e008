"""A replacement's rehearsed step (`members_fit.rehearse`): runs once, then leaves
the model as it was. The rehearsal's communicators are
tests/collectives/test_ucx_engine.py's; the whole join is test_elastic.py's."""

import numpy as np
import tensorflow as tf
import keras

from tfdist_ext import _compat
from tfdist_ext.elastic import rehearsal
from tfdist_ext.keras import elastic_steps, members_fit


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    return model


def _dataset(rows):
    x = np.arange(rows * 5, dtype="float32").reshape(rows, 5) / 10
    return tf.data.Dataset.from_tensor_slices((x, np.arange(rows) % 3)).batch(4)


def _values(model):
    return [np.array(v.value) for v in elastic_steps.state(model)]


def test_the_rehearsed_step_runs_once_and_leaves_the_model_as_it_was():
    model = _model()
    step = _compat.keras_iterator_function(model.train_function)
    before = _values(model)
    iterator = iter(_dataset(11))
    members_fit.run_rehearsal(model, step, iterator, me=2)
    np.testing.assert_array_equal(next(iterator)[1].numpy(), [1, 2, 0, 1])  # read batch 0
    for kept, now in zip(before, _values(model)):
        np.testing.assert_array_equal(kept, now)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert all(float(np.sum(np.abs(np.array(v.value)))) == 0
               for v in model.metrics_variables)
    # It ran: the same step on the same batch, outside the rehearsal, trains alike.
    step(iter(_dataset(11)))
    assert step.experimental_get_tracing_count() == 1
    assert any(not np.array_equal(kept, now) for kept, now in zip(before, _values(model)))


def test_a_rehearsal_that_fails_leaves_the_model_as_it_was(caplog):
    model = _model()
    step = _compat.keras_iterator_function(model.train_function)
    before = _values(model)
    empty = iter(_dataset(11).take(0))
    with caplog.at_level("INFO", logger="tfdist_ext"):
        members_fit.run_rehearsal(model, step, empty, me=2)
    assert "worker 2 could not run its rehearsed step" in caplog.text
    for kept, now in zip(before, _values(model)):
        np.testing.assert_array_equal(kept, now)


def test_the_members_a_replacement_expects_are_the_chief_then_everyone_by_index():
    assert rehearsal.expected((0, 3, 1), 3) == (0, 1, 3)
    assert rehearsal.expected((2,), 0) == (2, 0)
    assert rehearsal.expected((0, 2), 1) == (0, 1, 2)  # its predecessor's rank
    assert rehearsal.expected((1, 2), 0) == (1, 0, 2)  # the chief stays first
