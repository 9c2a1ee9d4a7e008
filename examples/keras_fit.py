"""Train a small 1-D CNN on mnist1d with Keras `model.fit` under tfdist_ext.Strategy.

Runs alone (one process; `--num-replicas N` for N logical-CPU replicas) or as N
workers:

    python examples/keras_fit.py
    tfdist-run -np 2 python examples/keras_fit.py --allreduce native

mnist1d (Greydanus 2020) is generated locally by its package: 4000 training and
1000 test sequences of 40 values, 10 classes. Prints the test accuracy; with
`--json` also writes it with the loss history and a weight checksum.
"""

import argparse
import hashlib
import json
import os
import time

import numpy as np


def load_mnist1d(seed=42):
    """(x_train, y_train, x_test, y_test) as float32 / int32 arrays."""
    from mnist1d.data import get_dataset_args, make_dataset  # pylint: disable=import-outside-toplevel

    args = get_dataset_args()
    args.seed = seed
    data = make_dataset(args)
    return (data["x"].astype("float32"), data["y"].astype("int32"),
            data["x_test"].astype("float32"), data["y_test"].astype("int32"))


def build_model(keras, name="cnn"):
    """The model called `name`, not compiled.

    "cnn": a 1-D CNN for 40-sample signals, ~26k parameters (0.1 MB of
    float32 gradients). "mlp": Dense 40-1024-1024-10 with ReLU, ~1.1M
    parameters (4.4 MB of gradients), for communication-bound runs (it
    plateaus near 0.61). "widecnn": the CNN with 64/128/128 channels and a
    512-unit head, ~0.74M parameters (2.9 MB of gradients), which keeps
    learning for tens of epochs.
    """
    if name == "widecnn":
        return _cnn(keras, (64, 128, 128), 512)
    if name == "mlp":
        return keras.Sequential([keras.Input((40,)),
                                 keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(10)])
    return _cnn(keras, (32, 32, 32), 64)


def _cnn(keras, channels, head):
    """Three 1-D convolutions (`channels`; the last two with stride 2), a `head`-unit layer."""
    return keras.Sequential([
        keras.Input((40,)),
        keras.layers.Reshape((40, 1)),
        keras.layers.Conv1D(channels[0], 5, padding="same", activation="relu"),
        keras.layers.Conv1D(channels[1], 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv1D(channels[2], 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(head, activation="relu"),
        keras.layers.Dense(10),
    ])


def _option(text):
    """A strategy option from the command line: a name or a JSON dict."""
    return json.loads(text) if text and text.lstrip().startswith("{") else text


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp", "widecnn"],
                        help="cnn (~26k parameters, default), mlp (~1.1M parameters) or "
                             "widecnn (~0.74M parameters)")
    parser.add_argument("--batch-size", type=int, default=128,
                        help="global batch size, split across replicas (default 128)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"],
                        help="adam, or SGD with --momentum (lr x10)")
    parser.add_argument("--schedule", default="constant", choices=["constant", "cosine"],
                        help="learning rate: constant, or cosine decay to 0 over the run")
    parser.add_argument("--momentum", type=float, default=0.9,
                        help="SGD momentum; 0 with DGC momentum correction "
                             '(--compression \'{"name": "topk", "momentum": 0.9}\')')
    parser.add_argument("--engine", default="auto", choices=["auto", "ucx", "tf"],
                        help="what carries the bytes: UCX where built ('auto'), or TF's ops")
    parser.add_argument("--allreduce", default=None,
                        help="a name or a JSON dict, e.g. '{\"name\": \"auto\"}' "
                             "(default: the engine's, ring on UCX, TF's native ring on tf)")
    parser.add_argument("--compression", default="none")
    parser.add_argument("--sync", default="sync")
    parser.add_argument("--bucketing", default=None)
    parser.add_argument("--num-replicas", type=int, default=None,
                        help="local replicas when run without TF_CONFIG")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None,
                        help="write results here ({worker} is replaced by the index)")
    parser.add_argument("--verbose", type=int, default=2, help="Keras fit verbosity")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import keras  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(allreduce=_option(args.allreduce),
                                   compression=_option(args.compression),
                                   sync=_option(args.sync), bucketing=_option(args.bucketing),
                                   num_replicas=args.num_replicas, engine=args.engine)
    worker = strategy.cluster.task_index if strategy.cluster else 0
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = load_mnist1d()
    with strategy.scope():
        model = build_model(keras, args.model)
        lr = args.lr if args.optimizer == "adam" else 10 * args.lr
        if args.schedule == "cosine":
            steps = args.epochs * -(-len(x_train) // args.batch_size)
            lr = keras.optimizers.schedules.CosineDecay(lr, decay_steps=steps)
        optimizer = (keras.optimizers.Adam(lr) if args.optimizer == "adam"
                     else keras.optimizers.SGD(lr, momentum=args.momentum))
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    start = time.perf_counter()
    history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
                        shuffle=True, verbose=args.verbose if worker == 0 else 0)
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    stats = strategy.communication_stats()
    print(f"worker {worker}: test accuracy {accuracy:.4f} after {args.epochs} epochs "
          f"in {seconds:.1f} s on {strategy.num_replicas_in_sync} replica(s) "
          f"(engine {strategy.config.engine}); sent "
          f"{stats['bytes_sent'] / 1e6:.2f} MB of gradients ({stats['compression_ratio']:.1f}x "
          "fewer than dense)", flush=True)
    if args.json:
        path = args.json.replace("{worker}", str(worker))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"worker": worker, "test_accuracy": float(accuracy),
                       "fit_seconds": seconds, "loss": history.history["loss"],
                       "replicas": strategy.num_replicas_in_sync,
                       "engine": strategy.config.engine,
                       "communication": stats,
                       "allreduce_refinements": strategy.allreduce_refinements,
                       "weights_sum": float(weights.astype("float64").sum()),
                       "weights_sha": hashlib.sha256(weights.tobytes()).hexdigest()},
                      f, indent=1)
    return accuracy


if __name__ == "__main__":
    main()
