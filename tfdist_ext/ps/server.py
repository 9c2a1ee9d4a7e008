"""The parameter server: holds a shard of the model and applies gradients as they arrive.

A "ps" task of TF_CONFIG becomes a server when it creates
`tfdist_ext.Strategy(sync="async")` (the same script as the workers), or
with ``python -m tfdist_ext.ps``; either way the process serves until the
job ends, then exits. It listens on the port of its TF_CONFIG address.

Per training session (one `Strategy` on the workers), the chief sends the
layout of this server's variables, the optimizer's Keras config and the
initial values; the server builds the variables and that optimizer, and then
for each pushed gradient, in the order `admission.Admission` allows, applies
it with the optimizer (after delay compensation, if configured) and answers
that worker alone with the new parameters. No worker waits for another,
except under a staleness bound.

Delay compensation (DC-ASGD, Zheng et al., "Asynchronous Stochastic Gradient
Descent with Delay Compensation", ICML 2017): the gradient g of a worker
that pulled w_bak is applied as g + lambda * g * g * (w - w_bak), a
first-order correction towards the gradient at the current w; the server
keeps each worker's w_bak. The paper's lambda is 0.04-2 (larger for more
workers); 0 disables it.

The server ends when every worker that connected has disconnected while idle
(after the barrier at the end of `fit`); a worker that disconnects while it
trains ends the server with an error naming it, and a server that hears
nothing for `timeout_seconds` ends too.
"""

import json
import logging
import re
import sys

import keras
import numpy as np
import tensorflow as tf

from tfdist_ext.ps import messages
from tfdist_ext.ps.staleness import Admission

log = logging.getLogger("tfdist_ext")
_PEER = re.compile(r"\bpeer (\d+) failed")


class _Session:
    """One model: its variables, optimizer, versions and statistics."""

    def __init__(self, index, layout, values):
        self.number = layout["session"]
        self.workers = int(layout["workers"])
        self.shapes = [tuple(s) for s in layout["shapes"]]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        if sum(self.sizes) != values.size:
            raise ValueError(f"the layout holds {sum(self.sizes)} parameters but the chief "
                             f"sent {values.size}")
        self.variables = [
            keras.Variable(np.reshape(part, shape), dtype="float32", name=f"ps{index}_{i}")
            for i, (part, shape) in enumerate(zip(np.split(values, np.cumsum(self.sizes)[:-1]),
                                                  self.shapes))]
        self.optimizer = keras.optimizers.deserialize(layout["optimizer"])
        self.optimizer.build(self.variables)
        self.dc_lambda = float(layout.get("delay_compensation") or 0.0)
        self.admission = Admission(layout.get("staleness_bound"))
        self.histogram = np.zeros([self.workers, messages.HISTOGRAM_BINS], np.int64)
        self.dropped = np.zeros([self.workers], np.int64)
        self.reported = 0  # the version of the last report
        self.backup = {}  # peer -> the parameters it computes on (DC-ASGD)
        self.apply = tf.function(self._apply)
        self.flat = tf.function(self._flat)

    def _flat(self):
        return tf.concat([tf.reshape(v.value, [-1]) for v in self.variables], 0)

    def state(self):
        """The optimizer's variables (iterations, slots...) as one float64 vector."""
        return tf.concat([tf.reshape(tf.cast(v.value, tf.float64), [-1])
                          for v in self.optimizer.variables], 0)

    def load_state(self, flat):
        """Sets the optimizer's variables from a `state()` vector."""
        sizes = [int(np.prod(v.shape)) for v in self.optimizer.variables]
        if sum(sizes) != flat.shape[0]:
            raise ValueError(f"optimizer state of {flat.shape[0]} values for "
                             f"{sum(sizes)} optimizer variable elements")
        for v, part in zip(self.optimizer.variables, np.split(flat, np.cumsum(sizes)[:-1])):
            v.assign(np.reshape(part, v.shape).astype(v.dtype))

    def _apply(self, gradient, backup):
        if self.dc_lambda:
            gradient += self.dc_lambda * gradient * gradient * (self._flat() - backup)
        grads = [tf.reshape(g, s) for g, s in zip(tf.split(gradient, self.sizes), self.shapes)]
        self.optimizer.apply(grads, self.variables)
        return self._flat()


