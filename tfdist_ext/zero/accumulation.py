"""`gradient_accumulation_steps=k` with the state sharded.

As in Keras (and `tfdist_ext.keras.optimizer_fixes` unsharded): each replica
adds its own gradients to its accumulators (whole, one per weight) for k - 1
steps without communicating; the k-th step applies (gradient + accumulated)
/ k through the sharded step, which sums it over the replicas once, and
zeroes the accumulators. The choice is a `cond` in cross-replica context
(the sharded step's collectives cannot sit in a replica-context `cond`),
whose update branch runs the step in each replica again.

Memory: the accumulators are whole gradients per replica, as without
sharding; ZeRO saves the optimizer's state and, at stage 2, the summed
gradient, not them.
"""

import tensorflow as tf

from tfdist_ext import _compat


def accumulators(optimizer, variables):
    """The optimizer's accumulator (its tf.Variable) of each of `variables`."""
    index = optimizer._get_variable_index  # pylint: disable=protected-access
    kept = optimizer._accumulated_gradients  # pylint: disable=protected-access
    return [getattr(kept[index(v)], "value", kept[index(v)]) for v in variables]


def apply_every(optimizer, grads, variables, apply):
    """Accumulates `grads`, or on every k-th step calls `apply(optimizer, means, variables)`
    in each replica (replica context in, replica context out)."""
    steps = optimizer.gradient_accumulation_steps
    kept = accumulators(optimizer, variables)

    def merge_fn(distribution, *per_replica):
        per_replica = [g if _compat.is_distributed_value(g) else _compat.PerReplica(
            (g,) * len(distribution.extended.worker_devices)) for g in per_replica]

        def update():
            def in_replica(*local):
                means = [(g + tf.convert_to_tensor(a)) / steps for g, a in zip(local, kept)]
                apply(optimizer, means, variables)

            distribution.extended.call_for_each_replica(in_replica, args=tuple(per_replica))
            for acc in kept:
                distribution.extended.update(acc, lambda var: var.assign(tf.zeros_like(var)),
                                             group=False)

        def accumulate():
            for acc, grad in zip(kept, per_replica):
                distribution.extended.update(acc, lambda var, g: var.assign_add(g),
                                             args=(grad,), group=False)

        # `iterations` counts updates under accumulation; `_iterations` counts steps.
        taken = optimizer._iterations  # pylint: disable=protected-access
        is_update = tf.equal((taken + 1) % steps, 0)
        tf.cond(is_update, update, accumulate)

    tf.distribute.get_replica_context().merge_call(merge_fn, args=tuple(grads))
