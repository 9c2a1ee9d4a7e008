"""A `keras.metrics.Mean` fed one scalar per step gives one process's value on replicas
whose local batches differ (`tfdist_ext.keras.uneven.wrap_mean_update`, issue 47).

Multi-worker runs of the same: tests/test_corpus.py (custom steps, a functional
model's per-output losses).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext

X = np.random.default_rng(0).normal(size=(23, 3)).astype("float32")
Y = (X @ np.array([1.0, -2.0, 0.5], "float32"))[:, None]


class Tracked(keras.Model):
    """keras.io's "custom train_step" model: its own Mean tracker of the batch loss."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.tracker = keras.metrics.Mean(name="tracked")

    def call(self, x):
        return self.dense(x)

    def _loss(self, data):
        x, y = data
        return self.compute_loss(y=y, y_pred=self(x))

    def train_step(self, data):
        with tf.GradientTape() as tape:
            loss = self._loss(data)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.tracker.update_state(loss)
        return {"tracked": self.tracker.result()}

    def test_step(self, data):
        self.tracker.update_state(self._loss(data))
        return {"tracked": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


def _run(strategy):
    keras.utils.set_random_seed(4)
    with strategy.scope():
        model = Tracked()
        model.compile(keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(X, Y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    evaluated = model.evaluate(X, Y, batch_size=10, return_dict=True, verbose=0)
    return history.history["tracked"], evaluated["tracked"]


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_scalar_tracker_averages_batches_as_one_process(replicas):
    # 23 samples in batches of 10: the last batch (3) splits 2/1 or 1/1/1, and
    # 10 splits 5/5 or 4/3/3 (unequal local batches at 3 replicas).
    one = _run(tf.distribute.get_strategy())
    ours = _run(tfdist_ext.Strategy(num_replicas=replicas))
    np.testing.assert_allclose(ours[0], one[0], rtol=1e-5)
    np.testing.assert_allclose(ours[1], one[1], rtol=1e-5)


def test_a_tracker_outside_a_replica_step_is_unchanged():
    strategy = tfdist_ext.Strategy(num_replicas=2)
    with strategy.scope():
        tracker = keras.metrics.Mean()
    tracker.update_state(2.0)
    tracker.update_state(4.0)
    assert float(tracker.result()) == 3.0  # cross-replica updates keep their weight
