"""Reduction hooks: the strategy's one entry point into compression.

For every fused gradient bucket of every replica the strategy calls

    reduce_bucket(compressor, bucket, comm, state) -> (SUM over replicas, bytes sent)

which decides, in this one place, what is sent dense — "none", integer
buckets, empty buckets, and every bucket during the compressor's
`warmup_steps` — and otherwise runs the compressor's reduction hook
`compressor.reduce(bucket, comm, state)`. The bytes reported are those the
`Communicator` was asked to send (during warm-up, the dense branch's count).

`GradientReduction` is the strategy's side of that call: for one replica's
traced gradient all-reduce it names each bucket, builds its `Bucket` and
`Communicator`, and adds up the bytes sent and the dense baseline.
"""

import dataclasses
import itertools

import tensorflow as tf

from tfdist_ext.compression.base import FLOAT_DTYPES
from tfdist_ext.compression.payload import NoCompression


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One replica's fused gradient buffer, as a reduction hook receives it.

    Attributes:
        flat: The 1-D buffer (static length): the gradients concatenated.
        shapes: The `tf.TensorShape` of each gradient in `flat`, in order.
        key: A stable name of the bucket (the same every step and on every
            replica); per-bucket state is stored under it.
        replica: This replica's index among the worker's local replicas.
        step: int64 scalar, this replica's step counter (before this step).
    """

    flat: tf.Tensor
    shapes: tuple
    key: str
    replica: int
    step: tf.Tensor

    def split(self, flat=None):
        """`flat` (default: the bucket's buffer) cut into the gradients' shapes."""
        flat = self.flat if flat is None else flat
        sizes = [shape.num_elements() for shape in self.shapes]
        pieces = tf.split(flat, sizes) if len(sizes) > 1 else [flat]
        return [tf.reshape(piece, shape) for piece, shape in zip(pieces, self.shapes)]


class Communicator:
    """What a reduction hook may send, counted.

    Args:
        all_reduce: ``fn(1-D tensor) -> its SUM over all replicas``, with the
            strategy's configured algorithm for that size.
        all_gather: ``fn(1-D int32 tensor) -> the replicas' tensors
            concatenated in rank order``.
        reduce_bytes: ``fn(num_elements, dtype) -> bytes`` this replica
            sends in `all_reduce` of such a tensor.
        world_size: Replicas taking part.
        rank: This replica's global rank.
    """

    def __init__(self, all_reduce, all_gather, reduce_bytes, world_size, rank):
        self._all_reduce = all_reduce
        self._all_gather = all_gather
        self._reduce_bytes = reduce_bytes
        self.world_size = world_size
        self.rank = rank
        self.bytes_sent = 0

    def all_reduce(self, tensor):
        """The element-wise SUM of a 1-D tensor over all replicas."""
        self.bytes_sent += self._reduce_bytes(tensor.shape.num_elements(), tensor.dtype)
        return self._all_reduce(tensor)

    def all_gather(self, tensor):
        """Every replica's 1-D int32 tensor, concatenated in rank order.

        Pack other dtypes with `transport.pack` (the CPU gather takes few
        dtypes).
        """
        if tensor.dtype != tf.int32 or tensor.shape.rank != 1:
            raise TypeError(f"Communicator.all_gather takes a 1-D int32 tensor; received "
                            f"{tensor.dtype.name} of shape {tensor.shape}. Pack payloads "
                            "with tfdist_ext.compression.transport.pack().")
        self.bytes_sent += (self.world_size - 1) * tensor.shape.num_elements() * 4
        return self._all_gather(tensor)

    def count(self, num_bytes):
        """Adds bytes sent by sub-hooks (an int or an int64 scalar tensor).

        For a hook that picks one of several forked communicators at run time
        (`adaptive`): it adds the bytes of the branch taken.
        """
        self.bytes_sent = self.bytes_sent + num_bytes

    def fork(self):
        """A communicator over the same replicas that counts from zero."""
        return Communicator(self._all_reduce, self._all_gather, self._reduce_bytes,
                            self.world_size, self.rank)


def compresses(compressor, flat):
    """Whether `compressor` applies to the buffer `flat` at all (outside warm-up)."""
    return (not isinstance(compressor, NoCompression) and flat.dtype in FLOAT_DTYPES
            and flat.shape.num_elements() > 0)


def reduce_bucket(compressor, bucket, comm, state):
    """The SUM over replicas of `bucket.flat` through `compressor`, and the bytes sent.

    Returns:
        ``(summed, bytes_sent)``: `summed` like `bucket.flat`; `bytes_sent` a
        Python int, or an int64 scalar tensor when warm-up and compressed steps
        send different amounts.
    """
    if not compresses(compressor, bucket.flat):
        return comm.all_reduce(bucket.flat), comm.bytes_sent
    hook_comm = comm.fork()
    if not compressor.warmup_steps:
        return compressor.reduce(bucket, hook_comm, state), hook_comm.bytes_sent
    dense_comm = comm.fork()

    def dense():
        return dense_comm.all_reduce(bucket.flat), tf.constant(dense_comm.bytes_sent, tf.int64)

    def compressed():
        return (compressor.reduce(bucket, hook_comm, state),
                tf.cast(hook_comm.bytes_sent, tf.int64))

    summed, sent = tf.cond(bucket.step < compressor.warmup_steps, dense, compressed)
    hooked = hook_comm.bytes_sent
    if isinstance(hooked, int) and hooked == dense_comm.bytes_sent:
        return summed, hooked
    return summed, sent


class GradientReduction:
    """One replica's traced gradient all-reduce: each fused bucket through `reduce_bucket`.

    `CrossDeviceOps` makes one per replica each time it traces a gradient
    all-reduce, and hands `reduce` to the fusion as the per-bucket reduction.

    Args:
        compressor: The strategy's `Compressor`.
        state: The strategy's `StrategyState` (residuals, step counters).
        replica: This replica's index among the worker's local replicas.
        rank: This replica's global rank.
        world_size: Replicas taking part.
        all_reduce: ``fn(1-D tensor, bucket_name) -> SUM over all replicas``
            (the strategy's dense all-reduce).
        all_gather: ``fn(1-D tensor, bucket_name) -> the replicas' tensors``.
        dense_bytes: ``fn(num_elements, dtype, refine) -> bytes`` this replica
            sends to all-reduce such a buffer densely (`collectives.wire_bytes`).
        key_prefix: Prefix of the buckets' names ("delta_" for what relaxed
            sync policies send instead of gradients).

    Attributes:
        step: This replica's step counter before this step (advanced here).
        bytes_sent: Bytes the buckets sent so far (an int or an int64 tensor).
        dense_bytes: Bytes dense all-reduce of the same buckets would send.
    """

    def __init__(self, compressor, state, replica, rank, world_size, all_reduce, all_gather,
                 dense_bytes, key_prefix=""):
        self.compressor = compressor
        self.state = state
        self.replica = replica
        self.rank = rank
        self.world_size = world_size
        self._all_reduce = all_reduce
        self._all_gather = all_gather
        self._dense_bytes = dense_bytes
        self.key_prefix = key_prefix
        self.step = state.next_step(replica)
        self.bytes_sent = 0
        self.dense_bytes = 0
        self._numbers = itertools.count()

    def reduce(self, buffer, shapes):
        """The SUM of one bucket's flat `buffer` (gradients of `shapes`), compressed if
        configured, and counted."""
        name = f"{self.key_prefix}b{next(self._numbers)}"
        n, dtype = buffer.shape.num_elements(), buffer.dtype
        dense_only = not compresses(self.compressor, buffer)
        self.dense_bytes += self._dense_bytes(
            n, dtype, dense_only or self.compressor.warmup_steps > 0)
        comm = Communicator(
            all_reduce=lambda t: self._all_reduce(t, name),
            all_gather=lambda t: self._all_gather(t, name),
            reduce_bytes=lambda length, wire_dtype: self._dense_bytes(length, wire_dtype, True),
            world_size=self.world_size, rank=self.rank)
        bucket = Bucket(flat=buffer, shapes=tuple(shapes), key=f"{name}_{dtype.name}_{n}",
                        replica=self.replica, step=self.step)
        summed, sent = reduce_bucket(self.compressor, bucket, comm, self.state)
        self.bytes_sent += sent
        return summed
