"""Training step time of one model in every system a user would pick, in one run.

    python bench/step.py --json docs/results/step.json --png docs/results/step.png
    python bench/step.py --models mlp --workers 1,2 --systems tfdist,torch_ddp

The same model, optimizer (Adam 1e-3), batch per worker (`--batch`) and
random data in each system; the global batch grows with the workers. Systems:

* ``keras``, ``keras_xla``: plain Keras on TF, no strategy (one process),
  without and with `jit_compile=True`;
* ``tfdist``, ``tfdist_xla``: `tfdist_ext.Strategy()` under
  ``tfdist-run -np W`` with default settings;
* ``torch_ddp``: PyTorch `DistributedDataParallel` with Gloo under torchrun
  (the `bench` extra; skipped when torch is missing);
* ``keras_jax``: Keras on JAX, `keras.distribution.DataParallel` across W
  processes (JAX's Gloo CPU collectives; skipped when jax is missing).

With ``--hosts HxW [--link-bandwidth RATE]`` (root) the tfdist and torch_ddp workers
run on H emulated hosts (`tfdist-run -H`, one network namespace each), DDP's Gloo on
the same shaped links.

Optional rows for the thread-pool choice of co-located workers:
``tfdist_threads_machine`` (TF's pools sized for the whole machine in every
worker, as before tfdist_ext split the cores) and ``tfdist_inter2``
(intra-op pool split, two inter-op threads). Optional rows for the cross-host
path: ``tfdist_fixed1mb`` (gradients in buckets of at most 1 MiB, sent while
backprop goes on, as DDP's first bucket) and ``tfdist_nospin`` (the UCX
executor sleeps at once when it waits, ``TFDIST_UCX_SPIN_US=0``).

Timing, the same in every system: after `--warmup` steps, each of `--repeats`
measurements (one Keras `fit` call, or a PyTorch loop) runs `--skip` steps and
then `--steps` timed steps, from the start of the first timed step to a host
synchronisation after the last (Keras' epoch end reads the metrics, which
waits for JAX's asynchronous steps too): the steady step time without `fit`'s
set-up. The chief's (rank 0's) figure is reported: min and median over all
measurements. The machine's speed drifts over minutes, so every system is
launched once per round for `--rounds` rounds, and tfdist_ext on one worker
also times plain Keras in the same process, alternating measurements
(``keras_with_tfdist`` rows; `x_keras_same_process` is the median of the
paired ratios); with `--paired-ddp` the tfdist_ext workers also join a Gloo
group and time PyTorch DDP alternately with `fit` (``torch_ddp_with_tfdist``,
`x_torch_ddp_same_process`). Models (`bench/step_models.py`, the PyTorch twins in
`step_torch.py`): "mlp" (Dense 40-1024-1024-10, 1.1M parameters), "cnn" (the
example's 1-D CNN, 26k parameters), "resnet20" (CIFAR ResNet-20), "transformer" (a
text classifier with a 20,000-token embedding, sequences of 128) and "gru".
"""

import argparse
import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  (bench/, on the path above)
import step_models  # noqa: E402
import step_report  # noqa: E402
import step_torch  # noqa: E402

