"""Reductions started in one training step and awaited in a later one (graph engine).

Stale-synchronous training and delayed averaging need a reduction launched at
step t to run while steps t+1, ..., t+s compute, and to be awaited at step t+s.
Inside one `tf.function` call every stateful op finishes before the call
returns, so the step cannot hold a collective open. The split here:

* ``start`` (a stateful `tf.numpy_function` in the step) copies this
  replica's flat gradient buffers out and returns at once. When all local
  replicas of the step have started, the round goes to a background thread.
* The background thread runs rounds in step order, each as one call of a
  `tf.function` that sums the buffers over all replicas and workers with the
  strategy's configured algorithms (`CrossDeviceOps.reduce_buffers`, real TF
  collectives; TF releases the GIL while they run).
* ``wait`` (in step t + delay) blocks until that round is done and returns
  the sum and this replica's own contribution.

This is the graph engine's version: TF's collective executors, and the
rendezvous of remote collectives, are scoped to the step that launched them, so
a reduction cannot stay open across steps there. The background call keeps
TF's transport and our all-reduce algorithms, and the overlap is real: the
collectives of round t run on TF's threads while the main thread executes
steps t+1, .... With the UCX engine, `tickets.InflightTickets` uses its
start/wait ops instead.

Only one ``wait`` blocks at a time (numpy functions are stateful, so automatic
control dependencies run them in program order), which leaves TF's inter-op
threads to the background call.

Counters: rounds started, and the observed lead: at step t, t minus the newest
round already reduced (every worker has computed that step, so no worker is
more than that many steps behind this one).
"""

import concurrent.futures
import functools
import queue
import threading

import numpy as np
import tensorflow as tf


class InflightReductions:
    """Start/wait pairs of per-step reductions, reduced on a background thread.

    Args:
        reduce_fn: ``reduce_fn(buffers) -> sums``: for each local replica a list
            of 1-D tensors -> the same nesting of sums over all replicas. Called
            on the background thread, once per step, in step order.
        num_local: Local replicas; a round starts when all have started it.
        delay: Steps between a round's start and its wait.
        timeout_seconds: How long a wait blocks before failing (a worker
            stopped or is more than that behind).
    """

    def __init__(self, reduce_fn, num_local: int, delay: int, timeout_seconds: float = 600.0):
        self._reduce_fn = reduce_fn
        self._num_local = num_local
        self.delay = delay
        self._timeout = timeout_seconds
        self._lock = threading.Lock()
        self._starting = {}   # step -> per-replica buffers, until all local replicas started
        self._rounds = {}     # step -> _Round
        self._queue = queue.Queue()
        self._reduced_upto = None  # newest step whose reduction finished
        self.first_step = 0        # rounds before this step do not exist (start of a pipeline)
        self.rounds_started = 0
        self.last_lead = 0
        self.max_lead = 0
        self._leads = []
        thread = threading.Thread(target=self._serve, name="tfdist-inflight", daemon=True)
        thread.start()

    # -- graph side ----------------------------------------------------------

    def start(self, step, replica: int, buffers):
        """Op: hands this replica's `buffers` of `step` to the round (returns `step`)."""
        return tf.numpy_function(functools.partial(self._start, replica), [step] + buffers,
                                 tf.int64, stateful=True, name="tfdist_inflight_start")

    def wait(self, step, replica: int, like):
        """Op: (sums, own) of round `step` for `replica`; zeros before `first_step`.

        Args:
            step: The round to wait for (the current step minus `delay`).
            replica: Local replica index.
            like: This step's buffers (the round has the same shapes and dtypes).
        """
        dtypes = [b.dtype for b in like]
        shapes = [b.shape for b in like]
        out = tf.numpy_function(
            functools.partial(self._wait, replica, [(s.as_list(), d.as_numpy_dtype)
                                                    for s, d in zip(shapes, dtypes)]),
            [step], dtypes * 2, stateful=True, name="tfdist_inflight_wait")
        for tensor, shape in zip(out, shapes * 2):
            tensor.set_shape(shape)
        return out[:len(like)], out[len(like):]

    # -- Python side -----------------------------------------------------------

    def _start(self, replica, step, *arrays):
        step = int(step)
        copies = [np.array(a, copy=True) for a in arrays]
        with self._lock:
            slot = self._starting.setdefault(step, [None] * self._num_local)
            slot[replica] = copies
            if all(s is not None for s in slot):
                del self._starting[step]
                round_ = _Round(slot, self._num_local)
                self._rounds[step] = round_
                self.rounds_started += 1
                self._queue.put((step, round_))
        return np.int64(step)

    def _serve(self):
        while True:
            step, round_ = self._queue.get()
            try:
                sums = self._reduce_fn([[tf.constant(a) for a in buffers]
                                        for buffers in round_.contributions])
                result = [[np.asarray(s) for s in replica_sums] for replica_sums in sums]
            except Exception as error:  # pylint: disable=broad-except
                round_.future.set_exception(error)
                continue
            with self._lock:
                self._reduced_upto = step
            round_.future.set_result(result)

    def _wait(self, replica, specs, step):
        step = int(step)
        if step < self.first_step:
            zeros = [np.zeros(shape, dtype) for shape, dtype in specs]
            return zeros + zeros
        with self._lock:
            round_ = self._rounds.get(step)
        if round_ is None:
            raise RuntimeError(
                f"tfdist_ext: step {step + self.delay} waits for the reduction of step "
                f"{step}, which this worker never started (rounds start at step "
                f"{self.first_step}).")
        sums = self._result(round_, step)
        with self._lock:
            round_.consumers -= 1
            if round_.consumers == 0:
                del self._rounds[step]
            lead = step + self.delay - self._reduced_upto
            self.last_lead = lead
            self.max_lead = max(self.max_lead, lead)
            self._leads.append(lead)
        return sums[replica] + round_.contributions[replica]

    def _result(self, round_, step):
        try:
            return round_.future.result(timeout=self._timeout)
        except concurrent.futures.TimeoutError:
            raise RuntimeError(
                f"tfdist_ext: the reduction of step {step} did not finish within "
                f"{self._timeout:.0f} s: another worker stopped, or is more than that "
                "far behind.") from None

    def drain(self):
        """Waits for every started round; returns {step: (sums, contributions)} (eager).

        Rounds from here on start at the caller's next `first_step`.
        """
        with self._lock:
            if self._starting:
                raise RuntimeError(
                    f"tfdist_ext: rounds {sorted(self._starting)} were started by some "
                    "local replicas but not all.")
            rounds = sorted(self._rounds.items())
            self._rounds = {}
        return {step: (self._result(r, step), r.contributions) for step, r in rounds}

    def lead_stats(self):
        """(last, max, mean) lead; the mean covers the steps since the last call."""
        with self._lock:
            leads, self._leads = self._leads, []
        return self.last_lead, self.max_lead, float(np.mean(leads)) if leads else 0.0


class _Round:
    """One step's reduction: contributions per local replica and the future sums."""

    def __init__(self, contributions, consumers):
        self.contributions = contributions
        self.consumers = consumers
        self.future = concurrent.futures.Future()
