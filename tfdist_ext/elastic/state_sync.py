"""One member's training state to every member after a membership change.

After a failed step the survivors may hold different weights (one applied
the update, another did not), and a replacement holds none of the members'
training: one broadcast per dtype from a member that holds the state (rank 0,
or the first survivor that holds it, `membership.agree`) makes them equal.
"""

import tensorflow as tf

from tfdist_ext.collectives import ucx_engine

LABEL = "tfdist/elastic/state"


def broadcast(engine, variables, root=0):
    """Gives every member rank `root`'s values of `variables` (eager).

    Args:
        engine: The cross-device ops' collective engine (`broadcast(tensor,
            instance, root, label)`), made for the current membership.
        variables: The model's and optimizer's variables, in the same order on
            every member. Empty ones are skipped; dtypes the engine does not
            carry travel as float64 or int64.
        root: The rank whose values everyone gets.
    """
    variables = [v for v in variables if v.shape.num_elements()]
    by_dtype = {}
    for v in variables:
        by_dtype.setdefault(_wire_dtype(v.dtype), []).append(v)
    received = {}
    for dtype, group in by_dtype.items():
        flat = tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(v.value), dtype), [-1])
                          for v in group], 0)
        received[dtype] = engine.broadcast(flat, 0, root=root, label=LABEL)
    # Assigned once every dtype arrived: a broadcast cut short by a death leaves this
    # worker's state as it was, not the weights of one step with the counters of another.
    for dtype, group in by_dtype.items():
        offset = 0
        for v in group:
            size = v.shape.num_elements()
            v.assign(tf.cast(tf.reshape(received[dtype][offset:offset + size], v.shape),
                             v.dtype))
            offset += size


def _wire_dtype(dtype):
    dtype = tf.as_dtype(dtype)
    if dtype in ucx_engine.SUPPORTED_DTYPES:
        return dtype
    return tf.float64 if dtype.is_floating else tf.int64
