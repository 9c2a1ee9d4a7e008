"""Worker program for tests/test_profile.py (run under `tfdist-run --profile`).

    python profile_checks.py OUT_DIR

A 2-layer MLP trained for one epoch of 16 steps under `tfdist_ext.Strategy()`
(the UCX engine's ring), with Keras' `TensorBoard(profile_batch=(2, 3))`
writing to OUT_DIR/tb; the launcher's --profile traces other steps of every
worker (tfdist_ext.keras.job_profile). Writes OUT_DIR/w<index>.json.
"""

import json
import os
import sys

import keras
import numpy as np

import tfdist_ext


def main(out_dir):
    strategy = tfdist_ext.Strategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * 32, 16)).astype("float32")
    y = (x @ rng.normal(size=(16, 1))).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    board = keras.callbacks.TensorBoard(log_dir=os.path.join(out_dir, "tb"), profile_batch=(2, 3))
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[board])
    with open(os.path.join(out_dir, f"w{strategy.worker_index}.json"), "w",
              encoding="utf-8") as f:
        json.dump({"loss": history.history["loss"]}, f)


if __name__ == "__main__":
    main(sys.argv[1])
