"""Large-batch training with the linear scaling rule, with and without warm-up.

    python bench/warmup.py --replicas 4 --seeds 0,1,2 --json docs/results/warmup.json

    # the result in docs/results.md: a deep plain ReLU MLP, k = 16
    python bench/warmup.py --model mlp --depth 8 --width 256 --train-samples 20000 \
        --replicas 4 --seeds 0,1,2 --epochs 20 --base-batch 32 --base-lr 0.02 --k 16 \
        --warmup-epochs 5 --json docs/results/warmup_mlp.json --png docs/results/warmup_mlp.png

Trains a model on mnist1d (SGD, momentum 0.9) with Keras `fit` under
`tfdist_ext.Strategy(num_replicas=R)` (R logical CPU replicas, synchronous):
`--model cnn` (default) the example's 1-D CNN, `mlp` a `--depth` x `--width`
plain ReLU MLP (He init, no normalization), `resnet` a 1-D ResNet with batch
normalization. `--train-samples` generates more mnist1d data locally (default:
the example's 4000). Four configurations differ only in batch size and
learning rate:

* `base`: the recipe, global batch `--base-batch` at `--base-lr`.
* `large`: global batch k times larger, same learning rate.
* `large_scaled`: k times larger batch, k times the rate
  (`tfdist_ext.keras.linear_scaling`), from the first step.
* `large_scaled_warmup`: the same, reached over `--warmup-epochs` with
  `tfdist_ext.keras.LearningRateWarmup(factor=k)` (Goyal et al. 2017).

Records test accuracy and training loss after every epoch, per seed; prints
min / median / max final accuracy, the median loss after epoch 1 and how many
runs ended with a NaN loss per configuration, and writes JSON and a PNG of the
median curves.
"""

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  pylint: disable=wrong-import-position


def build_cnn(keras, args):  # pylint: disable=unused-argument
    from examples.keras_fit import build_model  # pylint: disable=import-outside-toplevel
    return build_model(keras)


def build_mlp(keras, args):
    """`--depth` ReLU layers of `--width` units, He-normal init, no normalization."""
    layers = [keras.Input((40,))]
    for _ in range(args.depth):
        layers.append(keras.layers.Dense(args.width, activation="relu",
                                         kernel_initializer="he_normal"))
    layers.append(keras.layers.Dense(10))
    return keras.Sequential(layers)


