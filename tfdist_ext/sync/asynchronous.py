"""Asynchronous SGD with parameter servers: no worker waits for another.

    Strategy(sync="async")                          # TF_CONFIG has a "ps" job
    Strategy(sync={"name": "async", "staleness_bound": 4, "delay_compensation": 0.1})
    tfdist-run -np 4 --ps 1 train.py                # 4 workers, 1 server

Each step, every replica computes a gradient on the parameters it last
received, pushes it to the servers (each holds whole variables,
`tfdist_ext.ps.sharding`) and receives the parameters the servers hold after
applying it; the servers apply gradients in arrival order with the model's
own optimizer (`tfdist_ext.ps.server`), so a slow worker slows only itself:

    w_{t+1} = w_t - eta * G_{k, t - tau}    (tau: the gradient's staleness)

The same script runs on the "ps" tasks: there `Strategy(sync="async")` serves
until the job ends and exits the process. The model's initial weights come
from the chief; at epoch ends and before evaluation every worker takes the
servers' current parameters (no barrier); at the end of `fit` all workers
wait for each other and end with the same parameters, which is what `fit`
evaluates and saves. The staleness of every applied gradient is recorded:
`communication_stats()["staleness_histogram"]` on each worker (its own
replicas), logged at epoch ends, and printed per worker by the servers.

References: Dean et al., "Large Scale Distributed Deep Networks" (Downpour
SGD), NeurIPS 2012; Ho et al., "More Effective Distributed ML via a Stale
Synchronous Parallel Parameter Server", NeurIPS 2013 (the bound); Zheng et
al., "Asynchronous SGD with Delay Compensation", ICML 2017 (DC-ASGD);
Mitliagkas, Zhang, Hadjis, Ré, "Asynchrony begets momentum, with an
application to deep learning", Allerton 2016 (momentum compensation).

Each worker pushes its gradient as Keras scales it in a synchronous step
(its mean gradient divided by the number of replicas N), so the N updates the
servers apply per round of N pushes move as far as one synchronous step: the
synchronous learning rate carries over (the linear scaling rule of Goyal et
al., 2017, for updates from 1/N of the global batch). With Keras' `SGD` and
momentum m, `momentum_compensation` (on by default) gives the servers'
optimizer the momentum 1 - (1 - m) N: a gradient applied N - 1 updates late
on average acts as extra momentum (`tfdist_ext.sync.momentum`, Mitliagkas et
al. 2016), and the compensated value keeps synchronous training's step gain.

Tuning: keep the synchronous learning rate. A staleness bound (at least
workers - 1) trades the stragglers' freedom for fresher gradients; delay
compensation helps at large staleness. Weights other than trainable ones
(BatchNorm statistics) stay per worker during `fit` and are averaged over the
workers when it returns.
"""

import dataclasses
import itertools
import logging
import math
import numbers
from typing import Optional

import numpy as np
import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.ps import messages, optimizer_layout, sharding
from tfdist_ext.registry import boolean
from tfdist_ext.sync import momentum
from tfdist_ext.sync.base import SYNC_POLICIES, SyncPolicy
from tfdist_ext.sync.runner import PolicyRunner, dense_gradients, tf_variable

log = logging.getLogger("tfdist_ext")
_sessions = itertools.count()  # async strategies in this process, in creation order


