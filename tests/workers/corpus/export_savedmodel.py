"""Keras 3's saving guide: `model.save("model.keras")` and
`keras.models.load_model`, and `model.export(path)` (a TF SavedModel for
inference) reloaded with `tf.saved_model.load` (its `serve` endpoint) and with
`keras.layers.TFSMLayer`. Files as TF's multi-worker tutorial writes them:
the chief into OUT, the other workers into a temporary directory; every
worker then loads the chief's .keras file. Adam. Writes OUT/w<index>.json.
"""

import json
import os
import shutil
import sys
import tempfile

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(122)
strategy = tfdist_ext.Strategy()
out = sys.argv[1]
is_chief = strategy.worker_index == 0
write_dir = out if is_chief else tempfile.mkdtemp(prefix=f"worker{strategy.worker_index}_")

rng = np.random.default_rng(122)
x = rng.normal(size=(200, 12)).astype("float32")
y = (x[:, :6].sum(axis=1) > 0).astype("int64")

with strategy.scope():
    inputs = keras.Input(shape=(12,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.LayerNormalization()(hidden)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=40, epochs=2, verbose=2)
expected = model.predict(x[:16], verbose=0)

export_path = os.path.join(write_dir, "exported")
model.export(export_path)
reloaded_artifact = tf.saved_model.load(export_path)
served = reloaded_artifact.serve(tf.constant(x[:16])).numpy()
tfsm_layer = keras.layers.TFSMLayer(export_path, call_endpoint="serving_default")
layer_output = tfsm_layer(tf.constant(x[:16]))
layer_output = np.asarray(next(iter(layer_output.values())) if isinstance(layer_output, dict)
                          else layer_output)

model.save(os.path.join(write_dir, "model.keras"))
if not is_chief:
    shutil.rmtree(write_dir)
reconstructed_model = keras.models.load_model(os.path.join(out, "model.keras"))
reconstructed = reconstructed_model.predict(x[:16], verbose=0)
reconstructed_evaluation = reconstructed_model.evaluate(x, y, batch_size=40, verbose=0)

with open(os.path.join(out, f"w{strategy.worker_index}.json"), "w", encoding="utf-8") as f:
    json.dump({"history": history.history, "predict": expected.tolist(),
               "served": served.tolist(), "tfsm_layer": layer_output.tolist(),
               "reconstructed": reconstructed.tolist(),
               "evaluate": model.evaluate(x, y, batch_size=40, verbose=0),
               "reconstructed_evaluate": reconstructed_evaluation}, f)
