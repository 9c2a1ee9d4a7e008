"""The elastic tests' jobs: elastic_fit.py's workers as plain TF_CONFIG processes."""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, end_processes
from tfdist_ext.elastic.options import REPLACEMENT_DELAY_SECONDS
from tfdist_ext.launch import free_ports, tf_configs
from tfdist_ext.ops import ucx as ucx_ops

WORKER = ROOT / "tests" / "workers" / "elastic_fit.py"
NO_UCX = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")


def start(configs, index, out, log, *args, env=None):
    env = dict(os.environ, TF_CONFIG=configs[index], PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen([sys.executable, str(WORKER), str(out), *map(str, args)], env=env,
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


class Job:
    """Processes of one TF_CONFIG cluster running elastic_fit.py, their logs in `out`."""

    def __init__(self, out, workers, env=None):
        out.mkdir()
        self.out, self.env = out, env
        self.configs = tf_configs([f"127.0.0.1:{p}" for p in free_ports(workers)])
        self.procs, self.logs, self.files = [], [], []

    def start(self, index, log_name, *args):
        """Starts task `index` with `args`, writing to OUT/`log_name`; returns the process."""
        self.logs.append(self.out / log_name)
        self.files.append(open(self.logs[-1], "w", encoding="utf-8"))  # pylint: disable=consider-using-with
        self.procs.append(start(self.configs, index, self.out, self.files[-1], *args,
                                env=self.env))
        return self.procs[-1]


@contextlib.contextmanager
def started(out, *args, workers=3, env=None):
    """Starts `workers` tasks with `args` writing to the new folder `out`; yields the
    `Job` and ends what is left of its processes on exit."""
    job = Job(out, workers, env)
    try:
        for i in range(workers):
            job.start(i, f"w{i}.log", *args)
        yield job
    finally:
        end_processes(job.procs, job.files)


def wait_for(ready, procs, logs, seconds=120):
    """Polls `ready()` until it holds; fails (with the logs' ends) after `seconds` or
    when one of `procs` ended first."""
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [log.read_text(errors="replace")[-2000:] for log in logs]
        time.sleep(0.1)


def run_job(tmp_path, name, kill_worker, kill_step, workers=3, extra=(), restart=False):
    """Runs the job; with `restart`, starts the killed worker again (same TF_CONFIG,
    nobody killed) once it died: its exit code and log are the last ones."""
    out = tmp_path / name
    env = {"TFDIST_ELASTIC": "1", "WAIT_REJOIN": "1"} if restart else None
    with started(out, kill_worker, kill_step, *extra, workers=workers, env=env) as job:
        if restart:
            job.procs[kill_worker].wait(timeout=240)
            time.sleep(REPLACEMENT_DELAY_SECONDS)  # the survivors notice the death first
            job.start(kill_worker, f"w{kill_worker}-replacement.log", -1, -1, *extra)
        codes = [p.wait(timeout=240) for p in job.procs]
    logs = job.logs
    texts = [log.read_text(errors="replace") for log in logs]
    results = {i: json.loads((out / f"w{i}.json").read_text())
               for i in range(workers) if (out / f"w{i}.json").exists()}
    return codes, texts, results


def removed_in_time(out, removed, survivors, seconds=10):
    """The survivors' results: each removed `removed` once, within `seconds` of the time
    in OUT/killed.txt, and ended with the same weights; `removed` wrote no result."""
    then = float((out / "killed.txt").read_text())
    results = {i: json.loads((out / f"w{i}.json").read_text()) for i in survivors}
    assert not (out / f"w{removed}.json").exists()
    for r in results.values():
        (failure,) = r["failures"]
        assert failure["dead"] == [removed] and failure["members"] == survivors
        assert failure["time"] - then < seconds, (failure, then)
    assert len({r["sha"] for r in results.values()}) == 1
    return results


def weights_sha(path):
    """The sha256 of a checkpoint of elastic_fit.py's MLP, hashed as the script hashes."""
    sys.path.insert(0, str(WORKER.parent))
    try:
        import elastic_fit  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    model = elastic_fit.build("mlp")
    model.load_weights(path)
    return hashlib.sha256(b"".join(np.asarray(w).tobytes()
                                   for w in model.get_weights())).hexdigest()
