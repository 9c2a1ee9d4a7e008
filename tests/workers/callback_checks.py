"""Worker program for tests/keras/test_worker_callbacks.py (run under tfdist-run).

    python callback_checks.py OUT_DIR files
    python callback_checks.py OUT_DIR resume|preempt [CRASH_EPOCH] [OPTIONS_JSON]

`files`: a 1-epoch fit with a CSVLogger alone (OUT_DIR/alone/log.csv), then a
3-epoch fit with Keras' ModelCheckpoint, TensorBoard, CSVLogger, BackupAndRestore
and tfdist_ext's CommunicationStats writing under OUT_DIR, as a user would write them.
`resume`: a 4-epoch fit with BackupAndRestore(OUT_DIR/backup); with
CRASH_EPOCH, worker 1 kills itself (SIGKILL) in the middle of that epoch (in
the first attempt only, when `tfdist-run --max-restarts` starts it again);
`preempt` sends SIGTERM instead.
OPTIONS_JSON: `tfdist_ext.Strategy` options. Both write the final weights
and losses to OUT_DIR/w<index>.json.
"""

import json
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext


class KillAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch, sig=signal.SIGKILL):
        super().__init__()
        self.epoch, self.batch, self.current, self.signal = epoch, batch, -1, sig

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch and batch == self.batch:
            os.kill(os.getpid(), self.signal)


def main(out_dir, mode, crash_epoch=None, options="{}"):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tfdist_ext.Strategy(**json.loads(options))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(250, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(250, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(20)
    if mode == "files":
        # A CSVLogger alone, in a folder of its own: no other callback makes the folders
        # of a worker's private copy for it.
        os.makedirs(os.path.join(out_dir, "alone"), exist_ok=True)
        model.fit(data, epochs=1, verbose=0,
                  callbacks=[keras.callbacks.CSVLogger(os.path.join(out_dir, "alone", "log.csv"))])
        callbacks = [
            keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "ckpt-{epoch}.keras")),
            keras.callbacks.TensorBoard(os.path.join(out_dir, "logs")),
            keras.callbacks.CSVLogger(os.path.join(out_dir, "log.csv")),
            keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")),
            tfdist_ext.keras.CommunicationStats(os.path.join(out_dir, "logs", "comm")),
        ]
        epochs = 3
    else:
        callbacks = [keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup"))]
        first_attempt = os.environ.get("TFDIST_RESTART", "0") == "0"
        if crash_epoch is not None and int(crash_epoch) >= 0 and index == 1 and first_attempt:
            sig = signal.SIGTERM if mode == "preempt" else signal.SIGKILL
            callbacks.append(KillAt(int(crash_epoch), 5, sig))
        epochs = 4
    history = model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks).history
    result = {"loss": history["loss"], "weights": [w.tolist() for w in model.get_weights()],
              "optimizer_iterations": int(model.optimizer.iterations.numpy())}
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
