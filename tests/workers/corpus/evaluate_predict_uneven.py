"""`evaluate` and `predict` as the Keras "Training & evaluation with the built-in
methods" guide calls them, on a held-out set of 101 samples with batch size 16:
101 divides neither by the batch nor by 2 or 3 workers, so the last batch (5
samples) leaves some replica with one sample or none. Arrays and a batched
`tf.data` dataset alike; predictions must come back all 101, in order.
Plain SGD, accuracy and AUC metrics. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(99)
strategy = tfdist_ext.Strategy()

rng = np.random.default_rng(99)
x_train = rng.normal(size=(256, 6)).astype("float32")
y_train = (x_train[:, 0] - x_train[:, 1] > 0).astype("float32")
x_test = rng.normal(size=(101, 6)).astype("float32")
y_test = (x_test[:, 0] - x_test[:, 1] > 0).astype("float32")

with strategy.scope():
    inputs = keras.Input(shape=(6,), name="digits")
    x = keras.layers.Dense(16, activation="relu", name="dense_1")(inputs)
    outputs = keras.layers.Dense(1, activation="sigmoid", name="predictions")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.BinaryCrossentropy(),
                  metrics=[keras.metrics.BinaryAccuracy(name="acc"),
                           keras.metrics.AUC(name="auc")])

print("Fit model on training data")
history = model.fit(x_train, y_train, batch_size=64, epochs=2, verbose=2)

print("Evaluate on test data")
results = model.evaluate(x_test, y_test, batch_size=16, verbose=2)
print("test loss, test acc, test auc:", results)
test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(16)
dataset_results = model.evaluate(test_dataset, return_dict=True, verbose=0)

print("Generate predictions for 101 samples")
predictions = model.predict(x_test, batch_size=16, verbose=0)
dataset_predictions = model.predict(test_dataset, verbose=0)
print("predictions shape:", predictions.shape)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history, "evaluate": results,
               "evaluate_dataset": dataset_results,
               "predict": predictions.ravel().tolist(),
               "predict_dataset": dataset_predictions.ravel().tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
