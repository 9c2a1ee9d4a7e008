"""A script written for Keras' distribution API (only `keras` names plus `import tfdist_ext`).

    python keras_distribution_fit.py OUT_JSON [scope|global]

Trains an MLP and a small CNN with `keras.distribution.DataParallel` over
every device of the job and writes the per-epoch losses, the evaluation and
a weight checksum; each worker writes OUT_JSON with {worker} replaced by its
index. The same file runs on Keras' JAX backend (KERAS_BACKEND=jax,
JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo; bench/keras_distribution.py compares
the two): the initial weights come from numpy, not from the backend's random
ops, and 320 samples make 10 equal global batches of 32 (Keras' own split on
JAX needs equal batches).
"""

import json
import os
import sys

import keras
import numpy as np

import tfdist_ext  # noqa: F401  pylint: disable=unused-import


def data(n=320, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 1)).astype("float32")
    y = (x.reshape(n, -1)[:, :10].argmax(axis=1) % 4).astype("int32")
    return x, y


MODELS = {
    "mlp": lambda: keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                     keras.layers.Dense(32, activation="relu"),
                                     keras.layers.Dense(4)]),
    "cnn": lambda: keras.Sequential([keras.Input((8, 8, 1)),
                                     keras.layers.Conv2D(8, 3, activation="relu"),
                                     keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
                                     keras.layers.Dense(4)]),
}


def train(build, dataset):
    """Builds, compiles, fits and evaluates under whatever distribution is current."""
    model = build()
    rng = np.random.default_rng(7)
    model.set_weights([rng.normal(scale=0.2, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(dataset, epochs=3, verbose=0)
    return model, history, model.evaluate(dataset, verbose=0, return_dict=True)


def main(out, mode="scope"):
    keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    distribution = keras.distribution.DataParallel(devices=devices)
    if mode == "global":
        keras.distribution.set_distribution(distribution)
    x, y = data()
    # Keras' multi-process DataParallel takes tf.data, on JAX as on TensorFlow.
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    results = {"devices": devices, "processes": distribution.num_processes}
    for name, build in MODELS.items():
        keras.utils.set_random_seed(1)
        if mode == "scope":
            with distribution.scope():
                model, history, evaluation = train(build, dataset)
        else:
            model, history, evaluation = train(build, dataset)
        results[name] = {"loss": [float(v) for v in history.history["loss"]],
                         "evaluate": {k: float(v) for k, v in evaluation.items()},
                         "checksum": float(sum(np.abs(w).sum() for w in model.get_weights())),
                         "backend": keras.backend.backend()}
        if keras.backend.backend() == "tensorflow":
            results[name].update(strategy=type(model.distribute_strategy).__name__,
                                 replicas=model.distribute_strategy.num_replicas_in_sync)
    # Only to name the output file.
    index = os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID") or json.loads(
        os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
    with open(out.replace("{worker}", str(index)), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
