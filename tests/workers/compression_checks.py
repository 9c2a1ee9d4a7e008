"""Worker program for tests/compression/test_compression_workers.py (under tfdist-run).

    python compression_checks.py OUT_DIR name [name ...]

For each compressor name: a small Keras fit under tfdist_ext.Strategy(compression=name);
writes the losses (or the divergence guard's message), a weight checksum and the byte
counters to OUT_DIR/w<index>.json.
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext
from tfdist_ext.keras import divergence


def fit(name):
    strategy = tfdist_ext.Strategy(compression=name)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(480, 8)).astype("float32")
    y = (np.tanh(x @ rng.normal(size=(8, 1)))).astype("float32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="tanh"),
                                  keras.layers.Dense(64, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    result = {}
    try:
        history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=6,
                            verbose=0)
        result["loss"] = history.history["loss"]
    except divergence.DivergenceError as error:  # stopped by the guard, on every worker
        result["diverged"] = str(error)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return dict(result, stats=strategy.communication_stats(),
                sha=hashlib.sha256(weights.tobytes()).hexdigest())


def main(out_dir, *names):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    results = {name: fit(name) for name in names}
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
