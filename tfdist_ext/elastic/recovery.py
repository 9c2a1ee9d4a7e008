"""What survivors do when a worker dies during `fit` (`Strategy(elastic=True)`).

The anchor is torchft's per-step fault tolerance (pytorch/torchft, 2025): a
step whose collective failed is discarded, the survivors form a new quorum and
reconfigure their communicators, and training goes on in the same processes.
Here, in order:

1. Detect: the dead-peer watcher (`tfdist_ext.liveness`) finds a killed or
   stopped worker within about a second and aborts the UCX communicators that
   exist (only those: new ones work), so the step in flight fails at once on
   every survivor. A survivor whose step had already finished fails in its
   next one.
2. Discard: the failed step's batch is consumed and its update not trusted
   (a survivor may have applied it, another not: step 5 makes them equal).
3. Agree: the survivors health-check the members, report what they found
   and how many steps they ran, and the lowest-indexed survivor announces the
   new membership (`membership.agree`, in the survivor's key-value store,
   `store.py`: TF's coordination service dies with worker 0). Fewer than
   `min_workers` stops every survivor with an error naming the missing
   workers.
4. Rebuild: each survivor's cross-device ops take the new world size and
   rank and make new communicators (`CrossDeviceOps.reconfigure`); Keras'
   train, test and predict functions are traced again.
5. Agree on state: the new rank 0 broadcasts the model's variables and the
   optimizer's (slots, iteration count) to the others, so all members hold
   the same weights whichever of them applied the failed step; survivors
   that ran fewer steps skip the difference. If worker 0 died, the new rank
   0 becomes the chief: Keras' file-writing callbacks of the running `fit`
   write where the user asked from then on (`keras.worker_callbacks`).

Where Keras reads each worker's part of every global batch through a plain
`tf.data` pipeline (`tfdist_ext.keras.local_input`: one replica per worker,
a dataset of known length, auto-sharding AUTO or DATA), the survivors split
each global batch among themselves from the next batch on: the global batch
keeps its size and no sample is skipped. Otherwise each survivor keeps its
shard of the data and its per-replica batch, the global batch shrinks, and a
dead worker's share of the rest of the `fit` is not trained on. Either way the
gradient is the mean over the samples the members computed.

The same holds for a test step (`evaluate`, or `fit`'s validation): the
failed batch is left out of the metrics. Not covered yet: a replacement worker
rejoining, a second death during a recovery, and sync policies other than
"sync".
"""

import contextlib
import logging
import threading
import time
from typing import List

import tensorflow as tf

from tfdist_ext import _compat, coordination, liveness
from tfdist_ext.collectives import ucx_engine
from tfdist_ext.elastic import membership, store

log = logging.getLogger("tfdist_ext")
HEALTH_TIMEOUT_SECONDS = 2.0
HEALTH_TRIES = 2


