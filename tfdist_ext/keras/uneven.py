"""Any global batch size on any number of replicas, with single-process results.

A global batch of B samples split over R replicas gives local batches of
unequal sizes n_r whenever R does not divide B, at the partial last batch of
an epoch, and when one worker's shard runs out first (its replicas then get
empty batches until every shard is exhausted). Two things in Keras 3's `fit`
assume equal local batches, and the wrappers here (installed by
`tfdist_ext.keras.patches`) repair both for `tfdist_ext.Strategy` (other
strategies are untouched):

* `TensorFlowTrainer._maybe_symbolic_build` all-reduces (MEAN) the first
  data batch only to get a sample batch for building the model; local
  batches of different lengths make that collective fail ("Shape mismatch in
  the collective instance"). Under our strategy the first local batch is used
  instead: every worker builds the same variables from the same feature
  shapes. A model without `call()` (only a custom `train_step`, as a GAN) is
  left to build while its step is traced, as Keras does without a strategy.
* Keras scales each replica's loss by 1 / R (`scale_loss_for_distribution`)
  so that the summed gradients are the global mean. With unequal n_r the
  correct weight is n_r / N, where N = sum of n_r: otherwise a sample in a
  small local batch counts more than one in a large batch. During a
  synchronous training step the strategy all-reduces n_r (one scalar
  collective per step, skipped when the local batch size is static, which
  means every replica has the same) and the loss's gradient is scaled by
  n_r / N. Under `tfdist_ext.Strategy` the scaling applies to the gradient
  only: the loss's value is left as it is, so `fit`'s loss and metrics, and
  what a custom `train_step` tracks or returns, equal single-process values
  (Keras scales the value, which divided custom steps' losses by R).

Keras runs as many steps per epoch as the local dataset has batches. When the
user shards a dataset per worker (auto-sharding off) the workers' shards can
differ in length, and the worker that ran out first would leave the others
waiting in a collective. `local_input.common_length` pads each worker's `tf.data.Dataset`
with empty batches up to the longest shard's batch count (agreed through
the coordination service), and the sample weighting above gives those empty
batches weight 0.

Relaxed sync policies (`tfdist_ext.sync`) take local steps on the local mean
gradient and keep Keras' 1 / R scaling, which their runners undo.

A replica with an empty batch must contribute nothing, but BatchNormalization's
moments over zero samples are NaN, and they reach its gradients (gamma's
gradient multiplies the NaN mean by a zero sum) and its moving statistics.
Under `tfdist_ext.Strategy` the moments of an empty batch are the moving
statistics instead (unless `synchronized=True`, whose moments are global):
the layer's gradients are 0 and its moving statistics stay as they were (up
to rounding) on that replica. Likewise TF 2.21's oneDNN CPU kernels mishandle
empty batches: convolutions return an empty tensor shaped like their input
(the next layer fails on a shape mismatch), separable convolutions fail, and
max pooling's gradient aborts the process. Under `tfdist_ext.Strategy` these
ops, on a batch that is empty at run time, run on one zero sample instead and
return none of it.
"""

import contextlib
import functools
import threading

import keras
import tensorflow as tf

from tfdist_ext import _compat, frontends
from tfdist_ext.keras import xla

_step = threading.local()  # replica threads trace the step concurrently


def applies(strategy) -> bool:
    """Whether training steps under `strategy` weight replicas by their samples."""
    return (frontends.our_strategy(strategy) is not None and strategy.sync_runner is None
            and strategy.num_replicas_in_sync > 1)


def weighted_train_step(train_step, strategy, eager=False):
    """`train_step` with each replica's loss weighted by its share of the samples.

    The same all-reduce carries the workers' preemption requests
    (`tfdist_ext.keras.preemption`) to every worker. `eager`: the model runs
    eagerly (`run_eagerly=True`), where each step sees its batch's concrete
    shapes, so a static batch dimension says nothing about the other replicas.
    """

    @functools.wraps(train_step)
    def step(data):
        try:
            with _loss_scale(_agree(data, strategy, eager)):
                return train_step(data)
        finally:
            _step.timing = None

    return step


def weighted_test_step(test_step, strategy, eager=False):
    """`test_step` with this replica's share of the samples known to its trackers.

    No preemption or join flags travel with it: one scalar all-reduce per step,
    and none when the batch dimension is static (every replica the same).
    """

    @functools.wraps(test_step)
    def step(data):
        with _loss_scale(_samples_share(data, strategy, eager)):
            return test_step(data)

    return step


def _first_input(data):
    x = keras.utils.unpack_x_y_sample_weight(data)[0]
    return next((t for t in tf.nest.flatten(x) if t is not None), None)


def _static_batch(first, eager):
    """Whether the batch size is known while tracing (then the same on every replica)."""
    return first is None or (not eager and tf.convert_to_tensor(first).shape.rank
                             and tf.convert_to_tensor(first).shape[0] is not None)


