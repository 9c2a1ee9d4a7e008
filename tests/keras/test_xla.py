"""`compile(jit_compile=True)` under the strategy: XLA compiles the step around its collectives."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.keras import xla


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 5)).astype("float32")
    y = rng.integers(0, 3, size=96).astype("int32")
    return x, y


def _fit(engine, jit, replicas=3):
    strategy = tfdist_ext.Strategy(num_replicas=replicas, engine=engine)
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=jit)
    x, y = _data()
    history = model.fit(x, y, batch_size=24, epochs=3, shuffle=False, verbose=0)
    evaluation = model.evaluate(x, y, batch_size=24, verbose=0)
    return model, history.history["loss"], evaluation




@pytest.mark.parametrize("engine", ["ucx", "tf"])
def test_jit_compile_fit_and_evaluate_match_the_uncompiled_step(engine):
    model, loss, evaluation = _fit(engine, jit=True)
    _, loss_ref, evaluation_ref = _fit(engine, jit=False)
    assert model.jit_compile is True
    assert loss[-1] < loss[0]
    np.testing.assert_allclose(loss, loss_ref, rtol=2e-4)
    np.testing.assert_allclose(evaluation, evaluation_ref, rtol=2e-4)


def test_the_compute_is_marked_for_xla_and_the_collectives_are_not():
    strategy = tfdist_ext.Strategy(num_replicas=3)

    def replica_step(x):
        return tf.distribute.get_replica_context().all_reduce("sum", tf.matmul(x, x) + 1.0)

    @tf.function
    def step(x):
        return strategy.run(xla.clustered(replica_step), args=(x,))

    graph = step.get_concrete_function(tf.TensorSpec((2, 2), tf.float32)).graph
    marks = {}
    for op in graph.get_operations():
        try:
            compiled = op.get_attr("_XlaCompile")
        except ValueError:
            compiled = False
        marks.setdefault(op.type, set()).add(compiled)
    assert marks["MatMul"] == {True}
    collectives = [op for op in marks if op.startswith("TfdistUcx")]
    assert collectives and all(marks[op] == {False} for op in collectives)


def test_one_replica_keeps_keras_whole_step_compilation():
    strategy = tfdist_ext.Strategy(num_replicas=1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert not xla.applies(model, strategy)
    x, _ = _data()
    model.fit(x, np.zeros((96, 3), "float32"), batch_size=24, epochs=1, verbose=0)


def test_compilable_keeps_collectives_and_tfdist_ops_out():
    def node(op):
        return tf.compat.v1.NodeDef(op=op)

    assert xla.compilable(node("MatMul"))
    assert xla.compilable(node("AssignAddVariableOp"))
    for op in ("CollectiveReduceV2", "CollectiveGatherV2", "NcclAllReduce", "TfdistUcxRun",
               "TfdistTopK"):
        assert not xla.compilable(node(op))


def test_jit_compile_with_convolutions_and_an_empty_replica_batch():
    # 50 samples in global batches of 24: the last batch's 2 samples leave the
    # third replica none (TF's oneDNN convolutions need a guard there, XLA's not).
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 12)).astype("float32")
    y = rng.integers(0, 3, size=50).astype("int32")
    results = []
    for jit in (True, False):
        strategy = tfdist_ext.Strategy(num_replicas=3)
        keras.utils.set_random_seed(4)
        with strategy.scope():
            model = keras.Sequential([
                keras.Input((12,)), keras.layers.Reshape((12, 1)),
                keras.layers.Conv1D(4, 3, activation="relu"), keras.layers.MaxPooling1D(2),
                keras.layers.Flatten(), keras.layers.Dense(3)])
            model.compile(optimizer=keras.optimizers.SGD(0.05),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          jit_compile=jit)
        history = model.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
        results.append((history.history["loss"], model.get_weights()))
    (loss, weights), (loss_ref, weights_ref) = results
    assert np.all(np.isfinite(loss))
    np.testing.assert_allclose(loss, loss_ref, rtol=2e-4)
    for got, want in zip(weights, weights_ref):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
