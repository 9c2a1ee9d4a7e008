"""Keras optimizer features that assume one replica, made global under the strategy.

Three Keras 3.15 optimizer features decide on the gradients *before* they are
all-reduced, which under a distribution strategy means on each replica's
local gradient. For `tfdist_ext.Strategy` in synchronous training, the
wrappers here (installed by `tfdist_ext.keras.patches`) make them decide on
the global gradient, as in single-process training:

* Clipping (`clipnorm`, `global_clipnorm`, `clipvalue`) clips the all-reduced
  gradient instead of each replica's share of it.
* `gradient_accumulation_steps=k` (keras-team/keras#20582: its `cond` around
  the all-reduce fails under tf.distribute with "merge_call called while
  defining a new graph"): as in Keras, each replica accumulates its own
  gradients for k - 1 steps with no communication, and the k-th step
  all-reduces their mean once and applies it. The condition is evaluated in
  cross-replica context, where `cond` may contain collectives. The
  accumulators are per replica: a checkpoint written between two updates
  keeps the chief's partial sum only (end epochs on a multiple of k to
  checkpoint none).
* `LossScaleOptimizer` (mixed precision) decides "finite or skip the step"
  from the first local replica's unreduced gradients, so replicas and
  workers could disagree: one skips (no all-reduce) while another reduces, or
  a replica's infinite gradient reaches the sum. Every replica's finiteness
  is all-reduced first; if any replica overflowed, every replica skips the
  step (the dynamic loss scale halves everywhere), so error-feedback
  residuals never see an infinite gradient.

Other strategies, relaxed sync policies and optimizers without these
options take Keras' own path; a sharded optimizer (`zero_stage=1`) takes
`tfdist_ext.zero.apply_gradients`, which clips the summed gradients too.
"""

import functools

import tensorflow as tf

from tfdist_ext import _compat, frontends, zero


def _synchronous_tfdist(strategy, min_replicas=2) -> bool:
    return (frontends.our_strategy(strategy) is not None
            and strategy.sync_runner is None
            and strategy.num_replicas_in_sync >= min_replicas)


def _needs_global_apply(optimizer) -> bool:
    return bool(optimizer.gradient_accumulation_steps or optimizer.clipnorm
                or optimizer.global_clipnorm or optimizer.clipvalue)


def wrap_apply(original):
    """`TFOptimizer._backend_apply_gradients`: clip / accumulate the reduced gradient."""

    @functools.wraps(original)
    def backend_apply_gradients(self, grads, trainable_variables):
        strategy = self._distribution_strategy  # pylint: disable=protected-access
        if frontends.our_strategy(strategy) is not None:
            grads = [_shaped_as(g, v) for g, v in zip(grads, trainable_variables)]
        if zero.sharded(self) and tf.distribute.get_replica_context() is not None:
            return zero.apply_gradients(self, grads, trainable_variables)
        # One replica needs this path for accumulation only: Keras' `cond` around
        # its merge_call fails under any tf.distribute strategy.
        if (not _needs_global_apply(self) or tf.distribute.get_replica_context() is None
                or not (_synchronous_tfdist(strategy, 1 if self.gradient_accumulation_steps
                                            else 2))):
            return original(self, grads, trainable_variables)
        _apply_globally(self, strategy, grads, trainable_variables)
        if self.use_ema:
            self._update_model_variables_moving_average(  # pylint: disable=protected-access
                self._trainable_variables)  # pylint: disable=protected-access
        return None

    return backend_apply_gradients


def _shaped_as(grad, variable):
    """`grad` with `variable`'s static shape where its own is not fully known (a Dense
    kernel's gradient on 3-D inputs, through `tensordot`, is (None, units)): the
    engine all-reduces tensors of known size, TF's own collectives the rest."""
    shape = tf.TensorShape(variable.shape)
    if (isinstance(grad, tf.Tensor) and not grad.shape.is_fully_defined()
            and shape.is_fully_defined()):
        return tf.ensure_shape(grad, shape)
    return grad


def _tf_variable(variable):
    return getattr(variable, "value", variable)


