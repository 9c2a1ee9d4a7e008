"""The harness of the sync policy tests on logical-CPU replicas.

The model is a bias-free linear layer with MSE loss (a quadratic) trained with
(momentum) SGD in Keras `fit`; `reference.py` implements each paper's update
rule independently.
"""

import keras
import numpy as np

import tfdist_ext

FEATURES, PER_REPLICA, LR = 5, 4, 0.05
# Fixed initial weights: the compressed references round float32 values the same way
# only away from rounding ties, which their tests check for these weights.
INITIALIZER = keras.initializers.GlorotUniform(seed=11)


def data(steps, num):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(steps * num * PER_REPLICA, FEATURES))
    y = x @ rng.normal(size=(FEATURES, 1)) + 0.3 * rng.normal(size=(len(x), 1))
    return x, y


def rows_of(x, y, num):
    batch = num * PER_REPLICA

    def rows(t, i):
        lo = t * batch + i * PER_REPLICA
        return x[lo:lo + PER_REPLICA], y[lo:lo + PER_REPLICA]

    return rows


def fit(policy, steps=6, num=2, epochs=1, momentum=0.0, **strategy_args):
    """Trains; returns (w0, per-step per-replica weights, final weights, strategy)."""
    x, y = data(steps, num)
    strategy = tfdist_ext.Strategy(sync=policy, num_replicas=num, **strategy_args)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(1, use_bias=False,
                                                     kernel_initializer=INITIALIZER)])
        model.compile(optimizer=keras.optimizers.SGD(LR, momentum=momentum), loss="mse")
    w0 = model.get_weights()[0].astype(np.float64)
    history = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            variable = model.trainable_variables[0].value
            history.append([c.numpy().astype(np.float64) for c in variable.values])

    model.fit(x.astype("float32"), y.astype("float32"), batch_size=num * PER_REPLICA,
              epochs=epochs, shuffle=False, verbose=0, callbacks=[Record()])
    final = [c.numpy().astype(np.float64)
             for c in model.trainable_variables[0].value.values]
    return w0, history, final, strategy, rows_of(x, y, num)


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-6)
