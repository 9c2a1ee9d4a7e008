"""Keras 3 `model.fit` under Ray Train's TensorflowTrainer with tfdist_ext.Strategy.

    pip install "ray[train]>=2.60,<2.61"
    python examples/ray_train.py --workers 2 --epochs 10

Ray starts the workers and writes each one's TF_CONFIG; `tfdist_ext.Strategy()`
reads it as on any cluster (`import tfdist_ext` also removes the
TF_USE_LEGACY_KERAS=1 that Ray sets, so `tf.keras` stays Keras 3). Metrics and
checkpoints go to Ray through its own Keras callback, `ReportCheckpointCallback`.
On a running cluster pass `--address auto` (or the head's address).
"""

import argparse
import pathlib
import sys

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

EXAMPLES = pathlib.Path(__file__).resolve().parent


def train_loop_per_worker(config):
    import keras  # pylint: disable=import-outside-toplevel
    from ray.train.tensorflow.keras import (  # pylint: disable=import-outside-toplevel
        ReportCheckpointCallback)

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    sys.path.insert(0, config["examples"])
    from keras_fit import build_model, load_mnist1d  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(sync=config["sync"])
    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = load_mnist1d()
    with strategy.scope():
        model = build_model(keras, "cnn")
        model.compile(optimizer=keras.optimizers.Adam(3e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=128, epochs=config["epochs"], verbose=0,
              validation_data=(x_test, y_test), callbacks=[ReportCheckpointCallback()])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--sync", default="sync", help="a tfdist_ext sync policy name")
    parser.add_argument("--address", default=None, help="a running Ray cluster (or 'auto')")
    parser.add_argument("--storage", default=str(pathlib.Path.cwd() / "ray_results"))
    args = parser.parse_args(argv)
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.workers, include_dashboard=False)
    trainer = TensorflowTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": args.epochs, "sync": args.sync,
                           "examples": str(EXAMPLES)},
        scaling_config=ScalingConfig(num_workers=args.workers,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=args.storage, name="mnist1d"))
    result = trainer.fit()
    print(f"final metrics: {result.metrics}\ncheckpoint: {result.checkpoint}")
    ray.shutdown()
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