def _samples(first):
    return (tf.constant(0.0) if first is None
            else tf.cast(tf.shape(tf.convert_to_tensor(first))[0], tf.float32))


def _samples_share(data, strategy, eager):
    """n_r / N for this replica's batch, or None when the batch dimension is static."""
    first = _first_input(data)
    if _static_batch(first, eager):
        return None
    samples = _samples(first)
    total = strategy.all_reduce_dense(tf.distribute.ReduceOp.SUM, samples)
    return tf.math.divide_no_nan(samples, total)


def _agree(data, strategy, eager=False):
    """n_r / N for this replica's batch (None when every batch has the same size).

    With several workers the all-reduce also sums the stop requests into
    `strategy.preemption.agreed` and `strategy.preemption.stop_agreed`.
    """
    first = _first_input(data)
    static = _static_batch(first, eager)
    preemption = strategy.preemption if strategy.num_workers > 1 else None
    # When the members can change, Keras' 1 / R need not match the replicas left
    # (a worker died): the share is always computed.
    members = strategy.membership
    static = static and not members.changes
    if static and preemption is None:
        return None  # a static batch dimension: the same on every replica
    samples = _samples(first)
    values = [samples[None]]
    if preemption is not None:  # SIGTERM, and `stop_training` set on some workers only
        values.append(preemption.requested.read_value()[None])
        values.append(preemption.stop_requested.read_value()[None])
    flags_at = len(values)
    flags = members.step_flags()  # e.g. a replacement asking to join
    values.extend(flags)
    monitor = members.stragglers
    if monitor is not None:  # every worker's busy seconds of the last step
        with tf.control_dependencies([] if first is None else [first]):
            arrival = monitor.arrived()
        values.append(monitor.share())
    totals = strategy.all_reduce_dense(tf.distribute.ReduceOp.SUM, tf.concat(values, 0))
    if preemption is not None:
        preemption.agreed.assign(totals[1])
        preemption.stop_agreed.assign(totals[2])
    if flags:
        members.agree_flags(totals[flags_at:flags_at + len(flags)])
    if monitor is not None:
        monitor.table.assign(totals[-monitor.workers:])
        with tf.control_dependencies([totals]):
            _step.timing = (monitor, arrival, tf.timestamp())
    return None if static else tf.math.divide_no_nan(samples, totals[0])


@contextlib.contextmanager
def _loss_scale(share):
    previous = getattr(_step, "share", None)
    _step.share = share
    try:
        yield
    finally:
        _step.share = previous


def wrap_scale(original):
    """Keras' `scale_loss_for_distribution`, by samples under our strategy (see module)."""

    @functools.wraps(original)
    def scale_loss_for_distribution(value):
        share = getattr(_step, "share", None)
        if share is None:
            replicas = _tfdist_replicas()
            if replicas is None:
                return original(value)
            share = 1.0 / replicas
        else:
            # Eagerly, Keras' loss of an empty batch is an empty tensor: its sum, 0.
            value = tf.reduce_sum(value)
        timing = getattr(_step, "timing", None)
        if timing is not None:  # the forward pass ends here (`tfdist_ext.elastic.stragglers`)
            _step.timing = None
            monitor, arrival, synced = timing
            with tf.control_dependencies([value]):
                forward = tf.timestamp() - synced
            monitor.busy.assign(tf.cast(arrival + forward, tf.float32))
        return _gradient_scaled(tf.convert_to_tensor(value), share)

    return scale_loss_for_distribution


def wrap_unscale(original):
    """Keras' `unscale_loss_for_distribution`, matching `wrap_scale` (see module)."""

    @functools.wraps(original)
    def unscale_loss_for_distribution(value):
        if getattr(_step, "share", None) is not None:
            # Eagerly, an empty batch's loss is an empty tensor: its sum, 0.
            return tf.reduce_sum(value)
        if _tfdist_replicas() is None:
            return original(value)
        return value  # `scale_loss_for_distribution` kept the value

    return unscale_loss_for_distribution


def wrap_mean_update(original):
    """`keras.metrics.Mean.update_state`: a per-batch scalar counts once per batch.

    A tracker updated with one unweighted scalar per step (a custom step's
    `loss_tracker.update_state(loss)`, Keras' per-output loss metrics when the
    batch dimension is not static) averages batches in one process. Each
    replica adds its own value with weight 1, so across replicas it averaged
    replica means, weighting a sample of a small local batch more. Under a
    synchronous `tfdist_ext.Strategy` such an update is weighted by the
    replica's share of the batch's samples (1 / replicas when all are equal):
    the batch still counts once and its value is the batch mean.
    """

    @functools.wraps(original)
    def update_state(self, values, sample_weight=None):
        if sample_weight is None:
            share = _replica_share()
            if share is not None and tf.convert_to_tensor(values).shape.rank == 0:
                sample_weight = share
        return original(self, values, sample_weight=sample_weight)

    return update_state


