"""Keras fit with every graph-engine algorithm ends where "native" ends (4 logical CPUs)."""

import keras
import numpy as np
import pytest

import tfdist_ext
from tfdist_ext import collectives


def _fit(allreduce):
    strategy = tfdist_ext.Strategy(num_replicas=4, allreduce=allreduce)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype("float32")
    y = rng.integers(0, 3, size=256).astype("int32")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


@pytest.fixture(scope="module")
def native():
    return _fit("native")


@pytest.mark.parametrize("name", collectives.ALGORITHMS.names())
def test_fit_ends_with_the_weights_of_native(native, name):
    weights, loss = _fit(name)
    assert loss[-1] < loss[0]
    np.testing.assert_allclose(loss, native[1], rtol=1e-5)
    for ours, ref in zip(weights, native[0]):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
