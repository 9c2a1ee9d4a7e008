"""ZeRO stages 1 and 2: optimizer-state bytes, peak memory and step time per worker.

    python bench/zero.py --workers 1,2,4 --json docs/results/zero.json \
        --png docs/results/zero.png [--torch /path/to/python-with-torch]

A stack of Dense layers (`--layers` x `--hidden` wide on `--input` features,
about 50M weights by default), Adam 1e-4, random data, `--batch` samples per
worker, trained with `fit` under `tfdist-run` at each worker count with
`Strategy(zero_stage=0)`, `1` and `2` (one worker has nothing to shard: the
plain path). Per worker: the optimizer's state bytes (Adam's two slots; at
stages 1 and 2 the worker's shard), the summed gradient it receives (the
whole at stages 0 and 1, its shard at stage 2: the partition's size), its peak
resident
memory (`ru_maxrss`, after the steps), TensorFlow's allocator's peak bytes in
use (`tf.config.experimental.get_memory_info`) and the chief's median step over
`--steps` steps after `--warmup`; the first losses, which must agree across
stages. With `--torch PYTHON` (an interpreter with PyTorch), the same model
under DDP with `torch.optim.Adam` and with `ZeroRedundancyOptimizer(Adam)`
(bench/zero_torch.py, Gloo) beside it at stages 0 and 1. Reported per row: state and peak MB
per worker, the state saved against stage 0 at the same worker count, the
peak memory saved, and their ratio (the issue's bar: 80%).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # pylint: disable=wrong-import-position
from bench._relaunch import forward, relaunch, step_clock  # pylint: disable=wrong-import-position

MB = 1 << 20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--stages", default="0,1,2")
    parser.add_argument("--input", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="samples per worker")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--torch", default=None, help="a Python with PyTorch, for its twin")
    harness.add_arguments(parser)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # the stage
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def work(args):
    """One worker of one configuration: writes OUT-w<index>.json."""
    import resource  # pylint: disable=import-outside-toplevel

    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel
    from tfdist_ext import zero  # pylint: disable=import-outside-toplevel

    stage = int(args.worker)
    strategy = tfdist_ext.Strategy(zero_stage=stage)
    workers = strategy.num_workers
    rng = np.random.default_rng(0)
    n = args.batch * workers * (args.warmup + args.steps)
    x = rng.normal(size=(n, args.input)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((args.input,))]
            + [keras.layers.Dense(args.hidden, activation="relu") for _ in range(args.layers)]
            + [keras.layers.Dense(10)])
        optimizer = keras.optimizers.Adam(1e-4)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    clock = step_clock(keras)
    history = model.fit(x, y, batch_size=args.batch * workers, epochs=1, shuffle=False,
                        verbose=0, callbacks=[clock])
    state = (sum(zero.state_bytes(optimizer).values()) if zero.sharded(optimizer)
             else zero.slot_bytes(optimizer))
    sizes = [int(np.prod(w.shape)) for w in model.trainable_weights]
    summed = (zero.Partition.of(sizes, workers).shard if stage == 2 and workers > 1
              else sum(sizes))
    record = {"state_bytes": state, "summed_gradient_bytes": 4 * summed,
              "peak_rss_bytes": resource.getrusage(
                  resource.RUSAGE_SELF).ru_maxrss * 1024,
              "allocator_peak_bytes": _allocator_peak(),
              "median_step_s": float(np.median(np.diff(clock.times)[args.warmup:])),
              "loss": history.history["loss"][-1], "weights": model.count_params()}
    pathlib.Path(f"{args.out}-w{strategy.worker_index}.json").write_text(json.dumps(record))


def _allocator_peak():
    """Peak bytes in use of TensorFlow's CPU allocator (on x86 a BFC pool that keeps
    what it once held: RSS moves in its region steps), or None."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    try:
        return tf.config.experimental.get_memory_info("CPU:0")["peak"]
    except (ValueError, tf.errors.OpError):
        return None


def _row(framework, workers, stage, records):
    return {"framework": framework, "workers": workers, "stage": stage,
            "state_mb": max(r["state_bytes"] for r in records) / MB,
            "summed_gradient_mb": max(r.get("summed_gradient_bytes", 0) for r in records) / MB,
            "peak_mb": max(r["peak_rss_bytes"] for r in records) / MB,
            "allocator_peak_mb": (max(r["allocator_peak_bytes"] for r in records) / MB
                                  if all(r.get("allocator_peak_bytes") for r in records)
                                  else None),
            "step_ms": 1e3 * records[0]["median_step_s"], "loss": records[0]["loss"],
            "weights": records[0].get("weights")}


def measure(args):
    rows = []
    keys = ["input", "hidden", "layers", "batch", "steps", "warmup"]
    with tempfile.TemporaryDirectory() as tmp:
        for workers in map(int, args.workers.split(",")):
            for stage in map(int, args.stages.split(",")):
                out = pathlib.Path(tmp) / f"tfdist-{workers}-{stage}"
                relaunch(__file__, workers, forward(args, keys) + ["--worker", stage, "--out",
                                                                   out], timeout=900)
                records = [json.loads(pathlib.Path(f"{out}-w{i}.json").read_text())
                           for i in range(workers)]
                rows.append(_row("tfdist_ext", workers, stage, records))
                print(json.dumps(rows[-1]), flush=True)
                if args.torch and workers > 1 and stage < 2:  # ZeroRedundancyOptimizer: 1
                    out = pathlib.Path(tmp) / f"torch-{workers}-{stage}"
                    subprocess.run([args.torch, "-m", "torch.distributed.run",
                                    f"--nproc-per-node={workers}",
                                    str(ROOT / "bench" / "zero_torch.py"), "--zero", str(stage),
                                    "--out", str(out), *forward(args, keys)],
                                   check=True, cwd=ROOT, timeout=900)
                    records = [json.loads(pathlib.Path(f"{out}-w{i}.json").read_text())
                               for i in range(workers)]
                    rows.append(_row("pytorch", workers, stage, records))
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def savings(rows):
    """Per stage-1/2 row: state and peak MB saved against its stage-0 twin, and their ratio."""
    base = {(r["framework"], r["workers"]): r for r in rows if r["stage"] == 0}
    for r in rows:
        twin = base.get((r["framework"], r["workers"]))
        if r["stage"] and twin is not None:
            r["state_saved_mb"] = twin["state_mb"] - r["state_mb"]
            r["peak_saved_mb"] = twin["peak_mb"] - r["peak_mb"]
            r["peak_saved_over_state_saved"] = (r["peak_saved_mb"] / r["state_saved_mb"]
                                                if r["state_saved_mb"] > 0 else None)
            r["step_x_stage0"] = r["step_ms"] / twin["step_ms"]
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.worker is not None:
        work(args)
        return 0
    rows = savings(measure(args))
    result = {"cores": os.cpu_count(),
              "model": {k: getattr(args, k) for k in ("input", "hidden", "layers", "batch")},
              "rows": rows}
    harness.write(result, args.json, args.png, plot=lambda path: plot(rows, path))
    return 0


def plot(rows, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    labels = [f"{r['framework']} N={r['workers']} stage {r['stage']}" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 0.45 * len(rows) + 1.5), sharey=True)
    for ax, key, title in zip(axes, ("state_mb", "peak_mb", "step_ms"),
                              ("optimizer state per worker, MB", "peak RSS per worker, MB",
                               "step, ms (chief's median)")):
        ax.barh(labels, [r[key] for r in rows])
        for i, r in enumerate(rows):
            ax.text(r[key], i, f" {r[key]:.0f}", va="center", fontsize=7)
        ax.set(title=title)
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
