"""A small CNN with Keras' mixed precision and gradient accumulation, as users write it.

`keras.mixed_precision.set_global_policy("mixed_bfloat16")` with
`AdamW(..., gradient_accumulation_steps=4)` (decoupled weight decay), and the
same model in float32 with momentum SGD accumulating 3 steps and clipping by
global norm. Writes OUT/w<index>.json (OUT/one.json without TF_CONFIG and with
`--no-strategy`: Keras alone).
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np

OUT = sys.argv[1]
PLAIN = "--no-strategy" in sys.argv
rng = np.random.default_rng(0)
x = rng.normal(size=(250, 12, 12, 1)).astype("float32")  # 250: a partial last batch
y = (x.mean(axis=(1, 2, 3)) > 0).astype("int64")


def train(policy, optimizer):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(1)
    strategy = None if PLAIN else tfdist_ext.Strategy()
    scope = strategy.scope() if strategy else keras.name_scope("plain")
    with scope:
        model = keras.Sequential([
            keras.Input((12, 12, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2),
            keras.layers.Activation("softmax", dtype="float32")])
        model.compile(optimizer=optimizer(), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
    keras.mixed_precision.set_global_policy("float32")
    return {"loss": history.history["loss"], "accuracy": history.history["accuracy"],
            "iterations": int(model.optimizer.iterations.numpy()),
            "weights": [w.tolist() for w in model.get_weights()]}


results = {
    "bf16_adamw": train("mixed_bfloat16", lambda: keras.optimizers.AdamW(
        1e-2, weight_decay=0.01, gradient_accumulation_steps=4)),
    "f32_sgd": train("float32", lambda: keras.optimizers.SGD(
        0.05, momentum=0.9, global_clipnorm=1.0, gradient_accumulation_steps=3)),
}
name = "one.json" if PLAIN else f"w{tfdist_ext.cluster.cluster_from_env().task_index}.json"
with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
    json.dump(results, f)