SYSTEMS = ("keras", "keras_xla", "tfdist", "tfdist_xla", "torch_ddp", "keras_jax")
EXTRA_SYSTEMS = ("tfdist_threads_machine", "tfdist_inter2", "tfdist_fixed1mb", "tfdist_nospin")
# `tfdist_ext.Strategy` arguments of the systems that differ from tfdist only in them.
STRATEGY_ARGS = {"tfdist_fixed1mb": {"bucketing": {"name": "fixed", "bytes_per_bucket": 1 << 20}}}
ONE_PROCESS = step_report.ONE_PROCESS
MODELS = step_models.MODELS


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, from {SYSTEMS + EXTRA_SYSTEMS}")
    parser.add_argument("--batch", type=int, default=None,
                        help="samples per worker per step (default: each model's, "
                             "step_models.BATCH)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3,
                        help="launches of every system, round-robin")
    parser.add_argument("--hosts", default=None, metavar="HxW",
                        help="tfdist and torch_ddp workers on H emulated hosts of W workers "
                             "(tfdist-run -H; needs root); the worker count is H x W")
    parser.add_argument("--link-bandwidth", default=None, metavar="RATE",
                        help="with --hosts: shape the links between hosts (10gbit, 1gbit)")
    parser.add_argument("--paired-ddp", action="store_true",
                        help="tfdist also times PyTorch DDP in its own worker processes")
    harness.add_arguments(parser, repeats=2, repeats_help="measurements per launch")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        if name not in MODELS:
            parser.error(f"--models: unknown model {name!r}; choose from {MODELS}")
    for name in args.systems.split(","):
        if name not in SYSTEMS + EXTRA_SYSTEMS:
            parser.error(f"--systems: unknown system {name!r}; choose from "
                         f"{SYSTEMS + EXTRA_SYSTEMS}")
    if args.hosts and not args.worker:
        crossing = {"tfdist", "tfdist_xla", "torch_ddp", "tfdist_fixed1mb", "tfdist_nospin"}
        if not set(args.systems.split(",")) <= crossing:
            parser.error(f"--hosts: only {sorted(crossing)} run across emulated hosts; "
                         f"received --systems {args.systems}")
        h, _, w = args.hosts.partition("x")
        args.workers = str(int(h) * int(w))
    return args


def measure_ms(run, args):
    """One measurement in ms per step: `run(skip, steps)` returns the timed seconds."""
    return run(args.skip, args.steps) / args.steps * 1e3


def _clock(keras, skip):
    """A callback: `seconds` from the start of batch `skip` to the (synchronised) epoch end."""
    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.start = self.seconds = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == skip:
                self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            float(next(iter(logs.values())))  # waits for the last step
            self.seconds = time.perf_counter() - self.start

    return Clock()


def _keras_runner(keras, tf, name, args, world, scope=None, jit=False):
    """`run(skip, steps)` -> seconds: `fit` of model `name`, built under `scope`."""
    keras.utils.set_random_seed(0)
    with scope() if scope else contextlib.nullcontext():
        model = step_models.keras_model(keras, name)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=True if jit else "auto")  # "auto": XLA on JAX, not on TF/CPU
    x, y = step_models.data(name)
    batch = args.batch or step_models.BATCH[name]
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch * world)

    def run(skip, steps):
        clock = _clock(keras, skip)
        model.fit(data, epochs=1, steps_per_epoch=skip + steps, verbose=0, callbacks=[clock])
        return clock.seconds

    run(0, args.warmup)
    return run


def keras_worker(args, system, world):
    """plain Keras (TF or JAX backend) or tfdist_ext: ms per step for each model.

    tfdist_ext on one worker also times plain Keras (same jit setting) in the
    same process, alternating repeats with it ("<model>@keras"), and with
    `--paired-ddp` PyTorch DDP in the same worker processes
    ("<model>@torch_ddp"): their ratios do not depend on how fast the machine
    was during each launch.
    """
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    scope = None
    if system.startswith("tfdist"):
        import tfdist_ext  # pylint: disable=import-outside-toplevel
        scope = tfdist_ext.Strategy(**STRATEGY_ARGS.get(system, {})).scope
    elif system == "keras_jax" and world > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    jit = system.endswith("_xla")
    results = {}
    torch_rank = None
    if scope is not None and args.paired_ddp and system == "tfdist":
        torch_rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        if not step_torch.join(args, torch_rank, world):
            torch_rank = None
    for name in args.models.split(","):
        runs = {name: _keras_runner(keras, tf, name, args, world, scope, jit)}
        if scope is not None and world == 1:
            runs[f"{name}@keras"] = _keras_runner(keras, tf, name, args, world, None, jit)
        if torch_rank is not None:
            runs[f"{name}@torch_ddp"] = step_torch.runner(name, args, torch_rank)
        for key in runs:
            results[key] = []
        for _ in range(args.repeats):
            for key, run in runs.items():
                results[key].append(measure_ms(run, args))
    return results


