"""`strategy.gather` on the UCX engine: every replica's value concatenated along an axis
in rank order, whatever the lengths along it (`all_gather_v`). Keras' `predict` across
workers concatenates its outputs so; on an elastic job the engine's communicators follow
the members, where TF's own gather is wired for the first members only.

`CrossDeviceOps._batch_all_gather` asks `engine_gathers` and calls `gather_along` per
replica. Dtypes the engine lacks travel as ones it has (`wire_dtypes`); strings and an
axis known only when the function runs take TF's gather.
"""

import numpy as np
import tensorflow as tf

from tfdist_ext.collectives import wire_dtypes


def engine_gathers(value, axis) -> bool:
    """Whether `gather_along` takes `value`: rank 1 or more, a dtype it can send (any
    number or bool), and an `axis` known when traced."""
    rank = value.shape.rank
    if not rank or not isinstance(axis, int) or not -rank <= axis < rank:
        return False
    return wire_dtypes.carried(value.dtype)


def static_axis(axis):
    """`axis` as a Python int where it is an integer known when traced (a constant
    tensor, a numpy integer), else as given."""
    static = np.asarray(tf.get_static_value(axis))
    return int(static) if static.ndim == 0 and np.issubdtype(static.dtype, np.integer) else axis


def gather_along(engine, value, local_index, axis):
    """Every replica's `value` concatenated along `axis` in rank order (the engine's
    `all_gather_v`); other dimensions unequal between replicas raise InvalidArgumentError."""
    rank = value.shape.rank
    axis = axis + rank if axis < 0 else axis
    order = [axis] + [d for d in range(rank) if d != axis]
    with tf.device(engine.devices[local_index]):
        front = tf.transpose(value, order) if axis else value
        shape = tf.shape(front, out_type=tf.int64)
        shapes = tf.reshape(engine.all_gather(shape, local_index, label="tfdist/gather/shapes"),
                            [-1, rank])
        with tf.control_dependencies([tf.debugging.assert_equal(
                shapes[:, 1:], shapes[:1, 1:], message=(
                    f"strategy.gather along axis {axis}: the replicas hold values that differ "
                    "in another dimension (x: those dimensions, a row per replica)"))]):
            lengths = tf.identity(shapes[:, 0])
        whole = tf.concat([[tf.reduce_sum(lengths)], shape[1:]], 0)
        if 0 in front.shape[1:]:  # nothing to send (TF's own gather crashes here)
            out = tf.zeros(whole, value.dtype)
        else:
            wire, words = wire_dtypes.to_wire(tf.reshape(front, [-1]))
            gathered = engine.all_gather_v(wire, local_index, label="tfdist/gather",
                                           counts=lengths * tf.reduce_prod(shape[1:]) * words)
            out = tf.reshape(wire_dtypes.from_wire(gathered, value.dtype), whole)
        out.set_shape([None] + front.shape[1:])
        return tf.transpose(out, [order.index(d) for d in range(rank)]) if axis else out
