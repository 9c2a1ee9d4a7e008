"""TF's "Load and preprocess images" tutorial's `configure_for_performance`:
`.cache()`, `.shuffle(1000, seed=...)`, `.batch(32)`, `.prefetch(AUTOTUNE)` on a
`from_tensor_slices` dataset (offline data), trained with momentum SGD; then
another model fit on the arrays with `validation_split=0.2` (Keras' own
shuffle of the training part), Adam. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(133)
strategy = tfdist_ext.Strategy()
AUTOTUNE = tf.data.AUTOTUNE
batch_size = 32

rng = np.random.default_rng(133)
features = rng.normal(size=(320, 20)).astype("float32")
targets = (features[:, :5] @ rng.normal(size=5) > 0).astype("int64") + \
    (features[:, 5] > 1).astype("int64")


def configure_for_performance(ds):
    ds = ds.cache()
    ds = ds.shuffle(buffer_size=1000, seed=1)
    ds = ds.batch(batch_size)
    ds = ds.prefetch(buffer_size=AUTOTUNE)
    return ds


train_ds = configure_for_performance(
    tf.data.Dataset.from_tensor_slices((features[:256], targets[:256])))
val_ds = tf.data.Dataset.from_tensor_slices((features[256:], targets[256:])).batch(
    batch_size).cache().prefetch(AUTOTUNE)


def build(optimizer):
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(24, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


with strategy.scope():
    model = build(keras.optimizers.SGD(0.05, momentum=0.9))
history = model.fit(train_ds, validation_data=val_ds, epochs=3, verbose=2)

with strategy.scope():
    split_model = build(keras.optimizers.Adam(1e-2))
split_history = split_model.fit(features, targets, batch_size=32, epochs=2,
                                validation_split=0.2, verbose=2)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history, "split_history": split_history.history,
               "evaluate": model.evaluate(val_ds, verbose=0),
               "predict": model.predict(features[:16], verbose=0).tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights())),
               "split_weights": float(sum(np.sum(w) for w in split_model.get_weights()))},
              f)
