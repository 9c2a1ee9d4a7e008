"""Step time under each gradient bucketing planner: None, FixedSize, WFBP, MG-WFBP.

    python bench/bucketing.py --workers 2 --models mlp20,cnn --repeats 3 \
        --json docs/results/bucketing_w2.json --png docs/results/bucketing_w2.png
    python bench/bucketing.py --workers 2 --link 1gbit ...     # shaped links (root)

One launch of W workers (`python -m tfdist_ext.launch`, optionally with every
worker's link shaped by the test bed) runs every (repeat, model, planner) in
turn, the same order on every worker. Each run builds a fresh
`tfdist_ext.Strategy(bucketing=planner, engine=--engine)` and model, trains a warm-up `fit` of
`--warmup` steps (tracing; MG-WFBP profiles gradient-ready times in its first
5 steps, then times each distinct candidate plan (its own for several alphas,
one bucket, equal splits) for 5 steps and keeps the fastest), then times
`--steps` steps of a second `fit`. The step
time is the chief's median wall-clock time between consecutive batch starts.

Models: mlp20 (20 Dense layers of `--width` units, ReLU: 40 gradient tensors,
1.3M parameters at width 256) and cnn (the example's mnist1d 1-D CNN, 26k
parameters). Planners: none (one fused buffer), fixed (FixedSize(1 MiB)),
wfbp, mgwfbp (tuned, the default) and mgwfbp_model (tune=False: the timing
model's plan as is; not in the default list). The summary gives min/median
step time and each planner's median relative to the best of the others.
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

PLANNERS = {"none": None, "fixed": {"name": "fixed", "bytes_per_bucket": 1 << 20},
            "wfbp": "wfbp", "mgwfbp": "mgwfbp",
            "mgwfbp_model": {"name": "mgwfbp", "tune": False}}
PER_WORKER_BATCH = 64


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--models", default="mlp20,cnn")
    parser.add_argument("--planners", default="none,fixed,wfbp,mgwfbp")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=60,
                        help="steps before timing (MG-WFBP profiles and tunes in them)")
    parser.add_argument("--link", default="none", help="shaped link rate (root), or none")
    parser.add_argument("--engine", choices=("tf", "ucx"), default="tf",
                        help="tf: TF's native ring; ucx: the UCX engine's ring")
    harness.add_arguments(parser, repeats=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--verbose", action="store_true",
                        help="log the profiled times and MG-WFBP's timed candidate plans")
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _build(name, width, keras):
    if name == "cnn":
        from examples.keras_fit import build_model  # pylint: disable=import-outside-toplevel
        return build_model(keras), (40, 1), 10
    layers = [keras.Input((64,))] + [keras.layers.Dense(width, activation="relu")
                                     for _ in range(19)] + [keras.layers.Dense(10)]
    return keras.Sequential(layers), (64,), 10


def _worker(args):
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    config = json.loads(os.environ["TF_CONFIG"])
    index, workers = config["task"]["index"], len(config["cluster"]["worker"])
    if args.verbose:
        import logging  # pylint: disable=import-outside-toplevel
        logging.basicConfig()
        logging.getLogger("tfdist_ext").setLevel(logging.INFO)

    def run(model_name, planner):
        strategy = tfdist_ext.Strategy(
            allreduce={"name": "native" if args.engine == "tf" else "ring",
                       "calibration_cache": None},
            bucketing=PLANNERS[planner], engine=args.engine)
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model, shape, classes = _build(model_name, args.width, keras)
            model.compile(optimizer=keras.optimizers.SGD(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rng = np.random.default_rng(0)
        x = rng.normal(size=(1024,) + shape).astype("float32")
        y = rng.integers(0, classes, size=1024).astype("int32")
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
            PER_WORKER_BATCH * workers)
        model.fit(data, epochs=1, steps_per_epoch=args.warmup, verbose=0)
        clock = step_clock(keras)
        model.fit(data, epochs=1, steps_per_epoch=args.steps + 1, verbose=0, callbacks=[clock])
        steps = np.diff(clock.times)
        return {"model": model_name, "planner": planner, "step_ms_median":
                float(np.median(steps) * 1e3), "step_ms_min": float(np.min(steps) * 1e3),
                "buckets": len(strategy.bucket_plan) or 1,  # none: one fused buffer
                "parameters": int(sum(np.prod(w.shape) for w in model.trainable_weights))}

    records = []
    for repeat in range(args.repeats):
        for model_name in args.models.split(","):
            for planner in args.planners.split(","):
                record = run(model_name, planner)
                record["repeat"] = repeat
                records.append(record)
    with open(os.path.join(args.worker_out, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(records, f)


def summarize(records):
    import numpy as np  # pylint: disable=import-outside-toplevel

    summary = []
    for model in dict.fromkeys(r["model"] for r in records):
        rows = []
        for planner in dict.fromkeys(r["planner"] for r in records):
            runs = [r for r in records if r["model"] == model and r["planner"] == planner]
            rows.append({"model": model, "planner": planner,
                         "step_ms_min": float(np.min([r["step_ms_median"] for r in runs])),
                         "step_ms_median": float(np.median([r["step_ms_median"] for r in runs])),
                         "buckets": runs[-1]["buckets"],
                         "parameters": runs[-1]["parameters"]})
        for row in rows:
            others = [r["step_ms_median"] for r in rows if r is not row]
            row["vs_best_other"] = row["step_ms_median"] / min(others) if others else 1.0
            none = next((r for r in rows if r["planner"] == "none"), None)
            row["vs_none"] = row["step_ms_median"] / none["step_ms_median"] if none else None
        summary += rows
    return summary


def plot(summary, path, title):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    models = list(dict.fromkeys(r["model"] for r in summary))
    planners = list(dict.fromkeys(r["planner"] for r in summary))
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        values = [next(r["step_ms_median"] for r in summary
                       if r["model"] == model and r["planner"] == p) for p in planners]
        ax.bar(planners, values)
        ax.set_title(model)
        ax.set_ylabel("step time, ms (median)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    if args.worker_out:
        return _worker(args)
    forwarded = forward(args, ("models", "planners", "width", "steps", "warmup", "repeats",
                               "engine"))
    forwarded += ["--verbose"] if args.verbose else []
    with tempfile.TemporaryDirectory() as out_dir:
        relaunch(__file__, args.workers, forwarded + ["--worker-out", out_dir], args.timeout,
                 link=args.link, check=args.link != "none")
        records = json.loads((pathlib.Path(out_dir) / "w0.json").read_text())
    summary = summarize(records)
    print(f"{'model':<8} {'planner':<12} {'buckets':>7} {'step ms min':>12} {'median':>8} "
          f"{'x best other':>13} {'x none':>7}")
    for row in summary:
        print(f"{row['model']:<8} {row['planner']:<12} {row['buckets']:>7} "
              f"{row['step_ms_min']:>12.1f} {row['step_ms_median']:>8.1f} "
              f"{row['vs_best_other']:>13.2f} {row['vs_none'] or float('nan'):>7.2f}")
    title = f"{args.workers} workers, link {args.link}, engine {args.engine}"
    harness.write({"args": {k: v for k, v in vars(args).items() if k != "worker_out"},
                   "summary": summary, "records": records},
                  args.json, args.png, plot=lambda path: plot(summary, path, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
