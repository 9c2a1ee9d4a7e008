"""Worker (and parameter-server) program for tests/ps/test_async_workers.py.

    tfdist-run -np N --ps M python async_checks.py OUT_DIR MODE

The same program runs on the "ps" tasks, where `Strategy(sync="async")`
serves and exits. Modes:

* ``train``: three sessions (strategies) in one process: (1) unbounded
  async SGD with the optimizer's own momentum (no compensation) and worker
  N-1 sleeping before every step (about 3x slower), validation data and a
  ModelCheckpoint; (2) the same with ``staleness_bound = N - 1`` and the
  default momentum compensation; (3) the model and optimizer restored from
  session 1's checkpoint (`keras.models.load_model`), trained one step per
  worker at learning rate 0: the restored momentum alone moves the weights. Writes per session
  the weights' digest, stats, losses, weights, momentum slots and the
  evaluation loss to OUT_DIR/w<index>.json.
  A fourth session trains a BatchNormalization model (each worker on rows of
  its own scale) and records its moving mean and digest.
* ``shaped``: one async session of 8 steps (under the network test bed);
  writes the "ps" addresses, this worker's address, the median step time and
  the stats to OUT_DIR/w<index>.json.
* ``kill_server``: the "ps" task writes its pid to OUT_DIR/ps.pid; worker 0
  kills it with SIGKILL at step 3 of a long fit.
"""

import hashlib
import json
import os
import pathlib
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext

STEPS, EPOCHS = 12, 2


def config():
    raw = json.loads(os.environ["TF_CONFIG"])
    return raw["task"]["type"], raw["task"]["index"], len(raw["cluster"]["worker"])


class Sleep(keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_begin(self, batch, logs=None):
        time.sleep(self.seconds)


def data(num_workers):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(960, 8)).astype("float32")
    y = (np.tanh(x @ rng.normal(size=(8, 1)))).astype("float32")
    return (tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8 * num_workers),
            tf.data.Dataset.from_tensor_slices((x[:96], y[:96])).batch(16))


def build(learning_rate):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.5), loss="mse")
    return model


def digest(model):
    return hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()


def slots(model):
    return [v.numpy().tolist() for v in model.optimizer.variables if "momentum" in v.path]


def session(policy, index, num_workers, out, steps=STEPS, epochs=EPOCHS, restore=None,
            checkpoint=None):
    strategy = tfdist_ext.Strategy(sync=policy)
    train, validation = data(num_workers)
    with strategy.scope():
        model = keras.models.load_model(restore) if restore else build(0.05)
    if restore:  # only the restored momentum moves the weights now
        model.optimizer.learning_rate.assign(0.0)
    restored = {"weights": [w.tolist() for w in model.get_weights()], "slots": slots(model)}
    callbacks = [Sleep(0.06)] if index == num_workers - 1 else [Sleep(0.0)]
    if checkpoint and index == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint))
    history = model.fit(train, epochs=epochs, steps_per_epoch=steps, verbose=0,
                        validation_data=validation if checkpoint else None,
                        callbacks=callbacks)
    return {"sha": digest(model), "stats": strategy.communication_stats(),
            "loss": [float(v) for v in history.history["loss"]],
            "val_loss": [float(v) for v in history.history.get("val_loss", [])],
            "evaluate": float(model.evaluate(validation, verbose=0)),
            "weights": [w.tolist() for w in model.get_weights()], "slots": slots(model),
            "restored": restored if restore else None}


class StepTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds, self._start = [], None

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.monotonic() - self._start)


def shaped(index, num_workers, out):
    strategy = tfdist_ext.Strategy(sync="async")
    train, _ = data(num_workers)
    with strategy.scope():
        model = build(0.05)
    times = StepTimes()
    model.fit(train, epochs=1, steps_per_epoch=8, verbose=0, callbacks=[times])
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    (out / f"w{index}.json").write_text(json.dumps({
        "ps": cluster["ps"], "address": cluster["worker"][index].split(":")[0],
        "step_seconds": float(np.median(times.seconds[2:])),
        "stats": strategy.communication_stats()}))


def batchnorm(index, num_workers):
    """Async fit of a model with BatchNormalization; each worker sees other rows."""
    strategy = tfdist_ext.Strategy(sync="async")
    rng = np.random.default_rng(index)
    x = (rng.normal(size=(96, 8)) * (1 + index)).astype("float32")
    train = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(8 * num_workers)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.BatchNormalization(),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(train, epochs=1, steps_per_epoch=4, verbose=0)
    return {"moving_mean": model.layers[0].moving_mean.numpy().tolist(), "sha": digest(model)}


def main():
    out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
    task, index, num_workers = config()
    if task == "ps":
        (out / f"ps{index}.pid").write_text(str(os.getpid()))
    if mode == "kill_server":
        strategy = tfdist_ext.Strategy(sync="async")
        train, _ = data(num_workers)
        with strategy.scope():
            model = build(0.01)

        class Kill(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if index == 0 and batch == 3:
                    os.kill(int((out / "ps0.pid").read_text()), signal.SIGKILL)

        model.fit(train, epochs=1, steps_per_epoch=10_000, verbose=0, callbacks=[Kill()])
        return
    if mode == "shaped":
        shaped(index, num_workers, out)
        return
    checkpoint = str(out / "session1.keras")
    own_momentum = {"name": "async", "momentum_compensation": False}
    results = [session(own_momentum, index, num_workers, out, checkpoint=checkpoint),
               session({"name": "async", "staleness_bound": num_workers - 1}, index,
                       num_workers, out),
               session(own_momentum, index, num_workers, out, steps=1, epochs=1,
                       restore=checkpoint),
               batchnorm(index, num_workers)]
    (out / f"w{index}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
