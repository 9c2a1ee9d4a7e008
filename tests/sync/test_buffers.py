"""BatchNorm statistics (non-trainable variables) end `fit` equal on every replica."""

import keras
import numpy as np
import pytest

import tfdist_ext

# One policy per drain: the base drain (local SGD; DiLoCo's), gossip's, the pipelined
# runner's (stale-synchronous; delayed averaging's) and model averaging's.
POLICIES = [
    {"name": "local_sgd", "period": 2},
    "gossip",
    {"name": "stale_synchronous", "staleness": 1},
    {"name": "model_averaging", "learners_per_device": 1},
]


def _replicas(variable):
    return [c.numpy() for c in variable.value.values]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p if isinstance(p, str) else p["name"])
def test_batchnorm_statistics_are_averaged_and_frozen_weights_kept(policy):
    num = 3
    rng = np.random.default_rng(0)
    # Rows scaled by position: each replica's shard has its own statistics.
    x = (rng.normal(size=(192, 4)) * np.linspace(0.5, 3.0, 192)[:, None]).astype("float32")
    y = rng.normal(size=(192, 1)).astype("float32")
    strategy = tfdist_ext.Strategy(sync=policy, num_replicas=num)
    with strategy.scope():
        frozen = keras.layers.Dense(8, trainable=False)
        norm = keras.layers.BatchNormalization()
        model = keras.Sequential([keras.Input((4,)), frozen, norm, keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    kernel = frozen.kernel.numpy().copy()
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(_replicas(norm.moving_mean))

    model.fit(x, y, batch_size=16 * num, epochs=1, shuffle=False, verbose=0,
              callbacks=[Record()])
    # Between synchronisation points each replica kept its own statistics ...
    assert np.abs(seen[-1][0] - seen[-1][1]).max() > 1e-4
    means, variances = _replicas(norm.moving_mean), _replicas(norm.moving_variance)
    # ... and the averaged ones are the mean of what the replicas had.
    np.testing.assert_allclose(means[0], np.mean(seen[-1], axis=0), rtol=1e-5, atol=1e-7)
    for values in (means, variances):
        for other in values[1:]:
            np.testing.assert_array_equal(values[0], other)
    for component in _replicas(frozen.kernel):  # 3 replicas: a plain mean could round
        np.testing.assert_array_equal(component, kernel)


def test_synchronous_training_averages_batchnorm_statistics_at_epoch_ends():
    strategy = tfdist_ext.Strategy(num_replicas=3)
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(96, 4)) * np.linspace(0.5, 3.0, 96)[:, None]).astype("float32")
    y = rng.normal(size=(96, 1)).astype("float32")
    with strategy.scope():
        norm = keras.layers.BatchNormalization()
        model = keras.Sequential([keras.Input((4,)), norm, keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(_replicas(norm.moving_variance))

    model.fit(x, y, batch_size=48, epochs=2, shuffle=False, verbose=0, callbacks=[Record()])
    assert np.abs(seen[-1][0] - seen[-1][2]).max() > 1e-4  # per replica during the epoch
    final = _replicas(norm.moving_variance)
    np.testing.assert_allclose(final[0], np.mean(seen[-1], axis=0), rtol=1e-5)
    assert all(np.array_equal(final[0], f) for f in final[1:])
