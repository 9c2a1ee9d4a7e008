"""What every sync policy's runner shares: applying updates and averaging parameters.

A runner lives as long as its strategy. `tfdist_ext.keras.fit_hooks` calls it from
inside Keras' train step (replica context):

* `update_step` replaces Keras' "all-reduce the gradients, then apply" step
  (`TFOptimizer._backend_update_step`);
* `wrap_train_step` may wrap the model's whole train step (model averaging
  runs several learners per replica);
* `drain` runs eagerly between epochs, before evaluation and at the end of
  `fit` (from `SyncCallback`): it finishes in-flight communication and leaves
  every replica with the same weights (and BatchNorm statistics,
  `BufferAverager`), so what `fit` evaluates and saves is one model.

Relaxed policies (`worker_local_logs`) communicate less than once per step, so
the per-step collectives Keras itself adds in multi-worker `fit` (the
"does any worker still have data" all-reduce of the distributed iterator and
the all-reduce of the logged loss and metrics) would synchronise the workers
again. While a train function of such a policy runs, `Strategy.reduce` reduces
over this worker's replicas only: the progress bar shows this worker's loss,
and each worker ends an epoch when its own data ends, so every worker must run
the same number of steps per epoch (pass `steps_per_epoch`, or give workers
equal shards); `drain` checks this and names the workers that differ.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.sync import lr_scaling


class ReplicaOps:
    """A strategy's replicas as runners see them: ranks and uncounted all-reduces.

    Args:
        strategy: The owning `tfdist_ext.Strategy`.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        self.cross_ops = strategy.extended.cross_device_ops
        self.num_local = len(self.cross_ops.devices)
        self._functions = {}

    @property
    def world_size(self) -> int:
        """Replicas in sync now (an elastic job's members change)."""
        return self.strategy.num_replicas_in_sync

    @property
    def first_rank(self) -> int:
        """Global rank of this worker's first replica now."""
        return self.cross_ops.first_rank

    def replica_function(self, replica_fn, variables):
        """A `tf.function` that runs ``replica_fn(variables, *args)`` on every replica.

        Traced once per `replica_fn` and kept while `variables` are the same
        objects (a new model retraces) and the members are (an elastic job's
        next generation retraces: its collectives are new). Call it eagerly
        with the extra args.
        """
        ids = ([id(v) for v in variables], self.cross_ops.engines.generation,
               self.world_size, self.first_rank)
        cached = self._functions.get(replica_fn.__name__)
        if cached is None or cached[0] != ids:
            cached = (ids, tf.function(lambda *args: self.strategy.run(
                replica_fn, args=(variables, *args))))
            self._functions[replica_fn.__name__] = cached
        return cached[1]

    def local_index(self) -> int:
        """Index of the current replica among this worker's replicas (Python int)."""
        replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
        return int(tf.get_static_value(replica_id)) - self.first_rank

    def all_reduce_dense(self, reduce_op, values):
        """All-reduces tensors from replica context, uncompressed and uncounted
        (`Strategy.all_reduce_dense`)."""
        return self.strategy.all_reduce_dense(reduce_op, list(values))


class BufferAverager(ReplicaOps):
    """Averages a model's floating-point non-trainable variables over all replicas.

    These are BatchNorm's moving statistics (and frozen weights): each replica
    updates its own from its own batches, so without this the workers would
    end `fit` with different models. The mean is computed as replica 0's value
    plus the mean deviation from it, so replicas that agree (frozen weights)
    keep their value bit for bit. Call it eagerly, `averager(model)`, at the
    same point on every worker.
    """

    def __call__(self, model):
        buffers = [tf_variable(v) for v in model.non_trainable_variables
                   if tf.as_dtype(v.dtype).is_floating]
        if buffers and self.world_size > 1:
            self.replica_function(self._replica, buffers)()

    def _replica(self, buffers):
        first = self.first_rank + self.local_index() == 0
        values = [tf.identity(v) for v in buffers]
        anchors = self.all_reduce_dense(
            _compat.ReduceOp.SUM, [v if first else tf.zeros_like(v) for v in values])
        deviations = self.all_reduce_dense(
            _compat.ReduceOp.SUM, [v - a for v, a in zip(values, anchors)])
        inverse = 1.0 / self.world_size
        updates = [b.assign(a + d * tf.cast(inverse, d.dtype))
                   for b, a, d in zip(buffers, anchors, deviations)]
        with tf.control_dependencies(updates):
            return tf.constant(0)


