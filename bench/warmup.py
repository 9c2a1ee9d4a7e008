"""Large-batch training with the linear scaling rule, with and without warm-up.

    python bench/warmup.py --replicas 4 --seeds 0,1,2 --json docs/results/warmup.json

Trains the example's mnist1d 1-D CNN (SGD, momentum 0.9) with Keras `fit` under
`tfdist_ext.Strategy(num_replicas=R)` (R logical CPU replicas, synchronous),
in four configurations that differ only in batch size and learning rate:

* `base`: the recipe, global batch `--base-batch` at `--base-lr`.
* `large`: global batch k times larger, same learning rate.
* `large_scaled`: k times larger batch, k times the rate
  (`tfdist_ext.keras.linear_scaling`), from the first step.
* `large_scaled_warmup`: the same, reached over `--warmup-epochs` with
  `tfdist_ext.keras.LearningRateWarmup(factor=k)` (Goyal et al. 2017).

Records test accuracy and training loss after every epoch, per seed; prints
min / median final accuracy per configuration and writes JSON and a PNG of the
median curves.
"""

import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
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
    from examples.keras_fit import build_model  # pylint: disable=import-outside-toplevel

    x_train, y_train, x_test, y_test = data
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = build_model(keras)
        model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    callbacks = [tfdist_ext.keras.LearningRateWarmup(args.warmup_epochs, factor=args.k)] \
        if warmup else []
    history = model.fit(x_train, y_train, batch_size=batch, epochs=args.epochs, verbose=0,
                        validation_data=(x_test, y_test), callbacks=callbacks).history
    loss = [float(v) if np.isfinite(v) else None for v in history["loss"]]
    return {"test_accuracy": [float(v) for v in history["val_accuracy"]], "loss": loss}


def plot(summary, curves, path, args):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        batch, lr = summary[name]["batch"], summary[name]["lr"]
        ax.plot(range(1, len(curve) + 1), curve, label=f"{name} (batch {batch}, lr {lr:g})")
    if args.warmup_epochs:
        ax.axvline(args.warmup_epochs, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (median over seeds)")
    ax.set_title(f"mnist1d, SGD momentum 0.9, {args.replicas} replicas, k={args.k}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    from tfdist_ext import cluster  # pylint: disable=import-outside-toplevel
    cluster.local_devices(args.replicas)
    import tfdist_ext  # pylint: disable=import-outside-toplevel
    from examples.keras_fit import load_mnist1d  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(num_replicas=args.replicas)
    data = load_mnist1d()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs, summary, curves = [], {}, {}
    chosen = args.configs.split(",")
    for name, (batch, lr, warmup) in configs(args).items():
        if name not in chosen:
            continue
        finals, per_seed = [], []
        for seed in seeds:
            result = run(strategy, data, batch, lr, warmup, seed, args)
            runs.append({"config": name, "seed": seed, "batch": batch, "lr": lr,
                         "warmup_epochs": args.warmup_epochs if warmup else 0, **result})
            finals.append(result["test_accuracy"][-1])
            per_seed.append(result["test_accuracy"])
            print(f"{name:20s} seed {seed}: final test accuracy {finals[-1]:.3f}", flush=True)
        curves[name] = np.median(np.array(per_seed), axis=0).tolist()
        summary[name] = {"batch": batch, "lr": lr, "min": min(finals),
                         "median": float(np.median(finals)), "max": max(finals)}
    print(f"\n{'config':20s} {'batch':>6s} {'lr':>6s} {'min':>6s} {'median':>7s} {'max':>6s}")
    for name, row in summary.items():
        print(f"{name:20s} {row['batch']:6d} {row['lr']:6.3g} {row['min']:6.3f} "
              f"{row['median']:7.3f} {row['max']:6.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"args": vars(args), "summary": summary, "runs": runs}, indent=1))
    if args.png:
        plot(summary, curves, args.png, args)


if __name__ == "__main__":
    main()
