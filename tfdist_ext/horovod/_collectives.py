"""Horovod's collectives, eager and inside `tf.function`, on the runtime's Strategy.

Every worker must issue the same collectives in the same order (as in
Horovod). Gradients (`gradients=True`, used by `DistributedGradientTape` and
`DistributedOptimizer`) travel the strategy's gradient path: its all-reduce
algorithm, compressor and bucketing; the other collectives are plain
all-reduces (`Strategy.all_reduce_dense`) and all-gathers. Booleans travel as
int32.
"""

import contextlib
import logging
import threading
from typing import Tuple

import tensorflow as tf

from tfdist_ext.horovod._runtime import rank, size, strategy


class _ReduceOp:
    """A Horovod reduction op (`hvd.Average`, `hvd.Sum`)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"hvd.{self.name}"


Average = _ReduceOp("Average")
Sum = _ReduceOp("Sum")
Adasum = _ReduceOp("Adasum")


class Compression:
    """Horovod's wire compression for `allreduce` and the distributed optimizers.

    `none` sends the values as they are; `fp16` sends floating-point tensors
    as float16 and casts the result back. For top-k, quantization or
    error-feedback compression pass a tfdist_ext compressor to
    `DistributedOptimizer(compression=...)` or `init(compression=...)`.
    """

    class none:  # pylint: disable=invalid-name
        """No compression."""

        @staticmethod
        def compress(tensor):
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            del ctx
            return tensor

    class fp16:  # pylint: disable=invalid-name
        """Floating-point tensors travel as float16."""

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating and tensor.dtype != tf.float16:
                return tf.cast(tensor, tf.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tf.cast(tensor, ctx)


class _QuietEagerRun(logging.Filter):
    """Hides TF's "Using Strategy eagerly has significant overhead" for our own calls."""

    local = threading.local()

    def filter(self, record):
        return not (getattr(self.local, "active", False)
                    and "eagerly has significant overhead" in record.getMessage())


_FILTER = _QuietEagerRun()
tf.get_logger().addFilter(_FILTER)


@contextlib.contextmanager
def _quiet():
    _FILTER.local.active = True
    try:
        yield
    finally:
        _FILTER.local.active = False


def _run(fn, values, dist=None):
    """Runs `fn(*values)` in the (one) replica context of `dist` (default: init's)."""
    dist = dist or strategy()
    with _quiet():
        return dist.run(lambda *v: fn(dist, [tf.identity(x) for x in v]), args=tuple(values))


def reduce_op(op):
    """The `tf.distribute.ReduceOp` for a Horovod op (None means Average)."""
    if op is None or op is Average:
        return tf.distribute.ReduceOp.MEAN
    if op is Sum:
        return tf.distribute.ReduceOp.SUM
    raise ValueError(f"Argument `op` must be hvd.Average or hvd.Sum; received {op!r} "
                     "(Adasum is not supported).")


def _check_dtype(tensor, what):
    if tensor.dtype in (tf.string, tf.resource, tf.variant):
        raise ValueError(f"{what}: tensors of dtype {tensor.dtype.name} cannot be reduced; "
                         "send numbers.")


def _to_wire(tensor):
    return tf.cast(tensor, tf.int32) if tensor.dtype == tf.bool else tensor


def _from_wire(tensor, dtype):
    return tf.cast(tensor, tf.bool) if dtype == tf.bool else tensor


