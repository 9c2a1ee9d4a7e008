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

`--mtbf SECONDS` is a random killer instead (torchft's punisher): once every
worker's fit has begun, after exponentially distributed intervals of that mean
it SIGKILLs a random worker that is in the job (worker 0 included), and starts
it again with its TF_CONFIG after
`tfdist_ext.elastic.options.REPLACEMENT_DELAY_SECONDS`; the
replacement rejoins. It never kills the last worker in the job (a job of none
would restart from a checkpoint, which this does not measure): a kill due then
waits until a replacement is in. Stops killing after `--failures`. Reported per failure as well: the
seconds from the kill to the job's return to full size; a kill no member recorded a
failure for (one before the workers' fit began) is listed in `kills_without_failure`.
Goodput (torchft's measure): the steps whose result was kept (all of the fit's
steps but the discarded and skipped ones) over the steps the uninterrupted job
would have run in the same wall-clock time, i.e. (kept / total) x (uninterrupted
seconds / seconds with failures); `identical_weights` says whether every worker
ended with the same weights. The PNG's second panel is the step rate over time
of both jobs with the kills marked. `admission_pauses`: per replacement's
admission, the seconds the members did not step beyond their median step.

`--preload tensorflow,keras` forks the workers and the replacements from a template that
imported those modules once (`tfdist_ext.launch.preload`, as `tfdist-run --preload`):
a replacement then rejoins without importing TensorFlow again.

`--cpus-per-worker C` caps every worker and replacement at C cores
(`tfdist_ext.launch.cpucap`): on a machine with fewer cores than workers, the
survivors of a failure would otherwise step faster than the full job, and
goodput above 1 would follow.

The model: an MLP (20-H-H-4, H = `--hidden`, 128 by default) on a synthetic
4-class problem with overlapping classes (`--samples` training points, 8,000 by
default, and half as many for testing), momentum SGD 0.05/0.9, global batch
`--batch` (96), split by Keras' input among the workers. With H = 128 and
batch 96 the step is mostly communication latency and per-step overhead (a
ring of two steps faster than a ring of three); raise H and the batch until
compute dominates, so that the survivors of a failure carry the dead worker's
share of the batch, as on a real cluster.
"""

import argparse
import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  (bench/, above)
from elastic_killer import random_kills  # noqa: E402  (bench/, above)
from elastic_report import plot, summarize, summarize_random  # noqa: E402  (bench/, above)


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
    parser.add_argument("--batch", type=int, default=96, help="the global batch size")
    parser.add_argument("--hidden", type=int, default=128,
                        help="width of the MLP's two hidden layers (raise it and --batch "
                             "for a compute-bound step)")
    parser.add_argument("--samples", type=int, default=8000,
                        help="training samples of the synthetic problem (half as many more "
                             "are for testing); raise it for long runs, so that the model "
                             "does not fit the training set long before the end")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument("--preload", default="",
                        help="fork the workers and replacements from a template that "
                             "imported these modules once (tensorflow,keras), as "
                             "`tfdist-run --preload` does; default: fresh processes")
    parser.add_argument("--cpus-per-worker", type=float, default=0.0,
                        help="cap each worker (and its replacements) at this many cores with "
                             "a cgroup, so that a death does not speed up the others on a "
                             "shared machine (root; 0: no cap)")
    parser.add_argument("--root", default=None,
                        help="keep the jobs' logs and records here (default: a temporary "
                             "folder); an uninterrupted job already recorded there with the "
                             "same --workers and --epochs is reused")
    harness.add_arguments(parser)
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

def data(samples=8000, seed=0, d=20, classes=4):
    """`samples` training and `samples // 2` test points of the 4-class problem."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    n = samples + samples // 2
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=0.35, size=(classes, d))
    y = rng.integers(0, classes, size=n)
    x = (centers[y] + rng.normal(size=(n, d))).astype("float32")
    return x[:samples], y[:samples], x[samples:], y[samples:]


def work(args):
    """Trains as one worker; writes OUT_DIR/w{index}.json (and killed-{index}.txt)."""
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    out = pathlib.Path(args.worker)
    me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tfdist_ext.Strategy(elastic=True)
    x, y, x_test, y_test = data(args.samples)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)),
                                  keras.layers.Dense(args.hidden, activation="relu"),
                                  keras.layers.Dense(args.hidden, activation="relu"),
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

    steps_per_epoch = -(-len(x) // args.batch)

    class Log(keras.callbacks.Callback):
        steps = 0
        epoch = position = 0
        seen = {"failures": 0, "joins": 0, "leaves": 0}
        paused = set()  # generations whose admission pause is noted
        times = []

        def on_train_begin(self, logs=None):
            note("fit_start")

        def on_epoch_begin(self, epoch, logs=None):
            Log.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            Log.position = Log.epoch * steps_per_epoch + batch  # a replacement starts late
            if (me, Log.steps) in args.kills:
                (out / f"killed-{me}.txt").write_text(repr(time.time()))
            Log.steps += 1

        def on_train_batch_end(self, batch, logs=None):
            if logs and "loss" in logs:
                curve.append((Log.position, time.time(), float(logs["loss"])))
            Log.times.append(time.time())
            # Each change at once (a death before the next step must not lose a join),
            # an admission's pause again once complete (after the members' next step).
            for kind, seen in Log.seen.items():
                changes = getattr(recovery, kind)
                for change in changes[seen:]:
                    note(kind[:-1], change=change)
                Log.seen[kind] = len(changes)
            for change in recovery.joins:
                if ("step" in change.get("pause", {})
                        and change["generation"] not in Log.paused):
                    Log.paused.add(change["generation"])
                    note("join_pause", change=change)
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
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch), epochs=args.epochs,
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
    from tfdist_ext.launch.cpucap import CpuCaps  # pylint: disable=import-outside-toplevel

    if args.cpus_per_worker:
        CpuCaps.remove_leftovers("bench")
    caps = (CpuCaps(f"bench-{os.getpid()}-{time.monotonic_ns()}", args.cpus_per_worker)
            if args.cpus_per_worker else contextlib.nullcontext())

    from tfdist_ext.launch import preload  # pylint: disable=import-outside-toplevel
    common = dict(os.environ, TFDIST_ELASTIC="1",
                  PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    common.pop("TF_CONFIG", None)
    modules = preload.modules_from(args.preload)
    template = preload.Template(modules, common) if modules else None

    def start(i, tag=""):
        command = [__file__, "--worker", str(out), "--workers",
                   str(args.workers), "--epochs", str(args.epochs), "--kill", kill,
                   "--hidden", str(args.hidden), "--batch", str(args.batch),
                   "--samples", str(args.samples)]
        env = dict(common, TF_CONFIG=configs[i])
        with open(out / f"w{i}{tag}.log", "w", encoding="utf-8") as log:
            if template is not None:
                proc = template.start(command, env, cwd=str(ROOT), output=log.fileno())
            else:
                proc = subprocess.Popen([sys.executable, *command], env=env, cwd=ROOT,
                                        stdout=log, stderr=subprocess.STDOUT)
        if args.cpus_per_worker:
            caps.add(i, proc.pid)
        return proc

    try:
        with caps:
            return _supervise(args, out, start, killer)
    finally:
        if template is not None:
            template.close()


def _supervise(args, out, start, killer):
    procs = [start(i) for i in range(args.workers)]
    deadline = time.monotonic() + args.timeout
    kills_done = random_kills(args, procs, start, out, deadline) if killer else None
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


def uninterrupted_name(args):
    cap = f"-c{args.cpus_per_worker:g}" if args.cpus_per_worker else ""
    width = (f"-h{args.hidden}" if args.hidden != 128 else "") + (
        f"-b{args.batch}" if args.batch != 96 else "") + (
        f"-s{args.samples}" if args.samples != 8000 else "")
    return f"uninterrupted-w{args.workers}-e{args.epochs}{cap}{width}"


def _recorded(out, workers):
    """{worker: record} of a finished job in `out`, or None."""
    paths = [out / f"w{i}.json" for i in range(workers)]
    if not all(path.exists() for path in paths):
        return None
    return {i: json.loads(path.read_text()) for i, path in enumerate(paths)}


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        work(args)
        return 0
    import tempfile  # pylint: disable=import-outside-toplevel
    root = pathlib.Path(args.root or tempfile.mkdtemp(prefix="tfdist-elastic-bench-"))
    whole = _recorded(root / uninterrupted_name(args), args.workers)
    if whole is None:
        _, whole, _ = job(args, uninterrupted_name(args), [], root)
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
    result.update(samples=args.samples)
    harness.write(result, args.json, args.png, plot=lambda path: plot(result, path))
    return 0


def random_killer(args, whole, root):
    name = f"with_failures-{int(time.time())}"
    codes, broken, kills = job(args, name, [], root, killer=True)
    if sorted(whole) != list(range(args.workers)) or not broken:
        print(f"FAIL: finished: uninterrupted {sorted(whole)}, with failures "
              f"{sorted(broken)}; logs in {root}", flush=True)
        return 1
    if len(kills) < args.failures:  # reported all the same: `kills` says how many
        print(f"note: the job ended after {len(kills)} of {args.failures} kills (raise "
              f"--epochs for more); finished: {sorted(broken)}", flush=True)
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
