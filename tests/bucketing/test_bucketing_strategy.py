"""Bucketing in the strategy: per-bucket reductions in the traced train step."""

import pathlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.ops import ucx as ucx_ops
from tfdist_ext import bucketing
from tfdist_ext.keras import fit_callbacks

LAYERS = 4


def _model():
    keras.utils.set_random_seed(3)
    layers = [keras.Input((8,))] + [keras.layers.Dense(16, activation="tanh")
                                    for _ in range(LAYERS - 1)] + [keras.layers.Dense(4)]
    return keras.Sequential(layers)


def _data(n=72):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 8)).astype("float32"),
            rng.integers(0, 4, size=n).astype("int32"))


def _compiled(strategy):
    with strategy.scope():
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _traced_step(strategy):
    """The graph of a Keras-style train step; names of layer 0's gradient ops."""
    model = _compiled(strategy)
    first_layer_grads = []

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
            loss = loss / strategy.num_replicas_in_sync
        grads = tape.gradient(loss, model.trainable_variables)
        first_layer_grads.extend(g.op for g in grads[:2])  # layer 0's kernel and bias
        model.optimizer.apply(grads, model.trainable_variables)

    @tf.function
    def step(x, y):
        strategy.run(replica_step, args=(x, y))

    x, y = _data(8)
    graph = step.get_concrete_function(tf.constant(x), tf.constant(y)).graph
    return graph, first_layer_grads


def _ancestors(ops):
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _collectives(graph, scope):
    return [op for op in graph.get_operations() if op.name.startswith(scope)
            and (op.type.startswith("Collective") or op.type.startswith("TfdistUcx"))]


# Each engine with its default algorithm: TF's native ring, the UCX engine's ring.
ENGINES = [("tf", "native"),
           pytest.param("ucx", "ring", marks=pytest.mark.skipif(
               ucx_ops.problem() is not None, reason="UCX engine not built"))]


@pytest.mark.parametrize("engine, algorithm", ENGINES)
def test_wfbp_first_bucket_does_not_depend_on_earlier_layers(engine, algorithm):
    graph, first_grads = _traced_step(tfdist_ext.Strategy(bucketing="wfbp", num_replicas=2,
                                                          engine=engine))
    # WFBP: one bucket per gradient tensor, numbered in backward order.
    scope = f"tfdist/{algorithm}/"
    buckets = {op.name.split("/")[2] for op in _collectives(graph, scope)}
    assert buckets == {f"b{i}" for i in range(2 * LAYERS)}
    first_bucket = _collectives(graph, f"{scope}b0/")
    assert len(first_bucket) == 2  # one collective per replica
    ancestors = _ancestors(first_bucket)
    assert not {op.name for op in first_grads} & ancestors
    # The last bucket (layer 0's kernel) does wait for it: the check can fail.
    last_bucket = _collectives(graph, f"{scope}b{2 * LAYERS - 1}/")
    assert {op.name for op in first_grads} & _ancestors(last_bucket)


@pytest.mark.parametrize("engine, algorithm", ENGINES)
def test_single_bucket_waits_for_every_gradient(engine, algorithm):
    graph, first_grads = _traced_step(tfdist_ext.Strategy(num_replicas=2, engine=engine))
    only = _collectives(graph, f"tfdist/{algorithm}/b0/")
    assert only and {op.name for op in first_grads} & _ancestors(only)


def _fit(strategy, epochs=2):
    model = _compiled(strategy)
    x, y = _data()
    model.fit(x, y, batch_size=12, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights(), model


@pytest.mark.parametrize("planner", ["wfbp", {"name": "fixed", "bytes_per_bucket": 300},
                                     {"name": "mgwfbp", "profile_steps": 3}])
@pytest.mark.parametrize("replicas, algorithm", [(2, "native"), (3, "master_worker")])
def test_bucketed_training_equals_unbucketed_bit_for_bit(planner, replicas, algorithm):
    allreduce = {"name": algorithm, "calibration_cache": None}
    expected, _ = _fit(tfdist_ext.Strategy(allreduce=allreduce, num_replicas=replicas))
    strategy = tfdist_ext.Strategy(allreduce=allreduce, bucketing=planner,
                                   num_replicas=replicas)
    actual, _ = _fit(strategy)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)
    plan = strategy.extended.cross_device_ops.buckets.bucket_plan
    assert sum(b["gradients"] for b in plan) == 2 * LAYERS
    if planner == "wfbp":
        assert len(plan) == 2 * LAYERS


