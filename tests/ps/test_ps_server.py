"""A real parameter server (thread) and real UCX mailboxes in this process, against numpy.

The test plays the workers by hand: it sends the messages of `tfdist_ext.ps.messages`
and checks every reply against a numpy simulation of the same updates.
"""

import os
import pathlib
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.launch import free_ports
from tfdist_ext.ops import ucx as ucx_ops
from tfdist_ext.ps import messages
from tfdist_ext.ps.server import ParameterServer

pytestmark = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")
SHAPES = [[2, 3], [8]]


class Worker:
    """One hand-driven worker: a mailbox connected to the server."""

    def __init__(self, port, rank, session=0):
        self.mailbox = messages.Mailbox(timeout_seconds=20.0)
        self.peer, self.id = self.mailbox.connect(f"127.0.0.1:{port}", source=0)
        self.session = session
        self.token = _compat.ResourceVariable(0.0)
        self.mailbox.send(self.peer, messages.tag(messages.HELLO, self.id, rank | (session << 16)))

    def init(self, values, **options):
        layout = {"session": self.session, "shapes": SHAPES,
                  "optimizer": keras.optimizers.serialize(options.pop("optimizer")), **options}
        self.mailbox.send_json(self.peer, messages.tag(messages.INIT, self.id), layout)
        self.mailbox.send(self.peer, messages.tag(messages.INIT_VALUES, self.id),
                          tf.constant(values))

    def request(self, kind):
        self.mailbox.send(self.peer, messages.tag(kind, self.id, self.session))
        _, _, value, data = self.mailbox.recv(messages.PARAMS, source=0, watch=self.peer)
        return value, data.numpy()

    def push(self, gradient):
        tags, replies = self.mailbox.exchange(
            self.token.handle, [tf.constant(gradient, tf.float32)], [self.peer],
            [messages.tag(messages.PUSH, self.id, self.session)], messages.PARAMS, [0])
        return int(tags.numpy()[0]) & ((1 << messages.VALUE_BITS) - 1), replies[0].numpy()

    def round_trip(self):
        """Returns once the server has handled every message it received before this one
        (it answers a request for its optimizer state in order)."""
        self.mailbox.send(self.peer, messages.tag(messages.STATE, self.id, self.session))
        self.mailbox.recv(messages.STATE_VALUES, source=0, watch=self.peer, dtype=tf.float64)

    def leave(self):
        self.mailbox.ops.tfdist_ps_destroy(self.mailbox.handle)


@pytest.fixture
def server():
    ps = ParameterServer(0, 0, timeout_seconds=60.0)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", ps.serve()),
                              daemon=True)
    thread.start()
    yield ps, result, thread
    thread.join(timeout=30)


def _gradients(rng, n):
    return [rng.normal(size=14).astype(np.float32) for _ in range(n)]


def _wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.01)


def test_sgd_with_delay_compensation_matches_numpy(server):
    ps, result, thread = server
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=14).astype(np.float32)
    lr, lam = 0.1, 0.5
    a, b = Worker(ps.mailbox.port, 0), Worker(ps.mailbox.port, 1)
    a.init(w0, workers=2, optimizer=keras.optimizers.SGD(lr), delay_compensation=lam)
    assert a.request(messages.PULL)[1].tolist() == w0.tolist()
    assert b.request(messages.PULL)[1].tolist() == w0.tolist()
    g1, g2, g3 = _gradients(rng, 3)
    staleness, w1 = a.push(g1)  # computed on w0, applied at once
    assert staleness == 0
    np.testing.assert_allclose(w1, w0 - lr * g1, rtol=1e-6)
    staleness, w2 = b.push(g2)  # computed on w0, one update late: compensated
    assert staleness == 1
    np.testing.assert_allclose(w2, w1 - lr * (g2 + lam * g2 * g2 * (w1 - w0)), rtol=1e-5)
    staleness, w3 = a.push(g3)  # computed on w1
    assert staleness == 1
    np.testing.assert_allclose(w3, w2 - lr * (g3 + lam * g3 * g3 * (w2 - w1)), rtol=1e-5)
    a.leave()
    b.leave()
    thread.join(timeout=30)
    assert result.get("code") == 1  # they left while training: the server says so


