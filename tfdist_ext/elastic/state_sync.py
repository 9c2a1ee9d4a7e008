"""One member's training state to every member after a membership change.

After a failed step the survivors may hold different weights (one applied
the update, another did not), and a replacement holds none of the members'
training: one broadcast per dtype from a member that holds the state (the chief,
or the first survivor that holds it, `membership.agree`) makes them equal.
"""

import tensorflow as tf

from tfdist_ext.collectives import wire_dtypes

LABEL = "tfdist/elastic/state"


def broadcast(engine, variables, root=0):
    """Gives every member rank `root`'s values of `variables` (eager).

    Args:
        engine: The cross-device ops' collective engine (`broadcast(tensor,
            instance, root, label)`), made for the current membership.
        variables: The model's and optimizer's variables, in the same order on
            every member. Empty ones are skipped; dtypes the engine does not
            carry travel bit for bit as ones it does (`wire_dtypes`).
        root: The rank whose values everyone gets.

    Raises:
        TypeError: A variable's dtype is not a number or bool.
    """
    variables = [v for v in variables if v.shape.num_elements()]
    by_wire = {}
    for v in variables:
        if not wire_dtypes.carried(v.dtype):
            raise TypeError(f"elastic training cannot send variable {v.name!r} of dtype "
                            f"{v.dtype.name} to a new member: only number and bool variables "
                            "are carried. Hold other state outside the model and optimizer.")
        wire, _ = wire_dtypes.to_wire(tf.reshape(tf.convert_to_tensor(v.value), [-1]))
        by_wire.setdefault(wire.dtype, []).append((v, wire))
    received = {}
    for dtype, group in by_wire.items():
        flat = tf.concat([wire for _, wire in group], 0)
        received[dtype] = engine.broadcast(flat, 0, root=root, label=LABEL)
    # Assigned once every dtype arrived: a broadcast cut short by a death leaves this
    # worker's state as it was, not the weights of one step with the counters of another.
    for dtype, group in by_wire.items():
        offset = 0
        for v, wire in group:
            size = wire.shape.num_elements()
            value = wire_dtypes.from_wire(received[dtype][offset:offset + size],
                                          tf.as_dtype(v.dtype))
            v.assign(tf.reshape(value, v.shape))
            offset += size
