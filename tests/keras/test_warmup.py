"""tfdist_ext.keras.LearningRateWarmup and linear_scaling: Goyal et al.'s rule, step by step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.keras import LearningRateWarmup, linear_scaling

STEPS = 4


class Rates(keras.callbacks.Callback):
    """The learning rate each batch ran with."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_end(self, batch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate.numpy()))


def goyal(target, k, warmup_epochs, epochs, steps):
    """Reference: start at target / k, add target * (k - 1) / k / (warmup steps) per step."""
    rates = []
    for step in range(epochs * steps):
        done = min(step / (warmup_epochs * steps), 1.0)
        rates.append(np.float32(target / k + done * (target - target / k)))
    return rates


def _data(n=STEPS * 6):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")


def test_updates_follow_the_warmup_schedule_exactly():
    """Plain SGD on a linear model: every step's update equals numpy with Goyal's rate."""
    x, y = _data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(0.08), loss="mse")
    w = model.get_weights()[0].astype("float64")
    rates = Rates()
    model.fit(x, y, batch_size=6, epochs=3, shuffle=False, verbose=0,
              callbacks=[LearningRateWarmup(warmup_epochs=1.5, factor=4), rates])
    want = goyal(0.08, 4, 1.5, 3, STEPS)
    np.testing.assert_allclose(rates.rates, want, rtol=3e-7)  # float32 rounding
    assert want[0] == np.float32(0.02) and want[6] == np.float32(0.08) and want[-1] == want[6]
    for step in range(3 * STEPS):
        xb, yb = x[step % STEPS * 6:][:6], y[step % STEPS * 6:][:6]
        grad = 2 * xb.T @ (xb @ w - yb) / len(xb)
        w = w - float(want[step]) * grad
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-5)


def test_factor_defaults_to_the_replicas_in_sync():
    x, y = _data()
    strategy = tfdist_ext.Strategy(num_replicas=3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.3), loss="mse")
    rates = Rates()
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(6), epochs=2, verbose=0,
              callbacks=[LearningRateWarmup(warmup_epochs=1), rates])
    np.testing.assert_allclose(rates.rates, goyal(0.3, 3, 1, 2, STEPS), rtol=3e-7)


def test_explicit_target_and_steps_per_epoch():
    x, y = _data()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")  # as if resumed mid-warm-up
    rates = Rates()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(6).repeat()
    model.fit(data, epochs=2, steps_per_epoch=STEPS, verbose=0,
              callbacks=[LearningRateWarmup(2, factor=2, steps_per_epoch=STEPS,
                                            target_learning_rate=0.2), rates])
    np.testing.assert_allclose(rates.rates, goyal(0.2, 2, 2, 2, STEPS), rtol=3e-7)


def test_a_schedule_is_refused_with_advice():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    x, y = _data()
    with pytest.raises(ValueError, match="needs a constant learning rate.*build the warm-up "
                                         "into the schedule"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[LearningRateWarmup(1)])


@pytest.mark.parametrize("kwargs, text", [
    ({"warmup_epochs": 0}, r"Argument `warmup_epochs` must be a finite number > 0; received 0"),
    ({"factor": 0.5}, r"Argument `factor` must be >= 1 .*received 0.5"),
    ({"steps_per_epoch": 2.5}, r"Argument `steps_per_epoch` must be an integer >= 1 or None"),
    ({"target_learning_rate": -1}, r"Argument `target_learning_rate` must be a finite number"),
])
def test_bad_arguments_are_refused_by_name(kwargs, text):
    with pytest.raises(ValueError, match=text):
        LearningRateWarmup(**kwargs)


def test_linear_scaling():
    assert linear_scaling(0.1, 1024, 256) == pytest.approx(0.4)
    assert linear_scaling(0.1, 64, 256) == pytest.approx(0.025)
    with pytest.raises(ValueError, match=r"Argument `global_batch_size` must be a finite number "
                                         r"> 0; received 0"):
        linear_scaling(0.1, 0, 256)
