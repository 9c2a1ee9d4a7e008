"""keras.io's "Text classification from scratch" baseline shape, a bag of
embeddings (Embedding(5000, 32), GlobalAveragePooling1D, Dense), trained with
momentum SGD (sparse embedding gradients), then again with learning-rate
schedules as the Keras optimizers guide writes them: SGD with
`keras.optimizers.schedules.ExponentialDecay` and Adam with `CosineDecay`.
Offline integer sequences. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(144)
strategy = tfdist_ext.Strategy()

max_features = 5000
sequence_length = 24
rng = np.random.default_rng(144)
x = np.where(rng.random((320, sequence_length)) < 0.7,
             rng.integers(1, 100, size=(320, sequence_length)),
             rng.integers(1, max_features, size=(320, sequence_length)))
y = ((x < 20).sum(axis=1) > 3).astype("int64")
x_train, y_train, x_val, y_val = x[:256], y[:256], x[256:], y[256:]


def build(optimizer):
    model = keras.Sequential([
        keras.Input(shape=(sequence_length,), dtype="int64"),
        layers.Embedding(max_features, 32),
        layers.GlobalAveragePooling1D(),
        layers.Dense(16, activation="relu"),
        layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(loss="binary_crossentropy", optimizer=optimizer, metrics=["accuracy"])
    return model


def learning_rate(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


results = {}
with strategy.scope():
    momentum = build(keras.optimizers.SGD(learning_rate=0.2, momentum=0.9))
    exponential = build(keras.optimizers.SGD(
        learning_rate=keras.optimizers.schedules.ExponentialDecay(
            initial_learning_rate=1.0, decay_steps=4, decay_rate=0.5)))
    cosine = build(keras.optimizers.Adam(
        learning_rate=keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=1e-2, decay_steps=20, alpha=0.1)))
for name, model in (("momentum", momentum), ("exponential", exponential),
                    ("cosine", cosine)):
    history = model.fit(x_train, y_train, batch_size=32, epochs=2,
                        validation_data=(x_val, y_val), verbose=2)
    results[name] = {"history": history.history,
                     "iterations": int(model.optimizer.iterations.numpy()),
                     "learning_rate": learning_rate(model.optimizer),
                     "predict": model.predict(x_val[:16], verbose=0).ravel().tolist(),
                     "embedding_sum": float(np.sum(model.layers[0].get_weights()[0])),
                     "weights": float(sum(np.sum(w) for w in model.get_weights()))}

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump(results, f)
