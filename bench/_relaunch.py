"""Runs a benchmark script again as W workers under `python -m tfdist_ext.launch`."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def relaunch(script, workers, worker_args, timeout, link="none", check=False):
    """Launches `python script *worker_args` on `workers` workers; raises on failure.

    Args:
        script: Path of the benchmark script (its worker mode reads `worker_args`).
        workers: Number of worker processes.
        worker_args: Command-line arguments of every worker.
        timeout: Seconds before the launcher stops the job.
        link: A `--link-bandwidth` rate for the shaped test bed (root), or "none".
        check: Measure the shaped link first (`--check`).
    """
    command = [sys.executable, "-m", "tfdist_ext.launch", "-np", str(workers),
               "--timeout", str(timeout)]
    if link != "none":
        command += ["--link-bandwidth", link] + (["--check"] if check else [])
    command += ["--", sys.executable, str(pathlib.Path(script).resolve()), *map(str, worker_args)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_CONFIG", None)
    code = subprocess.run(command, env=env, cwd=ROOT, check=False).returncode
    if code != 0:
        raise RuntimeError(f"`{' '.join(command)}` exited with code {code}")