class Recovery:
    """Elastic membership of one strategy.

    Args:
        strategy: The `tfdist_ext.Strategy` (one replica per worker).
        options: Its `tfdist_ext.elastic.Elastic`.
        key_prefix: Unique to the strategy, the same on every worker.

    Attributes:
        members: TF_CONFIG indices of the workers in the job now.
        generation: How many times the membership changed.
        failures: One dict per change: "generation", "step" (this worker's
            steps so far, the failed one included), "dead", "members",
            "skipped" (steps this worker skips to be level with the others),
            "seconds" (from the failed step to the new membership) and
            "time" (`time.time()` then).
    """

    def __init__(self, strategy, options, key_prefix):
        self.options = options
        self.me = strategy.worker_index
        self.members = tuple(range(strategy.num_workers))
        self.generation = 0
        self.failures: List[dict] = []
        self._strategy = strategy
        self._prefix = key_prefix
        self._addresses = dict(enumerate(strategy.cluster.worker_addresses))
        # Keras' input splits each global batch by these (`data_split`); made here,
        # outside any strategy scope, so that they stay this worker's own.
        self._split = (tf.Variable(self.me, dtype=tf.int64, trainable=False,
                                   name="elastic_part"),
                       tf.Variable(len(self.members), dtype=tf.int64, trainable=False,
                                   name="elastic_parts"))
        self._lock = threading.Lock()  # the watcher's aborts against a membership change
        self._on_promotion = []
        # Every worker serves a store; the members meet in the lowest one's.
        self._store = store.Store(self._addresses[self.me].rpartition(":")[0].strip("[]"))
        stores = coordination.exchange(f"{key_prefix}/elastic/stores", self._store.address,
                                       len(self.members), self.me)
        self._stores = dict(enumerate(stores))

    def kv(self, leader=None):
        """The meeting place of the members: the store of `leader` (default: the
        lowest-indexed member). Same interface as `coordination.KeyValue`."""
        leader = self.members[0] if leader is None else leader
        return store.Client(self._stores[leader])

    @contextlib.contextmanager
    def on_promotion(self, callback):
        """Within the context, `callback()` runs if this worker becomes the members'
        worker 0 (the chief)."""
        self._on_promotion.append(callback)
        try:
            yield
        finally:
            self._on_promotion.remove(callback)

    def data_split(self):
        """(part, parts): int64 variables of this worker's rank and the member count.

        Keras' input (`tfdist_ext.keras.local_input`) splits each global
        batch by them, so after a failure the survivors share whole batches.
        """
        return self._split

    def abort_communicators(self, reason: str, task: str):
        """Fails the collectives in flight if `task` (a TF task name, from the watcher)
        is a member; communicators made later work. A worker the members already
        went on without is ignored: its death must not fail their new communicators."""
        with self._lock:
            if any(liveness.task_name("worker", m) == task for m in self.members):
                ucx_engine.abort(reason, later=False)

    def dead_members(self) -> List[int]:
        """Members other than this worker whose TF server does not answer."""
        dead = []
        for worker in self.members:
            if worker == self.me:
                continue
            for attempt in range(HEALTH_TRIES):
                try:
                    _compat.check_peer_health(liveness.task_name("worker", worker),
                                              int(HEALTH_TIMEOUT_SECONDS * 1000))
                    break
                except Exception:  # pylint: disable=broad-except  (any failure is a miss)
                    if attempt + 1 == HEALTH_TRIES:
                        dead.append(worker)
        return dead

    def recover(self, error: Exception, steps: int) -> int:
        """Goes on without the dead workers after `error` failed a training step.

        Args:
            error: What the failed step raised.
            steps: Training steps this worker ran in this `fit`, the failed one
                included.

        Returns:
            Steps this worker must skip to be level with the others.

        Raises:
            The `error` itself when no member is dead (not a failure this
            handles); `membership.MembershipError` when the survivors cannot
            agree or are fewer than `min_workers`.
        """
        start = time.monotonic()
        dead = self.dead_members()
        if not dead:
            raise error
        alive = membership.survivors(self.members, dead)
        self._check_enough(alive, dead)
        generation = self.generation + 1
        meeting = self.kv(leader=min(alive))
        members, level = membership.agree(
            meeting.set, meeting.get, f"{self._prefix}/elastic/{generation}", self.me, alive,
            steps, self.options.recover_seconds)
        self._check_enough(members, sorted(set(self.members) - set(members)))
        lost = sorted(set(self.members) - set(members))
        was_chief = self.members[0] == self.me
        rank = membership.position(members, self.me)
        with self._lock:
            self.generation, self.members = generation, members
            self._strategy.reconfigure_workers(rank, len(members), generation, self.kv())
        self._split[0].assign(rank)
        self._split[1].assign(len(members))
        if rank == 0 and not was_chief:
            log.warning("tfdist_ext: worker %d is now the chief (it writes the checkpoints).",
                        self.me)
            for callback in list(self._on_promotion):
                callback()
        self.failures.append({"generation": generation, "step": steps, "dead": lost,
                              "members": list(members), "skipped": level - steps,
                              "seconds": time.monotonic() - start, "time": time.time()})
        log.warning("tfdist_ext: worker(s) %s died (%s); step %d discarded, %d worker(s) %s "
                    "go on (generation %d, %.1f s).", lost,
                    " ".join(str(error).split())[:200], steps, len(members), list(members),
                    generation, time.monotonic() - start)
        return level - steps

    def _check_enough(self, alive, dead):
        if len(alive) < self.options.min_workers:
            raise membership.MembershipError(
                f"tfdist_ext: worker(s) {sorted(dead)} ({', '.join(self._addresses[w] for w in sorted(dead))}) "
                f"died; {len(alive)} worker(s) {list(alive)} are left, fewer than "
                f"Elastic(min_workers={self.options.min_workers}). Restart the job, or lower "
                "min_workers.")

    def broadcast_state(self, variables):
        """Gives every member rank 0's values of `variables` (eager)."""
        variables = [v for v in variables if v.shape.num_elements()]
        engine = self._strategy.extended.cross_device_ops.collective_engine()
        by_dtype = {}
        for v in variables:
            by_dtype.setdefault(_wire_dtype(v.dtype), []).append(v)
        for dtype, group in by_dtype.items():
            flat = tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(v.value), dtype), [-1])
                              for v in group], 0)
            received = engine.broadcast(flat, 0, root=0, label="tfdist/elastic/state")
            offset = 0
            for v in group:
                size = v.shape.num_elements()
                v.assign(tf.cast(tf.reshape(received[offset:offset + size], v.shape), v.dtype))
                offset += size


def _wire_dtype(dtype):
    dtype = tf.as_dtype(dtype)
    if dtype in ucx_engine.SUPPORTED_DTYPES:
        return dtype
    return tf.float64 if dtype.is_floating else tf.int64
