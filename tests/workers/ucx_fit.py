"""Worker program for tests/collectives/test_ucx_failures.py: a long UCX-engine fit.

    python ucx_fit.py EPOCHS

Prints "epoch N done" after each epoch (flushed), so the test knows the
collectives are running before it stops a worker.
"""

import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext


class Progress(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch {epoch} done", flush=True)


def main(epochs):
    strategy = tfdist_ext.Strategy(engine="ucx")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=int(epochs),
              verbose=0, callbacks=[Progress()])


if __name__ == "__main__":
    main(*sys.argv[1:])
