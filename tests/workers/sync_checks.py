"""Worker program for tests/sync/test_sync_workers.py (run under tfdist-run).

    python sync_checks.py OUT_DIR RUN_JSON [RUN_JSON ...]

Each RUN_JSON is {"sync": <policy name or dict>, "sleep": seconds} and
optionally "compression": <name or dict>. For each,
in one process: builds a `tfdist_ext.Strategy` and a small MLP, runs `fit` for
2 epochs of 12 steps while a seeded schedule (the same on every worker) makes
one worker per step sleep that long before the step, and records the final weights' digest, losses and the strategy's
communication counters in OUT_DIR/w<index>.json.
"""

import hashlib
import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext

STEPS, EPOCHS = 12, 2


class Straggler(keras.callbacks.Callback):
    """Sleeps before the steps a seeded schedule gives to this worker."""

    def __init__(self, index, num_workers, seconds, seed=3):
        super().__init__()
        self.schedule = np.random.default_rng(seed).integers(0, num_workers, STEPS * EPOCHS)
        self.index, self.seconds, self.step = index, seconds, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.seconds and self.schedule[self.step] == self.index:
            time.sleep(self.seconds)
        self.step += 1


def run(policy, index, num_workers, sleep, compression=None):
    strategy = tfdist_ext.Strategy(sync=policy, compression=compression)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(480, 8)).astype("float32")
    y = (np.tanh(x @ rng.normal(size=(8, 1)))).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8 * num_workers)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    start = time.monotonic()
    history = model.fit(dataset, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0,
                        callbacks=[Straggler(index, num_workers, sleep)])
    seconds = time.monotonic() - start
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return {"policy": strategy.config.sync.name, "seconds": seconds,
            "loss": history.history["loss"], "stats": strategy.communication_stats(),
            "sha": hashlib.sha256(weights.tobytes()).hexdigest()}


def main(out_dir, *runs):
    config = json.loads(os.environ["TF_CONFIG"])
    index, num_workers = config["task"]["index"], len(config["cluster"]["worker"])
    results = []
    for spec in map(json.loads, runs):
        results.append(run(spec["sync"], index, num_workers, spec.get("sleep", 0.0),
                           spec.get("compression")))
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
