"""Shared test set-up: logical CPU replicas and multi-worker launches.

TensorFlow's devices are fixed the first time its runtime initialises, and all
in-process tests share one runtime, so the 8 logical CPUs every test may use are
created here, before any test runs.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LOCAL_REPLICAS = 8
# The files that take minutes, longest first (seconds of one pytest process on the
# 2-core CI machine): they start first, so that the two processes of a phase end
# together instead of one finishing a long file alone. Every other file keeps its place
# after them.
LONG_FIRST = (
    # in-process
    "tests/test_upstream.py",  # one test of ~200 s
    "tests/zero/test_zero.py",  # ~880 s
    "tests/collectives/test_engine_replicas.py",  # ~460 s
    "tests/sync/test_safe_defaults.py",  # ~360 s
    "tests/keras/test_uneven.py",  # ~270 s
    "tests/keras/test_xla.py",  # ~180 s
    # launching workers
    "tests/test_corpus.py",  # ~300 s in two launches
    "tests/zero/test_zero_workers.py",  # ~360 s
    "tests/test_user_scripts.py",
    "tests/test_benchmarks.py",
    "tests/collectives/test_engine_workers.py",
    "tests/test_multiworker.py",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "multiworker: launches worker processes")
    from tfdist_ext import cluster  # pylint: disable=import-outside-toplevel

    os.environ.pop("TF_CONFIG", None)
    cluster.local_devices(MAX_LOCAL_REPLICAS)


def pytest_collection_modifyitems(config, items):
    """Puts the files of LONG_FIRST first, in its order (a stable sort)."""
    del config
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(
        pathlib.Path(item.path).relative_to(ROOT).as_posix(), len(LONG_FIRST)))


def launch(num_workers, args, timeout=300, extra_env=None, options=()):
    """Runs `python args...` on `num_workers` workers through tfdist-run (with `options`).

    Every worker's lines are kept (`--output all`): tests read each worker's output.

    Returns:
        (exit code, combined output, seconds taken).
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(extra_env or {}))
    env.pop("TF_CONFIG", None)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tfdist_ext.launch", "-np", str(num_workers),
         "--timeout", str(timeout), "--output", "all", *options, sys.executable,
         *map(str, args)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout + 30,
        check=False)
    return result.returncode, result.stdout + result.stderr, time.monotonic() - start


def end_processes(processes, files=()):
    """Kills what is left of `processes` (continuing stopped ones first) and closes `files`."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
        process.wait()
    for file in files:
        file.close()


def read_worker_json(directory, num_workers, name="w{worker}.json"):
    return [json.loads((pathlib.Path(directory) / name.format(worker=i)).read_text())
            for i in range(num_workers)]


@pytest.fixture
def launch_workers():
    return launch
