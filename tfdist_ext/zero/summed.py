"""The summed gradients a replica's optimizer gets: its block of each, clipped.

Stage 1 all-reduces the gradients and keeps the replica's blocks; stage 2
reduce-scatters them, so a replica never receives the other blocks' sums.
Both go bucket by bucket (`partition.Partition.buckets`) on the UCX engine,
each bucket's sums cut into blocks before the next bucket's collective
starts, so a step holds one bucket's summed gradients at a time. Stage 2
lays each bucket out rank-major (`blocks.rank_major`) so that the ring
reduce-scatter leaves replica r its blocks: each replica sends (N-1)/N of the
gradients' bytes, half an all-reduce's. With engine="tf" (stage 1 only),
the gradients are all-reduced in one call through TF's collectives.

Clipping matches one process's (Keras' formulas on the summed gradients):
each replica's squared norm of each of its blocks is all-reduced (one small
vector), which gives every weight's norm (`clipnorm`) and the global norm
(`global_clipnorm`); `clipvalue` is element-wise.

Tuning: stage 2 sends fewer bytes than stage 1 and holds less; bigger
buckets (`blocks.BUCKET_ELEMENTS`) mean fewer collectives and more memory
held at once.
"""

import tensorflow as tf

from tfdist_ext.zero import blocks


def gradient_blocks(context, optimizer, grads, plan, dtype, stage: int):
    """This replica's block of each summed gradient, clipped as the optimizer asks.

    Args:
        context: The replica context of the step.
        optimizer: The model's (sharded) optimizer.
        grads: This replica's gradients, in the partition's order.
        plan: The `Partition` of the weights.
        dtype: The blocks' dtype.
        stage: 1 (all-reduce) or 2 (reduce-scatter).
    """
    strategy = context.strategy
    replica = int(tf.get_static_value(context.replica_id_in_sync_group))
    # Static lengths (a densified embedding gradient has none): the engine needs them.
    grads = [tf.reshape(tf.cast(tf.convert_to_tensor(g), dtype), [n])
             for g, n in zip(grads, plan.sizes)]
    if strategy.config.engine != "ucx":
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        mine = [blocks.block(g, plan, i, replica, dtype) for i, g in enumerate(summed)]
    else:
        mine = _bucket_by_bucket(strategy.extended.cross_device_ops, replica, grads, plan,
                                 dtype, stage)
    return _clipped(optimizer, strategy, mine, dtype)


def _bucket_by_bucket(cross_ops, replica, grads, plan, dtype, stage):
    engine = cross_ops.engines.main()
    local = replica - cross_ops.first_rank
    mine, previous = [], []
    for bucket in plan.buckets(blocks.BUCKET_ELEMENTS):
        with tf.control_dependencies(previous), tf.device(engine.devices[local]):
            if stage == 2:
                flat = blocks.rank_major([grads[i] for i in bucket], plan, bucket, dtype)
                cut = blocks.split(engine.reduce_scatter(flat, local, label="tfdist/zero2"),
                                   plan, bucket)
            else:
                flat = tf.concat([grads[i] for i in bucket], 0)
                nbytes = flat.shape.num_elements() * dtype.size
                summed = engine.all_reduce(
                    flat, local, cross_ops.choice.select(nbytes, dtype.size),
                    label="tfdist/zero1")
                parts = (tf.split(summed, [plan.sizes[i] for i in bucket]) if len(bucket) > 1
                         else [summed])
                cut = [blocks.block(g, plan, i, replica, dtype) for i, g in zip(bucket, parts)]
            mine += cut
            previous = cut
    return mine


def _clipped(optimizer, strategy, mine, dtype):
    if not (optimizer.clipnorm or optimizer.global_clipnorm):
        if optimizer.clipvalue:
            return [tf.clip_by_value(g, -optimizer.clipvalue, optimizer.clipvalue)
                    for g in mine]
        return mine
    squared = strategy.all_reduce_dense(
        tf.distribute.ReduceOp.SUM, tf.stack([tf.reduce_sum(tf.square(g)) for g in mine]))
    if optimizer.clipnorm:
        clip = tf.cast(optimizer.clipnorm, dtype)
        norms = tf.unstack(tf.sqrt(squared))
        return [g * clip / tf.maximum(norm, clip) for g, norm in zip(mine, norms)]
    norm = tf.sqrt(tf.reduce_sum(squared))
    clip = tf.cast(optimizer.global_clipnorm, dtype)
    # + (norm - norm): a non-finite norm makes the step non-finite, as in Keras.
    scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
    return [g * scale for g in mine]