def grouped_allreduce(tensors, average=None, op=None, compression=Compression.none,
                      prescale_factor=1.0, postscale_factor=1.0, gradients=False,
                      dist=None):
    """All-reduces a list of tensors in one fused collective; returns the list.

    Args:
        tensors: Tensors of any numeric dtype (`IndexedSlices` are densified).
        average: Horovod's deprecated flag; True means `op=Average`.
        op: `hvd.Average` (default) or `hvd.Sum`.
        compression: `hvd.Compression.none` or `.fp16`.
        prescale_factor: Multiplies each input before the reduction.
        postscale_factor: Multiplies each result.
        gradients: Send through the strategy's gradient path (its compressor
            and bucketing); used by the distributed optimizers.
        dist: The `tfdist_ext.Strategy` to use (default: `strategy()`).
    """
    if average is not None:
        op = Average if average else Sum
    wanted = reduce_op(op)
    tensors = [tf.convert_to_tensor(t) for t in tensors]  # IndexedSlices: reduced dense
    for t in tensors:
        _check_dtype(t, "hvd.allreduce")
    if prescale_factor != 1.0:
        tensors = [t * tf.cast(prescale_factor, t.dtype) for t in tensors]
    packed = [compression.compress(t) for t in tensors]
    wire = [_to_wire(t) for t, _ in packed]
    # Integer tensors cannot be averaged in place: sum, then divide like Horovod.
    integer = [not t.dtype.is_floating and not t.dtype.is_complex for t in wire]
    op_for_wire = tf.distribute.ReduceOp.SUM if any(integer) else wanted

    def fn(dist, values):
        if not values:
            return []
        if gradients:
            return tf.distribute.get_replica_context().all_reduce(op_for_wire, values)
        return dist.all_reduce_dense(op_for_wire, values)

    reduced = _run(fn, wire, dist) if wire else []
    average_here = op_for_wire != wanted
    out = []
    for r, (sent, ctx), is_int in zip(reduced, packed, integer):
        if is_int:  # booleans too: average on the int32 wire, then back to bool
            if average_here:
                r = tf.truncatediv(r, tf.cast(size(), r.dtype))
            r = compression.decompress(_from_wire(r, sent.dtype), ctx)
        else:
            r = compression.decompress(r, ctx)
            if average_here:
                r = r / tf.cast(size(), r.dtype)
        if postscale_factor != 1.0:
            r = r * tf.cast(postscale_factor, r.dtype)
        out.append(r)
    return out


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None):
    """All-reduces one tensor (average by default); see `grouped_allreduce`."""
    del device_dense, device_sparse, name
    return grouped_allreduce([tensor], average=average, op=op, compression=compression,
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor)[0]


def allgather(tensor, name=None):
    """Concatenates every process's tensor along axis 0 (first dimensions may differ)."""
    del name
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("hvd.allgather: the tensor must have at least one dimension "
                         "(it is concatenated along axis 0); received a scalar.")
    gathered = _run(lambda dist, v: tf.distribute.get_replica_context().all_gather(v[0], 0),
                    [_to_wire(tensor)])
    return _from_wire(gathered, tensor.dtype)


def broadcast(tensor, root_rank, name=None):
    """Every process gets `root_rank`'s tensor (an all-reduce of it and zeros)."""
    del name
    tensor = tf.convert_to_tensor(tensor)
    return _broadcast_list([tensor], root_rank)[0]


def _broadcast_list(tensors, root_rank):
    count = size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < count:
        raise ValueError(f"Argument `root_rank` must be an integer in [0, {count}); "
                         f"received {root_rank!r}.")
    mine = rank() == root_rank
    wire = []
    for t in tensors:
        _check_dtype(t, "hvd.broadcast")
        w = _to_wire(t)
        wire.append(w if mine else tf.zeros_like(w))
    reduced = _run(lambda dist, v: dist.all_reduce_dense(tf.distribute.ReduceOp.SUM, v),
                   wire) if wire else []
    return [_from_wire(r, t.dtype) for r, t in zip(reduced, tensors)]


def broadcast_variables(variables, root_rank):
    """Assigns `root_rank`'s values to `variables` on every process."""
    variables = list(variables)
    values = _broadcast_list([tf.convert_to_tensor(v) for v in variables], root_rank)
    for var, value in zip(variables, values):
        var.assign(value)


def alltoall(tensor, splits=None, name=None) -> Tuple:
    """Scatters slices of `tensor` (axis 0, sizes `splits`, one per process) and
    gathers what every process sent here.

    Returns:
        (received tensor, received splits), as Horovod. Built on two
        all-gathers, so each process receives everything (fine for small
        tensors).
    """
    del name
    tensor = tf.convert_to_tensor(tensor)
    count = size()
    if splits is None:
        first = tf.shape(tensor)[0]
        splits = tf.fill([count], first // count)
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int32)
    all_splits = tf.reshape(allgather(splits), [count, count])  # row: sender
    everything = allgather(tensor)
    offsets = tf.concat([[0], tf.cumsum(tf.reshape(all_splits, [-1]))], 0)
    me = rank()
    pieces = [everything[offsets[s * count + me]:offsets[s * count + me + 1]]
              for s in range(count)]
    return tf.concat(pieces, 0), all_splits[:, me]
