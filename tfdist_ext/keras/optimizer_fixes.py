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
  defining a new graph"): the gradients are all-reduced every step, the
  reduced gradients accumulated, and every k-th step their mean is applied.
  The condition is evaluated in cross-replica context, where `cond` may
  contain collectives.
* `LossScaleOptimizer` (mixed precision) decides "finite or skip the step"
  from the first local replica's unreduced gradients, so replicas and
  workers could disagree: one skips (no all-reduce) while another reduces, or
  a replica's infinite gradient reaches the sum. Every replica's finiteness
  is all-reduced first; if any replica overflowed, every replica skips the
  step (the dynamic loss scale halves everywhere), so error-feedback
  residuals never see an infinite gradient.

Other strategies, relaxed sync policies and optimizers without these
options take Keras' own path.
"""

import functools

import tensorflow as tf

from tfdist_ext import _compat


def _synchronous_tfdist(strategy) -> bool:
    return (hasattr(strategy, "sync_runner") and hasattr(strategy, "config")
            and strategy.sync_runner is None and strategy.num_replicas_in_sync > 1)


def _needs_global_apply(optimizer) -> bool:
    return bool(optimizer.gradient_accumulation_steps or optimizer.clipnorm
                or optimizer.global_clipnorm or optimizer.clipvalue)


def wrap_apply(original):
    """`TFOptimizer._backend_apply_gradients`: clip / accumulate the reduced gradient."""

    @functools.wraps(original)
    def backend_apply_gradients(self, grads, trainable_variables):
        strategy = self._distribution_strategy  # pylint: disable=protected-access
        if (not _synchronous_tfdist(strategy) or not _needs_global_apply(self)
                or tf.distribute.get_replica_context() is None):
            return original(self, grads, trainable_variables)
        _apply_globally(self, strategy, grads, trainable_variables)
        if self.use_ema:
            self._update_model_variables_moving_average(  # pylint: disable=protected-access
                self._trainable_variables)  # pylint: disable=protected-access
        return None

    return backend_apply_gradients


def _tf_variable(variable):
    return getattr(variable, "value", variable)


def _apply_globally(optimizer, strategy, grads, variables):
    """All-reduce, then clip / accumulate / apply in cross-replica context."""
    tf_variables = [_tf_variable(v) for v in variables]
    steps = optimizer.gradient_accumulation_steps
    accumulators = ([optimizer._accumulated_gradients[  # pylint: disable=protected-access
        optimizer._get_variable_index(v)] for v in variables]  # pylint: disable=protected-access
                    if steps else [])

    def merge_fn(distribution, *per_replica):
        reduced = distribution.extended.batch_reduce_to(
            _compat.ReduceOp.SUM, list(zip(per_replica, tf_variables)))
        local = [distribution.experimental_local_results(r) for r in reduced]

        def apply(per_variable):
            per_replica_grads = list(zip(*per_variable))  # [replica][variable]
            clipped = [optimizer._clip_gradients(list(g))  # pylint: disable=protected-access
                       for g in per_replica_grads]
            optimizer._apply_weight_decay(variables)  # pylint: disable=protected-access
            grads = [_compat.PerReplica(tuple(c[k] for c in clipped))
                     for k in range(len(tf_variables))]
            _compat.distributed_update_step(optimizer)(
                distribution, list(zip(grads, tf_variables)), optimizer.learning_rate)

        if not steps:
            apply(local)
            return

        def update():
            acc = [distribution.experimental_local_results(_tf_variable(a))
                   for a in accumulators]
            apply([[(g + a) / steps for g, a in zip(gs, accs)]
                   for gs, accs in zip(local, acc)])
            for a in accumulators:
                _tf_variable(a).assign(tf.zeros_like(a))

        def accumulate():
            for a, r in zip(accumulators, reduced):
                distribution.extended.update(_tf_variable(a), lambda var, g: var.assign_add(g),
                                             args=(r,), group=False)

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