@SYNC_POLICIES.register("async")
@dataclasses.dataclass(frozen=True)
class Asynchronous(SyncPolicy):
    """Asynchronous SGD on the "ps" tasks of TF_CONFIG.

    Args:
        staleness_bound: None (default: no bound), or s >= workers - 1: a
            gradient is applied only if it is at most s updates old; a worker
            whose push would leave a slower one beyond s waits for it.
        delay_compensation: DC-ASGD's lambda >= 0 (0: off).
        timeout_seconds: A worker waiting this long for a server fails,
            naming it (a server that exits is noticed at once). 0: forever.
        momentum_compensation: Lower an SGD optimizer's momentum on the
            servers for the staleness of N replicas (see the module doc).
            False keeps the optimizer's own momentum.
    """

    staleness_bound: Optional[int] = None
    delay_compensation: float = 0.0
    timeout_seconds: float = 600.0
    momentum_compensation: bool = True
    uses_parameter_servers = True
    communicates = ("gradients to parameter servers and parameters back, every step, "
                    "without waiting for other workers")
    divergence_advice = "set `staleness_bound` (e.g. 2) or `delay_compensation` (e.g. 0.04)"

    @property
    def momentum_caution(self):
        """What momentum SGD risks at 4 or more workers (compensation on or off)."""
        return ("each gradient is applied about N - 1 updates late, which acts as extra "
                "momentum (Mitliagkas et al., 2016); the compensated server momentum "
                "1 - (1 - m) N " + ("" if self.momentum_compensation else "(switched off "
                                       "here) ") +
                "keeps 2 workers close to synchronous training, but at 4 or more workers "
                "it may end a few points below synchronous momentum SGD; safer at 4 or more "
                "workers: Adam or sync='sync'")

    def __post_init__(self):
        boolean("momentum_compensation", self.momentum_compensation)
        s = self.staleness_bound
        if s is not None and (isinstance(s, bool) or not isinstance(s, numbers.Integral)
                              or s < 0):
            raise ValueError(f"Argument `staleness_bound` must be None or an integer >= 0; "
                             f"received {s!r}.")
        for name in ("delay_compensation", "timeout_seconds"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"Argument `{name}` must be a finite number >= 0; "
                                 f"received {value!r}.")

    def check_servers(self, cluster, world_size):
        """The "ps" addresses of `cluster`; raises ValueError naming what is missing."""
        servers = cluster.jobs.get("ps") if cluster is not None else None
        if not servers:
            where = ("TF_CONFIG is not set" if cluster is None
                     else f"TF_CONFIG's cluster has jobs {sorted(cluster.jobs)}")
            raise ValueError(
                f"sync='async' needs parameter servers, but {where} and no 'ps' job. Launch "
                "with `tfdist-run -np N --ps M script.py`, or add \"ps\": [\"host:port\", "
                "...] to TF_CONFIG's cluster and run the same script there.")
        if self.staleness_bound is not None and self.staleness_bound < world_size - 1:
            raise ValueError(
                f"Argument `staleness_bound` ({self.staleness_bound}) must be at least the "
                f"number of replicas minus one ({world_size - 1}): all {world_size} start "
                "from the same parameters, so the last of their first gradients is "
                f"{world_size - 1} updates old. Use staleness_bound >= {world_size - 1}, "
                "or None.")
        return list(servers)

    def runner(self, strategy):
        return _AsyncRunner(strategy, self, self.check_servers(strategy.cluster,
                                                               strategy.num_replicas_in_sync))


class _Client:
    """One replica's connections: a mailbox, its token, and a peer and id per server."""

    def __init__(self, servers, rank, session, timeout_seconds, device):
        self.mailbox = messages.Mailbox(timeout_seconds)
        with tf.device(device):
            self.token = _compat.ResourceVariable(0.0, trainable=False)
        self.peers, self.ids = [], []
        for index, address in enumerate(servers):
            peer, ident = self.mailbox.connect(address, source=index)
            self.peers.append(peer)
            self.ids.append(ident)
            self.mailbox.send(peer, messages.tag(messages.HELLO, ident, rank | (session << 16)))

    def tags(self, kind, session):
        return [messages.tag(kind, ident, session) for ident in self.ids]


