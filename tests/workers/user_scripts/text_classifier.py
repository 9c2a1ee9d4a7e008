"""keras-io's text_classification_from_scratch, shrunk, with offline data.

As there: the TextVectorization layer is adapted (TensorFlow runs) before the
strategy exists, and vectorizes inside the tf.data pipeline. Writes the
worker's loss, weight sum and vocabulary to OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext  # first: it readies TensorFlow for the job in TF_CONFIG
import keras
import numpy as np
import tensorflow as tf

WORDS = ["good", "bad", "great", "awful", "fine", "poor", "nice", "ugly", "plot", "film"]
rng = np.random.default_rng(0)
texts = np.array([" ".join(rng.choice(WORDS, 8)) for _ in range(384)])
labels = np.array([sum(t.split().count(w) for w in ("good", "great", "fine", "nice")) > 3
                   for t in texts], dtype="int64")
raw_train_ds = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(48)

vectorize_layer = keras.layers.TextVectorization(max_tokens=40, output_mode="int",
                                                 output_sequence_length=8)
vectorize_layer.adapt(raw_train_ds.map(lambda x, y: x))


def vectorize_text(text, label):
    return vectorize_layer(tf.expand_dims(text, -1)), label


train_ds = raw_train_ds.map(vectorize_text)

strategy = tfdist_ext.Strategy()
with strategy.scope():
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = keras.layers.Embedding(40, 8)(inputs)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Conv1D(8, 3, padding="valid", activation="relu")(x)
    x = keras.layers.GlobalMaxPooling1D()(x)
    predictions = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, predictions)
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
history = model.fit(train_ds, epochs=2, verbose=2)
# The adapted layer (made before the strategy) still works on new text.
scores = model.predict(vectorize_layer(texts[:4]), verbose=0)
index = strategy.worker_index
with open(os.path.join(sys.argv[1], f"w{index}.json"), "w", encoding="utf-8") as f:
    json.dump({"loss": history.history["loss"],
               "weights": float(sum(np.sum(w) for w in model.get_weights())),
               "vocabulary": [str(v) for v in vectorize_layer.get_vocabulary()],
               "scores": scores.ravel().tolist()}, f)
