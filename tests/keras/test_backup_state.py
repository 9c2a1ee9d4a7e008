"""BackupAndRestore carries the strategy's state (in one process, 2 replicas)."""

import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext


def _fit(backup_dir, epochs, strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    backup = keras.callbacks.BackupAndRestore(str(backup_dir), delete_checkpoint=False)
    model.fit(data, epochs=epochs, verbose=0, callbacks=[backup])
    return model


def test_residuals_are_backed_up_and_a_backup_without_them_is_refused(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2, compression={"name": "topk", "ratio": 0.25})
    _fit(tmp_path, 1, strategy)
    saved = tmp_path / "tfdist-worker0"
    assert sorted(p.name for p in saved.iterdir())[-1] == "state.index"
    residual = max((v[1].numpy() for v in strategy.state.residuals.values()), key=len)
    assert np.any(residual != 0)
    shutil.rmtree(saved)
    with pytest.raises(FileNotFoundError) as error:
        _fit(tmp_path, 2, strategy)
    message = str(error.value)
    assert "holds a backup of the weights but not of worker 0's tfdist_ext state" in message
    assert "delete the backup directory to start over" in message


def test_plain_sync_resumes_from_a_keras_only_backup(tmp_path):
    strategy = tfdist_ext.Strategy(num_replicas=2)
    _fit(tmp_path, 1, strategy)
    shutil.rmtree(tmp_path / "tfdist-worker0")  # e.g. written by plain Keras
    model = _fit(tmp_path, 2, strategy)  # resumes at epoch 1 without complaint
    assert model.optimizer.iterations.numpy() == 8
