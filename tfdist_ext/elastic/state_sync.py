"""Rank 0's training state to every member after a membership change.

After a failed step the survivors may hold different weights (one applied
the update, another did not), and a replacement holds none of the members'
training: one broadcast per dtype from the new rank 0 makes them equal.
"""

import tensorflow as tf

from tfdist_ext.collectives import ucx_engine

LABEL = "tfdist/elastic/state"


def broadcast(engine, variables):
    """Gives every member rank 0's values of `variables` (eager).

    Args:
        engine: The cross-device ops' collective engine (`broadcast(tensor,
            instance, root, label)`), made for the current membership.
        variables: The model's and optimizer's variables, in the same order on
            every member. Empty ones are skipped; dtypes the engine does not
            carry travel as float64 or int64.
    """
    variables = [v for v in variables if v.shape.num_elements()]
    by_dtype = {}
    for v in variables:
        by_dtype.setdefault(_wire_dtype(v.dtype), []).append(v)
    for dtype, group in by_dtype.items():
        flat = tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(v.value), dtype), [-1])
                          for v in group], 0)
        received = engine.broadcast(flat, 0, root=0, label=LABEL)
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
