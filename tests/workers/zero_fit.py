"""Worker program for tests/zero/test_zero_workers.py: ZeRO stage 1 across processes.

    tfdist-run -np N python zero_fit.py OUT_DIR STAGE

For momentum SGD, Adam, AdamW (in buckets of at most 150 elements: several
collectives per step), momentum SGD clipped by the global norm and Adam
accumulating 3 steps: `fit` (10 epochs of 600 samples, global
batch 64: 100 steps, each epoch's last batch partial) under
`Strategy(zero_stage=STAGE)`; then an embedding model with positions from the
input's dynamic length (keras.io's Transformer embedding) and SGD. Worker 0 then
trains the same models from the same seeds in plain Keras on the global batches
(the one-process answer; the others have exited by then, so it runs alone). Writes
OUT_DIR/w<index>.json: per optimizer the loss curve, the weights' hash and this
worker's optimizer-state bytes; worker 0's also the one-process loss curves, the
largest relative difference of its weights from one process's and the unsharded
state's bytes.
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np

import tfdist_ext
from tfdist_ext import zero
from tfdist_ext.zero import blocks

BUCKET_ELEMENTS = blocks.BUCKET_ELEMENTS

OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    # Clipped by the norm of the summed gradient, which every worker has whole.
    "sgd_global_clipnorm": lambda: keras.optimizers.SGD(0.05, momentum=0.9,
                                                        global_clipnorm=0.3),
    "adam_accumulate": lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=3),
}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 20)).astype("float32")
    y = (x[:, :4].sum(1) > 0).astype("int64") + (x[:, 4] > 0) + (x[:, 5] > 0)
    return x, y


def model_and_fit(optimizer, x, y):
    keras.utils.set_random_seed(1)
    # 829 weights: a block of each weight per worker (415 elements at 2 workers, 277 at 3).
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(33, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=64, epochs=10, shuffle=False, verbose=0)
    return model, history.history["loss"]


class TokenAndPosition(keras.layers.Layer):
    """keras.io's Transformer embedding: positions from the input's dynamic length."""

    def __init__(self, length, vocabulary, width):
        super().__init__()
        self.token = keras.layers.Embedding(vocabulary, width)
        self.position = keras.layers.Embedding(length, width)

    def call(self, x):
        positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
        return self.token(x) + self.position(positions)


def embedding_fit(tokens, labels):
    """3 epochs of an embedding model with SGD (sparse and dense updates agree)."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((10,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(TokenAndPosition(10, 50, 8)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(pooled))
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model.fit(tokens, labels, batch_size=32, epochs=3, shuffle=False,
                     verbose=0).history["loss"]


def main(out_dir, stage):
    strategy = tfdist_ext.Strategy(zero_stage=stage)
    x, y = data()
    record, models = {}, {}
    for name, make in OPTIMIZERS.items():
        # AdamW's collectives go in buckets of at most 150 elements: 3 buckets, the last
        # with two weights (the others: one bucket for the whole model).
        blocks.BUCKET_ELEMENTS = 150 if name == "adamw" else BUCKET_ELEMENTS
        with strategy.scope():
            optimizer = make()
            models[name], losses = model_and_fit(optimizer, x, y)
        blocks.BUCKET_ELEMENTS = BUCKET_ELEMENTS
        record[name] = {
            "losses": losses,
            "sha": hashlib.sha256(b"".join(np.asarray(w).tobytes()
                                           for w in models[name].get_weights())).hexdigest(),
            "state_bytes": zero.state_bytes(optimizer),
        }
    tokens = np.random.default_rng(1).integers(0, 50, size=(96, 10))
    labels = (tokens[:, 0] % 2).astype("int64")
    with strategy.scope():
        record["embedding"] = embedding_fit(tokens, labels)
    if strategy.cluster.task_index == 0:
        for name, make in OPTIMIZERS.items():
            plain_optimizer = make()
            plain_model, plain = model_and_fit(plain_optimizer, x, y)
            record[name]["one_process"] = plain
            record[name]["weights_off"] = max(
                float(np.max(np.abs(a - b) / (np.abs(b) + 1e-3)))
                for a, b in zip(models[name].get_weights(), plain_model.get_weights()))
            # The sharded state: Adam's accumulators stay whole on every worker.
            record[name]["unsharded_state_bytes"] = zero.slot_bytes(plain_optimizer) - sum(
                np.asarray(v).nbytes for v in plain_optimizer.variables
                if v.name.endswith("gradient_accumulator"))
        record["embedding_one_process"] = embedding_fit(tokens, labels)
    with open(os.path.join(out_dir, f"w{strategy.cluster.task_index}.json"), "w",
              encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
