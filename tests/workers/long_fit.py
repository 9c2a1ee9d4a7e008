"""Worker program for tests/collectives/test_peer_failures.py: a long fit.

    python long_fit.py EPOCHS ENGINE [TIMEOUT_SECONDS [SIGNAL STAMP_FILE]]

ENGINE is "ucx" (the ring, with a progress timeout of TIMEOUT_SECONDS) or "tf"
(TF's own all-reduce).
Prints "epoch N done" after each epoch (flushed), so the test knows the
collectives are running before it stops a worker. With SIGNAL ("kill",
"stop" or "raise"), worker 1 writes the time to STAMP_FILE after its second
epoch and sends itself that signal (or raises RuntimeError).
"""

import json
import os
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext


class Progress(keras.callbacks.Callback):
    def __init__(self, sig=None, stamp=None):
        super().__init__()
        self.sig, self.stamp = sig, stamp

    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch {epoch} done", flush=True)
        index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index")
        if self.sig and index == 1 and epoch == 1:
            with open(self.stamp, "w", encoding="utf-8") as f:
                f.write(repr(time.time()))
            if self.sig == "raise":
                raise RuntimeError("worker 1 gives up")
            os.kill(os.getpid(), {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[self.sig])


def main(epochs, engine, timeout_seconds="30", sig=None, stamp=None):
    strategy = tfdist_ext.Strategy(
        engine=engine, allreduce="native" if engine == "tf" else {
            "name": "ring", "timeout_seconds": float(timeout_seconds)})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=int(epochs),
              verbose=0, callbacks=[Progress(sig, stamp)])


if __name__ == "__main__":
    main(*sys.argv[1:])
