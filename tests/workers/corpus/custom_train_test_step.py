"""keras.io's "Customizing what happens in fit() with TensorFlow": a subclassed
model with its own `train_step` and `test_step`, its own loss function, loss
tracker and MAE metric listed in `metrics`, shrunk, with offline data.

Fit with validation data (so `test_step` runs every epoch), then `evaluate`.
Adam, as the guide's `compile(optimizer="adam")`. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(22)
strategy = tfdist_ext.Strategy()


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            loss = self.loss_fn(y, y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply_gradients(zip(gradients, trainable_vars))
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.loss_fn(y, y_pred)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self):
        # Listed here so that `reset_states()` is called at the start of each epoch.
        return [self.loss_tracker, self.mae_metric]


rng = np.random.default_rng(22)
x = rng.random((330, 32)).astype("float32")
y = (x @ rng.normal(size=(32, 1)) / 4).astype("float32")

with strategy.scope():
    inputs = keras.Input(shape=(32,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(1)(hidden)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))

history = model.fit(x[:256], y[:256], epochs=3, batch_size=40,
                    validation_data=(x[256:], y[256:]), verbose=2)
evaluation = model.evaluate(x[256:], y[256:], batch_size=25, return_dict=True, verbose=0)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history, "evaluate": evaluation,
               "predict": model.predict(x[:16], verbose=0).ravel().tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
