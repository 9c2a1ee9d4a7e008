"""A gradient whose static shape Keras leaves open reaches the engine with its weight's.

A Dense layer on 3-D inputs (a Transformer's feed-forward block, an RNN's head) goes
through `tensordot`, whose kernel gradient is (None, units) when traced. TF's own
collectives used to sum it: slower than the engine, and under `elastic` a death made
them fail for good (TF aborts its collectives). Logical CPU replicas in this process.
"""

import contextlib

import keras
import numpy as np
import pytest

import tfdist_ext
from tfdist_ext import _compat
from tfdist_ext.ops import ucx as ucx_ops

NO_UCX = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")


def _fit(strategy=None, **options):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(70, 6, 5)).astype("float32")
    y = (x[:, :, 0].sum(1) > 0).astype("int64")
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((6, 5)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Flatten(), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(0.01, **options),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=20, epochs=2, shuffle=False, verbose=0)
    return model


def _op_types(model):
    step = _compat.keras_iterator_function(model.train_function)
    types = set()
    for concrete in step._list_all_concrete_functions():  # pylint: disable=protected-access
        graph = concrete.graph.as_graph_def()
        types |= {node.op for node in graph.node}
        types |= {node.op for f in graph.library.function for node in f.node_def}
    return types


@NO_UCX
@pytest.mark.parametrize("options", [{}, {"clipnorm": 0.5}])  # Keras' apply, ours
def test_a_dense_kernel_on_3d_inputs_is_summed_on_the_engine(options):
    model = _fit(tfdist_ext.Strategy(num_replicas=3, engine="ucx"), **options)
    types = _op_types(model)
    assert "TfdistUcxRun" in types
    assert not {t for t in types if t.startswith("Collective")}, sorted(types)
    for mine, theirs in zip(model.get_weights(), _fit(**options).get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
