"""Worker program for tests/compression/test_adaptive.py (under tfdist-run).

    python adaptive_checks.py OUT_DIR

One Keras fit under compression="adaptive" with short probes; from batch
SLOW_FROM on, worker 1 sleeps SLOW_SECONDS per batch (a real straggler: every
synchronous step waits for it), which must trigger a new probe. Writes the
decision rounds (a drift of 5x: the straggler's
+100 ms is 50x a step here, while this 2-core machine's noise once doubled two
windows in a row), the byte counters, the losses and a weight checksum to
OUT_DIR/w<index>.json.
"""

import hashlib
import json
import os
import sys
import time

import keras
import numpy as np

import tfdist_ext

SLOW_FROM, SLOW_SECONDS = 70, 0.1


class Straggle(keras.callbacks.Callback):
    def __init__(self, index):
        super().__init__()
        self.index, self.batches = index, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.batches += 1
        if self.index == 1 and self.batches > SLOW_FROM:
            time.sleep(SLOW_SECONDS)


def main(out_dir):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tfdist_ext.Strategy(compression={
        "name": "adaptive", "candidates": ["none", "bf16", {"name": "powersgd", "rank": 2}],
        "probe_steps": 2, "check_every": 10, "drift": 5.0})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 16)).astype("float32")
    y = (x[:, :2].sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=32, epochs=6, verbose=0,
                        callbacks=[Straggle(index)])
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    result = {"loss": history.history["loss"], "stats": strategy.communication_stats(),
              "sha": hashlib.sha256(weights.tobytes()).hexdigest(),
              "decisions": [{"step": d["step"], "reason": d["reason"],
                             "choices": [b["choice"] for b in d["buckets"]]}
                            for d in strategy.compression_decisions]}
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
