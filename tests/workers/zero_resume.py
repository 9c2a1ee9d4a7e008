"""Worker program for tests/zero/test_zero_workers.py: a ZeRO checkpoint at other counts.

    tfdist-run -np 4 python zero_resume.py save OUT_DIR
    tfdist-run -np 2 python zero_resume.py resume OUT_DIR
    python zero_resume.py plain OUT_DIR

`save`: for Adam and momentum SGD, `fit` 2 epochs (600 samples, global batch
64) under `Strategy(zero_stage=2)` with `ModelCheckpoint(save_weights_only=True)`
and `BackupAndRestore`, then go on one more epoch (the losses of each step
of it: "continued"), and from the checkpoint in a fresh model ("resumed").
`resume` (`zero_stage=1`): the fresh model from the checkpoint at this worker count, and one
that `BackupAndRestore` resumes at epoch 3 (from OUT_DIR/<name>-backup-<mode>,
a copy of the backup `save` wrote). `plain`: the same in plain Keras,
no strategy (one process). Every mode writes
OUT_DIR/<mode>-w<index>.json with the per-step losses of the epoch after the
checkpoint and the weights' hash after it.
"""

import contextlib
import json
import os
import sys

import keras
import numpy as np

import tfdist_ext

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
}


class StepLosses(keras.callbacks.Callback):
    """Each step's running loss, as Keras logs it."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 20)).astype("float32")
    y = (x[:, :4].sum(1) > 0).astype("int64") + (x[:, 4] > 0) + (x[:, 5] > 0)
    return x, y


def fresh(make):
    keras.utils.set_random_seed(1)
    # 829 weights: uneven shards at 4 and 2 workers.
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(33, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=make(),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    return model


def next_epoch(model, x, y):
    steps = StepLosses()
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[steps])
    return {"losses": steps.losses, "weights": [float(np.sum(np.abs(w)))
                                                for w in model.get_weights()]}


def main(mode, out_dir):
    x, y = data()
    stage = 2 if mode == "save" else 1
    strategy = None if mode == "plain" else tfdist_ext.Strategy(zero_stage=stage)
    record = {}
    for name, make in OPTIMIZERS.items():
        path = os.path.join(out_dir, f"{name}.weights.h5")
        with strategy.scope() if strategy else contextlib.nullcontext():
            if mode == "save":
                model = fresh(make)
                model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0,
                          callbacks=[keras.callbacks.ModelCheckpoint(path,
                                                                     save_weights_only=True),
                                     keras.callbacks.BackupAndRestore(
                                         os.path.join(out_dir, f"{name}-backup"),
                                         delete_checkpoint=False)])
                record[f"{name}/continued"] = next_epoch(model, x, y)
            model = fresh(make)
            model.load_weights(path)
            record[f"{name}/resumed"] = next_epoch(model, x, y)
            if mode != "save":
                # BackupAndRestore restores the epoch-2 backup and runs epoch 3 only.
                model, steps = fresh(make), StepLosses()
                model.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0,
                          callbacks=[steps, keras.callbacks.BackupAndRestore(
                              os.path.join(out_dir, f"{name}-backup-{mode}"))])
                record[f"{name}/backup"] = {"losses": steps.losses}
    index = strategy.worker_index if strategy else 0
    with open(os.path.join(out_dir, f"{mode}-w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