def test_mgwfbp_profiles_backward_times_then_replans():
    strategy = tfdist_ext.Strategy(allreduce={"name": "native", "calibration_cache": None},
                                   bucketing={"name": "mgwfbp", "profile_steps": 3},
                                   num_replicas=2)
    cross_ops = strategy.extended.cross_device_ops
    assert cross_ops.buckets.needs_backward_profile()
    _fit(strategy, epochs=1)
    times = cross_ops.buckets.backward_times
    assert times is not None and len(times) == 2 * LAYERS
    assert all(t >= 0 for t in times) and sum(times) > 0
    assert int(strategy.state.ready_count.numpy()) == 3
    assert not cross_ops.buckets.needs_backward_profile()
    # The calibration the planner uses was measured for the configured algorithm.
    assert [line[0] for line in strategy.calibration.lines] == ["native"]


def test_backward_times_from_ready_stamps():
    from tfdist_ext.keras.backward_profile import backward_times  # pylint: disable=import-outside-toplevel
    assert backward_times([0.0, 1.0, 0.5, 3.0]) == [0.0, 1.0, 0.0, 2.0]
    assert backward_times([]) == []


def test_supplied_backward_times_of_the_wrong_length_are_rejected():
    strategy = tfdist_ext.Strategy(
        bucketing=bucketing.MGWFBP(backward_times=(0.1, 0.2)), num_replicas=2)
    with pytest.raises(ValueError, match=(r"Argument `backward_times` of MGWFBP has 2 entries "
                                          r"but the model has 8 gradients to reduce")):
        _fit(strategy, epochs=1)


@pytest.mark.parametrize("engine, algorithm", ENGINES)
def test_profile_trace_shows_bucket_scopes(tmp_path, engine, algorithm):
    strategy = tfdist_ext.Strategy(bucketing="wfbp", num_replicas=2, engine=engine)
    model = _compiled(strategy)
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
        keras.callbacks.TensorBoard(log_dir=str(tmp_path), profile_batch=(2, 3))])
    traces = list(pathlib.Path(tmp_path).rglob("*.xplane.pb"))
    assert traces, list(pathlib.Path(tmp_path).rglob("*"))
    content = b"".join(p.read_bytes() for p in traces)
    for bucket in ("b0", f"b{2 * LAYERS - 1}"):
        assert f"tfdist/{algorithm}/{bucket}/".encode() in content, bucket
    if engine == "ucx":  # the executor thread's TraceMe: the label without an op name
        assert re.search(rb"tfdist/ring/b0(?![/_0-9])", content), "no TraceMe tfdist/ring/b0"


def test_mgwfbp_tuning_times_candidate_plans_and_keeps_the_fastest():
    strategy = tfdist_ext.Strategy(allreduce={"name": "native", "calibration_cache": None},
                                   bucketing={"name": "mgwfbp", "profile_steps": 2},
                                   num_replicas=2)
    # A link with a tiny per-message cost (the backward of these small layers
    # takes microseconds), so that alpha x 1/4 .. x 1e6 give different plans.
    from tfdist_ext.collectives import auto  # pylint: disable=import-outside-toplevel
    strategy.extended.cross_device_ops.choice.calibration = auto.Calibration(
        "test", 2, alpha=1e-6, beta=1e-11, gamma=0.0, lines=(("native", 1e-6, 1e-11),))
    _fit(strategy, epochs=8)  # 48 steps: 2 profiled, then 3 per candidate plan
    tuner = fit_callbacks.kept(strategy)["bucket_tuner"]
    assert tuner.done, tuner.phase
    plans = [plan for _, plan in tuner.candidates]
    assert len(set(plans)) == len(plans) >= 2  # distinct plans, one bucket among them
    assert ((tuple(range(2 * LAYERS)),) in plans)
    assert all(t["step_seconds"] > 0 for t in tuner.trials)
    cross_ops = strategy.extended.cross_device_ops
    chosen = min(tuner.trials, key=lambda t: t["step_seconds"])
    assert [t for t in tuner.trials if t["chosen"]] == [chosen]
    assert cross_ops.buckets.plan_override == plans[tuner.trials.index(chosen)]
    assert len(strategy.bucket_plan) == chosen["buckets"]
    # Later fits add no tuning callback.
    assert not [c for c in strategy.fit_callbacks() if c is tuner]
