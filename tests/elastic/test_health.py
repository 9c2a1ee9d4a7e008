"""The survivors' health check of a member (`elastic.health`): its store asked through
a real store server in another process, stopped and continued with signals."""

import os
import signal
import subprocess
import sys
import threading
import time

from tfdist_ext.elastic import health, store

SERVE = ("from tfdist_ext.elastic import store\nimport time\n"
         "s = store.Store('127.0.0.1')\nprint(s.address, flush=True)\ntime.sleep(120)\n")


def test_a_store_answering_late_is_alive_with_patience_and_a_closed_one_dead_at_once():
    """A member whose TF server answered as a new process (an admitted replacement) but
    whose store is slow, as a process starved of CPU is: asked once it counts as dead
    (it did under load, a replacement left out of the membership); asked with patience
    it is found alive. A store nobody serves is dead at once, patience or not."""
    server = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    address = server.stdout.readline().strip()
    client = store.Client(address)
    continued = threading.Timer(3.0, os.kill, (server.pid, signal.SIGCONT))
    try:
        assert client.reach(5.0) is True
        os.kill(server.pid, signal.SIGSTOP)
        assert client.reach(0.5) is None  # silent, not refused
        began = time.monotonic()
        continued.start()
        assert not health.store_alive(address, patience=0)  # one ask of 2 s: still stopped
        assert health.store_alive(address, patience=health.STORE_PATIENCE_SECONDS)
        assert 2.9 < time.monotonic() - began < 10
    finally:
        continued.cancel()
        server.kill()
        server.wait()
    began = time.monotonic()
    assert client.reach(5.0) is False  # refused
    assert not health.store_alive(address, patience=health.STORE_PATIENCE_SECONDS)
    assert time.monotonic() - began < 2
