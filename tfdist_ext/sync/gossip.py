"""Decentralized gossip SGD: every step, average parameters with a few peers only.

    Strategy(sync="gossip")                                   # exponential graph, 1 peer
    Strategy(sync={"name": "gossip", "topology": "random", "peers": 2})

References: Lian et al., "Can Decentralized Algorithms Outperform Centralized
Algorithms? A Case Study for Decentralized Parallel SGD" (D-PSGD), NeurIPS
2017; Assran et al., "Stochastic Gradient Push for Distributed Deep
Learning" (SGP), ICML 2019, for the time-varying exponential graph.

Step t: every replica r applies its own gradient, then mixes its parameters
with the parameters of p in-peers:

    w_r <- (1 - p m) w_r + m * sum_j w_{(r - s_j(t)) mod N}

where replica r also sends its parameters to (r + s_j(t)) mod N. The shifts
s_j(t) come from `shift_table`, the same on every worker: "exponential"
cycles through 1, 2, 4, ... < N (SGP's one-peer exponential graph: any
replica's update reaches every other one within log2 N steps), "ring" uses
+1 (and -1 for a second peer), "random" draws p distinct shifts per step
from a generator seeded with `seed`. Every mixing matrix is doubly
stochastic, so the replicas' mean is what synchronous SGD on the mean would
give and the spread (the consensus distance) stays bounded; there is no
global all-reduce during training. Replicas are averaged exactly before
evaluation, at epoch ends and when `fit` returns (the drain), so the saved
model is one model; the consensus distance just before that average is
reported as ``consensus_distance`` (root mean square distance of the
replicas' parameters from their mean) by `communication_stats()` and
`CommunicationStats`. Optimizer slots stay local unless `mix_slots`.

Tuning: one peer with m = 1/2 halves each step's communication against a
ring all-reduce of the model and needs no synchronisation beyond a pair of
replicas; more peers (or "exponential" over "ring") shrink the spread
faster. Keep the synchronous learning rate; if accuracy lags, add a peer or
mix the optimizer's slots (`mix_slots`, one more model-sized message per
slot). With Adam (or any optimizer that normalizes the gradient per
replica) and small per-replica batches, parameter mixing does not undo
what each replica's optimizer does with its own noisy gradient: mix the
gradients too (`mix_gradients`), so each optimizer steps on the mixed
gradient of 1 + p replicas' batches, at one more model-sized message per
peer and step (docs/results.md#gossip-at-4-workers has the measurements).
By default (`sqrt_lr_scaling`) such an optimizer's learning rate is multiplied
by the square root of the ratio of the variance of the gradient it steps on
to the synchronous gradient's: N, or N ((1 - p m)^2 + p m^2) with
`mix_gradients` (`tfdist_ext.sync.lr_scaling`), so the replicas' mean moves
as synchronous training's does.
"""

import dataclasses
import math
import numbers

import numpy as np
import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.collectives import fusion
from tfdist_ext.collectives.schedule import Recv, Schedule, Send
from tfdist_ext.registry import boolean, positive_int
from tfdist_ext.sync.base import SYNC_POLICIES, SyncPolicy
from tfdist_ext.sync.runner import PolicyRunner, dense_gradients, tf_variable

TOPOLOGIES = ("exponential", "ring", "random")
TABLE_STEPS = 1024  # the random topology repeats after this many steps