def _per_replica(distribution, value):
    """`value` as one component per local replica.

    `merge_call` hands over a value every replica passed as the same object
    as that object, not as per-replica values; summing it over the replicas
    must still count it once per replica, as `ReplicaContext.all_reduce` does.
    """
    if _compat.is_distributed_value(value):
        return value
    return _compat.PerReplica((value,) * len(distribution.extended.worker_devices))


def _decay_weights(optimizer, distribution, variables):
    """Keras' decoupled weight decay (`TFOptimizer._apply_weight_decay`), called
    in cross-replica context, where Keras' own version finds no replica context."""
    if optimizer.weight_decay is None:
        return

    def decay(variable):
        if optimizer._use_weight_decay(variable):  # pylint: disable=protected-access
            lr = tf.cast(optimizer.learning_rate, variable.dtype)
            wd = tf.cast(optimizer.weight_decay, variable.dtype)
            variable.assign_sub(variable * wd * lr)

    for variable in variables:
        distribution.extended.update(_tf_variable(variable), decay, group=False)


def _apply_globally(optimizer, strategy, grads, variables):
    """All-reduce, then clip / apply in cross-replica context.

    With `gradient_accumulation_steps=k`, as in Keras: each replica adds its
    own gradient to its accumulators for k - 1 steps without communicating;
    the k-th step all-reduces (gradient + accumulated) / k once and applies it.
    """
    tf_variables = [_tf_variable(v) for v in variables]
    steps = optimizer.gradient_accumulation_steps
    accumulators = ([_tf_variable(optimizer._accumulated_gradients[  # pylint: disable=protected-access
        optimizer._get_variable_index(v)]) for v in variables]  # pylint: disable=protected-access
                    if steps else [])

    def reduce_and_apply(distribution, per_replica):
        reduced = distribution.extended.batch_reduce_to(
            _compat.ReduceOp.SUM, list(zip(per_replica, tf_variables)))
        local = [distribution.experimental_local_results(r) for r in reduced]
        per_replica_grads = list(zip(*local))  # [replica][variable]
        clipped = [optimizer._clip_gradients(list(g))  # pylint: disable=protected-access
                   for g in per_replica_grads]
        _decay_weights(optimizer, distribution, variables)
        grads = [_compat.PerReplica(tuple(c[k] for c in clipped))
                 for k in range(len(tf_variables))]
        _compat.distributed_update_step(optimizer)(
            distribution, list(zip(grads, tf_variables)), optimizer.learning_rate)

    def merge_fn(distribution, *per_replica):
        per_replica = [_per_replica(distribution, g) for g in per_replica]
        if not steps:
            reduce_and_apply(distribution, per_replica)
            return

        def update():
            means = []
            for grad, acc in zip(per_replica, accumulators):
                pairs = zip(distribution.experimental_local_results(grad),
                            distribution.experimental_local_results(acc))
                means.append(_compat.PerReplica(tuple((g + a) / steps for g, a in pairs)))
            reduce_and_apply(distribution, means)
            for acc in accumulators:
                distribution.extended.update(acc, lambda var: var.assign(tf.zeros_like(var)),
                                             group=False)

        def accumulate():
            for acc, grad in zip(accumulators, per_replica):
                distribution.extended.update(acc, lambda var, g: var.assign_add(g),
                                             args=(grad,), group=False)

        is_update = tf.equal((optimizer._iterations + 1) % steps, 0)  # pylint: disable=protected-access
        tf.cond(is_update, update, accumulate)

    tf.distribute.get_replica_context().merge_call(merge_fn, args=tuple(grads))


def wrap_loss_scale_apply(original):
    """`LossScaleOptimizer._tf_apply`: every replica skips an overflowed step."""

    @functools.wraps(original)
    def tf_apply(self, grads, trainable_variables=None):
        strategy = tf.distribute.get_strategy()
        context = tf.distribute.get_replica_context()
        if not _synchronous_tfdist(strategy) or context is None:
            return original(self, grads, trainable_variables)
        finite = tf.cast(self.check_finite(grads), tf.float32)
        overflowed = strategy.all_reduce_dense(_compat.ReduceOp.SUM, 1.0 - finite)
        # A replica whose own gradients are finite is made to skip too.
        poison = tf.where(overflowed > 0, float("inf"), 1.0)
        grads = [g if g is None else g * tf.cast(poison, g.dtype) for g in grads]
        return original(self, grads, trainable_variables)

    return tf_apply
