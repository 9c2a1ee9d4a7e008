"""A worker that dies or hangs during a fit never leaves the others hanging.

Worker 1 is killed (SIGKILL) or frozen (SIGSTOP) once training runs, as plain
TF_CONFIG processes (no launcher to stop the rest) on both engines, and under
`tfdist-run`; worker 0 must exit non-zero within 10 s, with an error that names
the peer. The engines keep their own (30 s) timeouts: the bound comes from
the dead-peer watcher (tfdist_ext/liveness.py), or from the launcher.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, end_processes, launch
from tfdist_ext.launch import free_ports, tf_configs
from tfdist_ext.ops import ucx as ucx_ops

pytestmark = [pytest.mark.multiworker, pytest.mark.alone]
WORKER = ROOT / "tests" / "workers" / "long_fit.py"
LIMIT_SECONDS = 10
NO_UCX = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")
ENGINES = [pytest.param("ucx", marks=NO_UCX), "tf"]


def _start(configs, index, log, engine, *args):
    """Worker `index` of long_fit.py (`args` after its engine), its output to `log`."""
    env = dict(os.environ, TF_CONFIG=configs[index], PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(WORKER), "100000", engine, *map(str, args)],
                            env=env, cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)


def _wait_for(path, text, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


def _ends_in_time(worker, log):
    """Waits for the survivor `worker`; asserts it failed within LIMIT_SECONDS of now
    (its peer's end); returns its output."""
    since = time.monotonic()
    code = worker.wait(timeout=LIMIT_SECONDS + 30)
    took = time.monotonic() - since
    out = log.read_text(errors="replace")
    assert code != 0, out[-3000:]
    assert took < LIMIT_SECONDS, (took, out[-3000:])
    return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_survivor_fails_in_bounded_time_naming_the_peer(tmp_path, sig, engine):
    configs = tf_configs([f"127.0.0.1:{p}" for p in free_ports(2)])
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    files = [open(path, "w", encoding="utf-8") for path in logs]  # pylint: disable=consider-using-with
    workers = [_start(configs, i, files[i], engine) for i in range(2)]
    try:
        assert _wait_for(logs[0], "epoch 0 done", 120), \
            [log.read_text(errors="replace")[-3000:] for log in logs]
        workers[1].send_signal(sig)
        out = _ends_in_time(workers[0], logs[0])
        # The watcher names the peer's task and what happened to it; after a SIGKILL,
        # TF's own collective (engine "tf") often sees the lost connection first, and its
        # error names the peer's task and how gRPC lost it (refused, reset or closed: seen
        # in CI runs).
        lost = ("Connection refused", "Connection reset by peer", "Socket closed")
        tf_first = (sig == signal.SIGKILL and engine == "tf"
                    and "remote target /job:worker/replica:0/task:1" in out
                    and any(text in out for text in lost))
        assert tf_first or "peer /job:worker/replica:0/task:1 (127.0.0.1:" in out, out[-3000:]
        assert tf_first or ("server is gone" if sig == signal.SIGKILL
                            else "no answer to 2 health checks") in out, out[-3000:]
    finally:
        end_processes(workers, files)


@NO_UCX
def test_a_peer_dead_before_the_wire_up_stops_the_wait_for_its_address(tmp_path):
    # Worker 1 dies before it publishes its address for the UCX communicators: worker 0
    # stops waiting for it when the watcher finds it dead (it used to wait the
    # rendezvous' 300 s: the 100-kill elastic run found it).
    configs = tf_configs([f"127.0.0.1:{p}" for p in free_ports(2)])
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    files = [open(path, "w", encoding="utf-8") for path in logs]  # pylint: disable=consider-using-with
    script = ROOT / "tests" / "workers" / "wireup_death.py"
    workers = [subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=files[i],
                                stderr=subprocess.STDOUT,
                                env=dict(os.environ, TF_CONFIG=configs[i], PYTHONPATH=str(ROOT)))
               for i in range(2)]
    try:
        assert workers[1].wait(timeout=120) == -signal.SIGKILL
        out = _ends_in_time(workers[0], logs[0])
        assert "Stopped waiting for 'tfdist_ext/ucx/main" in out, out[-3000:]
        assert "/address/1' in the store: tfdist_ext: peer /job:worker/replica:0/task:1" in out
    finally:
        end_processes(workers, files)


@NO_UCX
@pytest.mark.parametrize("how", ["launcher", "plain"])
def test_a_failing_peer_stops_the_job_naming_it(tmp_path, how):
    # Under tfdist-run worker 1 is SIGKILLed and the launcher stops the job; as plain
    # processes worker 1's script raises, and worker 0 names its error.
    stamp = tmp_path / "signalled"
    if how == "launcher":
        code, out, _ = launch(2, [WORKER, 100000, "ucx", 30, "kill", stamp], timeout=240)
    else:
        configs = tf_configs([f"127.0.0.1:{p}" for p in free_ports(2)])
        logs = [tmp_path / f"w{i}.log" for i in range(2)]
        with open(logs[0], "w", encoding="utf-8") as first, \
                open(logs[1], "w", encoding="utf-8") as second:
            procs = [_start(configs, i, log, "ucx", 30, "raise", stamp)
                     for i, log in enumerate((first, second))]
            code = procs[0].wait(timeout=240)
            procs[1].wait(timeout=240)
        out, other = (log.read_text(errors="replace") for log in logs)
        assert "RuntimeError: worker 1 gives up" in other, other[-3000:]
    took = time.time() - float(stamp.read_text())
    assert code != 0, out[-3000:]
    assert took < LIMIT_SECONDS, (took, out[-3000:])
    if how == "launcher":  # the launcher saw worker 1 die and names it
        assert "worker 1" in out, out[-3000:]
    else:
        assert ("peer /job:worker/replica:0/task:1 (127.0.0.1:" in out
                and "failed: its script ended with RuntimeError: worker 1 gives up" in out), \
            out[-3000:]
