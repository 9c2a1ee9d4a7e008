"""A user's script: callbacks that stop training from what their own worker sees.

    python stop_on_some_workers.py OUT_DIR

A time budget read from each worker's own clock decides on one worker before
the others; here the last worker's callback stops (1) at the end of epoch 1,
(2) after the 4th batch, and (3) every worker's callback stops after the 4th
batch, as TerminateOnNaN would. Each fit: SGD on 384 samples in batches of 16
(24 steps an epoch), 4 epochs. Writes OUT_DIR/w<index>.json with the epochs
and optimizer iterations of each fit and a weight digest.
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np

import tfdist_ext


class StopOn(keras.callbacks.Callback):
    """Sets `stop_training` on the chosen workers, at an epoch's end or after a batch."""

    def __init__(self, stops, epoch=None, batch=None):
        super().__init__()
        self.stops, self.epoch, self.batch = stops, epoch, batch

    def on_epoch_end(self, epoch, logs=None):
        if self.stops and epoch == self.epoch:
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        if self.stops and batch == self.batch:
            self.model.stop_training = True


def main(out_dir):
    strategy = tfdist_ext.Strategy()
    last = strategy.worker_index == strategy.num_workers - 1
    rng = np.random.default_rng(5)
    x = rng.normal(size=(384, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")
    results = {}
    for name, stop in (("epoch_end_on_one", StopOn(last, epoch=1)),
                       ("batch_on_one", StopOn(last, batch=3)),
                       ("batch_on_all", StopOn(True, batch=3))):
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                                      keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        history = model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                            callbacks=[stop])
        digest = hashlib.sha256(b"".join(np.asarray(w).tobytes()
                                         for w in model.get_weights())).hexdigest()
        results[name] = {"epochs": len(history.history["loss"]),
                         "iterations": int(model.optimizer.iterations.numpy()),
                         "sha": digest}
    with open(os.path.join(out_dir, f"w{strategy.worker_index}.json"), "w",
              encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
