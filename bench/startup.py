"""Worker start-up: a short multi-worker `fit`, workers executed or forked from a preload.

Runs the same small job (a Dense model, 2 epochs of 8 steps on each worker) through
`tfdist-run -np N` with fresh Python workers (``--preload ""``) and with workers forked
from a template that imported TensorFlow and Keras once (``--preload
tensorflow,keras``), alternating the two in each repeat. Reports per job: wall time,
the CPU time of the launcher and everything it started (RUSAGE_CHILDREN), and the
seconds until the last worker had imported TensorFlow, Keras and tfdist_ext.

`--rejoin` also measures what the preload is for in an elastic job: 3 workers under
`tfdist-run --elastic` (tests/workers/elastic_fit.py, the MLP), worker 2 SIGKILLs
itself at step 10, the launcher starts it again after its 2 s delay and it rejoins;
reported: the seconds from the kill to the members admitting the replacement.

    python bench/startup.py --workers 1 2 3 --repeats 3 --rejoin \
        --json docs/results/startup.json --png docs/results/startup.png

Tuning: the job is tiny on purpose (start-up is what is measured); on a machine
with more cores than workers the wall time gains less than the CPU time.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import harness

SCRIPT = """
import time
import os, sys
preloaded = "tensorflow" in sys.modules
import numpy as np
import keras
import tfdist_ext
imported = time.time()
strategy = tfdist_ext.Strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile("sgd", "mse")
batch = 16 * strategy.num_replicas_in_sync
x = np.random.default_rng(0).normal(size=(8 * batch, 16))
model.fit(x.astype("float32"), x[:, :4].astype("float32"), batch_size=batch, epochs=2,
          verbose=0)
print("STARTUP", imported, preloaded, flush=True)
"""

MODES = {"executed": "", "preload": "tensorflow,keras"}


def _launch(workers, modules, options, args, **env):
    """`tfdist-run -np WORKERS --preload MODULES OPTIONS python ARGS` from the repository."""
    return subprocess.run(
        [sys.executable, "-m", "tfdist_ext.launch", "-np", str(workers), "--output", "all",
         "--timeout", "300", "--preload", modules, *options, sys.executable, *args],
        capture_output=True, text=True, check=False, cwd=harness.ROOT,
        env=dict(os.environ, PYTHONPATH=str(harness.ROOT), **env))


def run_job(script, workers, modules):
    """One job; returns {wall, cpu, imported, preloaded} (seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    result = _launch(workers, modules, [], [script])
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line.split("STARTUP ", 1)[1].split() for line in result.stdout.splitlines()
             if "STARTUP " in line]
    if result.returncode != 0 or len(lines) != workers:
        raise RuntimeError(f"the job failed (code {result.returncode}):\n{result.stdout}"
                           f"{result.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu,
            "imported": max(float(done) for done, _ in lines) - start,
            "preloaded": all(flag == "True" for _, flag in lines)}


def rejoin(modules, folder):
    """Seconds from worker 2's death to its replacement's admission (3 workers, --elastic)."""
    out = os.path.join(folder, f"rejoin-{len(os.listdir(folder))}")
    os.makedirs(out)
    worker = os.path.join(harness.ROOT, "tests", "workers", "elastic_fit.py")
    result = _launch(3, modules, ["--elastic"], [worker, out, "2", "10", "4", "mlp"],
                     WAIT_REJOIN="1")
    if result.returncode != 0:
        raise RuntimeError(f"the elastic job failed:\n{result.stdout[-4000:]}")
    with open(os.path.join(out, "killed.txt"), encoding="utf-8") as f:
        killed = float(f.read())
    with open(os.path.join(out, "w0.json"), encoding="utf-8") as f:
        (join,) = json.load(f)["joins"]
    return join["time"] - killed


def summarize(runs):
    return {key: {"min": min(r[key] for r in runs),
                  "median": statistics.median(r[key] for r in runs)}
            for key in ("wall", "cpu", "imported")}


def plot(result, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    rejoins = result["rejoin_seconds"]
    figure, axes = plt.subplots(1, 4 if rejoins else 3, figsize=(16 if rejoins else 12, 3.6))
    workers = result["workers"]
    for axis, key, title in zip(axes, ("wall", "cpu", "imported"),
                                ("job wall time (s)", "CPU time of the job (s)",
                                 "launch to the last worker's imports done (s)")):
        for offset, mode in ((-0.2, "executed"), (0.2, "preload")):
            axis.bar([w + offset for w in workers],
                     [result["rows"][mode][str(w)][key]["median"] for w in workers],
                     width=0.4, label=mode)
        axis.set_xticks(workers)
        axis.set_xlabel("workers")
        axis.set_title(title, fontsize=9)
    if rejoins:
        axes[3].boxplot([rejoins["executed"], rejoins["preload"]])
        axes[3].set_xticks([1, 2], ["executed", "preload"])
        axes[3].set_title("3 workers, --elastic: kill to rejoin (s)", fontsize=9)
    axes[0].legend()
    figure.suptitle(f"tfdist-run start-up, median of {result['repeats']} "
                    f"({os.cpu_count()} cores)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _write_script(folder):
    """The worker program, written into `folder`; returns its path."""
    script = os.path.join(folder, "startup_fit.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(SCRIPT)
    return script


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rejoin", action="store_true",
                        help="also time an elastic replacement's rejoin both ways")
    harness.add_arguments(parser, repeats=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = _write_script(folder)
        runs = {mode: {w: [] for w in args.workers} for mode in MODES}
        rejoins = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))
            for workers in args.workers:
                for mode in order:
                    run = run_job(script, workers, MODES[mode])
                    if run["preloaded"] != (mode == "preload"):
                        raise RuntimeError(f"{mode}: the workers' preloaded flag is "
                                           f"{run['preloaded']}")
                    runs[mode][workers].append(run)
                    print(f"repeat {repeat} workers {workers} {mode}: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in run.items()
                                      if k != "preloaded"), flush=True)
            for mode in order if args.rejoin else ():
                rejoins[mode].append(rejoin(MODES[mode], folder))
                print(f"repeat {repeat} rejoin {mode}: {rejoins[mode][-1]:.2f} s", flush=True)
    rows = {mode: {str(w): summarize(runs[mode][w]) for w in args.workers} for mode in MODES}
    ratios = {str(w): {key: rows["preload"][str(w)][key]["median"]
                       / rows["executed"][str(w)][key]["median"]
                       for key in ("wall", "cpu", "imported")} for w in args.workers}
    result = {"workers": args.workers, "repeats": args.repeats, "rows": rows,
              "preload_over_executed": ratios,
              "runs": {mode: {str(w): v for w, v in by.items()} for mode, by in runs.items()},
              "rejoin_seconds": rejoins if args.rejoin else None}
    if args.rejoin:
        result["rejoin_median"] = {mode: statistics.median(v) for mode, v in rejoins.items()}
    print(json.dumps({"preload_over_executed": ratios,
                      "rejoin_median": result.get("rejoin_median")}, indent=1))
    harness.write(result, args.json, args.png, plot=lambda path: plot(result, path))


if __name__ == "__main__":
    main()