def _replica_share():
    """This replica's weight for one per-batch value, inside a synchronous
    replica step of a `tfdist_ext.Strategy` of several replicas; else None."""
    if tf.distribute.in_cross_replica_context():
        return None
    share = getattr(_step, "share", None)
    if share is not None:
        return share
    strategy = tf.distribute.get_strategy()
    if not applies(strategy):
        return None
    return 1.0 / strategy.num_replicas_in_sync


def _tfdist_replicas():
    """Replicas in sync under a `tfdist_ext.Strategy` of several, else None."""
    strategy = tf.distribute.get_strategy()
    if frontends.our_strategy(strategy) is not None and strategy.num_replicas_in_sync > 1:
        return strategy.num_replicas_in_sync
    return None


def _gradient_scaled(value, share):
    """`value` itself, whose gradient is scaled by `share`.

    Summed over the replicas, the scaled gradients are the global batch's
    mean gradient, while the value (what a custom `train_step` logs or
    tracks) stays this replica's mean loss, as in one process.
    """

    @tf.custom_gradient
    def identity(x):
        return tf.identity(x), lambda upstream: upstream * tf.cast(share, upstream.dtype)

    return identity(value)


def wrap_moments(original):
    """`BatchNormalization._moments`: the moving statistics for an empty batch."""

    @functools.wraps(original)
    def moments(self, inputs, mask):
        mean, variance = original(self, inputs, mask)
        inputs = tf.convert_to_tensor(inputs)
        if (self.synchronized or frontends.our_strategy(tf.distribute.get_strategy()) is None
                or inputs.shape.num_elements()):  # statically non-empty
            return mean, variance
        empty = tf.equal(tf.size(inputs), 0)

        def moving(statistic, batch):
            return tf.reshape(tf.cast(statistic, batch.dtype), tf.shape(batch))

        return (tf.where(empty, moving(self.moving_mean, mean), mean),
                tf.where(empty, moving(self.moving_variance, variance), variance))

    return moments


def one_sample_when_empty(original):
    """A Keras TF-backend op run on one zero sample when its batch is empty.

    Only where a replica can get an empty batch (several replicas). In a step
    compiled by XLA (`tfdist_ext.keras.xla`) the guard is a zero sample
    appended and sliced off again, which XLA removes at a static batch size
    (a `tf.cond` whose branches differ in shape does not compile; before a
    cluster is compiled, TF's kernels run it and need the guard).
    """

    @functools.wraps(original)
    def op(inputs, *args, **kwargs):
        inputs = tf.convert_to_tensor(inputs)
        strategy = tf.distribute.get_strategy()
        if (not tf.inside_function() or inputs.shape.rank is None
                or inputs.shape[0] is not None  # a static batch: never empty
                or frontends.our_strategy(strategy) is None or strategy.num_replicas_in_sync < 2):
            return original(inputs, *args, **kwargs)
        def one_zero_sample():
            return tf.zeros(tf.concat([[1], tf.shape(inputs)[1:]], 0), inputs.dtype)

        if xla.tracing():
            size = tf.shape(inputs)[0]
            padded = tf.concat([inputs, one_zero_sample()], 0)[:tf.maximum(size, 1)]
            return original(padded, *args, **kwargs)[:size]

        def on_one_zero_sample():
            return original(one_zero_sample(), *args, **kwargs)[:0]

        return tf.cond(tf.size(inputs) > 0, lambda: original(inputs, *args, **kwargs),
                       on_one_zero_sample)

    return op


def wrap_symbolic_build(original):
    """`TensorFlowTrainer._maybe_symbolic_build` from the first local batch."""

    @functools.wraps(original)
    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy  # pylint: disable=protected-access
        if iterator is None or frontends.our_strategy(strategy) is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        if not _has_call(self):
            return None  # as without a strategy: the traced train_step builds what it uses
        if not _needs_a_batch(self):
            # Nothing to build from data: no second iterator over the user's dataset
            # (one that reads a batch and is dropped while the epoch's own iterator
            # starts, both filling the same `cache()`).
            return original(self)
        for *_, it in iterator:  # (step, iterator) before Keras 3.11, (begin, end, iterator) after
            batch = next(it)
            data_batch = tf.nest.map_structure(
                lambda v: strategy.experimental_local_results(v)[0]
                if _compat.is_distributed_value(v) else v, batch)
            break
        return original(self, data_batch=data_batch)

    return maybe_symbolic_build


def _needs_a_batch(model):
    """Whether Keras' symbolic build needs a data batch (as `Trainer._symbolic_build`)."""
    compiled = (getattr(model, "_compile_metrics", None), getattr(model, "_compile_loss", None))
    return (not all(layer.built for layer in model._flatten_layers())  # pylint: disable=protected-access
            or any(c is not None and not c.built for c in compiled))


def _has_call(model):
    """Whether `model` computes outputs (a GAN with only `train_step` does not)."""
    return type(model).call not in (keras.Model.call, keras.layers.Layer.call)