def worker_main(args):
    """A worker of one system: writes {"model": [ms per repeat]} to OUT/w<rank>.json."""
    system = args.worker
    if system == "torch_ddp":
        rank, world, results = step_torch.worker(args, measure_ms)
    elif system == "keras_jax":
        import jax  # pylint: disable=import-outside-toplevel
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        import keras  # pylint: disable=import-outside-toplevel
        rank, world = args.rank, args.world
        if world > 1:
            keras.distribution.initialize(f"127.0.0.1:{args.port}", world, rank)
        results = keras_worker(args, system, world)
    elif system.startswith("tfdist"):
        config = json.loads(os.environ["TF_CONFIG"])
        rank, world = config["task"]["index"], len(config["cluster"]["worker"])
        results = keras_worker(args, system, world)
    else:
        rank, world = 0, 1
        results = keras_worker(args, system, 1)
    path = pathlib.Path(args.out) / f"w{rank}.json"
    path.write_text(json.dumps({"world": world, "results": results}))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def launch(args, system, workers, out_dir):
    """Runs `system` on `workers` processes; returns the chief's {"model": [ms...]}."""
    common = [str(pathlib.Path(__file__).resolve()), "--worker", system, "--out", out_dir,
              "--models", args.models, "--steps", str(args.steps),
              "--skip", str(args.skip), "--warmup", str(args.warmup),
              "--repeats", str(args.repeats)] + (["--batch", str(args.batch)] if args.batch else [])
    hosts = ((["-H", args.hosts] + (["--link-bandwidth", args.link_bandwidth]
                                    if args.link_bandwidth else [])) if args.hosts else [])
    # Emulated hosts share this machine's cores: every system gets cores / workers threads.
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    shared = (dict(TF_NUM_INTRAOP_THREADS=threads, TF_NUM_INTEROP_THREADS=threads,
                   OMP_NUM_THREADS=threads) if args.hosts else {})
    if system == "torch_ddp" and args.hosts:  # DDP's workers in the same namespaces
        commands = [[sys.executable, "-m", "tfdist_ext.launch", *hosts, "--timeout",
                     str(args.timeout), "--", sys.executable, *common, "--port", "29500"]]
        env = _env(**shared)
    elif system == "torch_ddp":
        commands = [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                     f"--nproc-per-node={workers}", *common]]
        env = _env()
    elif system == "keras_jax":
        port = _free_port()
        commands = [[sys.executable, *common, "--rank", str(rank), "--world", str(workers),
                     "--port", str(port)] for rank in range(workers)]
        env = _env(KERAS_BACKEND="jax")
    elif system in ONE_PROCESS:
        commands = [[sys.executable, *common]]
        env = _env()
    else:
        paired = (["--paired-ddp", "--port", str(_free_port())]
                  if args.paired_ddp and system == "tfdist" else [])
        commands = [[sys.executable, "-m", "tfdist_ext.launch", "-np", str(workers), *hosts,
                     "--timeout", str(args.timeout), "--", sys.executable, *common, *paired]]
        cores = str(os.cpu_count())
        env = _env(**shared, **{"tfdist_threads_machine": {"TF_NUM_INTRAOP_THREADS": cores,
                                                 "TF_NUM_INTEROP_THREADS": cores},
                      "tfdist_inter2": {"TF_NUM_INTRAOP_THREADS": str(
                          max(1, os.cpu_count() // workers)), "TF_NUM_INTEROP_THREADS": "2"},
                      "tfdist_nospin": {"TFDIST_UCX_SPIN_US": "0"},
                      }.get(system, {}))
    processes = [subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for command in commands]
    failed = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            raise RuntimeError(f"{system} at {workers} workers: no result in {args.timeout} s")
        if process.returncode != 0:
            failed.append(err[-3000:])
    if failed:
        raise RuntimeError(f"{system} at {workers} workers failed:\n{failed[0]}")
    return json.loads((pathlib.Path(out_dir) / "w0.json").read_text())["results"]


def _launch_twice(args, system, workers, failures):
    """`launch`, once more if it fails; {} (and the error in `failures`) if both fail, so
    one crash of a baseline does not end a long run."""
    for attempt in range(2):
        with tempfile.TemporaryDirectory() as out_dir:
            try:
                return launch(args, system, workers, out_dir)
            except RuntimeError as err:
                failures.setdefault(f"{system}@{workers}", []).append(str(err)[-1500:])
                print(f"{system} at {workers} workers failed (attempt {attempt + 1} of 2): "
                      f"{str(err).splitlines()[-1][:200]}", flush=True)
    return {}


def available(system):
    """Why `system` cannot run here, or None."""
    module = {"torch_ddp": "torch", "keras_jax": "jax"}.get(system)
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError:
        return f"{module} is not installed (pip install {module})"
    return None


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    skipped, times, failures = {}, {}, {}
    for system in args.systems.split(","):
        reason = available(system)
        if reason:
            skipped[system] = reason
            print(f"skipping {system}: {reason}", flush=True)
    systems = [s for s in args.systems.split(",") if s not in skipped]
    for round_index in range(args.rounds):
        for system in systems:
            counts = [1] if system in ONE_PROCESS else [int(w) for w in args.workers.split(",")]
            for workers in counts:
                results = _launch_twice(args, system, workers, failures)
                for key, ms in results.items():
                    model, _, paired = key.partition("@")
                    name = f"{paired}_with_{system}" if paired else system
                    times.setdefault((name, model, workers), []).extend(ms)
                    print(f"round {round_index + 1}: {name:<26} {model:<4} {workers} workers: "
                          + " ".join(f"{t:.2f}" for t in ms) + " ms/step", flush=True)
    rows = []
    for (system, model, workers), ms in times.items():
        ordered = sorted(ms)
        median = float(np.median(ordered))
        batch = args.batch or step_models.BATCH[model]
        rows.append({"system": system, "model": model, "workers": workers, "ms": ms,
                     "ms_min": ordered[0], "ms_median": median, "batch_per_worker": batch,
                     "samples_per_s": workers * batch / median * 1e3})
    rows = step_report.summarize(rows)
    cores = os.cpu_count()
    batches = args.batch or {m: step_models.BATCH[m] for m in args.models.split(",")}
    print(f"\nsamples per worker per step: {batches}, {cores} CPU cores, {args.rounds} "
          f"rounds x {args.repeats} repeats of {args.steps} steps (median / min ms per step)")
    header = f"{'system':<28} {'model':<5} {'W':>2} {'median':>8} {'min':>8}"
    ratio_keys = ("x_keras", "x_keras_same_process", "x_torch_ddp",
                  "x_torch_ddp_same_process", "x_keras_jax")
    print(header + "".join(f" {k:>12}" for k in ratio_keys))
    for row in rows:
        print(f"{row['system']:<28} {row['model']:<5} {row['workers']:>2} "
              f"{row['ms_median']:>8.2f} {row['ms_min']:>8.2f}"
              + "".join(f" {row.get(k, float('nan')):>12.2f}" for k in ratio_keys))
    xlabel = "workers (processes on this host)"
    if args.hosts:
        link = f", links {args.link_bandwidth}" if args.link_bandwidth else ""
        xlabel = f"workers ({args.hosts} emulated hosts{link})"
    harness.write({"args": {k: v for k, v in vars(args).items()
                            if k not in ("worker", "out", "rank", "world", "port")},
                   "cpu_cores": cores, "skipped": skipped, "failures": failures, "rows": rows},
                  args.json, args.png,
                  plot=lambda path: step_report.plot(
                      rows, path, f"samples/worker/step {batches}, {cores} cores", xlabel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
