"""Reductions started in one training step and awaited in a later one, on UCX.

The UCX engine's start/wait op pair (`UcxEngine.start` / `UcxEngine.wait`)
holds a collective open across `tf.function` calls: ``start`` submits the
all-reduce to the rank's communicator thread and returns a ticket at once;
``wait``, in any later step, blocks until it is done and returns the sum and,
because the round is started with ``keep_input``, this replica's own
contribution without a copy. Round t's ticket lives in slot t mod (d + 1) of a
per-replica int64 variable, so the step that starts round t and awaits round
t - d never overwrites a ticket still needed.

The rounds go through the strategy's background communicators (their own UCP
workers and executor threads), so the main step's collectives (metrics,
parameter averages) never queue behind a round in flight.

`InflightTickets` has the interface of `inflight.InflightReductions` (the
background-thread version used with the graph engine), so `PipelinedRunner`
takes either.
"""

import numpy as np
import tensorflow as tf

from tfdist_ext import _compat


class InflightTickets:
    """Start/wait pairs of per-step all-reduces on the UCX engine's in-flight tickets.

    Args:
        cross_ops: The strategy's background `CrossDeviceOps` (engine "ucx");
            its engine runs the rounds and its choice (`choice.select`) picks each
            buffer's algorithm (from the model: no timing beside the steps).
        num_local: Local replicas.
        delay: d, steps between a round's start and its wait.
    """

    def __init__(self, cross_ops, num_local: int, delay: int):
        self._cross_ops = cross_ops
        self._num_local = num_local
        self.delay = delay
        self._slots = delay + 1
        self._tickets = {}  # local replica -> int64 variable [d + 1, buffers]
        self._specs = None  # (num_elements, dtype) per buffer
        with _compat.init_scope(), tf.device(cross_ops.engines.main().devices[0]):
            def counter(value):
                return _compat.ResourceVariable(tf.constant(value, tf.int64), trainable=False)
            self._first = counter(0)            # rounds before it do not exist
            self._last = counter(-1)            # newest round started
            self._started = counter(0)          # rounds started
            self._lead = counter([0, 0, 0, 0])  # last, max, sum, count

    @property
    def first_step(self) -> int:
        return int(self._first.numpy())

    @first_step.setter
    def first_step(self, step):
        self._first.assign(step)

    @property
    def rounds_started(self) -> int:
        return int(self._started.numpy())

    # -- graph side ----------------------------------------------------------

    def start(self, step, replica: int, buffers):
        """Op: starts round `step` of this replica's `buffers` (returns `step`)."""
        engine = self._cross_ops.engines.main()
        specs = [(b.shape.num_elements(), b.dtype) for b in buffers]
        if self._specs is None:
            self._specs = specs
        elif specs != self._specs:
            raise ValueError(f"The in-flight buffers changed from {self._specs} to {specs}; "
                             "the model's trainable variables must not change during fit.")
        tickets = []
        for b in buffers:
            algorithm = self._cross_ops.choice.select(
                b.shape.num_elements() * b.dtype.size, b.dtype.size, refine=False)
            tickets.append(engine.start(b, replica, algorithm, keep_input=True,
                                        label=f"tfdist/{algorithm}/inflight"))
        variable = self._ticket_variable(replica, len(buffers))
        updates = [variable.scatter_nd_update([[step % self._slots]], [tf.stack(tickets)])]
        if replica == 0:
            updates += [self._last.assign(step), self._started.assign_add(1)]
        with tf.control_dependencies(updates):
            return tf.identity(step)

    def wait(self, step, replica: int, like):
        """Op: (sums, own) of round `step` for `replica`; zeros before the first round.

        Args:
            step: The round to wait for (the current step minus `delay`).
            replica: Local replica index.
            like: This step's buffers (the round has the same shapes and dtypes).
        """
        engine = self._cross_ops.engines.main()
        variable = self._ticket_variable(replica, len(like))

        def awaited():
            ids = variable[step % self._slots]
            sums, own = [], []
            for k, b in enumerate(like):
                total, mine = engine.wait(ids[k], replica, b.shape.num_elements(), b.dtype,
                                          with_input=True)
                sums.append(total)
                own.append(mine)
            if replica == 0:
                with tf.control_dependencies(sums):
                    record = self._record_lead(step, variable)
                with tf.control_dependencies([record]):
                    sums = [tf.identity(s) for s in sums]
            return sums + own

        def before_first():
            return [tf.zeros_like(b) for b in like] * 2

        out = tf.cond(step >= self._first, awaited, before_first)
        return out[:len(like)], out[len(like):]

    def _record_lead(self, step, variable):
        # Lead at step t = step + d: t minus the newest round already reduced
        # (round `step` is; later ones may be).
        now = step + self.delay
        later = step + tf.range(1, self.delay, dtype=tf.int64)
        ids = tf.gather(variable, later % self._slots)[:, 0]
        engine = self._cross_ops.engines.main()
        done = engine.finished(ids) & (later <= self._last)
        newest = tf.reduce_max(tf.concat([[step], tf.boolean_mask(later, done)], 0))
        lead = now - newest
        _, most, total, count = tf.unstack(self._lead)
        return self._lead.assign(tf.stack([lead, tf.maximum(most, lead), total + lead,
                                           count + 1]))

    def _ticket_variable(self, replica, num_buffers):
        if replica not in self._tickets:
            with _compat.init_scope(), tf.device(self._cross_ops.engines.main()
                                                 .devices[replica]):
                self._tickets[replica] = _compat.ResourceVariable(
                    tf.zeros([self._slots, num_buffers], tf.int64), trainable=False)
        return self._tickets[replica]

    # -- eager side ------------------------------------------------------------

    def drain(self):
        """Waits for every started round; returns {step: (sums, contributions)} (eager).

        Both are, per local replica, lists of numpy arrays. Rounds from here on
        start at the caller's next `first_step`.
        """
        first, last = self.first_step, int(self._last.numpy())
        pending = {}
        if self._specs is None:
            return pending
        engine = self._cross_ops.engines.main()
        for step in range(max(first, last - self.delay + 1), last + 1):
            sums, contributions = [], []
            for replica in range(self._num_local):
                ids = self._tickets[replica][step % self._slots].numpy()
                waited = [engine.wait(tf.constant(i), replica, n, dtype, with_input=True)
                          for i, (n, dtype) in zip(ids, self._specs)]
                sums.append([np.asarray(total) for total, _ in waited])
                contributions.append([np.asarray(mine) for _, mine in waited])
            pending[step] = (sums, contributions)
        self._first.assign(last + 1)
        return pending

    def lead_stats(self):
        """(last, max, mean) lead since the last call; the mean is reset."""
        last, most, total, count = (int(v) for v in self._lead.numpy())
        self._lead.assign([last, most, 0, 0])
        return last, most, (total / count if count else 0.0)
