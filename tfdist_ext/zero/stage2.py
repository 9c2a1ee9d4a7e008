"""ZeRO stage 2: each replica gets only its shard of the summed gradients.

Where stage 1 all-reduces the gradients and keeps the shard's part, stage 2
reduce-scatters them (`summed_shard`): the replica's local gradients are
flattened in the partition's order (`partition.Partition`, padded) and the
UCX engine's ring reduce-scatter leaves each replica the sum of its own
shard. Each replica sends (N-1)/N of the gradients' bytes, half an
all-reduce's, and no replica holds another's summed gradient.

Clipping matches one process's: `clipvalue` element by element,
`global_clipnorm` by the norm of the whole summed gradient (each replica's
squared norm all-reduced: one scalar). `clipnorm` (each weight's own norm)
is refused at stage 2 (`check_clipping`).

Tuning: stage 2 sends fewer bytes than stage 1 and holds less; it needs
`engine="ucx"` (the default where UCX is installed).
"""

import tensorflow as tf


def check_clipping(optimizer) -> None:
    """Raises ValueError for `clipnorm`, which stage 2 cannot compute from one shard."""
    if optimizer.clipnorm:
        raise ValueError(f"zero_stage=2 does not support the optimizer's `clipnorm` "
                         f"(clipnorm={optimizer.clipnorm!r}): each replica holds a shard of "
                         "each weight's gradient. Use global_clipnorm or clipvalue, or "
                         "zero_stage=1.")


def summed_shard(context, optimizer, grads, plan, dtype):
    """This replica's shard of the summed `grads` (reduce-scattered), clipped.

    Args:
        context: The replica context of the step.
        optimizer: The model's (sharded) optimizer.
        grads: This replica's gradients, in the partition's order.
        plan: The `Partition` of the weights.
        dtype: The shard's dtype.
    """
    cross_ops = context.strategy.extended.cross_device_ops
    engine = cross_ops.collective_engine()
    local = int(tf.get_static_value(context.replica_id_in_sync_group)) - cross_ops.first_rank
    # Static lengths (a densified embedding gradient has none): the engine needs them.
    flat = [tf.reshape(tf.cast(tf.convert_to_tensor(g), dtype), [n])
            for g, n in zip(grads, plan.sizes)]
    padding = plan.padded - plan.total
    if padding:
        flat.append(tf.zeros([padding], dtype))
    with tf.device(engine.devices[local]):
        summed = engine.reduce_scatter(tf.concat(flat, 0), local, label="tfdist/zero2")
    if optimizer.global_clipnorm:
        squared = context.strategy.all_reduce_dense(tf.distribute.ReduceOp.SUM,
                                                    tf.reduce_sum(tf.square(summed)))
        norm = tf.sqrt(squared)
        clip = tf.cast(optimizer.global_clipnorm, dtype)
        # + (norm - norm): a non-finite norm makes the step non-finite, as in Keras.
        summed = summed * (clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm))
    elif optimizer.clipvalue:
        summed = tf.clip_by_value(summed, -optimizer.clipvalue, optimizer.clipvalue)
    return summed
