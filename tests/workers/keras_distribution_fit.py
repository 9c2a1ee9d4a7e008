"""A script written for Keras' distribution API (only `keras` names plus `import tfdist_ext`).

    python keras_distribution_fit.py OUT_JSON [scope|global|local|local-filtered]

Trains an MLP and a small CNN with `keras.distribution.DataParallel` over
every device of the job and writes the per-epoch losses, the evaluation and
a weight checksum; each worker writes OUT_JSON with {worker} replaced by its
index. The same file runs on Keras' JAX backend (KERAS_BACKEND=jax,
JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo; bench/keras_distribution.py compares
the two): the initial weights come from numpy, not from the backend's random
ops, and 320 samples make 10 equal global batches of 32 (Keras' own split on
JAX needs equal batches). `local` makes the distribution with
`auto_shard_dataset=False` and gives each worker its own dataset: its
contiguous part of every global batch of 32 out of 331 samples (the last
global batch, 11 samples, splits 5 + 6 at two workers), so its losses equal
one process's on the global batches. `local-filtered` does the same through
a `filter`, so TF cannot know the dataset's length (an error).
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


def own_part(x, y, index, count, batch=32):
    """This process's contiguous part of each global batch of `batch` samples."""
    rows = [row for start in range(0, len(x), batch)
            for size in [min(batch, len(x) - start)]
            for row in range(start + size * index // count, start + size * (index + 1) // count)]
    return x[rows], y[rows]


def process_index():
    return int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID") or json.loads(
        os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"])


def main(out, mode="scope"):
    keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    distribution = keras.distribution.DataParallel(devices=devices,
                                                   auto_shard_dataset=not mode.startswith("local"))
    if mode == "global":
        keras.distribution.set_distribution(distribution)
    # Keras' multi-process DataParallel takes tf.data, on JAX as on TensorFlow.
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if mode.startswith("local"):
        processes = distribution.num_processes
        x, y = own_part(*data(331), process_index(), processes)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        if mode == "local-filtered":
            dataset = dataset.filter(lambda *_: True)
        dataset = dataset.batch(32 // processes)
    else:
        dataset = tf.data.Dataset.from_tensor_slices(data()).batch(32)
    results = {"devices": devices, "processes": distribution.num_processes}
    for name, build in MODELS.items():
        keras.utils.set_random_seed(1)
        if mode != "global":
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
    with open(out.replace("{worker}", str(process_index())), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
