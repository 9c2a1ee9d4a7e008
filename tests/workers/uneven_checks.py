"""Worker program for tests/keras/test_uneven.py (run under tfdist-run).

    python uneven_checks.py OUT_DIR RUN_JSON [RUN_JSON ...]

Each RUN_JSON names strategy options ({"allreduce": ..., "sync": ...,
"compression": ...}) and optionally "shard": true (the user shards the data
per worker, unequally, with auto-sharding off, so one worker's data runs out
first) or "shard": "unknown" (likewise, of a length tf.data does not know). For each run, in one process: 1,347 generated 8x8 digits
(tests/workers/digits8x8.py) in `tf.data` batches of 64, a small MLP trained for 2 epochs under a
`tfdist_ext.Strategy`, then `evaluate` and `predict`; the same model trained
without a strategy (one replica, same initial weights, same data) is the
reference (for the runs that name an all-reduce). Writes per-run losses, metrics and weight digests to
OUT_DIR/w<index>.json.
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext
from tests.workers.digits8x8 import load_digits

SAMPLES, BATCH, EPOCHS = 1347, 64, 2


def data():
    digits = load_digits()
    return ((digits.data[:SAMPLES] / 16).astype("float32"),
            digits.target[:SAMPLES].astype("int64"))


def build():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def digest(weights):
    return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in weights)).hexdigest()


def dataset(x, y, shard=None, unknown=False):
    if shard is None:
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    index, count = shard
    # Unequal shards: worker 0 keeps 40% more rows than the others.
    bounds = np.cumsum([0] + [7 if i == 0 else 5 for i in range(count)])
    bounds = (bounds * len(x) // bounds[-1]).astype(int)
    lo, hi = bounds[index], bounds[index + 1]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    local = tf.data.Dataset.from_tensor_slices((x[lo:hi], y[lo:hi]))
    if unknown:  # a length tf.data cannot know without reading the data
        local = local.filter(lambda *_: True)
    return local.batch(BATCH).with_options(options)


class IteratorKinds(keras.callbacks.Callback):
    """Records the type of what Keras passes to its train function."""

    def __init__(self):
        super().__init__()
        self.kinds = set()

    def on_train_begin(self, logs=None):
        function = self.model.train_function

        def probed(iterator):
            self.kinds.add(type(iterator).__name__)
            return function(iterator)

        self.model.train_function = probed


def run(spec, x, y, index, count):
    options = {k: v for k, v in spec.items() if k != "shard"}
    strategy = tfdist_ext.Strategy(**options)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build()
    initial = model.get_weights()
    train = dataset(x, y, (index, count) if spec.get("shard") else None,
                    unknown=spec.get("shard") == "unknown")
    probe = IteratorKinds()
    history = model.fit(train, epochs=EPOCHS, verbose=0, callbacks=[probe]).history
    result = {"loss": history["loss"], "accuracy": history["accuracy"],
              "iterators": sorted(probe.kinds),
              "sha": digest(model.get_weights()),
              "weights": [w.tolist() for w in model.get_weights()[-1:]],
              "evaluate": model.evaluate(dataset(x, y), verbose=0),
              "predict_shape": list(model.predict(dataset(x, y), verbose=0).shape)}
    if "allreduce" in spec:  # the runs that must equal one process's training
        reference = build()
        reference.set_weights(initial)
        ref_history = reference.fit(dataset(x, y), epochs=EPOCHS, verbose=0).history
        result["reference"] = {"loss": ref_history["loss"],
                               "accuracy": ref_history["accuracy"],
                               "weights": [w.tolist() for w in reference.get_weights()[-1:]],
                               "evaluate": reference.evaluate(dataset(x, y), verbose=0)}
    return result


def main(out_dir, specs):
    config = json.loads(os.environ["TF_CONFIG"])
    index, count = config["task"]["index"], len(config["cluster"]["worker"])
    x, y = data()
    results = {}
    for text in specs:
        try:
            results[text] = run(json.loads(text), x, y, index, count)
        except Exception as err:  # pylint: disable=broad-except
            results[text] = {"error": f"{type(err).__name__}: {err}"[:2000]}
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
