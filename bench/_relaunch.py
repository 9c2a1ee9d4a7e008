"""Runs a benchmark script again as W workers under `python -m tfdist_ext.launch`.

Also the pieces such benchmarks share: the forwarded arguments, a clock of
batch starts and an emulated host's device. The commit measured, the machine
and the result files are bench/harness.py's.
"""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def relaunch(script, workers, worker_args, timeout, link="none", check=False, hosts=None,
             latency=None, servers=0):
    """Launches `python script *worker_args` on `workers` workers; raises on failure.

    Args:
        script: Path of the benchmark script (its worker mode reads `worker_args`).
        workers: Number of worker processes.
        worker_args: Command-line arguments of every worker.
        timeout: Seconds before the launcher stops the job.
        link: A `--link-bandwidth` rate for the shaped test bed (root), or "none".
        check: Measure the shaped link first (`--check`).
        hosts: "HxW" to spread the workers over H emulated hosts (`-H HxW`; the
            links between hosts are the shaped ones), or None.
        latency: A `--link-latency` delay (e.g. "100ms"), or None.
        servers: Parameter servers for sync="async" (`--ps`); they run the
            script too.
    """
    where = ["-H", hosts] if hosts else ["-np", str(workers)]
    command = [sys.executable, "-m", "tfdist_ext.launch", *where, "--timeout", str(timeout)]
    if link != "none":
        command += ["--link-bandwidth", link]
    if latency:
        command += ["--link-latency", latency]
    if check and (link != "none" or latency):
        command += ["--check"]
    if servers:
        command += ["--ps", str(servers)]
    command += ["--", sys.executable, str(pathlib.Path(script).resolve()), *map(str, worker_args)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_CONFIG", None)
    code = subprocess.run(command, env=env, cwd=ROOT, check=False).returncode
    if code != 0:
        raise RuntimeError(f"`{' '.join(command)}` exited with code {code}")


def forward(args, keys):
    """``["--key", "value", ...]`` for the parsed `args` named in `keys` (in that order)."""
    out = []
    for key in keys:
        out += [f"--{key}", str(getattr(args, key.replace("-", "_")))]
    return out


def step_clock(keras):
    """A Keras callback whose `times` lists `time.perf_counter()` at every batch start.

    The steps' durations are ``numpy.diff(clock.times)``.
    """
    import time  # pylint: disable=import-outside-toplevel

    class StepClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.times.append(time.perf_counter())

    return StepClock()


def host_device():
    """This network namespace's device other than loopback (an emulated host's veth):
    Gloo binds to the hostname's address (127.0.0.1) unless GLOO_SOCKET_IFNAME names it."""
    import socket  # pylint: disable=import-outside-toplevel
    return next(name for _, name in socket.if_nameindex() if name != "lo")

