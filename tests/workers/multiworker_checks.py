"""Worker program for tests/test_multiworker.py (run under tfdist-run, srun or Ray Train).

    python multiworker_checks.py OUT_DIR tfdist|stock|resolver:PORT|ray

Exercises the two Keras 3.15 multi-worker `fit` bugs (keras-team/keras#20585)
directly and through `fit`, and writes what happened to OUT_DIR/w<index>.json.
With `stock` the strategy is TF's MultiWorkerMirroredStrategy, and each failure
is recorded instead of raised. With `resolver:PORT` (under srun) the strategy takes its
cluster from TF's SlurmClusterResolver with ports from PORT. With `ray` (called as
`main` by tests/workers/ray_train.py in a Ray Train worker) `fit` also reports metrics and
checkpoints through Ray's own Keras callback.
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

import tfdist_ext


def attempt(results, name, fn):
    try:
        results[name] = {"ok": True, "value": fn()}
    except Exception as err:  # pylint: disable=broad-except
        results[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}


def main(out_dir, mode):
    if mode == "stock":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif mode.startswith("resolver:"):  # TF's Slurm resolver, its ports from PORT
        strategy = tfdist_ext.Strategy(
            cluster_resolver=tf.distribute.cluster_resolver.SlurmClusterResolver(
                port_base=int(mode.split(":")[1]), gpus_per_node=8, gpus_per_task=1,
                auto_set_gpu=False))  # on CPU: TF divides by gpus_per_task
        mode = "tfdist"
    else:
        strategy = tfdist_ext.Strategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    results = {"mode": mode, "workers": strategy.num_replicas_in_sync,
               "tf_config": json.loads(os.environ["TF_CONFIG"]),
               "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
               "tf_keras_is_keras_3": tf.keras.layers.Dense is keras.layers.Dense,
               "heartbeat_ms": getattr(context.context().coordination_service,
                                       "heartbeat_timeout_in_ms", None)}
    callbacks = []
    if mode == "ray":
        from ray.train.tensorflow.keras import (  # pylint: disable=import-outside-toplevel
            ReportCheckpointCallback)
        callbacks.append(ReportCheckpointCallback())

    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(24)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))

    # Part 1 of the bug: reduce over a nest of per-replica values (Keras'
    # _maybe_symbolic_build does exactly this with the first batch).
    attempt(results, "reduce_nest",
            lambda: [t.shape.as_list() for t in strategy.reduce("MEAN", batch, axis=None)])
    # Part 2: reduce a per-replica scalar over axis 0 (Keras' reduce_per_replica).
    scalar = strategy.run(tf.function(lambda: tf.cast(
        tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)))
    attempt(results, "reduce_scalar_axis0",
            lambda: float(strategy.reduce("MEAN", scalar, axis=0)))

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")

    def fit():
        history = model.fit(dataset, epochs=4, verbose=0, callbacks=callbacks)
        weights = np.concatenate([w.ravel() for w in model.get_weights()])
        return {"loss": history.history["loss"],
                "sha": hashlib.sha256(weights.tobytes()).hexdigest()}

    attempt(results, "fit", fit)
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
