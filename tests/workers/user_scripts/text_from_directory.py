"""keras.io's "Text classification from scratch", unchanged but for the strategy,
the data (a small movie-review directory made offline, 1,001 test files) and
the sizes.

As there: `text_dataset_from_directory` with the default (unseeded) shuffle
for the test set, a TextVectorization layer adapted before the strategy,
`.cache().prefetch()` on every split, `fit` with validation data, then
`evaluate` on the vectorized test set and on the raw strings through an
end-to-end model. Writes OUT/w<index>.json and OUT/w<index>.weights.h5.

`python text_from_directory.py OUT --evaluate WEIGHTS` instead builds the same
data and model in one process without a strategy, loads WEIGHTS and writes
both evaluations to OUT/one.json (the one-process answer).
"""

import json
import os
import re
import string
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf
from keras import layers

OUT = sys.argv[1]
ONE_PROCESS = len(sys.argv) > 3 and sys.argv[2] == "--evaluate"
WORDS = {"pos": ["good", "great", "fine", "nice", "superb"],
         "neg": ["bad", "awful", "poor", "ugly", "dull"]}
FILLER = ["the", "plot", "film", "actor", "scene", "movie", "was", "and", "a", "<br />"]


def write_reviews(root):
    rng = np.random.default_rng(0)
    for split, count in (("train", 600), ("test", 1001)):
        for label, words in WORDS.items():
            folder = os.path.join(root, split, label)
            os.makedirs(folder, exist_ok=True)
            for i in range(count // 2 + (label == "pos" and count % 2)):
                tokens = list(rng.choice(FILLER, 30)) + list(rng.choice(words, 4))
                rng.shuffle(tokens)
                with open(os.path.join(folder, f"{i}.txt"), "w", encoding="utf-8") as f:
                    f.write(" ".join(tokens))


strategy = None if ONE_PROCESS else tfdist_ext.Strategy()
index = 0 if ONE_PROCESS else strategy.worker_index
root = os.path.join(OUT, "one" if ONE_PROCESS else f"data{index}")
write_reviews(root)

batch_size = 32
raw_train_ds = keras.utils.text_dataset_from_directory(
    os.path.join(root, "train"), batch_size=batch_size, validation_split=0.2,
    subset="training", seed=1337)
raw_val_ds = keras.utils.text_dataset_from_directory(
    os.path.join(root, "train"), batch_size=batch_size, validation_split=0.2,
    subset="validation", seed=1337)
raw_test_ds = keras.utils.text_dataset_from_directory(
    os.path.join(root, "test"), batch_size=batch_size)


def custom_standardization(input_data):
    lowercase = tf.strings.lower(input_data)
    stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
    return tf.strings.regex_replace(stripped_html, f"[{re.escape(string.punctuation)}]", "")


max_features, embedding_dim, sequence_length = 200, 16, 40
vectorize_layer = keras.layers.TextVectorization(
    standardize=custom_standardization, max_tokens=max_features, output_mode="int",
    output_sequence_length=sequence_length)
vectorize_layer.adapt(raw_train_ds.map(lambda x, y: x))


def vectorize_text(text, label):
    text = tf.expand_dims(text, -1)
    return vectorize_layer(text), label


train_ds = raw_train_ds.map(vectorize_text).cache().prefetch(buffer_size=10)
val_ds = raw_val_ds.map(vectorize_text).cache().prefetch(buffer_size=10)
test_ds = raw_test_ds.map(vectorize_text).cache().prefetch(buffer_size=10)


def build():
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = layers.Embedding(max_features, embedding_dim)(inputs)
    x = layers.Dropout(0.5)(x)
    x = layers.Conv1D(16, 7, padding="valid", activation="relu", strides=3)(x)
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dense(16, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)
    model = keras.Model(inputs, predictions)
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


def end_to_end(model):
    inputs = keras.Input(shape=(1,), dtype="string")
    outputs = model(vectorize_layer(inputs))
    e2e = keras.Model(inputs, outputs)
    e2e.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return e2e


if ONE_PROCESS:
    model = build()
    model.load_weights(sys.argv[3])
    with open(os.path.join(OUT, "one.json"), "w", encoding="utf-8") as f:
        json.dump({"evaluate": model.evaluate(test_ds, verbose=0),
                   "end_to_end": end_to_end(model).evaluate(raw_test_ds, verbose=0)}, f)
    sys.exit(0)

with strategy.scope():
    model = build()
history = model.fit(train_ds, validation_data=val_ds, epochs=3, verbose=2)
evaluation = model.evaluate(test_ds, verbose=2)
with strategy.scope():
    e2e = end_to_end(model)
e2e_evaluation = e2e.evaluate(raw_test_ds, verbose=2)
model.save_weights(os.path.join(OUT, f"w{index}.weights.h5"))
with open(os.path.join(OUT, f"w{index}.json"), "w", encoding="utf-8") as f:
    json.dump({"history": history.history, "evaluate": evaluation,
               "end_to_end": e2e_evaluation,
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
