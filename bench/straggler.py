"""Throughput of sync policies with stragglers: synchronous SGD vs stale-synchronous and async.

    python bench/straggler.py --workers 3 --configs sync,ssp --repeats 3 \
        --json docs/results/straggler_w3.json --png docs/results/straggler_w3.png

One launch of W workers (`python -m tfdist_ext.launch`) runs every (repeat,
mode, config) in turn, in the same order on every worker. Each run builds a
fresh `tfdist_ext.Strategy(sync=config)` and an MLP on synthetic data, traces
it with a warm-up `fit`, then times a second `fit` of `--steps` steps while
stragglers sleep in `on_train_batch_begin`:

* ``none``: nobody sleeps (gives the step time);
* ``transient``: before every step, one worker drawn from a seeded schedule
  (identical for every config) sleeps `--sleep` seconds;
* ``permanent``: worker 0 sleeps `--sleep` seconds before every step.

`--sleep auto` (default) uses the median step time measured by a synchronous
pilot run without stragglers, "about one step time". Job time runs from the
last worker's first timed step to the last worker's end of the timed `fit`
(including the final drain); throughput = steps x global batch / job time. The summary
gives, per mode, each config's min/median throughput and its ratio to sync
(median over repeats).

Each worker's own throughput (its steps over the time from its first to its
last step, which leaves out the wait for others at the end of `fit`) gives
the "fast workers" columns: the mean over the workers that never sleep, and
its ratio to sync. Asynchronous configs run in a second launch with one
parameter server (`tfdist-run --ps 1`), right after the first, with the
first launch's sleep.

Configs: sync, ssp (StaleSynchronous(staleness)), local_sgd (LocalSGD(4)),
dga (DelayedAveraging(2)), model_averaging (2 learners), gossip, diloco
(DiLoCo(8)), async (Asynchronous()), async_bound
(Asynchronous(staleness_bound=workers - 1)), or a JSON dict for
`Strategy(sync=...)`.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # pylint: disable=wrong-import-position
from bench._relaunch import forward, relaunch  # pylint: disable=wrong-import-position

MODES = ("none", "transient", "permanent")
PER_WORKER_BATCH = 64


def sync_config(name, staleness, workers=2):
    presets = {"sync": "sync",
               "ssp": {"name": "stale_synchronous", "staleness": staleness},
               "local_sgd": {"name": "local_sgd", "period": 4},
               "dga": {"name": "delayed_averaging", "delay": 2},
               "model_averaging": {"name": "model_averaging", "learners_per_device": 2},
               "gossip": "gossip",
               "diloco": {"name": "diloco", "period": 8},
               "async": "async",
               "async_bound": {"name": "async", "staleness_bound": workers - 1}}
    return presets[name] if name in presets else json.loads(name)


def needs_servers(name):
    config = sync_config(name, 0)
    return (config if isinstance(config, str) else config["name"]) == "async"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--configs", default="sync,ssp")
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=80, help="timed steps per run")
    parser.add_argument("--sleep", default="auto", help="straggler seconds, or auto")
    parser.add_argument("--hidden", type=int, default=256, help="MLP width")
    harness.add_arguments(parser, repeats=3)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- worker side ------------------------------------------------------------------


def _worker(args):
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    config = json.loads(os.environ["TF_CONFIG"])
    index, workers = config["task"]["index"], len(config["cluster"]["worker"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 64)).astype("float32")
    y = rng.integers(0, 10, size=4096).astype("int32")

    def dataset():  # after the first Strategy: TF_CONFIG collectives come first
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
            PER_WORKER_BATCH * workers)

    class Straggler(keras.callbacks.Callback):
        def __init__(self, mode, seconds):
            super().__init__()
            schedule = np.random.default_rng(11).integers(0, workers, size=args.steps)
            self.sleeps = {"none": np.zeros(args.steps, bool),
                           "transient": schedule == index,
                           "permanent": np.full(args.steps, index == 0)}[mode]
            self.seconds, self.step, self.times = seconds, 0, []

        def on_train_batch_end(self, batch, logs=None):
            self.last_end = time.time()

        def on_train_end(self, logs=None):
            self.train_end = time.time()

        def on_train_batch_begin(self, batch, logs=None):
            self.times.append(time.time())
            if self.sleeps[self.step % args.steps]:
                time.sleep(self.seconds)
            self.step += 1

    def run(name, mode, seconds):
        strategy = tfdist_ext.Strategy(sync=sync_config(name, args.staleness, workers))
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([
                keras.Input((64,)), keras.layers.Dense(args.hidden, activation="relu"),
                keras.layers.Dense(args.hidden, activation="relu"), keras.layers.Dense(10)])
            model.compile(optimizer=keras.optimizers.SGD(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(dataset(), epochs=1, steps_per_epoch=10, verbose=0)  # traces
        straggler = Straggler(mode, seconds)
        start = time.time()
        model.fit(dataset(), epochs=1, steps_per_epoch=args.steps, verbose=0,
                  callbacks=[straggler])
        end = time.time()
        steps = np.diff(straggler.times)
        return {"config": name, "mode": mode, "start": start, "end": end, "steps": args.steps,
                "first_step": straggler.times[0], "train_end": straggler.train_end,
                "last_end": straggler.last_end,
                "first_step_s": straggler.times[0] - start,
                "after_last_step_s": end - straggler.times[-1],
                "last_step_s": straggler.last_end - straggler.times[-1],
                "return_s": end - straggler.train_end,
                "step_s_median": float(np.median(steps)) if len(steps) else None,
                "stats": strategy.communication_stats()}

    records = []
    sleep = None if args.sleep == "auto" else float(args.sleep)
    if sleep is None:  # pilot: step time without stragglers (synchronous where it can)
        pilot = run(args.configs.split(",")[0], "none", 0.0)
        sleep = pilot["step_s_median"]
    for repeat in range(args.repeats):
        for mode in args.modes.split(","):
            for name in args.configs.split(","):
                record = run(name, mode, sleep)
                record.update(repeat=repeat, sleep_s=sleep)
                records.append(record)
    with open(os.path.join(args.worker_out, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(records, f)


# -- controller side --------------------------------------------------------------


def _launch(args, out_dir, configs, servers=0):
    forwarded = forward(args, ("staleness", "modes", "steps", "sleep", "repeats", "hidden"))
    relaunch(__file__, args.workers, forwarded + ["--configs", ",".join(configs),
                                                  "--worker-out", out_dir],
             args.timeout, servers=servers)
    return [json.loads((pathlib.Path(out_dir) / f"w{i}.json").read_text())
            for i in range(args.workers)]


def combine(per_worker, workers):
    """One record per run: job time over all workers."""
    records = []
    for runs in zip(*per_worker):
        first = runs[0]
        # From the last worker's first timed step to the last worker's end of
        # `fit` (after the final drain): leaves out `fit`'s set-up (iterator
        # creation), which does not depend on the policy.
        job = max(r["train_end"] for r in runs) - max(r["first_step"] for r in runs)
        steps = first["stats"].get("sync_rounds") or first["stats"].get("reductions")
        sleeping = {"none": set(), "transient": set(range(workers)),
                    "permanent": {0}}[first["mode"]]
        own = [r["steps"] / (r["last_end"] - r["first_step"]) for r in runs]
        fast = [v for i, v in enumerate(own) if i not in sleeping] or own
        records.append({
            "config": first["config"], "mode": first["mode"], "repeat": first["repeat"],
            "workers": workers, "sleep_s": first["sleep_s"], "job_seconds": job,
            "steps_per_s": None, "samples_per_s": None,
            "step_s_median": [r["step_s_median"] for r in runs],
            "first_step_s": [r["first_step_s"] for r in runs],
            "after_last_step_s": [r["after_last_step_s"] for r in runs],
            "last_step_s": [r["last_step_s"] for r in runs],
            "return_s": [r["return_s"] for r in runs],
            "start_skew_s": max(r["start"] for r in runs) - min(r["start"] for r in runs),
            "staleness_max": max(r["stats"].get("staleness_max", 0) for r in runs),
            "own_steps_per_s": own,
            "fast_samples_per_s": sum(fast) / len(fast) * PER_WORKER_BATCH,
            "rounds": steps})
    return records


def summarize(records, steps):
    import numpy as np  # pylint: disable=import-outside-toplevel

    summary = []
    for record in records:
        record["steps_per_s"] = steps / record["job_seconds"]
        record["samples_per_s"] = record["steps_per_s"] * PER_WORKER_BATCH * record["workers"]
    for mode in dict.fromkeys(r["mode"] for r in records):
        base = [r["samples_per_s"] for r in records if r["mode"] == mode
                and r["config"] == "sync"]
        for config in dict.fromkeys(r["config"] for r in records):
            values = [r["samples_per_s"] for r in records
                      if r["mode"] == mode and r["config"] == config]
            fast = [r["fast_samples_per_s"] for r in records
                    if r["mode"] == mode and r["config"] == config]
            base_fast = [r["fast_samples_per_s"] for r in records if r["mode"] == mode
                         and r["config"] == "sync"]
            row = {"mode": mode, "config": config,
                   "fast_samples_per_s_median": float(np.median(fast)),
                   "samples_per_s_min": float(np.min(values)),
                   "samples_per_s_median": float(np.median(values)),
                   "staleness_max": max(r["staleness_max"] for r in records
                                        if r["mode"] == mode and r["config"] == config)}
            if base:
                row["ratio_vs_sync_median"] = row["samples_per_s_median"] / float(
                    np.median(base))
                # Per-repeat ratios (same repeat: same machine state, side by side).
                pairs = [a / b for a, b in zip(values, base)]
                row["ratio_vs_sync_min"] = float(np.min(pairs))
                row["fast_ratio_vs_sync_median"] = row["fast_samples_per_s_median"] / float(
                    np.median(base_fast))
                row["fast_ratio_vs_sync_min"] = float(np.min(
                    [a / b for a, b in zip(fast, base_fast)]))
            summary.append(row)
    return summary


def plot(summary, path, workers, sleep):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    modes = list(dict.fromkeys(r["mode"] for r in summary))
    configs = list(dict.fromkeys(r["config"] for r in summary))
    width = 0.8 / len(configs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "samples_per_s_median", "job samples / s (median)"),
                           (axes[1], "fast_samples_per_s_median",
                            "samples / s per fast worker (median)")):
        for k, config in enumerate(configs):
            values = [next((r[key] for r in summary if r["mode"] == m and r["config"] == config),
                           0.0) for m in modes]
            ax.bar([i + k * width for i in range(len(modes))], values, width, label=config)
        ax.set_xticks([i + width * (len(configs) - 1) / 2 for i in range(len(modes))], modes)
        ax.set_ylabel(label)
        ax.legend(fontsize=7, ncol=2, loc="upper right")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend
    fig.suptitle(f"{workers} workers, straggler sleep {sleep * 1000:.0f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    if args.worker_out:
        return _worker(args)
    configs = args.configs.split(",")
    plain = [c for c in configs if not needs_servers(c)]
    served = [c for c in configs if needs_servers(c)]
    records = []
    for group, servers in ((plain, 0), (served, 1)):
        if not group:
            continue
        with tempfile.TemporaryDirectory() as out_dir:
            per_worker = _launch(args, out_dir, group, servers)
        records += combine(per_worker, args.workers)
        args.sleep = str(records[0]["sleep_s"])  # the async launch uses the same sleep
    summary = summarize(records, args.steps)
    print(f"{'mode':<10} {'config':<12} {'samples/s min':>14} {'median':>10} "
          f"{'x sync (median)':>16} {'x sync (min)':>13} {'fast workers':>13} "
          f"{'x sync':>7} {'max lead':>9}")
    for row in summary:
        print(f"{row['mode']:<10} {row['config']:<12} {row['samples_per_s_min']:>14.0f} "
              f"{row['samples_per_s_median']:>10.0f} "
              f"{row.get('ratio_vs_sync_median', float('nan')):>16.2f} "
              f"{row.get('ratio_vs_sync_min', float('nan')):>13.2f} "
              f"{row['fast_samples_per_s_median']:>13.0f} "
              f"{row.get('fast_ratio_vs_sync_median', float('nan')):>7.2f} "
              f"{row['staleness_max']:>9}")
    print(f"straggler sleep: {records[0]['sleep_s'] * 1000:.1f} ms")
    harness.write({"args": {k: v for k, v in vars(args).items() if k != "worker_out"},
                   "summary": summary, "records": records},
                  args.json, args.png,
                  plot=lambda path: plot(summary, path, args.workers, records[0]["sleep_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