def test_momentum_state_lives_on_the_server_and_the_barrier_releases_everyone(server):
    ps, result, thread = server
    rng = np.random.default_rng(1)
    w = rng.normal(size=14).astype(np.float32)
    lr, mu = 0.05, 0.9
    workers = [Worker(ps.mailbox.port, r) for r in range(2)]
    workers[0].init(w, workers=2, optimizer=keras.optimizers.SGD(lr, momentum=mu))
    for worker in workers:
        worker.request(messages.PULL)
    velocity = np.zeros_like(w)
    for g in _gradients(rng, 4):
        _, reply = workers[0].push(g)
        velocity = mu * velocity - lr * g
        w = w + velocity
        np.testing.assert_allclose(reply, w, rtol=1e-5, atol=1e-6)
    released = {}
    first = threading.Thread(target=lambda: released.setdefault(
        0, workers[0].request(messages.BARRIER)))
    first.start()
    _wait_until(lambda: ps.barrier or 0 in released)  # worker 0's barrier arrived
    workers[1].round_trip()
    assert len(ps.barrier) == 1 and 0 not in released  # it waits for worker 1
    _, final = workers[1].request(messages.BARRIER)
    first.join(timeout=10)
    np.testing.assert_array_equal(released[0][1], final)
    np.testing.assert_allclose(final, w, rtol=1e-5, atol=1e-6)
    for worker in workers:  # paused after the barrier: leaving is the normal end
        worker.leave()
    thread.join(timeout=30)
    assert result.get("code") == 0


def test_staleness_bound_defers_the_fast_worker(server):
    ps, result, thread = server
    rng = np.random.default_rng(2)
    w0 = rng.normal(size=14).astype(np.float32)
    workers = [Worker(ps.mailbox.port, r) for r in range(3)]
    workers[0].init(w0, workers=3, optimizer=keras.optimizers.SGD(0.1), staleness_bound=2)
    for worker in workers:
        worker.request(messages.PULL)
    g = _gradients(rng, 4)
    assert workers[0].push(g[0])[0] == 0
    second = {}
    fast = threading.Thread(target=lambda: second.setdefault("reply", workers[0].push(g[1])))
    fast.start()
    _wait_until(lambda: ps.pending or ps.session.admission.version > 1)  # the push arrived
    workers[1].round_trip()
    # Held: workers 1 and 2 would fall beyond the bound.
    assert len(ps.pending) == 1 and ps.session.admission.version == 1
    assert workers[1].push(g[2])[0] == 1
    workers[1].round_trip()
    assert len(ps.pending) == 1 and ps.session.admission.version == 2  # worker 2 still would
    staleness, w = workers[2].push(g[3])
    assert staleness == 2
    fast.join(timeout=10)
    assert second["reply"][0] == 2
    expected = w0 - 0.1 * (g[0] + g[2] + g[3] + g[1])
    np.testing.assert_allclose(second["reply"][1], expected, rtol=1e-5, atol=1e-6)
    for worker in workers:
        worker.leave()
    thread.join(timeout=30)
    assert result.get("code") == 1


def test_a_dead_server_fails_the_worker_at_once_naming_it():
    port = free_ports(1)[0]
    code = ("from tfdist_ext.ps.server import ParameterServer; "
            f"ParameterServer(0, {port}, 60.0).serve()")
    process = subprocess.Popen([sys.executable, "-c", code], env=dict(
        os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2])))
    try:
        worker = Worker(port, 0)  # retries until the server listens
        process.kill()
        process.wait()
        start = time.monotonic()
        with pytest.raises(tf.errors.UnavailableError,
                           match=rf"the parameter server at 127.0.0.1:{port} failed"):
            worker.push(np.zeros(14, np.float32))
        assert time.monotonic() - start < 10
        worker.leave()
    finally:
        process.kill()
        process.wait()


def test_connecting_to_nobody_fails_after_the_connect_window(monkeypatch):
    monkeypatch.setattr(messages, "CONNECT_SECONDS", 1.0)
    mailbox = messages.Mailbox(timeout_seconds=5.0)
    with pytest.raises(tf.errors.UnavailableError, match=r"no parameter server answered at 127.0.0.1:9 within 1 s"):
        mailbox.connect("127.0.0.1:9", source=0)
    mailbox.ops.tfdist_ps_destroy(mailbox.handle)
