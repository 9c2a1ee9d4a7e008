"""What parameter servers and workers say to each other, over the UCX mailbox.

A message is a tag and a payload. Tags pack ``kind:8 | source:16 | value:40``:
a worker's source is the id the server gave its connection, a server's is its
task index. Payloads are raw bytes of one tensor.

===========  ==========================  =========================================
kind         payload                     the server answers
===========  ==========================  =========================================
HELLO        - (value: worker rank)      -
INIT         JSON layout (uint8)         - (first one wins; later ones ignored)
INIT_VALUES  float32 parameters          -
INIT_STATE   float64 optimizer variables -  (a restored optimizer's, server order)
STATE        -                           STATE_VALUES: float64 optimizer variables
PULL         - (value: session)          PARAMS when initialized
REST         - (value: session)          PARAMS; the worker pauses (evaluation)
PUSH         float32 gradient            PARAMS when admitted (`admission`);
                                         value: the staleness, or DROPPED | it
BARRIER      -                           PARAMS once every worker has arrived
===========  ==========================  =========================================

A server ends when every worker that connected has disconnected while
paused (after the barrier); the workers need not say goodbye.
"""

import json

import numpy as np
import tensorflow as tf

from tfdist_ext.ops import ucx as ucx_ops

HELLO, INIT, INIT_VALUES, PULL, PUSH, BARRIER, REST, INIT_STATE, STATE = 1, 2, 3, 4, 5, 6, 7, 8, 9
PARAMS, STATE_VALUES = 10, 11
DROPPED = 1 << 39  # in a PUSH reply's value: the gradient was refused (too stale)
VALUE_BITS = 40
KIND_SOURCE_MASK = -(1 << VALUE_BITS)  # as int64: the top 24 bits
KIND_MASK = -(1 << 56)
HISTOGRAM_BINS = 64  # staleness >= 63 shares the last bin
CONNECT_SECONDS = 300.0


def tag(kind: int, source: int, value: int = 0) -> int:
    """The int64 tag of a message (kind < 128, source < 65536, value < 2**40)."""
    return (kind << 56) | ((source & 0xFFFF) << VALUE_BITS) | (value & ((1 << VALUE_BITS) - 1))


def untag(value: int):
    """(kind, source, value) of an int64 tag."""
    value &= (1 << 64) - 1
    return value >> 56, (value >> VALUE_BITS) & 0xFFFF, value & ((1 << VALUE_BITS) - 1)


def value_of(tags):
    """The value fields of int64 tag tensors."""
    return tf.bitwise.bitwise_and(tags, tf.constant((1 << VALUE_BITS) - 1, tf.int64))


class Mailbox:
    """A mailbox (one UCP worker and its thread) and its calls, eager or traced.

    Args:
        timeout_seconds: A call that sees nothing for this long fails (0: never).
        listen_port: Servers: the port to accept connections on.
        source: Servers: the source field of the tags they send.
    """

    def __init__(self, timeout_seconds=0.0, listen_port=-1, source=0):
        self.ops = ucx_ops.load()
        with tf.init_scope():
            handle, port = self.ops.tfdist_ps_mailbox(
                timeout_seconds=float(timeout_seconds), listen_port=int(listen_port),
                source=int(source))
        self.handle = int(handle)
        self.port = int(port)

    def connect(self, address: str, source: int):
        """(peer, id): our index for the server at `address`, its id for us."""
        peer, ident = self.ops.tfdist_ps_connect(self.handle, tf.constant(address),
                                                 source=int(source),
                                                 connect_seconds=CONNECT_SECONDS)
        return int(peer), int(ident)

    def send(self, peer: int, message_tag: int, data=None):
        if data is None:
            data = tf.zeros([0], tf.uint8)
        self.ops.tfdist_ps_send(self.handle, tf.constant(peer, tf.int32),
                                tf.constant(message_tag, tf.int64), data)

    def send_json(self, peer: int, message_tag: int, obj):
        raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
        self.send(peer, message_tag, tf.constant(raw))

    def recv(self, kind=None, source=None, watch=-1, dtype=tf.float32):
        """(kind, source, value, data): the next message matching `kind` (and `source`)."""
        want, mask = 0, 0
        if kind is not None:
            want, mask = tag(kind, 0), KIND_MASK
        if source is not None:
            want, mask = tag(kind, source), KIND_SOURCE_MASK
        sender, data = self.ops.tfdist_ps_recv(
            self.handle, tf.constant(want, tf.int64), tf.constant(mask, tf.int64),
            tf.constant(watch, tf.int32), T=dtype)
        return untag(int(sender)) + (data,)

    def exchange(self, token, data, peers, send_tags, reply_kind, sources):
        """Sends `data[i]` to `peers[i]`, then takes one `reply_kind` reply from each (traceable).

        Args:
            token: A resource of this mailbox; exchanges sharing it run in
                program order, others concurrently.
            sources: The tag source of each peer's replies (server indices).

        Returns:
            (int64 tags [len(peers)], list of 1-D replies, in `peers` order).
        """
        return self.ops.tfdist_ps_exchange(
            self.handle, token, list(data), peers=list(peers), send_tags=list(send_tags),
            reply_kind=int(reply_kind), sources=list(sources))

    def close(self, peer: int):
        """Later failures of `peer` are no longer errors."""
        self.ops.tfdist_ps_close(self.handle, tf.constant(peer, tf.int32))
