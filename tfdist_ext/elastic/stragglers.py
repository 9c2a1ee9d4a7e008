"""Removing a straggler: a worker much slower than the others leaves the job.

In synchronous training every step waits for the slowest worker, so one slow
machine (a throttled CPU, a noisy neighbour, a failing disk) sets the pace of
all. With `Elastic(straggler_factor=F, straggler_steps=K)`, each worker
measures its own busy time per step: the seconds from the end of its previous
step to its arrival in this step's first all-reduce (its Python callbacks and
input pipeline), plus the seconds from that all-reduce to its loss (its forward
pass). The step's all-reduce of the agreement flags (`tfdist_ext.keras.uneven`)
carries every worker's busy time of the step before, so every member sees the
same table. A worker whose busy time was at least F times the median of the
other members' in each of K consecutive steps asks to leave, as SIGTERM would
(`tfdist_ext.elastic.leaving`): after the next step it exits with code 0 and
the others go on without discarding a step; every member logs the measured
times. Nobody is removed when the members left would be fewer than
`min_workers`, or fewer than two.

Waiting in a collective is not busy time, so the others' wait for the
straggler does not count against them. Not caught: a worker slow in its
backward pass alone, or slow only in the network.

Tuning: F = 3 and K = 20 remove a worker that is persistently slower by 3x
and ignore one-off hiccups (a garbage collection, a checkpoint write); lower K
reacts faster to a machine that went bad. Off by default: a job of unequal
machines by design would lose its slower ones.
"""

import statistics
from typing import Dict, Iterable, List, Optional

import tensorflow as tf

from tfdist_ext import _compat


def slow(seconds: Dict[int, float], members: Iterable[int], factor: float) -> Optional[int]:
    """The member whose busy `seconds` are >= `factor` x the median of the other
    members' (the slowest such one), or None; with fewer than two members, None."""
    members = [w for w in members if w in seconds]
    if len(members) < 2:
        return None
    slowest = max(members, key=lambda w: (seconds[w], -w))
    others = statistics.median(seconds[w] for w in members if w != slowest)
    return slowest if seconds[slowest] >= factor * others and seconds[slowest] > 0 else None


class Monitor:
    """The straggler check of one worker (see module doc).

    Args:
        me: This worker's TF_CONFIG index.
        workers: Workers in TF_CONFIG (the width of the table of busy times).
        factor: F, > 1.
        steps: K, >= 1.

    Attributes:
        ended: float64 variable, `time.time()` at the end of this worker's last step
            (0: none yet).
        busy: float32 variable, this worker's busy seconds in its last step.
        table: float32 variable, every worker's busy seconds of the step before the
            last one (0 for non-members), as the last step's all-reduce carried them.
        removed: One dict per straggler found: "worker", "step", "seconds" (its
            busy seconds in the last K steps) and "others" (the other members'
            median in each).
        leaving: Whether this worker is the straggler found and asked to leave.
    """

    def __init__(self, me: int, workers: int, factor: float, steps: int):
        self.me, self.workers, self.factor, self.steps = me, workers, factor, steps
        with tf.init_scope():
            self.ended = _compat.ResourceVariable(0.0, dtype=tf.float64, trainable=False,
                                                  name="elastic_step_ended")
            self.busy = _compat.ResourceVariable(0.0, trainable=False, name="elastic_busy")
            self.table = _compat.ResourceVariable(tf.zeros([workers]), trainable=False,
                                                  name="elastic_busy_table")
        self._history: List[Dict[int, float]] = []
        self.removed: List[dict] = []
        self.leaving = False  # this worker found itself a straggler and asked to leave

    def arrived(self) -> tf.Tensor:
        """In the step function, at the worker's arrival: float64 seconds since its
        last step ended (0 for its first step)."""
        now, ended = tf.timestamp(), self.ended.read_value()
        return tf.where(ended > 0, now - ended, tf.constant(0.0, tf.float64))

    def share(self) -> tf.Tensor:
        """This worker's row of the table to all-reduce: its busy seconds at its index."""
        return tf.one_hot(self.me, self.workers, dtype=tf.float32) * self.busy.read_value()

    def step_ended(self, now: float, steps: int, members) -> Optional[int]:
        """After a training step: records `now`, reads the table and returns the
        straggler found (every member finds the same one), or None.

        Args:
            now: `time.time()` at the step's end.
            steps: Training steps of this `fit` so far.
            members: The members now, the chief first.
        """
        self.ended.assign(now)
        row = self.table.numpy()
        seconds = {w: float(row[w]) for w in members}
        if not any(seconds.values()):  # the first step after a change: nothing measured
            return None
        self._history = (self._history + [seconds])[-self.steps:]
        found = [slow(s, members, self.factor) for s in self._history]
        if len(found) < self.steps or found[0] is None or len(set(found)) > 1:
            return None
        worker = found[0]
        self.removed.append({
            "worker": worker, "step": steps,
            "seconds": [round(s[worker], 6) for s in self._history],
            "others": [round(statistics.median(v for w, v in s.items() if w != worker), 6)
                       for s in self._history]})
        self._history = []
        return worker

    def reset(self):
        """Forgets the measured steps (the members changed)."""
        self._history = []
