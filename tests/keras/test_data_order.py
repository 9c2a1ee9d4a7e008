"""The digest `fit` compares across workers (tfdist_ext.keras.data_order)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT
from tfdist_ext import strategy_extended
from tfdist_ext.keras import data_order
from tfdist_ext.launch import free_ports, tf_configs


def test_arrays_in_another_order_have_another_digest():
    x = np.arange(60, dtype="float32").reshape(30, 2)
    y = np.arange(30)
    assert data_order.digest(x, y) == data_order.digest(x.copy(), y.copy())
    order = np.random.default_rng(1).permutation(30)
    assert data_order.digest(x[order], y[order]) != data_order.digest(x, y)
    assert data_order.digest({"a": x}, y) != data_order.digest({"a": x[:29]}, y[:29])
    assert data_order.digest(tf.constant(x), y) == data_order.digest(x, y)


def test_datasets_compare_their_first_element_unless_auto_sharding_is_off():
    x = np.arange(40, dtype="float32")
    seeded = [tf.data.Dataset.from_tensor_slices(x).shuffle(40, seed=5).batch(4)
              for _ in range(2)]
    assert data_order.digest(seeded[0]) == data_order.digest(seeded[1])
    other = tf.data.Dataset.from_tensor_slices(x).shuffle(40, seed=6).batch(4)
    assert data_order.digest(other) != data_order.digest(seeded[0])
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    assert data_order.digest(other.with_options(options)) is None
    assert data_order.digest(lambda: None) is None  # nothing it can read


@pytest.mark.multiworker
@pytest.mark.alone
def test_a_strategy_after_tensorflow_ran_names_the_fix():
    """TF ran before `import tfdist_ext` could prepare it: the error says what to do."""
    config = tf_configs([f"127.0.0.1:{p}" for p in free_ports(2)])[0]
    program = ("import tensorflow as tf; tf.constant(1.0); import tfdist_ext; "
               "tfdist_ext.Strategy(startup_timeout=20)")
    env = dict(os.environ, TF_CONFIG=config, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", program], env=env, cwd=ROOT, text=True,
                            capture_output=True, timeout=120, check=False)
    assert result.returncode == 1
    assert strategy_extended.LATE_START in result.stderr
    assert "put `import tfdist_ext` before the first TensorFlow op" in result.stderr
    assert "tfdist_ext.early.prepare()" in result.stderr


def test_barrier_refuses_a_bad_timeout_by_name():
    import tfdist_ext  # pylint: disable=import-outside-toplevel
    strategy = tfdist_ext.Strategy(num_replicas=1)
    strategy.barrier()  # one worker: returns at once
    with pytest.raises(ValueError, match=r"Argument `timeout` must be a number of seconds "
                                         r">= 0 \(0 waits forever\); received -1"):
        strategy.barrier(timeout=-1)