class ParameterServer:
    """Serves one shard of every session's parameters.

    Args:
        index: This server's task index in the "ps" job.
        port: TCP port to listen on.
        timeout_seconds: Give up when nothing arrives for this long (0: never).
    """

    def __init__(self, index: int, port: int, timeout_seconds: float = 0.0):
        self.index = index
        self.mailbox = messages.Mailbox(timeout_seconds, listen_port=port, source=index)
        self.ranks = {}       # peer -> (worker rank, session)
        self.active = set()   # peers computing on pulled parameters
        self.gone = set()     # peers that disconnected
        self.session = None
        self.pending = {}     # peer -> pushed gradient awaiting admission (arrival order)
        self.waiting = []     # peers whose PULL waits for the session's INIT
        self.barrier = []
        self._layout = None

    def serve(self) -> int:
        """Answers workers until they have all left; returns the exit code (0 or 1)."""
        print(f"tfdist_ext: parameter server {self.index} listening on port "
              f"{self.mailbox.port}", flush=True)
        while not self.ranks or len(self.gone) < len(self.ranks):
            try:
                kind, peer, value, data = self.mailbox.recv(dtype=tf.uint8)
            except tf.errors.UnavailableError as err:
                if not self._disconnected(err.message):
                    return 1
                continue
            try:
                self._handle(kind, peer, value, data)
            except (ValueError, KeyError) as err:
                print(f"tfdist_ext: parameter server {self.index}: bad message "
                      f"{kind} from {self._who(peer)}: {err}; stopping.", file=sys.stderr,
                      flush=True)
                return 1
        self._report()
        print(f"tfdist_ext: parameter server {self.index}: every worker has left; exiting.",
              flush=True)
        return 0

    def _who(self, peer):
        rank = self.ranks.get(peer, (None,))[0]
        return f"worker rank {rank}" if rank is not None else f"connection {peer}"

    def _disconnected(self, message) -> bool:
        match = _PEER.search(message)
        if match is None:
            print(f"tfdist_ext: parameter server {self.index}: {message}; stopping.",
                  file=sys.stderr, flush=True)
            return False
        peer = int(match.group(1))
        self.mailbox.close(peer)
        self.gone.add(peer)
        if peer in self.active:
            print(f"tfdist_ext: parameter server {self.index}: {self._who(peer)} disconnected "
                  f"while training ({message}); stopping.", file=sys.stderr, flush=True)
            return False
        return True

    def _handle(self, kind, peer, value, data):
        if kind == messages.HELLO:
            self.ranks[peer] = (value & 0xFFFF, value >> 16)
        elif kind == messages.INIT:
            self._layout = json.loads(bytes(data.numpy()).decode())
        elif kind == messages.INIT_VALUES:
            values = tf.bitcast(tf.reshape(data, [-1, 4]), tf.float32).numpy()
            self._report()
            self.session = _Session(self.index, self._layout, values)
            self.pending.clear()
            self.barrier = []
            waiting, self.waiting = self.waiting, []
            for other_kind, other in waiting:
                self._handle(other_kind, other, self.session.number, None)
        elif kind == messages.INIT_STATE:
            self.session.load_state(tf.bitcast(tf.reshape(data, [-1, 8]), tf.float64).numpy())
        elif kind == messages.STATE:
            self.mailbox.send(peer, messages.tag(messages.STATE_VALUES, self.index),
                              self.session.state())
        elif kind in (messages.PULL, messages.REST):
            if self.session is None or self.session.number != value:
                self.waiting.append((kind, peer))
            else:
                self._send_params(peer, 0, rest=kind == messages.REST)
        elif kind == messages.PUSH:
            gradient = tf.bitcast(tf.reshape(data, [-1, 4]), tf.float32)
            if gradient.shape[0] != sum(self.session.sizes):
                raise ValueError(f"a gradient of {gradient.shape[0]} values for "
                                 f"{sum(self.session.sizes)} parameters")
            self.session.admission.wake(self._rank(peer))
            self.active.add(peer)
            self.pending[peer] = gradient
            self._admit()
        elif kind == messages.BARRIER:
            self.barrier.append(peer)
            self.active.discard(peer)
            self.session.admission.rest(self._rank(peer))
            self._admit()  # the bound no longer waits for this worker
            if len(self.barrier) == self.session.workers:
                self._report()
                barrier, self.barrier = self.barrier, []
                for other in barrier:
                    self._send_params(other, 0, rest=True)
        else:
            raise RuntimeError(f"parameter server {self.index}: unexpected message kind "
                               f"{kind} from {self._who(peer)}")

    def _rank(self, peer):
        return self.ranks[peer][0]

    def _send_params(self, peer, value, rest=False):
        """Sends the parameters; unless it rests, the worker computes on them."""
        params = self.session.flat()
        if self.session.dc_lambda:
            self.session.backup[peer] = params
        self.session.admission.pulled(self._rank(peer), rest=rest)
        if rest:
            self.active.discard(peer)
        else:
            self.active.add(peer)
        self.mailbox.send(peer, messages.tag(messages.PARAMS, self.index, value), params)

    def _admit(self):
        session = self.session
        by_rank = {self._rank(p): p for p in self.pending}
        while by_rank:
            decision = session.admission.next(list(by_rank))
            if decision is None:
                return
            rank, apply = decision
            peer = by_rank.pop(rank)
            gradient = self.pending.pop(peer)
            if not apply:
                session.dropped[rank] += 1
                self._send_params(peer, messages.DROPPED | session.admission.staleness(rank))
                continue
            backup = session.backup.get(peer, gradient) if session.dc_lambda else gradient
            session.apply(gradient, backup)
            staleness = session.admission.applied(rank)
            session.histogram[rank, min(staleness, messages.HISTOGRAM_BINS - 1)] += 1
            self._send_params(peer, staleness)

    def _report(self):
        """Prints the session's staleness per worker (once per new updates)."""
        session = self.session
        if session is None or session.admission.version == session.reported:
            return
        session.reported = session.admission.version
        lines = [f"tfdist_ext: parameter server {self.index}, session {session.number}: "
                 f"{session.admission.version} updates; staleness of the applied gradients "
                 "by worker (mean / max, histogram from 0):"]
        for rank, row in enumerate(session.histogram):
            count = int(row.sum())
            if not count:
                continue
            mean = float((row * np.arange(len(row))).sum()) / count
            last = int(np.nonzero(row)[0].max())
            dropped = (f"; {session.dropped[rank]} refused (older than the bound)"
                       if session.dropped[rank] else "")
            lines.append(f"  worker {rank}: {count} applied, {mean:.2f} / {last}, "
                         f"{row[:last + 1].tolist()}{dropped}")
        print("\n".join(lines), flush=True)


def serve(spec, timeout_seconds: float = 0.0) -> int:
    """Runs this "ps" task of the validated TF_CONFIG `spec`; returns the exit code."""
    port = int(spec.jobs["ps"][spec.task_index].rsplit(":", 1)[1])
    return ParameterServer(spec.task_index, port, timeout_seconds).serve()