def build_resnet(keras, args):
    """A 1-D ResNet: stem, `--depth` basic blocks (conv-BN-ReLU-conv-BN + identity)."""
    inputs = keras.Input((40,))
    x = keras.layers.Reshape((40, 1))(inputs)
    x = keras.layers.Conv1D(args.width, 5, padding="same", use_bias=False,
                            kernel_initializer="he_normal")(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for _ in range(args.depth):
        y = keras.layers.Conv1D(args.width, 3, padding="same", use_bias=False,
                                kernel_initializer="he_normal")(x)
        y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
        y = keras.layers.Conv1D(args.width, 3, padding="same", use_bias=False,
                                kernel_initializer="he_normal")(y)
        y = keras.layers.BatchNormalization()(y)
        x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


MODELS = {"cnn": build_cnn, "mlp": build_mlp, "resnet": build_resnet}


def load_data(train_samples):
    """mnist1d with `train_samples` training sequences (4000: the example's data)."""
    from examples.keras_fit import load_mnist1d  # pylint: disable=import-outside-toplevel
    if train_samples == 4000:
        return load_mnist1d()
    from mnist1d.data import get_dataset_args, make_dataset  # pylint: disable=import-outside-toplevel
    data_args = get_dataset_args()
    data_args.seed = 42
    data_args.num_samples = train_samples * 5 // 4
    data = make_dataset(data_args)
    return (data["x"].astype("float32"), data["y"].astype("int32"),
            data["x_test"].astype("float32"), data["y_test"].astype("int32"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--base-batch", type=int, default=64)
    parser.add_argument("--base-lr", type=float, default=0.05)
    parser.add_argument("--k", type=int, default=16, help="batch growth factor")
    parser.add_argument("--warmup-epochs", type=float, default=5)
    parser.add_argument("--configs", default="base,large,large_scaled,large_scaled_warmup")
    parser.add_argument("--model", default="cnn", choices=sorted(MODELS),
                        help="cnn: the example's 1-D CNN; mlp: a deep plain ReLU MLP "
                             "(He init, no normalization, --depth x --width); resnet: a 1-D "
                             "ResNet with batch normalization")
    parser.add_argument("--depth", type=int, default=8, help="hidden layers / residual blocks")
    parser.add_argument("--width", type=int, default=256, help="units / channels")
    parser.add_argument("--train-samples", type=int, default=4000,
                        help="mnist1d training sequences (generated locally; the test set "
                             "is a quarter as many)")
    parser.add_argument("--verbose", type=int, default=0, help="Keras fit verbosity")
    harness.add_arguments(parser)
    return parser.parse_args(argv)


def configs(args):
    from tfdist_ext.keras import linear_scaling  # pylint: disable=import-outside-toplevel
    large = args.base_batch * args.k
    scaled = linear_scaling(args.base_lr, large, args.base_batch)
    return {
        "base": (args.base_batch, args.base_lr, False),
        "large": (large, args.base_lr, False),
        "large_scaled": (large, scaled, False),
        "large_scaled_warmup": (large, scaled, True),
    }


def run(strategy, data, batch, lr, warmup, seed, args):
    import keras  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    x_train, y_train, x_test, y_test = data
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = MODELS[args.model](keras, args)
        model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    callbacks = [tfdist_ext.keras.LearningRateWarmup(args.warmup_epochs, factor=args.k)] \
        if warmup else []
    start = time.perf_counter()
    history = model.fit(x_train, y_train, batch_size=batch, epochs=args.epochs,
                        verbose=args.verbose, validation_data=(x_test, y_test),
                        callbacks=callbacks).history
    seconds = time.perf_counter() - start
    loss = [float(v) if np.isfinite(v) else None for v in history["loss"]]
    return {"test_accuracy": [float(v) for v in history["val_accuracy"]], "loss": loss,
            "fit_seconds": seconds}


MODEL_TITLES = {"cnn": "1-D CNN", "mlp": "plain ReLU MLP {depth}x{width}",
                "resnet": "1-D ResNet (BN) {depth} blocks x {width}"}


def plot(summary, curves, path, args):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (accuracy, loss) in curves.items():
        batch, lr = summary[name]["batch"], summary[name]["lr"]
        epochs = range(1, len(accuracy) + 1)
        line, = acc_ax.plot(epochs, accuracy, label=f"{name} (batch {batch}, lr {lr:g})")
        diverged = summary[name]["diverged"]
        loss_ax.plot(epochs, loss, color=line.get_color(), label=name + (
            f" (loss NaN in {diverged} of {summary[name]['runs']} runs)" if diverged else ""))
    for ax in (acc_ax, loss_ax):
        if args.warmup_epochs and "large_scaled_warmup" in curves:
            ax.axvline(args.warmup_epochs, color="gray", lw=0.8, ls=":")
        ax.set_xlabel("epoch")
    acc_ax.set_ylabel("test accuracy (median over seeds)")
    acc_ax.legend(fontsize=8)
    loss_ax.set_ylabel("training loss (median over seeds)")
    loss_ax.set_yscale("log")
    loss_ax.legend(fontsize=8)
    model = MODEL_TITLES[args.model].format(depth=args.depth, width=args.width)
    fig.suptitle(f"mnist1d ({args.train_samples} train), {model}, SGD momentum 0.9, "
                 f"{args.replicas} replicas, k={args.k}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _stats(values):
    finite = [v for v in values if v is not None]
    if not finite:
        return {"min": None, "median": None, "max": None}
    return {"min": min(finite), "median": float(np.median(finite)), "max": max(finite)}


def _fmt(value, width=6):
    return f"{'nan':>{width}s}" if value is None else f"{value:{width}.4g}"


def main(argv=None):
    args = parse_args(argv)
    from tfdist_ext import cluster  # pylint: disable=import-outside-toplevel
    cluster.local_devices(args.replicas)
    import tfdist_ext  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(num_replicas=args.replicas)
    data = load_data(args.train_samples)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs, summary, curves = [], {}, {}
    chosen = args.configs.split(",")
    for name, (batch, lr, warmup) in configs(args).items():
        if name not in chosen:
            continue
        finals, first_losses, per_seed, per_seed_loss, diverged = [], [], [], [], 0
        for seed in seeds:
            result = run(strategy, data, batch, lr, warmup, seed, args)
            runs.append({"config": name, "seed": seed, "batch": batch, "lr": lr,
                         "warmup_epochs": args.warmup_epochs if warmup else 0, **result})
            finals.append(result["test_accuracy"][-1])
            first_losses.append(result["loss"][0])
            diverged += result["loss"][-1] is None
            per_seed.append(result["test_accuracy"])
            per_seed_loss.append([np.nan if v is None else v for v in result["loss"]])
            print(f"{name:20s} seed {seed}: final test accuracy {finals[-1]:.3f}, "
                  f"loss after epoch 1 {_fmt(first_losses[-1], 0)}, "
                  f"{result['fit_seconds']:.0f} s", flush=True)
        # Median curves; a seed whose loss is NaN makes that epoch's loss median NaN.
        curves[name] = (np.median(np.array(per_seed), axis=0).tolist(),
                        np.median(np.array(per_seed_loss), axis=0).tolist())
        loss1 = _stats(first_losses)
        summary[name] = {"batch": batch, "lr": lr, "min": min(finals),
                         "median": float(np.median(finals)), "max": max(finals),
                         "loss_epoch1_min": loss1["min"], "loss_epoch1_median": loss1["median"],
                         "loss_epoch1_max": loss1["max"], "diverged": diverged,
                         "runs": len(seeds)}
    print(f"\n{'config':20s} {'batch':>6s} {'lr':>6s} {'min':>6s} {'median':>7s} {'max':>6s}"
          f"  {'loss ep1 (median)':>17s}  diverged")
    for name, row in summary.items():
        print(f"{name:20s} {row['batch']:6d} {row['lr']:6.3g} {row['min']:6.3f} "
              f"{row['median']:7.3f} {row['max']:6.3f}  {_fmt(row['loss_epoch1_median'], 17)}"
              f"  {row['diverged']}/{row['runs']}")
    harness.write({"args": vars(args), "summary": summary, "runs": runs}, args.json, args.png,
                  plot=lambda path: plot(summary, curves, path, args))


if __name__ == "__main__":
    main()
