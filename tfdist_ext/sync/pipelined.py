"""Shared runner of the two policies that apply a gradient reduction steps late.

Both start the all-reduce of step t's gradients at step t and apply its result
at step t + d (on the UCX engine's start/wait ops, `InflightTickets`; on the
graph engine through a background thread, `InflightReductions`), while each replica keeps stepping with its
own fresh gradient. In Keras' scaling (every replica's gradient k_i is its own
mean gradient g_i divided by the number of replicas N, so that sum_i k_i is
the global mean gradient) the gradient applied at step t on replica i is

    a * k_i(t)  -  a * k_i(t - d)  +  sum_j k_j(t - d)

with the second and third terms only once round t - d exists. a = N for
delayed averaging (a full local step, corrected to the global mean d steps
later) and a = 1 for stale-synchronous training (one N-th of the global step,
then every other replica's share d steps later).

At a drain (epoch end, before evaluation, end of `fit`) the rounds still in
flight are awaited and what they owe is applied as plain SGD with the
optimizer's current learning rate; then parameters are averaged, so all
replicas continue from one model.
"""

import numpy as np
import tensorflow as tf

from tfdist_ext.collectives import fusion
from tfdist_ext.sync import momentum
from tfdist_ext.sync.inflight import InflightReductions
from tfdist_ext.sync.inflight_payloads import Payloads
from tfdist_ext.sync.tickets import InflightTickets
from tfdist_ext.sync.runner import PolicyRunner, dense_gradients, tf_variable


class PipelinedRunner(PolicyRunner):
    """Runner of `StaleSynchronous` and `DelayedAveraging`.

    Args:
        strategy: The owning strategy.
        delay: d, steps between a reduction's start and its use.
        local_scale: a, the weight of a replica's own gradient (see module doc).
        mean_staleness: E[tau] of the applied gradient, for SGD momentum
            compensation (`tfdist_ext.sync.momentum`); 0 turns it off.
        noise_ratio: Variance of the applied gradient over synchronous
            training's, for the square-root learning-rate scaling of
            normalizing optimizers (`tfdist_ext.sync.lr_scaling`); 1 turns it off.
    """

    def __init__(self, strategy, delay: int, local_scale: float, mean_staleness: float = 0.0,
                 noise_ratio: float = 1.0):
        super().__init__(strategy)
        self.delay = delay
        self.local_scale = local_scale
        self.mean_staleness = mean_staleness
        self.noise_ratio = noise_ratio
        timeout = self.cross_ops.timeout_seconds
        background = strategy.extended.background_cross_device_ops()
        if background.config.engine == "ucx":
            self.inflight = InflightTickets(background, self.num_local, delay)
        else:
            self.inflight = InflightReductions(tf.function(background.reduce_buffers),
                                               self.num_local, delay,
                                               timeout_seconds=timeout or 600.0)
        self._restore = None
        self.payloads = Payloads(strategy.config.compression, self.cross_ops.state,
                                 self.first_rank)

    def update_step(self, optimizer, grads, variables, learning_rate):
        learning_rate = self.sqrt_scaled(optimizer, learning_rate, self.noise_ratio,
                                         self.noise_ratio > 1)
        grads = dense_gradients(grads)
        replica = self.local_index()
        buffers, restore = fusion.flatten_by_dtype(grads)
        self._restore = restore
        step = tf.cast(optimizer.iterations, tf.int64)
        wire, residual_updates = self.payloads.compress(step, replica, buffers)
        started = [self.inflight.start(step, replica, wire)] + residual_updates
        if replica == 0:  # each round is one all-reduce of the (compressed) buffers
            sent = sum(self.cross_ops.wire.dense(w.shape.num_elements(), w.dtype)
                       for w in wire)
            dense = sum(self.cross_ops.wire.dense(b.shape.num_elements(), b.dtype)
                        for b in buffers)
            started.append(self.cross_ops.state.count(sent, dense))
        with tf.control_dependencies(started):
            sums, own = self.inflight.wait(step - self.delay, replica, wire)
        sums = self.payloads.decompress(step - self.delay, replica, sums)
        own = self.payloads.decompress(step - self.delay, replica, own)
        updates = []
        for fresh, stale, total in zip(buffers, own, sums):
            scale = tf.cast(self.local_scale, fresh.dtype)
            updates.append(scale * fresh - scale * stale + total)
        with momentum.momentum_while_tracing(optimizer, self.mean_staleness):
            self.apply(optimizer, restore(updates), variables, learning_rate)

    def on_train_begin(self, model):
        super().on_train_begin(model)
        self.inflight.drain()
        self.inflight.first_step = int(model.optimizer.iterations.numpy())

    def _drain_corrections(self, model):
        pending = self.inflight.drain()
        self.inflight.first_step = int(model.optimizer.iterations.numpy())
        if not pending:
            return
        owed = [None] * self.num_local
        for step, (sums, contributions) in pending.items():
            for r in range(self.num_local):
                dense_sums = self.payloads.decompress(step, r, sums[r])
                mine = self.payloads.decompress(step, r, contributions[r])
                terms = [np.asarray(s) - self.local_scale * np.asarray(c)
                         for s, c in zip(dense_sums, mine)]
                owed[r] = terms if owed[r] is None else [o + t for o, t in zip(owed[r], terms)]
        learning_rate = float(np.asarray(model.optimizer.learning_rate))
        variables = [tf_variable(v) for v in model.trainable_variables]
        for r in range(self.num_local):
            corrections = self._restore([tf.constant(o) for o in owed[r]])
            for variable, correction in zip(variables, corrections):
                component = variable.values[r]
                component.assign_sub(tf.cast(learning_rate, component.dtype) * correction)

    def stats(self):
        last, most, mean = self.inflight.lead_stats()
        return {"sync_rounds": self.inflight.rounds_started, "staleness": last,
                "staleness_max": most, "staleness_mean": mean}
