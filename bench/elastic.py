"""Elastic training under injected failures: what a dead worker costs.

    python bench/elastic.py --workers 3 --kill 2@30 --json docs/results/elastic_w3.json \
        --png docs/results/elastic_w3.png
    python bench/elastic.py --workers 4 --kill 0@20,3@70 ...
    python bench/elastic.py --workers 3 --mtbf 20 --failures 5 --epochs 80 ...

Two jobs of plain TF_CONFIG processes (no launcher) train the same model from
the same seed with `Strategy(elastic=True)`: one uninterrupted, one in which
each `--kill WORKER@STEP` SIGKILLs that worker when it starts that training
step (counted from the start of `fit`). Reported per failure: the seconds from
the kill to the survivors going on (their new membership), the steps each
survivor lost (the discarded step, plus any it skipped to be level with the
others), and the members left; per job: the lowest surviving worker's loss
curve (per step), its test accuracy and the wall-clock time. The PNG shows
both loss curves with the failures marked.

`--mtbf SECONDS` is a random killer instead (torchft's punisher): after
exponentially distributed intervals of that mean it SIGKILLs a random worker
that is in the job (worker 0 included), and starts it again with its
TF_CONFIG after `tfdist_ext.elastic.options.REPLACEMENT_DELAY_SECONDS`; the
replacement rejoins. Stops killing after `--failures`. Reported per failure as well: the
seconds from the kill to the job's return to full size; a kill no member recorded a
failure for (one before the workers' fit began) is listed in `kills_without_failure`.
Goodput (torchft's measure): the steps whose result was kept (all of the fit's
steps but the discarded and skipped ones) over the steps the uninterrupted job
would have run in the same wall-clock time, i.e. (kept / total) x (uninterrupted
seconds / seconds with failures); `identical_weights` says whether every worker
ended with the same weights. The PNG's second panel is the step rate over time
of both jobs with the kills marked.

The model: an MLP (20-128-128-4) on a synthetic 4-class problem with
overlapping classes (12,000 samples, 4,000 of them for testing), momentum SGD
0.05/0.9, global batch 96, split by Keras' input among the workers.
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill", default="2@30",
                        help="comma-separated WORKER@STEP: kill WORKER at the start of STEP")
    parser.add_argument("--mtbf", type=float, default=0.0,
                        help="random killer: mean seconds between kills (0: use --kill)")
    parser.add_argument("--failures", type=int, default=5, help="kills of the random killer")
    parser.add_argument("--seed", type=int, default=0, help="the random killer's seed")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument("--root", default=None,
                        help="keep the jobs' logs and records here (default: a temporary "
                             "folder); an uninterrupted job already recorded there with the "
                             "same --workers and --epochs is reused")
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # OUT_DIR
    args = parser.parse_args(argv)
    try:
        args.kills = [tuple(int(v) for v in item.split("@")) for item in args.kill.split(",")
                      if item]
    except ValueError:
        parser.error(f"argument --kill: {args.kill!r} must be WORKER@STEP[,WORKER@STEP...]")
    if args.mtbf:
        args.kills = []
    for worker, step in args.kills:
        if not 0 <= worker < args.workers or step < 0:
            parser.error(f"argument --kill: {worker}@{step} names no worker of "
                         f"{args.workers} or a negative step")
    if args.mtbf:
        if args.mtbf < 0 or args.workers < 2 or args.failures < 1:
            parser.error("argument --mtbf: needs a value > 0, --workers >= 2 and "
                         "--failures >= 1")
    if len({w for w, _ in args.kills}) >= args.workers:
        parser.error("argument --kill: at least one worker must survive")
    return args


# -- one worker ---------------------------------------------------------------

def data(seed=0, n=12000, d=20, classes=4):
    import numpy as np  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=0.35, size=(classes, d))
    y = rng.integers(0, classes, size=n)
    x = (centers[y] + rng.normal(size=(n, d))).astype("float32")
    return x[:8000], y[:8000], x[8000:], y[8000:]


def work(args):
    """Trains as one worker; writes OUT_DIR/w{index}.json (and killed-{index}.txt)."""
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    out = pathlib.Path(args.worker)
    me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tfdist_ext.Strategy(elastic=True)
    x, y, x_test, y_test = data()
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    curve = []
    recovery = strategy.elastic

    def note(kind, **fields):
        """Appends an event to OUT_DIR/events.jsonl, which outlives a killed process."""
        with open(out / "events.jsonl", "a", encoding="utf-8") as events:
            events.write(json.dumps({"event": kind, "worker": me, "pid": os.getpid(),
                                     "replacement": recovery.replacement,
                                     "time": time.time(), **fields}) + "\n")

    class Log(keras.callbacks.Callback):
        steps = 0
        seen = {"failures": 0, "joins": 0, "leaves": 0}
        times = []

        def on_train_begin(self, logs=None):
            note("fit_start")

        def on_train_batch_begin(self, batch, logs=None):
            if (me, Log.steps) in args.kills:
                (out / f"killed-{me}.txt").write_text(repr(time.time()))
            Log.steps += 1

        def on_train_batch_end(self, batch, logs=None):
            if logs and "loss" in logs:
                curve.append((Log.steps - 1, time.time(), float(logs["loss"])))
            Log.times.append(time.time())
            for kind, seen in Log.seen.items():
                for change in getattr(recovery, kind)[seen:]:
                    note(kind[:-1], change=change)
                Log.seen[kind] = len(getattr(recovery, kind))
            if len(Log.times) >= 100:
                self.flush()

        def on_train_end(self, logs=None):
            self.flush()
            note("fit_end")

        @staticmethod
        def flush():
            with open(out / f"steps-{os.getpid()}.txt", "a", encoding="utf-8") as steps:
                steps.write("".join(f"{t:.4f}\n" for t in Log.times))
            Log.times = []

    kills = [tfdist_ext.elastic.KillAt(w, s) for w, s in args.kills]
    start = time.time()
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(96), epochs=args.epochs,
              verbose=0, callbacks=[Log()] + kills)
    seconds = time.time() - start
    accuracy = float(np.mean(np.argmax(np.asarray(model(x_test)), -1) == y_test))
    weights = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
    (out / f"w{me}.json").write_text(json.dumps({
        "worker": me, "accuracy": accuracy, "seconds": seconds, "start": start,
        "sha": weights.hexdigest(), "steps": Log.steps,
        "failures": strategy.elastic.failures, "members": list(strategy.elastic.members),
        "joins": strategy.elastic.joins, "replacement": strategy.elastic.replacement,
        "curve": curve}))


# -- the driver ---------------------------------------------------------------

def job(args, name, kills, out_root, killer=False):
    """Runs one job (`killer`: with the random killer); returns its exit codes,
    {worker: record} of the workers that finished and {worker: kill time}, or with
    the killer the list of its kills as (worker, time)."""
    from tfdist_ext.launch import free_ports, tf_configs  # pylint: disable=import-outside-toplevel
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    configs = tf_configs([f"127.0.0.1:{p}" for p in free_ports(args.workers)])
    kill = ",".join(f"{w}@{s}" for w, s in kills) or ""

    def start(i, tag=""):
        env = dict(os.environ, TF_CONFIG=configs[i], TFDIST_ELASTIC="1",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        command = [sys.executable, __file__, "--worker", str(out), "--workers",
                   str(args.workers), "--epochs", str(args.epochs), "--kill", kill]
        with open(out / f"w{i}{tag}.log", "w", encoding="utf-8") as log:
            return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT)

    procs = [start(i) for i in range(args.workers)]
    deadline = time.monotonic() + args.timeout
    kills_done = _random_kills(args, procs, start, out, deadline) if killer else None
    # Once a worker finished, a replacement that never got in waits for a job that
    # is gone: 30 s more at most.
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if any(p.poll() == 0 for p in procs):
            deadline = min(deadline, time.monotonic() + 30)
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
    codes = [p.wait() for p in procs]
    records = {}
    for i in range(args.workers):
        path = out / f"w{i}.json"
        if path.exists():
            records[i] = json.loads(path.read_text())
    killed = {int(p.stem.split("-")[1]): float(p.read_text()) for p in out.glob("killed-*.txt")}
    return codes, records, (kills_done if killer else killed)


def _recorded(out, workers):
    """{worker: record} of a finished job in `out`, or None."""
    paths = [out / f"w{i}.json" for i in range(workers)]
    if not all(path.exists() for path in paths):
        return None
    return {i: json.loads(path.read_text()) for i, path in enumerate(paths)}


def _random_kills(args, procs, start, out, deadline):
    """The random killer: SIGKILLs a worker in the job after exponential intervals of
    mean `args.mtbf` and starts it again; returns [(worker, time)]."""
    import random  # pylint: disable=import-outside-toplevel

    from tfdist_ext.elastic.options import REPLACEMENT_DELAY_SECONDS  # pylint: disable=import-outside-toplevel
    rng = random.Random(args.seed)
    began, kills, restarts = time.monotonic(), [], 0
    joined = {i: True for i in range(len(procs))}  # in the job (a replacement: once joined)
    next_kill = began + 10.0 + rng.expovariate(1.0 / args.mtbf)  # after start-up
    while len(kills) < args.failures and time.monotonic() < deadline:
        time.sleep(0.2)
        if any(p.poll() == 0 for p in procs):
            break  # the job ended
        for i, tag in list(joined.items()):
            if tag is not True and "joined at step" in tag.read_text(errors="replace"):
                joined[i] = True
        ready = [i for i in range(len(procs)) if joined[i] is True
                 and procs[i].poll() is None]
        if time.monotonic() < next_kill or not ready:
            continue
        victim = rng.choice(ready)
        procs[victim].kill()
        procs[victim].wait()
        kills.append((victim, time.time()))
        print(f"random killer: killed worker {victim} at {time.monotonic() - began:.1f} s",
              flush=True)
        time.sleep(REPLACEMENT_DELAY_SECONDS)
        restarts += 1
        procs[victim] = start(victim, f"-r{restarts}")
        joined[victim] = out / f"w{victim}-r{restarts}.log"
        next_kill = time.monotonic() + rng.expovariate(1.0 / args.mtbf)
    return kills


def thin(curve, points=2000):
    """Every k-th (step, time, loss) of `curve`, at most about `points` of them."""
    return curve[::max(1, len(curve) // points)]


def summarize(args, whole, broken, killed, codes):
    lowest = min(broken)
    failures = []
    for failure in broken[lowest]["failures"]:
        (dead,) = failure["dead"] if len(failure["dead"]) == 1 else (failure["dead"][0],)
        lost = {w: 1 + next((f["skipped"] for f in r["failures"]
                             if f["generation"] == failure["generation"]), 0)
                for w, r in broken.items()}
        failures.append({
            "dead": failure["dead"], "step": failure["step"] - 1, "members": failure["members"],
            "seconds_to_go_on": failure["time"] - killed[dead] if dead in killed else None,
            "steps_lost": lost})
    reference = whole[min(whole)]
    return {
        "workers": args.workers, "kills": args.kills, "epochs": args.epochs,
        "exit_codes": codes, "cores": os.cpu_count(),
        "uninterrupted": {"accuracy": reference["accuracy"], "seconds": reference["seconds"],
                          "final_loss": reference["curve"][-1][2]},
        "with_failures": {"accuracy": broken[lowest]["accuracy"],
                          "seconds": broken[lowest]["seconds"],
                          "final_loss": broken[lowest]["curve"][-1][2],
                          "survivors": sorted(broken)},
        "accuracy_points_vs_uninterrupted": 100 * (broken[lowest]["accuracy"]
                                                   - reference["accuracy"]),
        "failures": failures,
        "curves": {"uninterrupted": thin(reference["curve"]),
                   "with_failures": thin(broken[lowest]["curve"])},
    }


def summarize_random(args, whole, broken, kills, codes, out):
    """The random killer's job: per kill, seconds to go on and to full size, steps lost;
    the job's goodput.

    Membership changes and the fit's start and end come from OUT/events.jsonl, which
    every process of the job appended to (killed ones included); the curve and
    accuracy from the worker that ran longest, the step rate from every process's
    OUT/steps-PID.txt (per window, the process that completed the most steps).
    """
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    chief = min(broken.values(), key=lambda r: (r["replacement"], r["start"]))
    reference = whole[min(whole)]
    changes = {}
    for e in events:
        if e["event"] in ("failure", "join"):
            changes.setdefault((e["event"], e["change"]["generation"]), e["change"])
    all_failures = sorted((f for (kind, _), f in changes.items() if kind == "failure"),
                          key=lambda f: f["generation"])
    joins = sorted((j for (kind, _), j in changes.items() if kind == "join"),
                   key=lambda j: j["generation"])
    failures, used, unmatched = [], set(), []
    for victim, when in kills:
        failure = next((f for f in all_failures if victim in f["dead"]
                        and f["generation"] not in used and f["time"] >= when - 1), None)
        if failure is None:  # e.g. killed before the fit began: nothing to recover
            unmatched.append({"worker": victim, "time": when})
            continue
        used.add(failure["generation"])
        join = next((j for j in joins if victim in j["joined"] and j["time"] > when), None)
        failures.append({
            "dead": failure["dead"], "step": failure["step"] - 1,
            "members": failure["members"], "seconds_to_go_on": failure["time"] - when,
            "seconds_to_full_size": None if join is None else join["time"] - when,
            "steps_lost": {"0": 1 + failure["skipped"]}})
    full = [f["seconds_to_full_size"] for f in failures if f["seconds_to_full_size"]]
    began = min(e["time"] for e in events if e["event"] == "fit_start" and not e["replacement"])
    ended = max(e["time"] for e in events if e["event"] == "fit_end")
    total = len(reference["curve"])  # the fit's steps (one loss per step)
    lost = sum(1 + f["skipped"] for f in all_failures)
    goodput = (total - lost) / total * reference["seconds"] / (ended - began)
    times = [[float(t) - began for t in path.read_text().split()]
             for path in sorted(out.glob("steps-*.txt"))]
    return {
        "goodput": goodput, "steps_total": total, "steps_lost_total": lost,
        "failures_recorded": len(all_failures), "seconds": ended - began,
        "identical_weights": len({r.get("sha") for r in broken.values()}) == 1,
        "kill_times": [when - began for _, when in kills],
        "workers": args.workers, "mtbf": args.mtbf, "kills": len(kills),
        "epochs": args.epochs, "exit_codes": codes, "cores": os.cpu_count(),
        "uninterrupted": {"accuracy": reference["accuracy"], "seconds": reference["seconds"],
                          "final_loss": reference["curve"][-1][2]},
        "with_failures": {"accuracy": chief["accuracy"], "seconds": ended - began,
                          "final_loss": chief["curve"][-1][2], "survivors": sorted(broken),
                          "members": chief["members"], "worker": chief["worker"],
                          "accuracy_by_worker": {str(w): r["accuracy"]
                                                 for w, r in sorted(broken.items())}},
        "accuracy_points_vs_uninterrupted": 100 * (chief["accuracy"] - reference["accuracy"]),
        "failures": failures,
        "kills_without_failure": unmatched,
        "mean_seconds_to_go_on": sum(f["seconds_to_go_on"] for f in failures)
        / max(len(failures), 1),
        "mean_seconds_to_full_size": sum(full) / len(full) if full else None,
        "mean_steps_lost": sum(f["steps_lost"]["0"] for f in failures) / max(len(failures), 1),
        "curves": {"uninterrupted": thin(reference["curve"]),
                   "with_failures": thin(chief["curve"])},
        "step_rates": {"uninterrupted": step_rate([c[1] - reference["curve"][0][1]
                                                   for c in reference["curve"]]),
                       "with_failures": step_rate(*times)},
    }


def step_rate(*processes, window=5.0):
    """(window middle, steps per second) over windows of `window` seconds, from each
    process's step times (seconds from the fit's start): per window, the process that
    completed the most steps (every member completes every step)."""
    if not any(processes):
        return []
    counts = {}
    for times in processes:
        per = {}
        for t in times:
            per[int(t // window)] = per.get(int(t // window), 0) + 1
        for w, n in per.items():
            counts[w] = max(counts.get(w, 0), n)
    return [((w + 0.5) * window, counts.get(w, 0) / window)
            for w in range(min(counts), max(counts) + 1)]


def plot(result, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    rates = result.get("step_rates")
    fig, axes = plt.subplots(2 if rates else 1, 1, figsize=(7, 6 if rates else 3.5))
    ax = axes[0] if rates else axes
    if rates:
        for name, points in rates.items():
            axes[1].plot([p[0] for p in points], [p[1] for p in points], label=name, lw=1)
        for when in result["kill_times"]:
            axes[1].axvline(when, color="red", ls="--", lw=0.6)
        axes[1].set(xlabel="seconds from the fit's start (red: a kill)",
                    ylabel="training steps / s (5 s windows)",
                    title=f"goodput {result['goodput']:.3f} ({len(result['failures'])} "
                          f"failures, mean interval {result['mtbf']:g} s)")
        axes[1].legend(fontsize=7)
    for name, curve in result["curves"].items():
        ax.plot([c[0] for c in curve], [c[2] for c in curve], label=name, lw=1)
    ax.set_yscale("log")
    for i, f in enumerate(result["failures"]):
        ax.axvline(f["step"], color="red", ls="--", lw=0.8)
        ax.text(f["step"], ax.get_ylim()[1] * 0.6 ** (i % 4), f" worker {f['dead']} killed",
                color="red", fontsize=7, va="top")
    ax.set(xlabel="training step", ylabel="loss (running mean of the epoch, log)",
           title=f"{result['workers']} workers, elastic: accuracy "
                 f"{result['with_failures']['accuracy']:.3f} with failures, "
                 f"{result['uninterrupted']['accuracy']:.3f} without")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        work(args)
        return 0
    import tempfile  # pylint: disable=import-outside-toplevel
    root = pathlib.Path(args.root or tempfile.mkdtemp(prefix="tfdist-elastic-bench-"))
    whole = _recorded(root / f"uninterrupted-w{args.workers}-e{args.epochs}", args.workers)
    if whole is None:
        _, whole, _ = job(args, f"uninterrupted-w{args.workers}-e{args.epochs}", [], root)
    if args.mtbf:
        return random_killer(args, whole, root)
    codes, broken, killed = job(args, f"with_failures-{int(time.time())}", args.kills, root)
    dead = {w for w, _ in args.kills}
    expected = [w for w in range(args.workers) if w not in dead]
    if sorted(whole) != list(range(args.workers)) or sorted(broken) != expected:
        print(f"FAIL: jobs did not finish as expected (uninterrupted {sorted(whole)}, with "
              f"failures {sorted(broken)} of {expected}); logs in {root}", flush=True)
        return 1
    result = summarize(args, whole, broken, killed, codes)
    for f in result["failures"]:
        print(f"worker(s) {f['dead']} killed at step {f['step']}: survivors {f['members']} "
              f"went on {f['seconds_to_go_on']:.2f} s later; steps lost {f['steps_lost']}",
              flush=True)
    print(f"accuracy {result['with_failures']['accuracy']:.4f} with failures, "
          f"{result['uninterrupted']['accuracy']:.4f} uninterrupted "
          f"({result['accuracy_points_vs_uninterrupted']:+.2f} points); wall-clock "
          f"{result['with_failures']['seconds']:.1f} s vs "
          f"{result['uninterrupted']['seconds']:.1f} s", flush=True)
    return _write(result, args)


def _write(result, args):
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    if args.png:
        plot(result, args.png)
    return 0


def random_killer(args, whole, root):
    name = f"with_failures-{int(time.time())}"
    codes, broken, kills = job(args, name, [], root, killer=True)
    everyone = list(range(args.workers))
    if sorted(whole) != everyone or sorted(broken) != everyone or len(kills) < args.failures:
        print(f"FAIL: {len(kills)} of {args.failures} kills (raise --epochs if the job ended "
              f"first); finished: uninterrupted {sorted(whole)}, with failures "
              f"{sorted(broken)}; logs in {root}", flush=True)
        return 1
    result = summarize_random(args, whole, broken, kills, codes, root / name)
    for f in result["failures"]:
        print(f"worker(s) {f['dead']} killed at step {f['step']}: went on "
              f"{f['seconds_to_go_on']:.2f} s later, full size after "
              f"{f['seconds_to_full_size'] or float('nan'):.1f} s; steps lost "
              f"{f['steps_lost']['0']}", flush=True)
    for k in result["kills_without_failure"]:
        print(f"worker {k['worker']} killed at {time.ctime(k['time'])}: no member recorded a "
              "failure (a kill before the fit began needs no recovery)", flush=True)
    print(f"goodput {result['goodput']:.3f}: {result['steps_lost_total']} of "
          f"{result['steps_total']} steps lost; identical weights at the end: "
          f"{result['identical_weights']}", flush=True)
    print(f"{len(result['failures'])} failures: mean {result['mean_seconds_to_go_on']:.2f} s to "
          f"go on, {result['mean_seconds_to_full_size'] or float('nan'):.1f} s to full size, "
          f"{result['mean_steps_lost']:.1f} steps lost; accuracy "
          f"{result['with_failures']['accuracy']:.4f} with failures, "
          f"{result['uninterrupted']['accuracy']:.4f} uninterrupted "
          f"({result['accuracy_points_vs_uninterrupted']:+.2f} points)", flush=True)
    return _write(result, args)


if __name__ == "__main__":
    sys.exit(main())
