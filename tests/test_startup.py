"""A worker whose peers never start exits in bounded time, naming them (tfdist_ext.startup)."""

import os
import signal
import subprocess
import sys
import time

import pytest

import tfdist_ext
from conftest import ROOT
from tfdist_ext import startup
from tfdist_ext.elastic import starting
from tfdist_ext.launch import free_ports, tf_configs

PROGRAM = "import tfdist_ext; tfdist_ext.Strategy(startup_timeout=6); print('joined')"


@pytest.mark.multiworker
@pytest.mark.alone
def test_a_lone_worker_exits_naming_the_worker_that_never_started():
    """Worker 0 (the coordination leader) and worker 1 of two different clusters, each alone."""
    ports = free_ports(4)
    started, procs = time.monotonic(), []
    for index, pair in ((0, ports[:2]), (1, ports[2:])):
        config = tf_configs([f"127.0.0.1:{p}" for p in pair])[index]
        env = dict(os.environ, TF_CONFIG=config, PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [proc.communicate(timeout=90)[0] for proc in procs]
    took = time.monotonic() - started
    for proc, out, (missing, port) in zip(procs, outs, ((1, ports[1]), (0, ports[2]))):
        assert proc.returncode == -signal.SIGKILL, out[-3000:]
        assert "joined" not in out
        assert ("the cluster did not come together within 6 s: no answer from "
                f"worker {missing} (127.0.0.1:{port})") in out, out[-3000:]
        assert "startup_timeout" in out
    assert took < 6 + 30, took


@pytest.mark.parametrize("value", [-1, "10", True, float("nan")])
def test_bad_startup_timeout_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"Argument `startup_timeout` must be a number of "
                                         r"seconds >= 0 \(0 waits forever\); received"):
        tfdist_ext.Strategy(num_replicas=1, startup_timeout=value)


def test_the_message_names_silent_peers_or_a_cluster_mismatch():
    tasks = startup.peers({"worker": ["a:1", "b:2", "c:3"], "chief": ["d:4"]}, "worker", 1)
    assert tasks == [("chief", 0, "d:4"), ("worker", 0, "a:1"), ("worker", 2, "c:3")]
    text = startup.message(5, tasks, [tasks[2]])
    assert "within 5 s: no answer from worker 2 (c:3)." in text
    assert "same TF_CONFIG" in startup.message(5, tasks, [])
    assert "UDP" not in startup.message(5, tasks, [])
    hint = starting.startup_hint({"TFDIST_ELASTIC": "1"})
    assert starting.startup_hint({}) == ""
    assert "no member answered its query on UDP" in startup.message(5, tasks, [], hint)
    assert "UDP" not in startup.message(5, tasks, [tasks[2]], hint)


def test_silent_finds_a_closed_port_and_not_an_open_one():
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        open_port = server.getsockname()[1]
        closed_port = free_ports(1)[0]
        tasks = [("worker", 0, f"127.0.0.1:{open_port}"), ("worker", 1, f"127.0.0.1:{closed_port}")]
        assert startup.silent(tasks) == [tasks[1]]
