"""One Keras distribution-API script on TensorFlow (tfdist_ext) and on JAX, side by side.

    python bench/keras_distribution.py --jax-python /path/to/venv/bin/python \
        --json docs/results/keras_distribution.json --png docs/results/keras_distribution.png

Runs tests/workers/keras_distribution_fit.py (an MLP and a small CNN, only
`keras` names plus `import tfdist_ext`) three ways: 2 TensorFlow workers
under `tfdist-run`, 2 JAX processes started with Keras' KERAS_DISTRIBUTION_*
variables (JAX's Gloo CPU collectives), and one TensorFlow process. Writes
each run's per-epoch losses, evaluation, weight checksum and wall time, and
the largest relative difference of the losses against the one-process run.
`--jax-python` is a Python with jax[cpu], Keras and TensorFlow (for tf.data)
installed (the `bench` extra); without it the JAX run is skipped.
"""

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  pylint: disable=wrong-import-position  (bench/, above)

SCRIPT = ROOT / "tests" / "workers" / "keras_distribution_fit.py"
MODELS = ("mlp", "cnn")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(commands, envs, out, timeout):
    start = time.monotonic()
    procs = [subprocess.Popen(c, env=e, cwd=ROOT, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                              stderr=subprocess.STDOUT, text=True)
             for c, e in zip(commands, envs)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    seconds = time.monotonic() - start
    if any(p.returncode for p in procs):
        raise RuntimeError("a run failed:\n" + "\n".join(log[-3000:] for log in logs))
    return json.loads((out / "w0.json").read_text()), seconds


def run_tf(out, workers, timeout):
    target = str(out / "w{worker}.json")
    if workers == 1:
        command = [sys.executable, str(SCRIPT), target, "scope"]
    else:
        command = [sys.executable, "-m", "tfdist_ext.launch", "-np", str(workers), "--",
                   sys.executable, str(SCRIPT), target, "scope"]
    return _run([command], [_env()], out, timeout)


def run_jax(out, python, workers, timeout):
    ports = [_port() for _ in range(workers)]
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    envs = [_env(KERAS_BACKEND="jax", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                 KERAS_DISTRIBUTION_JOB_ADDRESSES=addresses,
                 KERAS_DISTRIBUTION_NUM_PROCESSES=str(workers),
                 KERAS_DISTRIBUTION_PROCESS_ID=str(i)) for i in range(workers)]
    commands = [[python, str(SCRIPT), str(out / "w{worker}.json"), "scope"]] * workers
    return _run(commands, envs, out, timeout)


def _relative(got, want):
    return max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want))


def plot(report, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, axes = plt.subplots(1, len(MODELS), figsize=(10, 3.6))
    styles = {"tf_1": ("k", "-", "TF, 1 process"), "tfdist_2": ("C0", "--", "TF + tfdist_ext, 2"),
              "jax_2": ("C3", ":", "Keras on JAX, 2")}
    for axis, model in zip(axes, MODELS):
        for key, (color, line, label) in styles.items():
            if key in report["runs"]:
                losses = report["runs"][key][model]["loss"]
                axis.plot(range(1, len(losses) + 1), losses, color=color, linestyle=line,
                          marker="o", label=label)
        axis.set_title(f"{model}: loss per epoch")
        axis.set_xlabel("epoch")
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jax-python", default=None,
                        help="a Python with jax[cpu], keras and tensorflow (skipped without)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=300)
    harness.add_arguments(parser)
    args = parser.parse_args()
    work = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"keras_distribution_{os.getpid()}"
    runs, seconds = {}, {}
    for key, launch in (("tf_1", lambda out: run_tf(out, 1, args.timeout)),
                        (f"tfdist_{args.workers}",
                         lambda out: run_tf(out, args.workers, args.timeout)),
                        (f"jax_{args.workers}",
                         lambda out: run_jax(out, args.jax_python, args.workers, args.timeout))):
        if key.startswith("jax") and not args.jax_python:
            print("bench/keras_distribution.py: no --jax-python; the JAX run is skipped")
            continue
        out = work / key
        out.mkdir(parents=True)
        runs[key], seconds[key] = launch(out)
        print(f"{key}: {seconds[key]:.1f} s, losses "
              + ", ".join(f"{m} {runs[key][m]['loss']}" for m in MODELS))
    reference = runs["tf_1"]
    report = {
        "script": str(SCRIPT.relative_to(ROOT)), "workers": args.workers,
        "seconds": seconds, "runs": runs,
        "max_relative_loss_difference_to_tf_1": {
            key: {m: _relative(run[m]["loss"], reference[m]["loss"]) for m in MODELS}
            for key, run in runs.items() if key != "tf_1"}}
    print(json.dumps(report["max_relative_loss_difference_to_tf_1"]))
    harness.write(report, args.json, args.png, plot=lambda path: plot(report, path))


if __name__ == "__main__":
    main()
