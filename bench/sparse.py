"""Embedding gradients: all-gathered on the UCX engine, by TF, or dense, per `fit` step.

    python bench/sparse.py --workers 2 --json docs/results/sparse_w2.json \
        --png docs/results/sparse_w2.png

A text classifier (Embedding(VOCAB, DIM) over sequences of `--seq` token ids,
global average pooling, Dense(64, relu), Dense(2)), Adam 1e-3 (or `--optimizer
sgd`: SGD 1e-2), `--batch` samples
per worker, random data: its `fit` step time on `--workers` workers under
`tfdist-run` with the strategy's defaults (IndexedSlices all-gathered on the UCX
engine), with `engine="tf"` (TF's all-gather of rows), with
`Strategy(sparse_as_dense=True)` (reduced dense on the UCX engine); the same
function with a dense layer of the same size in the embedding's place
(CategoryEncoding counts / seq -> Dense(DIM, no bias): a dense VOCAB x DIM
gradient, the comparison issue 48 sets); the model with the embedding frozen
(`trainable=False`: no embedding gradient at all, the floor); plain Keras in one
process beside them, the embedding model and the dense-layer one (what Keras'
own handling of the sparse gradient costs without any communication). Each of `--rounds` rounds launches every configuration once
(the machine drifts); per launch, the chief's median over `--steps` steps after
`--warmup`. Reported: min and median over rounds, and ratios to the dense layer
and to the frozen row.
"""

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # pylint: disable=wrong-import-position
from bench._relaunch import forward, relaunch, step_clock  # pylint: disable=wrong-import-position

CONFIGS = ("ucx_all_gather", "tf_all_gather", "sparse_as_dense", "dense_layer",
           "frozen_embedding", "keras_one_process", "dense_layer_one_process")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32, help="samples per worker")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                        help="Adam 1e-3 or plain SGD 1e-2")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated, from {CONFIGS}; the ratios need "
                             f"dense_layer and frozen_embedding")
    harness.add_arguments(parser)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # CONFIG
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def work(args):
    """One configuration's fit; the chief writes OUT (its median step seconds)."""
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel
    alone = args.worker.endswith("one_process")
    strategy = None if alone else tfdist_ext.Strategy(
        sparse_as_dense=args.worker == "sparse_as_dense",
        engine="tf" if args.worker == "tf_all_gather" else None)
    workers = 1 if alone else strategy.num_workers
    rng = np.random.default_rng(0)
    n = args.batch * workers * (args.warmup + args.steps)
    x = rng.integers(0, args.vocab, size=(n, args.seq)).astype("int32")
    y = rng.integers(0, 2, size=n).astype("int32")
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        if args.worker.startswith("dense_layer"):  # the same function, a dense gradient
            pooled = [keras.layers.CategoryEncoding(args.vocab, output_mode="count"),
                      keras.layers.Rescaling(1 / args.seq),
                      keras.layers.Dense(args.dim, use_bias=False)]
        else:
            pooled = [keras.layers.Embedding(args.vocab, args.dim,
                                             trainable=args.worker != "frozen_embedding"),
                      keras.layers.GlobalAveragePooling1D()]
        model = keras.Sequential([keras.Input((args.seq,), dtype="int32"), *pooled,
                                  keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(2)])
        optimizer = (keras.optimizers.Adam(1e-3) if args.optimizer == "adam"
                     else keras.optimizers.SGD(1e-2))
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    clock = step_clock(keras)
    model.fit(x, y, batch_size=args.batch * workers, epochs=1, shuffle=False, verbose=0,
              callbacks=[clock])
    steps = np.diff(clock.times)[args.warmup:]
    if alone or strategy.worker_index == 0:
        pathlib.Path(args.out).write_text(json.dumps({"median_s": float(np.median(steps))}))


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        work(args)
        return 0
    keys = ["vocab", "dim", "seq", "batch", "steps", "warmup", "optimizer"]
    runs = {c: [] for c in args.configs.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for config in runs:
                out = pathlib.Path(tmp) / f"{config}-{r}.json"
                worker = forward(args, keys) + ["--worker", config, "--out", out]
                if config.endswith("one_process"):
                    work(parse_args(list(map(str, worker))))
                else:
                    relaunch(__file__, args.workers, worker, timeout=600)
                runs[config].append(json.loads(out.read_text())["median_s"])
                print(f"round {r}: {config}: {1e3 * runs[config][-1]:.1f} ms", flush=True)
    rows = [{"config": c, "min_ms": 1e3 * min(v), "median_ms": 1e3 * statistics.median(v)}
            for c, v in runs.items()]
    for base in ("dense_layer", "frozen_embedding"):  # ratios to whichever baselines ran
        if base in runs:
            for row in rows:
                row[f"x_{base}"] = row["median_ms"] / (1e3 * statistics.median(runs[base]))
    for row in rows:
        ratios = "".join(f", {row[k]:.2f}x the {k[2:].replace('_', ' ')}"
                         for k in ("x_dense_layer", "x_frozen_embedding") if k in row)
        print(f"{row['config']:>18}: median {row['median_ms']:.1f} ms "
              f"(min {row['min_ms']:.1f}){ratios}", flush=True)
    result = {"workers": args.workers, "cores": os.cpu_count(), "rounds": args.rounds,
              "model": {k: getattr(args, k) for k in keys}, "rows": rows, "runs_s": runs}
    harness.write(result, args.json, args.png, plot=lambda path: plot(rows, args, path))
    return 0


def plot(rows, args, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([r["config"] for r in rows], [r["median_ms"] for r in rows])
    for i, r in enumerate(rows):
        ax.text(r["median_ms"], i, f" {r['median_ms']:.1f} ms", va="center", fontsize=8)
    ax.set(xlabel=f"fit step, ms (median of {args.rounds} rounds)",
           title=f"Embedding({args.vocab}, {args.dim}), seq {args.seq}, batch {args.batch} "
                 f"x {args.workers} workers, {args.optimizer}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
