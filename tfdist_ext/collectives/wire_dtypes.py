"""Dtypes the UCX engine lacks, sent as ones it has, bit for bit.

Narrow integers and bool are widened by a cast (uint32 to int64, the others to int32);
8- and 16-byte dtypes (uint64, complex64, complex128) are reinterpreted as int64 words.
`strategy.gather` and the elastic state broadcast send their values so.
"""

import tensorflow as tf

from tfdist_ext.collectives import ucx_engine

CAST = (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16, tf.uint32)
AS_WORDS = (tf.uint64, tf.complex64, tf.complex128)


def carried(dtype) -> bool:
    """Whether `to_wire` takes `dtype`: any number dtype, or bool."""
    return tf.as_dtype(dtype) in ucx_engine.SUPPORTED_DTYPES + CAST + AS_WORDS


def to_wire(flat):
    """Rank-1 `flat` as a rank-1 tensor of an engine dtype, and its elements per value."""
    if flat.dtype in ucx_engine.SUPPORTED_DTYPES:
        return flat, 1
    if flat.dtype in CAST:
        return tf.cast(flat, tf.int64 if flat.dtype == tf.uint32 else tf.int32), 1
    return tf.reshape(tf.bitcast(flat, tf.int64), [-1]), flat.dtype.size // 8


def from_wire(wire, dtype):
    """The inverse of `to_wire` (rank 1)."""
    if dtype in ucx_engine.SUPPORTED_DTYPES:
        return wire
    if dtype in CAST:
        return tf.cast(wire, dtype)
    words = dtype.size // 8
    return tf.bitcast(wire if words == 1 else tf.reshape(wire, [-1, words]), dtype)