class PolicyRunner(ReplicaOps):
    """Base class of the runners of the sync policies.

    Args:
        strategy: The owning `tfdist_ext.Strategy`.
    """

    #: Whether `Strategy.reduce` stays on this worker during training (see module doc).
    worker_local_logs = True

    def __init__(self, strategy):
        super().__init__(strategy)
        self.average_buffers = BufferAverager(strategy)
        self._steps_at_drain = None
        self.lr_factor = None  # `sqrt_scaled`'s factor, resolved at the first traced step

    # -- replica context -------------------------------------------------

    def update_step(self, optimizer, grads, variables, learning_rate):
        """Replaces Keras' all-reduce-and-apply step; default: apply local gradients.

        Keras scales the loss by 1 / num_replicas_in_sync (so that summed
        gradients are the global mean); a local step undoes that scale.
        """
        scale = float(self.world_size)
        self.apply(optimizer, [g * tf.cast(scale, g.dtype) for g in dense_gradients(grads)],
                   variables, learning_rate)

    def wrap_train_step(self, model, train_step):
        """Returns the function Keras runs per replica and step (default: unchanged)."""
        return train_step

    def sqrt_scaled(self, optimizer, learning_rate, noise_ratio: float, enabled: bool):
        """`learning_rate` times the square-root factor of `tfdist_ext.sync.lr_scaling`.

        The factor (1 unless `enabled` and the optimizer normalizes the
        gradient) is resolved and logged at the first traced step and kept in
        `lr_factor`.
        """
        if self.lr_factor is None:
            self.lr_factor = lr_scaling.resolve(self.strategy.config.sync, optimizer,
                                                noise_ratio, enabled)
        return lr_scaling.scaled(learning_rate, self.lr_factor)

    def apply(self, optimizer, grads, variables, learning_rate):
        """Applies per-replica `grads` with `optimizer`, each replica to its own weights."""
        tf_variables = [tf_variable(v) for v in variables]
        tf.__internal__.distribute.interim.maybe_merge_call(
            _compat.distributed_update_step(optimizer),
            self.strategy, list(zip(grads, tf_variables)), learning_rate)

    # -- eager, between steps ----------------------------------------------

    def on_train_begin(self, model):
        self._steps_at_drain = int(model.optimizer.iterations.numpy())

    def drain(self, model):
        """Finishes in-flight work and makes every replica's weights equal (eager)."""
        steps = int(model.optimizer.iterations.numpy())
        since = steps - (self._steps_at_drain if self._steps_at_drain is not None else 0)
        self._drain_corrections(model)
        counts = self._average(model, since)
        self._steps_at_drain = steps
        self._check_step_counts(counts, since)
        self.average_buffers(model)

    def on_epoch_begin(self, model):
        """Hook: runs at every epoch's start, after every callback's `on_train_begin` (eager)."""

    def on_train_end(self, model):
        """Hook: runs after the final drain of `fit` (eager)."""

    def on_test_begin(self, model):
        """Hook: runs before evaluation, after the drain (eager)."""

    def on_test_end(self, model):
        """Hook: runs after evaluation (eager)."""

    def _drain_corrections(self, model):
        """Hook: apply what in-flight communication owes each replica (before averaging)."""

    def _average(self, model, steps_since_drain):
        """Averages trainable variables over all replicas; gathers step counts per worker."""
        variables = [tf_variable(v) for v in model.trainable_variables]
        counts = self.replica_function(self._average_replica, variables)(
            tf.constant(steps_since_drain, tf.int64))
        return np.asarray(self.strategy.experimental_local_results(counts)[0])

    def _average_replica(self, variables, steps):
        rank = self.first_rank + self.local_index()
        one_hot = tf.cast(tf.one_hot(rank, self.world_size), tf.float64) * tf.cast(
            steps, tf.float64)
        counts = self.all_reduce_dense(_compat.ReduceOp.SUM, [one_hot])[0]
        # TF's native path packs one dtype per call: the counts go separately.
        sums = self.all_reduce_dense(_compat.ReduceOp.SUM, [tf.identity(v) for v in variables])
        inverse = 1.0 / self.world_size
        updates = [v.assign(s * tf.cast(inverse, s.dtype)) for v, s in zip(variables, sums)]
        with tf.control_dependencies(updates):
            return tf.identity(counts)

    def _check_step_counts(self, counts, since):
        per_replica = [int(round(c)) for c in counts]
        if len(set(per_replica)) > 1:
            raise RuntimeError(
                f"tfdist_ext: with sync={self.strategy.config.sync.name!r} every replica "
                "must run the same number of steps between synchronisation points, but "
                f"replicas ran {per_replica} steps (by global rank; this worker: {since}). "
                "Pass `steps_per_epoch` to `fit`, or give every worker the same number "
                "of batches (e.g. `dataset.repeat()` with `steps_per_epoch`).")

    def stats(self):
        """Policy counters for logging (Python numbers)."""
        return {}


def tf_variable(variable):
    """The `tf.Variable` behind a Keras variable (or `variable` itself)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def dense_gradients(grads):
    """Gradients as dense tensors (IndexedSlices densified)."""
    return [tf.convert_to_tensor(g) for g in grads]

