"""Shuffles made before `fit` the ways other people's scripts make them.

OUT/w<index>.json gets which of four fits the workers' inputs agreed on:
an unseeded tf.data shuffle, np.random.permutation before validation_split,
a seeded tf.data shuffle, and arrays with Keras' own shuffle (no seed set).
"""

import json
import logging
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

warnings = []


class Collect(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())


logging.getLogger("tfdist_ext").addHandler(Collect(level=logging.WARNING))
strategy = tfdist_ext.Strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
rng = np.random.default_rng(0)
x = rng.normal(size=(120, 4)).astype("float32")
y = rng.integers(0, 2, size=120)
results = {}
runs = {
    "unseeded_dataset": lambda: model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(120).batch(24), verbose=0),
    "permuted_arrays": lambda: model.fit(
        *(lambda p: (x[p], y[p]))(np.random.permutation(len(x))), batch_size=24,
        validation_split=0.2, verbose=0),
    "seeded_dataset": lambda: model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(120, seed=3).batch(24), verbose=0),
    "keras_shuffle": lambda: model.fit(x, y, batch_size=24, shuffle=True, verbose=0),
}
for name, run in runs.items():
    before = len(warnings)
    run()
    results[name] = [w for w in warnings[before:] if "differ in content or order" in w]
results["global_seed"] = int(tf.random.uniform([], maxval=2**30, dtype=tf.int32))
with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump(results, f)
