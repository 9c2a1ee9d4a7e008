"""Throughput, scaling efficiency and communication overhead at 1..N workers.

    python bench/scaling.py --workers 1,2,3,4 --configs sync,powersgd,local_sgd \
        --json docs/results/scaling.json --png docs/results/scaling.png
    python bench/scaling.py --link 100mbit ...     # every worker's link shaped (root)

For each worker count W one launch (`python -m tfdist_ext.launch -np W`, with
the test bed's shaped links when `--link` is given) trains every configuration
in turn with a fixed batch per worker (weak scaling: the global batch grows
with W): a warm-up `fit` of `--warmup` steps, then `--steps` timed steps. The
step time is the chief's wall-clock time between consecutive batch starts;
min, median and mean over the timed steps are reported.

Figures of merit, per configuration, against the same configuration on one
worker:

* throughput: samples per second, W x per-worker batch / mean step time (the
  mean, not the median: local SGD's averaging steps are rare and long);
* scaling efficiency: throughput at W / (W x throughput at 1);
* communication overhead: mean step time at W minus at 1.

On a machine with fewer cores than workers the workers also share the CPU, so
efficiency there mixes communication and compute contention; the summary
prints the cores next to the table.

Configurations: sync (dense all-reduce), powersgd (rank 2), local_sgd
(period 8), diloco (period 8), fp16. The model is the example's MLP
(`examples/keras_fit.py --model mlp`: 1.1M parameters, 4.4 MB of gradients)
with Adam.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # pylint: disable=wrong-import-position
from bench._relaunch import forward, relaunch, step_clock  # pylint: disable=wrong-import-position

CONFIGS = {
    "sync": {},
    "powersgd": {"compression": {"name": "powersgd", "rank": 2}},
    "fp16": {"compression": "fp16"},
    "local_sgd": {"sync": {"name": "local_sgd", "period": 8}},
    "diloco": {"sync": {"name": "diloco", "period": 8}},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,3,4",
                        help="comma-separated worker counts")
    parser.add_argument("--configs", default="sync,powersgd,local_sgd")
    parser.add_argument("--batch", type=int, default=64, help="samples per worker per step")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--link", default="none", help="shaped link rate (root), or none")
    harness.add_arguments(parser)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in args.configs.split(","):
        if name not in CONFIGS:
            parser.error(f"--configs: unknown configuration {name!r}; choose from "
                         f"{sorted(CONFIGS)}")
    return args


def _worker(args):
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel
    from examples.keras_fit import build_model  # pylint: disable=import-outside-toplevel

    config = json.loads(os.environ["TF_CONFIG"])
    index, workers = config["task"]["index"], len(config["cluster"]["worker"])

    records = []
    for name in args.configs.split(","):
        strategy = tfdist_ext.Strategy(**CONFIGS[name])
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = build_model(keras, "mlp")
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2048,) + tuple(model.input_shape[1:])).astype("float32")
        y = rng.integers(0, 10, size=2048).astype("int32")
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch * workers)
        model.fit(data, epochs=1, steps_per_epoch=args.warmup, verbose=0)
        clock = step_clock(keras)
        model.fit(data, epochs=1, steps_per_epoch=args.steps + 1, verbose=0, callbacks=[clock])
        steps = np.diff(clock.times)
        stats = strategy.communication_stats()
        records.append({"config": name, "workers": workers,
                        "step_ms_median": float(np.median(steps) * 1e3),
                        "step_ms_min": float(np.min(steps) * 1e3),
                        "step_ms_mean": float(np.mean(steps) * 1e3),
                        "bytes_sent": int(stats.get("bytes_sent", 0)),
                        "parameters": int(sum(np.prod(w.shape)
                                              for w in model.trainable_weights))})
    with open(os.path.join(args.worker_out, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(records, f)


def summarize(records, batch):
    """Adds throughput, efficiency and overhead against each configuration's 1-worker row."""
    rows = []
    for record in records:
        row = dict(record)
        row["throughput"] = record["workers"] * batch / (record["step_ms_mean"] / 1e3)
        base = next((r for r in records
                     if r["config"] == record["config"] and r["workers"] == 1), None)
        if base is not None:
            base_throughput = batch / (base["step_ms_mean"] / 1e3)
            row["efficiency"] = row["throughput"] / (record["workers"] * base_throughput)
            row["overhead_ms"] = record["step_ms_mean"] - base["step_ms_mean"]
        rows.append(row)
    return rows


def plot(rows, path, title):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = sorted((r for r in rows if r["config"] == config), key=lambda r: r["workers"])
        xs = [r["workers"] for r in mine]
        left.plot(xs, [r["throughput"] for r in mine], marker="o", label=config)
        right.plot(xs, [r.get("efficiency", float("nan")) for r in mine], marker="o",
                   label=config)
    left.set_xlabel("workers")
    left.set_ylabel("samples / s")
    right.set_xlabel("workers")
    right.set_ylabel("scaling efficiency")
    right.set_ylim(0, 1.1)
    left.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    if args.worker_out:
        return _worker(args)
    forwarded = forward(args, ("configs", "batch", "steps", "warmup"))
    records = []
    for workers in [int(w) for w in args.workers.split(",")]:
        with tempfile.TemporaryDirectory() as out_dir:
            link = args.link if workers > 1 else "none"
            relaunch(__file__, workers, forwarded + ["--worker-out", out_dir], args.timeout,
                     link=link, check=link != "none")
            records += json.loads((pathlib.Path(out_dir) / "w0.json").read_text())
    rows = summarize(records, args.batch)
    cores = os.cpu_count()
    print(f"link {args.link}, {args.batch} samples per worker per step, {cores} CPU cores")
    print(f"{'config':<10} {'workers':>7} {'step ms min':>12} {'median':>8} {'mean':>8} "
          f"{'samples/s':>10} {'efficiency':>10} {'overhead ms':>12}")
    for row in rows:
        print(f"{row['config']:<10} {row['workers']:>7} {row['step_ms_min']:>12.1f} "
              f"{row['step_ms_median']:>8.1f} {row['step_ms_mean']:>8.1f} "
              f"{row['throughput']:>10.0f} "
              f"{row.get('efficiency', float('nan')):>10.2f} "
              f"{row.get('overhead_ms', float('nan')):>12.1f}")
    title = f"link {args.link}, {args.batch} samples/worker/step, {cores} cores"
    harness.write({"args": {k: v for k, v in vars(args).items() if k != "worker_out"},
                   "cpu_cores": cores, "rows": rows},
                  args.json, args.png, plot=lambda path: plot(rows, path, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
