"""Any global batch size on any replica count: fit equals single-process training.

Generated 8x8 digits (1,347 training samples) in batches of 64 over 3
replicas: local batches of 22/21/21 and a partial last batch of 3, or of 2
(one replica empty) with 1,346 samples.
"""

import inspect
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.ops import ucx as ucx_ops
from tests.workers import uneven_checks
from conftest import ROOT, launch, read_worker_json

# Uneven batches are handled above the all-reduce (the same masked tensors reach every
# algorithm; each algorithm is checked against numpy in tests/collectives): TF's fused op,
# the engine's default and one schedule that pairs replicas (3 is not a power of two).
ALGORITHMS = ["native", "ring", "butterfly"]
RELAXED = [{"name": "local_sgd", "period": 3}, {"name": "stale_synchronous", "staleness": 2},
           {"name": "delayed_averaging", "delay": 2},
           {"name": "model_averaging", "learners_per_device": 2},
           {"name": "diloco", "period": 3}, {"name": "gossip"}]


def _fit_both(strategy, samples=uneven_checks.SAMPLES, epochs=2):
    x, y = uneven_checks.data()
    x, y = x[:samples], y[:samples]
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(uneven_checks.BATCH)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = uneven_checks.build()
    reference = uneven_checks.build()
    reference.set_weights(model.get_weights())
    got = model.fit(data, epochs=epochs, verbose=0).history
    want = reference.fit(data, epochs=epochs, verbose=0).history
    return model, reference, got, want, data


