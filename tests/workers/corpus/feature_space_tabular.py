"""keras.io's "Structured data classification with FeatureSpace": a
`keras.utils.FeatureSpace` of numeric (normalized, discretized), integer and
string categorical features and a feature cross, adapted on the training set
BEFORE the strategy exists, the raw dataset mapped through it
(`num_parallel_calls`, prefetch), a small classifier on the encoded features,
and an end-to-end inference model on raw dict inputs. Offline heart-disease-like
records (imbalanced labels, so `fit` gets a `class_weight`). Adam, as there.
Writes OUT/w<index>.json.

This script creates its strategy after TensorFlow ran (the adapt): a driver runs
it first.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf
from keras.utils import FeatureSpace

keras.utils.set_random_seed(77)
rng = np.random.default_rng(77)
n = 300
records = {
    "age": rng.integers(29, 78, n).astype("float32"),
    "sex": rng.integers(0, 2, n).astype("int64"),
    "cp": rng.integers(0, 4, n).astype("int64"),
    "chol": rng.normal(245, 50, n).astype("float32"),
    "thalach": rng.normal(150, 22, n).astype("float32"),
    "thal": rng.choice(["normal", "fixed", "reversible"], n),
}
score = ((records["age"] - 50) / 10 + (records["cp"] == 3) + (records["thal"] == "fixed")
         - (records["thalach"] - 150) / 30 + 0.5 * rng.normal(size=n))
labels = (score > 1.8).astype("int64")
print(f"{labels.mean():.2f} of the samples are positive")

val_records = {k: v[240:] for k, v in records.items()}
train_records = {k: v[:240] for k, v in records.items()}
train_ds = tf.data.Dataset.from_tensor_slices((train_records, labels[:240])).batch(32)
val_ds = tf.data.Dataset.from_tensor_slices((val_records, labels[240:])).batch(32)

feature_space = FeatureSpace(
    features={
        "sex": FeatureSpace.integer_categorical(num_oov_indices=0),
        "cp": FeatureSpace.integer_categorical(num_oov_indices=0),
        "thal": FeatureSpace.string_categorical(num_oov_indices=0),
        "age": FeatureSpace.float_discretized(num_bins=8),
        "chol": FeatureSpace.float_normalized(),
        "thalach": FeatureSpace.float_normalized(),
    },
    crosses=[FeatureSpace.cross(feature_names=("sex", "age"), crossing_dim=32)],
    output_mode="concat",
)
train_ds_with_no_labels = train_ds.map(lambda x, _: x)
feature_space.adapt(train_ds_with_no_labels)

preprocessed_train_ds = train_ds.map(
    lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
).prefetch(tf.data.AUTOTUNE)
preprocessed_val_ds = val_ds.map(
    lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
).prefetch(tf.data.AUTOTUNE)

strategy = tfdist_ext.Strategy()
with strategy.scope():
    dict_inputs = feature_space.get_inputs()
    encoded_features = feature_space.get_encoded_features()
    x = keras.layers.Dense(16, activation="relu")(encoded_features)
    predictions = keras.layers.Dense(1, activation="sigmoid")(x)
    training_model = keras.Model(inputs=encoded_features, outputs=predictions)
    training_model.compile(optimizer=keras.optimizers.Adam(1e-2),
                           loss="binary_crossentropy", metrics=["accuracy"])
    inference_model = keras.Model(inputs=dict_inputs, outputs=predictions)

class_weight = {0: 1.0, 1: float((labels[:240] == 0).sum() / (labels[:240] == 1).sum())}
history = training_model.fit(preprocessed_train_ds, epochs=3,
                             validation_data=preprocessed_val_ds,
                             class_weight=class_weight, verbose=2)

sample = {k: tf.convert_to_tensor(v[:16]) for k, v in sorted(val_records.items())}
with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history, "class_weight": class_weight,
               "evaluate": training_model.evaluate(preprocessed_val_ds, verbose=0),
               "predict": training_model.predict(preprocessed_val_ds, verbose=0)[:16]
                          .ravel().tolist(),
               "inference": inference_model.predict(sample, verbose=0).ravel().tolist(),
               "weights": float(sum(np.sum(w) for w in training_model.get_weights()))}, f)
