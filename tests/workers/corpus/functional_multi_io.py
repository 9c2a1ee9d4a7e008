"""keras.io's "The Functional API" guide, "Models with multiple inputs and outputs":
a ticket ranker with two inputs (title words, tags) and two outputs, shrunk and
with offline data.

As there: named inputs and outputs, a dict of losses with `loss_weights`, dicts of
data to `fit`; here the priority is a regression (MSE) and the department a
classification, and only the priority output has sample weights other than 1. RMSprop,
as the guide uses. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(11)
strategy = tfdist_ext.Strategy()

num_tags = 12
num_words = 500
num_departments = 4

rng = np.random.default_rng(11)
title_data = rng.integers(0, num_words, size=(300, 10))
tags_data = rng.integers(0, 2, size=(300, num_tags)).astype("float32")
priority_targets = (tags_data[:, :4].mean(axis=1, keepdims=True)
                    + 0.01 * (title_data[:, :1] % 7)).astype("float32")
dept_targets = (tags_data[:, 4:8] @ np.arange(4) % num_departments).astype("int64")
priority_weights = np.where(tags_data[:, 0] > 0, 2.0, 0.5).astype("float32")

with strategy.scope():
    title_input = keras.Input(shape=(None,), name="title")
    tags_input = keras.Input(shape=(num_tags,), name="tags")
    title_features = layers.Embedding(num_words, 16)(title_input)
    title_features = layers.LSTM(16)(title_features)
    x = layers.concatenate([title_features, tags_input])
    priority_pred = layers.Dense(1, name="priority")(x)
    department_pred = layers.Dense(num_departments, name="department")(x)
    model = keras.Model(inputs=[title_input, tags_input],
                        outputs={"priority": priority_pred, "department": department_pred})
    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss={"priority": keras.losses.MeanSquaredError(),
              "department": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        loss_weights={"priority": 1.0, "department": 0.2},
        metrics={"priority": ["mae"], "department": ["accuracy"]})

history = model.fit(
    {"title": title_data[:240], "tags": tags_data[:240]},
    {"priority": priority_targets[:240], "department": dept_targets[:240]},
    # Keras wants one array per output: the department's weights are all 1.
    sample_weight={"priority": priority_weights[:240], "department": np.ones(240, "float32")},
    epochs=2, batch_size=32, verbose=2)
evaluation = model.evaluate(
    {"title": title_data[240:], "tags": tags_data[240:]},
    {"priority": priority_targets[240:], "department": dept_targets[240:]},
    batch_size=32, return_dict=True, verbose=0)
predictions = model.predict({"title": title_data[240:256], "tags": tags_data[240:256]},
                            verbose=0)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history, "evaluate": evaluation,
               "priority": predictions["priority"].ravel().tolist(),
               "department": predictions["department"].tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