def _assert_same_training(model, reference, got, want):
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["accuracy"], want["accuracy"], atol=1e-6)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_three_replicas_batch_64_equal_single_process(algorithm):
    strategy = tfdist_ext.Strategy(num_replicas=3, allreduce=algorithm)
    model, reference, got, want, data = _fit_both(strategy, epochs=1)
    _assert_same_training(model, reference, got, want)
    np.testing.assert_allclose(model.evaluate(data, verbose=0),
                               reference.evaluate(data, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(model.predict(data, verbose=0),
                               reference.predict(data, verbose=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("engine", ["tf", "ucx"])
def test_empty_replica_in_last_batch_counts_for_nothing(engine):
    if engine == "ucx" and ucx_ops.problem() is not None:
        pytest.skip("the UCX engine is not built here")
    # 1,346 = 21 x 64 + 2: the last batch leaves one of 3 replicas empty.
    strategy = tfdist_ext.Strategy(num_replicas=3, engine=engine)
    model, reference, got, want, _ = _fit_both(strategy, samples=1346)
    _assert_same_training(model, reference, got, want)


def test_five_replicas_with_compression_and_buckets_train():
    strategy = tfdist_ext.Strategy(num_replicas=5, compression={"name": "topk", "ratio": 0.3},
                                   bucketing={"name": "fixed", "bytes_per_bucket": 4096})
    model, _, got, _, _ = _fit_both(strategy)
    assert np.all(np.isfinite(got["loss"])) and got["loss"][-1] < got["loss"][0], got
    assert all(np.array_equal(w.values[0], w.values[-1])
               for w in (v.value for v in model.trainable_variables))


@pytest.mark.parametrize("policy", RELAXED, ids=lambda p: p["name"])
def test_relaxed_policies_train_with_uneven_batches(policy):
    strategy = tfdist_ext.Strategy(num_replicas=3, sync=policy)
    model, _, got, _, _ = _fit_both(strategy)
    assert np.all(np.isfinite(got["loss"])) and got["loss"][-1] < got["loss"][0], got
    for variable in model.trainable_variables:  # drained at the end of fit: one model
        values = [v.numpy() for v in variable.value.values]
        np.testing.assert_allclose(values[0], values[1], rtol=1e-6)


@pytest.mark.multiworker
def test_three_workers_batch_64_uneven_across_processes(tmp_path):
    # Across processes: the fused native op (the engine's schedules run uneven batches on
    # logical replicas above and across workers in test_engine_workers' fit), the
    # averaging drain and the ticket pipeline of the relaxed policies (every policy runs
    # uneven batches on logical replicas above), compression, unequal shards (of known and
    # unknown length). CI time.
    specs = [{"allreduce": "native"}]
    specs += [{"sync": policy} for policy in RELAXED
              if policy["name"] in ("local_sgd", "stale_synchronous")]
    specs += [{"compression": {"name": "topk", "ratio": 0.3}}, {"shard": True},
              {"shard": "unknown"}]
    texts = [json.dumps(spec) for spec in specs]
    code, out, _ = launch(3, [ROOT / "tests" / "workers" / "uneven_checks.py", tmp_path,
                              *texts], timeout=600)
    assert code == 0, out[-5000:]
    results = read_worker_json(tmp_path, 3)
    for spec, text in zip(specs, texts):
        runs = [r[text] for r in results]
        assert all("error" not in run for run in runs), (text, runs[0].get("error"))
        assert len({run["sha"] for run in runs}) == 1, text  # one model on every worker
        assert all(run["predict_shape"] == [uneven_checks.SAMPLES, 10] for run in runs)
        # Auto-sharded data of known length: a plain tf.data iterator (keras.local_input);
        # data the user shards (auto-sharding off): tf.distribute's iterator.
        plain = "shard" not in spec
        assert all(run["iterators"] == ["OwnedIterator" if plain else "DistributedIterator"]
                   for run in runs), (text, [run["iterators"] for run in runs])
        run = runs[0]
        if "allreduce" in spec:
            want = run["reference"]
            np.testing.assert_allclose(run["loss"], want["loss"], rtol=1e-5, err_msg=text)
            np.testing.assert_allclose(run["accuracy"], want["accuracy"], atol=1e-6)
            np.testing.assert_allclose(run["weights"], want["weights"], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(run["evaluate"], want["evaluate"], rtol=1e-5)
        else:
            assert np.all(np.isfinite(run["loss"])) and run["loss"][-1] < run["loss"][0], text


@pytest.mark.parametrize("sync, options", [("sync", {}), ("gossip", {}),
                                           ("sync", {"renorm": True})],
                         ids=["sync", "gossip", "sync-renorm"])
def test_batch_normalization_with_an_empty_replica_stays_finite(sync, options):
    # 1,346 samples in batches of 64 end with a batch of 2 on 3 replicas: one is empty,
    # and BatchNormalization's moments over no samples are NaN (its gamma's gradient and
    # moving statistics with them) unless the layer uses its moving statistics there.
    # Batch renormalization (Keras >= 3.14) computes its corrections from the same moments.
    if "renorm" in options and "renorm" not in inspect.signature(
            keras.layers.BatchNormalization).parameters:
        pytest.skip(f"Keras {keras.__version__}'s BatchNormalization has no renorm (3.14+)")
    x, y = uneven_checks.data()
    strategy = tfdist_ext.Strategy(num_replicas=3, sync=sync)
    with strategy.scope():
        model = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Dense(16),
                                  keras.layers.BatchNormalization(**options),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x[:1346], y[:1346], batch_size=uneven_checks.BATCH, epochs=2,
                        shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"])), history.history
    for variable in model.variables:
        for value in variable.value.values:
            assert np.all(np.isfinite(value.numpy())), variable.path
    assert np.isfinite(model.evaluate(x, y, verbose=0))


def _conv_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2), keras.layers.DepthwiseConv2D(2, padding="same"),
        keras.layers.SeparableConv2D(4, 2, padding="same"), keras.layers.Reshape((16, 4)),
        keras.layers.Conv1D(6, 3), keras.layers.MaxPooling1D(2),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(10)])


def _fit_equals_single_process(build, x, y, run_eagerly=False):
    """3 replicas against one process, 194 samples in batches of 64 (the last: 1/1/0)."""
    data = tf.data.Dataset.from_tensor_slices((x[:194], y[:194])).batch(uneven_checks.BATCH)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    keras.utils.set_random_seed(0)
    with tfdist_ext.Strategy(num_replicas=3).scope():
        model = build()
        model.compile(optimizer="adam", loss=loss, run_eagerly=run_eagerly)
    reference = build()
    reference.compile(optimizer="adam", loss=loss)
    reference.set_weights(model.get_weights())
    got = model.fit(data, epochs=1, verbose=0).history
    want = reference.fit(data, epochs=1, verbose=0).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_convolutions_with_an_empty_replica_equal_single_process():
    # TF's oneDNN convolutions return an input-shaped tensor for an empty batch, separable
    # ones fail and max pooling's gradient aborts.
    x, y = uneven_checks.data()
    _fit_equals_single_process(_conv_model, x.reshape(-1, 8, 8, 1), y)


def test_run_eagerly_with_an_empty_replica_equals_single_process():
    # Eagerly every step sees its batch's concrete shapes (22/21/21, then 1/1/0).
    _fit_equals_single_process(uneven_checks.build, *uneven_checks.data(), run_eagerly=True)