@SYNC_POLICIES.register("gossip")
@dataclasses.dataclass(frozen=True)
class Gossip(SyncPolicy):
    """Mix parameters with `peers` peers every step (no global all-reduce).

    Args:
        topology: "exponential" (default), "ring" or "random".
        peers: p >= 1, in-peers (and out-peers) per step; at most 2 for
            "ring", at most the number of distinct shifts otherwise.
        mixing: m, the weight of each peer's parameters, in [0, 1 / p];
            None means 1 / (p + 1) (a uniform average of self and peers).
            0 is independent local training.
        seed: Seed of the "random" topology (the same on every worker).
        mix_slots: Mix the optimizer's slot variables (momentum, Adam's
            moments) with the same weights as the parameters. Each replica's
            momentum otherwise carries its own gradient noise and pushes the
            replicas apart every step; mixing it costs one more model-sized
            message per slot and peer.
        mix_gradients: Mix the gradients with the same peers and weights
            before the optimizer steps, so each replica's optimizer sees
            the gradient of 1 + p replicas' batches (g_r <- (1 - p m) g_r +
            m sum_j g_{(r - s_j(t)) mod N}). Costs one more model-sized
            message per peer and step; use it with adaptive optimizers
            (Adam) when gossip trails synchronous training.
        sqrt_lr_scaling: Multiply a normalizing optimizer's learning rate
            (Adam, RMSprop, ...) by the square root of its gradient's noise
            ratio (module doc); False keeps it as given.
    """

    topology: str = "exponential"
    peers: int = 1
    mixing: float = None
    seed: int = 0
    mix_slots: bool = False
    mix_gradients: bool = False
    sqrt_lr_scaling: bool = True
    communicates = "parameters with a few peers every step"
    divergence_advice = "raise `peers` or pass `mix_slots=True`"

    def __post_init__(self):
        if self.topology not in TOPOLOGIES:
            raise ValueError(
                f"Argument `topology` must be one of {', '.join(map(repr, TOPOLOGIES))}; "
                f"received {self.topology!r}.")
        positive_int("peers", self.peers)
        if self.topology == "ring" and self.peers > 2:
            raise ValueError(f"Argument `peers` must be 1 or 2 with topology='ring' (the "
                             f"neighbours +1 and -1); received {self.peers}. Use "
                             "topology='exponential' or 'random' for more peers.")
        positive_int("seed", self.seed, minimum=0)
        boolean("mix_slots", self.mix_slots)
        boolean("mix_gradients", self.mix_gradients)
        boolean("sqrt_lr_scaling", self.sqrt_lr_scaling)
        if self.mixing is not None:
            m = self.mixing
            if (isinstance(m, bool) or not isinstance(m, numbers.Real) or not math.isfinite(m)
                    or not 0 <= m <= 1 / self.peers):
                raise ValueError(
                    f"Argument `mixing` must be in [0, 1 / peers] = [0, {1 / self.peers:g}]; "
                    f"received {m!r}. None gives 1 / (peers + 1), a uniform average.")

    def noise_ratio(self, world_size) -> float:
        """Variance of the gradient each replica's optimizer steps on over the synchronous one's."""
        if not self.weight:
            return 1.0  # independent replicas: nothing averages their steps
        if self.mix_gradients:
            p, m = self.peers, self.weight
            return world_size * ((1 - p * m) ** 2 + p * m * m)
        return float(world_size)

    @property
    def weight(self) -> float:
        """The mixing weight m of each peer."""
        return 1.0 / (self.peers + 1) if self.mixing is None else float(self.mixing)

    def shift_table(self, world_size):
        """int array [steps, peers]: the shifts s_j(t) of step t = row t mod steps."""
        shifts = [1 << k for k in range(max(1, math.ceil(math.log2(world_size))))]
        if self.topology == "ring":
            rows = [[1, world_size - 1][:self.peers]]
        elif self.topology == "exponential":
            rows = [[shifts[(t * self.peers + j) % len(shifts)] for j in range(self.peers)]
                    for t in range(len(shifts))]
        else:
            rng = np.random.default_rng(self.seed)
            rows = [list(rng.choice(np.arange(1, world_size), self.peers, replace=False) if
                         world_size > 1 else [1] * self.peers) for _ in range(TABLE_STEPS)]
        return np.asarray(rows, np.int64) % max(world_size, 1)

    def check_world_size(self, world_size):
        """Raises ValueError when the topology cannot give `peers` distinct peers."""
        if world_size < 2:
            raise ValueError(
                f"sync='gossip' needs at least 2 replicas to exchange parameters; this "
                f"strategy has {world_size}. Launch more workers (tfdist-run -np 2 ...), pass "
                "num_replicas=2 or more, or use sync='sync' for a single replica.")
        table = self.shift_table(world_size)
        if any(len(set(row)) < self.peers or 0 in row for row in table):
            raise ValueError(
                f"Argument `peers` = {self.peers} is more than topology={self.topology!r} "
                f"offers with {world_size} replicas; use peers <= "
                f"{max(1, min(len(set(r)) for r in table))}.")

    def runner(self, strategy):
        self.check_world_size(strategy.num_replicas_in_sync)
        return _GossipRunner(strategy, self)


@dataclasses.dataclass(frozen=True)
class Exchange:
    """The engine schedule of one gossip exchange: send to r + shift, receive from r - shift.

    Its result on replica r is replica (r - shift)'s buffer (not a sum).
    """

    shift: int

    def schedule(self, world_size, rank, num_elements) -> Schedule:
        if world_size == 1 or num_elements == 0:
            return Schedule(rank, world_size, num_elements, ())
        send = Send((rank + self.shift) % world_size, 0, num_elements)
        recv = Recv((rank - self.shift) % world_size, 0, num_elements, reduce=False)
        return Schedule(rank, world_size, num_elements, ((send, recv),))


