"""TF's "tf.data: Build TensorFlow input pipelines" guide, "Consuming Python
generators": `tf.data.Dataset.from_generator` with an `output_signature`,
`.repeat()` so the generator restarts, `steps_per_epoch` and
`validation_steps` in `fit` (its dataset's length is unknown to TF). A small
regression MLP on offline data, plain SGD. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(88)
strategy = tfdist_ext.Strategy()

rng = np.random.default_rng(88)
x_all = rng.normal(size=(300, 8)).astype("float32")
w_true = rng.normal(size=(8,)).astype("float32")
y_all = (np.tanh(x_all @ w_true) + 0.05 * rng.normal(size=300)).astype("float32")


def gen(start, stop):
    def samples():
        for i in range(start, stop):
            yield x_all[i], y_all[i]
    return samples


signature = (tf.TensorSpec(shape=(8,), dtype=tf.float32),
             tf.TensorSpec(shape=(), dtype=tf.float32))
train_ds = tf.data.Dataset.from_generator(gen(0, 200), output_signature=signature)
train_ds = train_ds.repeat().batch(30)
val_ds = tf.data.Dataset.from_generator(gen(200, 300), output_signature=signature)
val_ds = val_ds.batch(30).repeat()

with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                  metrics=[keras.metrics.MeanAbsoluteError(name="mae")])
history = model.fit(train_ds, epochs=3, steps_per_epoch=5, validation_data=val_ds,
                    validation_steps=3, verbose=2)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history,
               "iterations": int(model.optimizer.iterations.numpy()),
               "evaluate": model.evaluate(val_ds, steps=3, verbose=0),
               "predict": model.predict(x_all[200:216], verbose=0).ravel().tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
