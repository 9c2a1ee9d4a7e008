"""Worker program for tests/elastic/test_elastic_fits.py: a script of two fits, as users
write them (a head trained on a frozen base, then the whole model at a lower learning
rate in a second `fit`), under `tfdist-run --elastic`.

    python elastic_two_fits.py OUT_DIR KILL_FIT KILL_STEP [evaluate-first]

Worker 1 SIGKILLs itself before training step KILL_STEP of fit KILL_FIT (1 or 2). While
the job is short of a worker the members sleep 1 s after each step (at most 120 s),
leaving its replacement time to join, or to be refused: a replacement that exits writes
OUT_DIR/replacement_exit.txt, and the members then go on at full speed. Each worker that
ends writes OUT_DIR/w{index}.json: a hash of its weights, its members, the joins and
failures it saw, and both fits' losses. With "evaluate-first", every worker evaluates
the untrained model before the first fit (a baseline).
"""

import hashlib
import json
import os
import sys
import time

import keras
import numpy as np

import tfdist_ext

out_dir, kill_fit, kill_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(7)
strategy = tfdist_ext.Strategy()
rng = np.random.default_rng(7)
x = rng.normal(size=(1536, 16)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64") + (x[:, 4] > 0.5).astype("int64")


class WhileShort(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        waited = getattr(self, "waited", 0)
        if (len(strategy.elastic.members) < 3 and waited < 120
                and not os.path.exists(os.path.join(out_dir, "replacement_exit.txt"))):
            time.sleep(1.0)
            self.waited = waited + 1


def callbacks(fit):
    kill = [tfdist_ext.elastic.KillAt(1, kill_step)] if fit == kill_fit else []
    return kill + [WhileShort()]


with strategy.scope():
    base = keras.layers.Dense(32, activation="relu")
    model = keras.Sequential([keras.Input((16,)), base, keras.layers.Dense(3)])
    base.trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
try:
    if sys.argv[4:] == ["evaluate-first"]:
        model.evaluate(x, y, batch_size=64, verbose=0)
    head = model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=callbacks(1))
    with strategy.scope():
        base.trainable = True
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    whole = model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=callbacks(2))
except SystemExit:
    if strategy.elastic.replacement:
        with open(os.path.join(out_dir, "replacement_exit.txt"), "w", encoding="utf-8") as f:
            f.write(str(time.time()))
    raise

weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
    json.dump({"sha": hashlib.sha256(weights).hexdigest(),
               "members": list(strategy.elastic.members), "joins": strategy.elastic.joins,
               "failures": strategy.elastic.failures, "head_loss": head.history["loss"],
               "loss": whole.history["loss"],
               "iterations": int(model.optimizer.iterations.numpy())}, f)