class _GossipRunner(PolicyRunner):

    def __init__(self, strategy, policy):
        super().__init__(strategy)
        self.policy = policy
        self.table = policy.shift_table(self.world_size)
        self.shifts = sorted({int(s) for s in self.table.ravel()})
        with _compat.init_scope(), tf.device(self.cross_ops.devices[0]):
            self.rounds = _compat.ResourceVariable(tf.constant(0, tf.int64), trainable=False,
                                                   name="gossip_rounds")
        strategy.state.sync_rounds = self.rounds
        self.consensus_distance = None

    def update_step(self, optimizer, grads, variables, learning_rate):
        learning_rate = self.sqrt_scaled(optimizer, learning_rate,
                                         self.policy.noise_ratio(self.world_size),
                                         self.policy.sqrt_lr_scaling)
        step = tf.cast(optimizer.iterations, tf.int64)
        context = tf.distribute.get_replica_context()
        if self.policy.mix_gradients and self.policy.weight:
            grads = context.merge_call(self._mix_gradients_merge,
                                       args=(step, dense_gradients(grads)))
        super().update_step(optimizer, grads, variables, learning_rate)  # the local step
        slots = _compat.optimizer_slots(optimizer) if self.policy.mix_slots else []
        mixed = list(variables) + slots
        context.merge_call(self._mix_merge,
                           args=(step, [tf_variable(v) for v in mixed], len(variables)))

    def _mix_merge(self, strategy, step, variables, num_parameters):
        step = strategy.experimental_local_results(step)[0]  # equal on all replicas
        if not self.policy.weight:
            return self.rounds.assign_add(1)
        components = [strategy.experimental_local_results(v) for v in variables]
        mixed, sent = self._mix(step, [[c[i].read_value() for c in components]
                                       for i in range(len(components[0]))])
        updates = [c[i].assign(value) for i, values in enumerate(mixed)
                   for c, value in zip(components, values)]
        # Counted against what synchronous SGD's gradient all-reduce would send.
        dense = sum(self.cross_ops.wire.dense(c[0].shape.num_elements(), c[0].dtype)
                    for c in components[:num_parameters])
        updates.append(self.cross_ops.state.count(sent, dense))
        with tf.control_dependencies(updates):
            return self.rounds.assign_add(1)

    def _mix_gradients_merge(self, strategy, step, grads):
        """Each replica's gradients mixed with its peers' (per-replica values)."""
        step = strategy.experimental_local_results(step)[0]
        components = [strategy.experimental_local_results(g) for g in grads]
        mixed, sent = self._mix(step, [[c[i] for c in components]
                                       for i in range(len(components[0]))])
        with tf.control_dependencies([self.cross_ops.state.count(sent, 0, reductions=0)]):
            return [_compat.PerReplica([tf.identity(values[k]) for values in mixed])
                    for k in range(len(grads))]

    def _mix(self, step, replicas):
        """Mixes every local replica's list of tensors with its peers' at `step`.

        Returns the mixed lists (one per local replica) and the bytes one
        replica sent.
        """
        row = tf.gather(tf.constant(self.table), step % len(self.table))
        engine = self.cross_ops.engines.main()
        m, peers = self.policy.weight, self.policy.peers
        result, sent = [], 0
        for i, tensors in enumerate(replicas):
            buffers, restore = fusion.flatten_by_dtype(tensors)
            mixed = []
            for flat in buffers:
                received = [self._receive(engine, flat, i, row[j]) for j in range(peers)]
                keep = tf.cast(1.0 - m * peers, flat.dtype)
                mixed.append(keep * flat + tf.cast(m, flat.dtype) * tf.add_n(received))
                if i == 0:
                    sent += peers * flat.shape.num_elements() * flat.dtype.size
            result.append(restore(mixed))
        return result, sent

    def _receive(self, engine, flat, local_index, shift):
        """Replica (r - shift)'s `flat`, for the shift of this step (a traced switch)."""
        if len(self.shifts) == 1:
            return engine.all_reduce(flat, local_index, Exchange(self.shifts[0]),
                                     label="tfdist/gossip")
        index = tf.searchsorted(tf.constant(self.shifts, tf.int64), tf.reshape(shift, [1]))[0]
        branches = [lambda s=s: engine.all_reduce(flat, local_index, Exchange(s),
                                                  label="tfdist/gossip")
                    for s in self.shifts]
        return tf.switch_case(tf.cast(index, tf.int32), branches)

    def drain(self, model):
        """Measures the consensus distance, then averages the replicas (base class)."""
        self.consensus_distance = self._distance(model)
        super().drain(model)

    def _distance(self, model):
        variables = [tf_variable(v) for v in model.trainable_variables]
        total = self.replica_function(self._squared_distance_replica, variables)()
        total = self.strategy.experimental_local_results(total)[0]
        return math.sqrt(max(float(total), 0.0) / self.world_size)

    def _squared_distance_replica(self, variables):
        values = [tf.cast(tf.identity(v), tf.float64) for v in variables]
        sums = self.all_reduce_dense(_compat.ReduceOp.SUM, values)
        squares = tf.add_n([tf.reduce_sum(tf.square(v - s / self.world_size))
                            for v, s in zip(values, sums)])
        return self.all_reduce_dense(_compat.ReduceOp.SUM, [squares])[0]

    def stats(self):
        stats = {"sync_rounds": int(self.rounds.numpy())}
        if self.consensus_distance is not None:
            stats["consensus_distance"] = self.consensus_distance
        return stats
