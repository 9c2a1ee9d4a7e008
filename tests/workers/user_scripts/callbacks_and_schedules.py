"""A user's script: Keras' stopping and learning-rate callbacks, a PyDataset, resumed fits.

    python callbacks_and_schedules.py OUT_DIR

Written the way the Keras guides write them: EarlyStopping with
restore_best_weights, ReduceLROnPlateau and a LearningRateScheduler on
validation loss evaluated every second epoch (validation_freq=2), a second
fit that continues from initial_epoch, train_on_batch / test_on_batch, and a
keras.utils.PyDataset as the training input. Writes OUT_DIR/w<index>.json
with the epochs each fit ran, the learning rates, the losses and a weight
digest: every worker must end with the same ones.
"""

import hashlib
import json
import math
import os
import sys

import keras
import numpy as np

import tfdist_ext


class Batches(keras.utils.PyDataset):
    """Fixed synthetic batches, as a user's own data loader would serve them."""

    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return math.ceil(len(self.x) / self.batch_size)

    def __getitem__(self, index):
        part = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[part], self.y[part]


def main(out_dir):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 10)).astype("float32")
    y = (x[:, :3].sum(axis=1) + 0.5 * rng.normal(size=600) > 0).astype("int64")
    x_val, y_val = x[480:], y[480:]
    x, y = x[:480], y[:480]

    strategy = tfdist_ext.Strategy()
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    rates = []
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1,
                                         restore_best_weights=True)
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                                                min_delta=1e-3)
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: rates.append(
            float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))))
    first = model.fit(x, y, batch_size=32, epochs=30, validation_data=(x_val, y_val),
                      validation_freq=2, callbacks=[stop, plateau, record], verbose=0)
    stopped = len(first.history["loss"])

    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.01 / (1 + epoch))
    second = model.fit(Batches(x, y, 48), initial_epoch=stopped, epochs=stopped + 2,
                       callbacks=[schedule, record], verbose=0)
    on_batch = [float(model.train_on_batch(x[:64], y[:64])[0]) for _ in range(2)]
    tested = model.test_on_batch(x_val, y_val)
    weights = b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
    index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump({"first_epochs": stopped, "second_epochs": second.epoch,
                   "first_loss": first.history["loss"],
                   "val_loss": first.history.get("val_loss"),
                   "second_loss": second.history["loss"], "rates": rates,
                   "train_on_batch": on_batch, "test_on_batch": [float(v) for v in tested],
                   "sha": hashlib.sha256(weights).hexdigest()}, f)
    print(f"worker {index}: stopped after {stopped} epochs, learning rates {rates}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
