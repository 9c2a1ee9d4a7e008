"""The Keras guides' callbacks as users combine them: ModelCheckpoint keeping the
best model by validation loss (`save_best_only=True`), CSVLogger and TensorBoard,
every worker given the same paths as in a one-process script (tfdist_ext lets
only the chief write there). After `fit` every worker loads the best model with
`keras.models.load_model` and evaluates it. Adam. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np

keras.utils.set_random_seed(111)
strategy = tfdist_ext.Strategy()
out = sys.argv[1]

rng = np.random.default_rng(111)
x = rng.normal(size=(300, 10)).astype("float32")
y = (np.sin(x[:, 0] * 2) + x[:, 1] ** 2 > 0.5).astype("int64")
x_train, y_train, x_val, y_val = x[:220], y[:220], x[220:], y[220:]

with strategy.scope():
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

callbacks = [
    keras.callbacks.ModelCheckpoint(filepath=os.path.join(out, "best.keras"),
                                    save_best_only=True, monitor="val_loss", verbose=1),
    keras.callbacks.CSVLogger(os.path.join(out, "training.log")),
    keras.callbacks.TensorBoard(log_dir=os.path.join(out, "logs")),
]
history = model.fit(x_train, y_train, batch_size=32, epochs=4,
                    validation_data=(x_val, y_val), callbacks=callbacks, verbose=2)

best_model = keras.models.load_model(os.path.join(out, "best.keras"))
best_evaluation = best_model.evaluate(x_val, y_val, batch_size=32, verbose=0)

with open(os.path.join(out, f"w{strategy.worker_index}.json"), "w", encoding="utf-8") as f:
    json.dump({"history": history.history, "best_evaluate": best_evaluation,
               "best_predict": best_model.predict(x_val[:16], verbose=0).tolist()}, f)
