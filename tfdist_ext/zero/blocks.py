"""Tensors cut into a `Partition`'s blocks and put back together, and the gather of
updated blocks into whole weights.

`block` takes a replica's block of one weight; `placed` puts it among zeros
for an all-gather by summing; `rank_major` lays a bucket of
weights out for a reduce-scatter (replica r's blocks r-th); `whole` turns a
bucket's all-gathered blocks back into its weights; `gather` runs the
all-gather of every bucket in turn on the strategy's engine (or, with
engine="tf", an all-reduce of the blocks placed in zeros: exact, twice the
bytes).
"""

import tensorflow as tf

from tfdist_ext import _compat

# A bucket's blocks of all replicas, at most (float32: 16 MB); a larger weight goes alone.
BUCKET_ELEMENTS = 1 << 22
_ENGINE_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def block(tensor, plan, index: int, rank: int, dtype):
    """Replica `rank`'s block of weight `index` (`tensor`, any shape), padded with zeros."""
    lo, hi = plan.piece(rank, index)
    flat = tf.reshape(tf.cast(tensor, dtype), [plan.sizes[index]])[lo:hi]
    padding = plan.block(index) - (hi - lo)
    return tf.concat([flat, tf.zeros([padding], dtype)], 0) if padding else flat


def rank_major(tensors, plan, bucket, dtype):
    """The 1-D concatenation, replica by replica, of each replica's blocks of the weights
    `bucket` (indices; `tensors` holds them in that order)."""
    rows = []
    for i, tensor in zip(bucket, tensors):
        flat = tf.reshape(tf.cast(tensor, dtype), [plan.sizes[i]])
        padding = plan.block(i) * plan.world - plan.sizes[i]
        if padding:
            flat = tf.concat([flat, tf.zeros([padding], dtype)], 0)
        rows.append(tf.reshape(flat, [plan.world, plan.block(i)]))
    return tf.reshape(tf.concat(rows, 1), [-1])


def split(shard, plan, bucket):
    """A replica's part of a bucket (its blocks, concatenated) into one block per weight."""
    return tf.split(shard, [plan.block(i) for i in bucket]) if len(bucket) > 1 else [shard]


def whole(gathered, plan, bucket, shapes):
    """The weights `bucket` (of `shapes`) from every replica's blocks (rank-major, 1-D)."""
    width = sum(plan.block(i) for i in bucket)
    rows = tf.reshape(gathered, [plan.world, width])
    columns = (tf.split(rows, [plan.block(i) for i in bucket], axis=1) if len(bucket) > 1
               else [rows])
    return [tf.reshape(tf.reshape(c, [-1])[:plan.sizes[i]], shape)
            for i, c, shape in zip(bucket, columns, shapes)]


def placed(mine, rank: int, world: int):
    """`mine` (1-D) as block `rank` of `world` equal blocks, zeros elsewhere: summed over
    the replicas, such tensors are an all-gather (exact: the sums add zeros)."""
    width = mine.shape.num_elements()
    return tf.pad(mine, [[rank * width, (world - 1 - rank) * width]])


def gather(distribution, blocks, ranks, plan, variables, dtype, consume):
    """All-gathers every bucket of updated blocks and hands its weights to `consume`.

    Call in cross-replica context. Each bucket's collectives wait for what
    `consume` returned for the previous one, so a step holds one bucket's
    buffers at a time.

    Args:
        distribution: The strategy.
        blocks: Per weight, the local replicas' updated blocks (a list per device).
        ranks: The local replicas' replica ids, in device order.
        plan: The `Partition`.
        variables: The weights (mirrored), in the partition's order.
        dtype: The blocks' dtype.
        consume: `consume(bucket, weights)`: `weights[k][j]` is weight
            `bucket[k]` on local device j; returns ops the next bucket waits for.
    """
    devices = distribution.extended.worker_devices
    cross_ops = distribution.extended.cross_device_ops
    engine = (cross_ops.engines.main() if distribution.config.engine == "ucx"
              and dtype in _ENGINE_DTYPES else None)
    previous = []
    for bucket in plan.buckets(BUCKET_ELEMENTS):
        with tf.control_dependencies(previous):
            gathered = []
            for j, device in enumerate(devices):
                with tf.device(device):
                    mine = tf.concat([tf.reshape(blocks[i][j], [plan.block(i)])
                                      for i in bucket], 0)
                    if engine is not None:
                        gathered.append(engine.all_gather(mine, ranks[j] - cross_ops.first_rank,
                                                          label="tfdist/zero-gather"))
                    else:
                        gathered.append(placed(mine, ranks[j], plan.world))
            if engine is None:
                summed = distribution.extended.reduce_to(
                    tf.distribute.ReduceOp.SUM, _compat.PerReplica(gathered),
                    destinations=variables[bucket[0]])
                gathered = list(distribution.experimental_local_results(summed))
            shapes = [variables[i].shape for i in bucket]
            per_device = []
            for j, device in enumerate(devices):
                with tf.device(device):
                    per_device.append(whole(gathered[j], plan, bucket, shapes))
            previous = list(consume(bucket, [list(w) for w in zip(*per_device)]))