class _AsyncRunner(PolicyRunner):

    def __init__(self, strategy, policy, servers):
        super().__init__(strategy)
        self.policy = policy
        self.servers = servers
        self.session = next(_sessions)
        self.clients = None
        self.shards = None
        self.slots = None
        self._started = False
        with _compat.init_scope(), tf.device(self.cross_ops.devices[0]):
            self.histogram = _compat.ResourceVariable(
                tf.zeros([self.num_local, messages.HISTOGRAM_BINS + 1], tf.int64), trainable=False,
                name="async_staleness")

    # -- eager ------------------------------------------------------------

    def on_train_begin(self, model):
        self.strategy.keep_logs_local(True)
        self._started = False

    def on_epoch_begin(self, model):
        """Starts the session (or rejoins it) at the first epoch of `fit`.

        This runs after every callback's `on_train_begin`, so that weights and
        optimizer state restored there (BackupAndRestore) seed the servers. In
        a later `fit` of the same strategy the servers' parameters stay the
        model's.
        """
        if self._started:
            return
        self._started = True
        if self.clients is not None:
            self._pull(model, messages.PULL)
            return
        variables = [tf_variable(v) for v in model.trainable_variables]
        for v in variables:
            if v.dtype != tf.float32:
                raise TypeError(
                    f"sync='async' sends float32 parameters; variable {v.name} is "
                    f"{v.dtype.name}. Keep trainable variables in float32 (mixed precision "
                    "keeps them so).")
        sizes = [v.shape.num_elements() for v in variables]
        self.shards = sharding.shard(sizes, len(self.servers))
        server_optimizer = self._server_optimizer(model.optimizer)
        self.slots = optimizer_layout.layout(model, self.shards, server_optimizer)
        devices = self.cross_ops.devices
        with _compat.init_scope():
            self.clients = [_Client(self.servers, self.first_rank + i, self.session,
                                    self.policy.timeout_seconds, devices[i])
                            for i in range(self.num_local)]
        if self.first_rank == 0:
            self._initialize_servers(model, variables, server_optimizer)
        self._pull(model, messages.PULL)
        log.info("tfdist_ext: sync='async' over %d parameter server(s) %s; variables per "
                 "server %s", len(self.servers), self.servers, [len(s) for s in self.shards])

    def _server_optimizer(self, optimizer):
        """The Keras config of the servers' optimizer: the model's, momentum compensated."""
        import keras  # pylint: disable=import-outside-toplevel

        config = keras.optimizers.serialize(optimizer)
        if self.policy.momentum_compensation:
            config = momentum.compensated_config(config, self.world_size - 1)
        return config

    def _initialize_servers(self, model, variables, optimizer):
        """Sends each server its shard's layout, values and (restored) optimizer state.

        `optimizer` is the servers' optimizer config (`_server_optimizer`).
        """
        # A restored (or reused) optimizer's state goes to the servers too.
        restored = int(model.optimizer.iterations.numpy()) > 0
        chief = self.clients[0]
        for server, members in enumerate(self.shards):
            layout = {"session": self.session, "workers": self.world_size,
                      "shapes": [variables[j].shape.as_list() for j in members],
                      "optimizer": optimizer,
                      "staleness_bound": self.policy.staleness_bound,
                      "delay_compensation": self.policy.delay_compensation}
            peer, ident = chief.peers[server], chief.ids[server]
            chief.mailbox.send_json(peer, messages.tag(messages.INIT, ident), layout)
            values = self._flat([variables[j].read_value() for j in members])
            chief.mailbox.send(peer, messages.tag(messages.INIT_VALUES, ident), values)
            if restored:
                state = tf.concat([tf.reshape(tf.cast(v.value, tf.float64), [-1])
                                   for v, _ in self.slots[server]], 0)
                chief.mailbox.send(peer, messages.tag(messages.INIT_STATE, ident), state)

    def _pull_state(self):
        """Copies the servers' optimizer variables into this worker's optimizer (checkpoints)."""
        client = self.clients[0]
        for peer, message_tag in zip(client.peers, client.tags(messages.STATE, self.session)):
            client.mailbox.send(peer, message_tag)
        for _ in self.servers:
            _, source, _, data = client.mailbox.recv(messages.STATE_VALUES, watch=-1,
                                                     dtype=tf.float64)
            offset = 0
            for variable, owner in self.slots[source]:
                size = int(np.prod(variable.shape))
                if owner:
                    part = tf.reshape(data[offset:offset + size], variable.shape)
                    variable.assign(tf.cast(part, variable.dtype))
                offset += size

    def _pull(self, model, kind):
        """Every local replica sends `kind` (PULL or BARRIER), then takes the parameters."""
        variables = [tf_variable(v) for v in model.trainable_variables]
        components = [self.strategy.experimental_local_results(v) for v in variables]
        empty = [tf.zeros([0], tf.float32)] * len(self.servers)
        for client in self.clients:  # every request out before any wait (barrier)
            for peer, message_tag in zip(client.peers, client.tags(kind, self.session)):
                client.mailbox.send(peer, message_tag, empty[0])
        for i, client in enumerate(self.clients):
            replies = [None] * len(self.servers)
            for _ in self.servers:
                _, source, _, data = client.mailbox.recv(messages.PARAMS, watch=-1)
                replies[source] = data
            for c, value in zip(components, self._split(replies, variables)):
                c[i].assign(value)
        del empty

    def drain(self, model):
        """Takes the servers' current parameters and optimizer state (no barrier); logs staleness."""
        self._pull(model, messages.PULL)
        self._pull_state()
        stats = self.stats()
        if stats.get("async_steps"):
            log.info("tfdist_ext: async staleness on this worker: mean %.2f, max %d, "
                     "histogram %s", stats["staleness_mean"], stats["staleness_max"],
                     stats["staleness_histogram"])

    def on_test_begin(self, model):
        """Evaluation reduces over all workers: pause, so that nobody waits for us."""
        self.strategy.keep_logs_local(False)
        self._pull(model, messages.REST)

    def on_test_end(self, model):
        self.strategy.keep_logs_local(True)

    def on_train_end(self, model):
        """All workers meet; every replica ends with the servers' final parameters.

        The BatchNorm statistics, which stayed per worker, are averaged here.
        """
        self.strategy.keep_logs_local(False)
        self._pull(model, messages.BARRIER)
        self._pull_state()
        self.average_buffers(model)

    # -- replica context ----------------------------------------------------

    def update_step(self, optimizer, grads, variables, learning_rate):
        del optimizer, learning_rate  # the servers apply the gradients
        grads = dense_gradients(grads)
        tf.distribute.get_replica_context().merge_call(
            self._push_merge, args=(grads, [tf_variable(v) for v in variables]))

    def _push_merge(self, strategy, grads, variables):
        per_replica = [strategy.experimental_local_results(g) for g in grads]
        components = [strategy.experimental_local_results(v) for v in variables]
        updates = []
        for i, client in enumerate(self.clients):
            pushes = [self._flat([per_replica[j][i] for j in members])
                      for members in self.shards]
            tags, replies = client.mailbox.exchange(
                client.token.handle, pushes, client.peers, client.tags(messages.PUSH, self.session),
                messages.PARAMS, range(len(self.servers)))
            values = messages.value_of(tags)
            dropped = tf.reduce_any(values >= messages.DROPPED)
            staleness = tf.minimum(tf.reduce_max(values % messages.DROPPED),
                                   messages.HISTOGRAM_BINS - 1)
            # A refused gradient lands in the last column (never a staleness bin).
            column = tf.where(dropped, tf.constant(messages.HISTOGRAM_BINS, tf.int64), staleness)
            updates.append(self.histogram.scatter_nd_add([[i, column]], [1]))
            for c, value in zip(components, self._split(replies, variables)):
                updates.append(c[i].assign(value))
        size = 4 * sum(v.shape.num_elements() for v in variables)
        dense = sum(self.cross_ops.wire.dense(v.shape.num_elements(), v.dtype)
                    for v in variables)
        # What the worker sends (its gradient); it receives as much (the parameters).
        updates.append(self.cross_ops.state.count(size, dense))
        return tf.group(updates)

    # -- helpers --------------------------------------------------------------

    @staticmethod
    def _flat(tensors):
        return tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)

    def _split(self, replies, variables):
        """Values for `variables` (model order) from the servers' flat replies."""
        values = [None] * len(variables)
        for members, reply in zip(self.shards, replies):
            sizes = [variables[j].shape.num_elements() for j in members]
            parts = tf.split(reply, sizes) if len(sizes) > 1 else [reply]
            for j, part in zip(members, parts):
                values[j] = tf.reshape(part, variables[j].shape)
        return values

    def stats(self):
        counts = self.histogram.numpy().sum(axis=0)
        dropped, counts = int(counts[-1]), counts[:-1]
        steps = int(counts.sum())
        if not steps:
            return {"async_steps": 0, "async_refused": dropped}
        last = int(np.nonzero(counts)[0].max())
        return {"async_steps": steps, "async_refused": dropped,
                "staleness_mean": float((counts * np.arange(len(counts))).sum()) / steps,
                "staleness_max": last,
                "staleness_histogram": counts[:last + 1].tolist()}
