"""Argument checks and payload sizes shared by the compression op wrappers.

Static values are checked here with messages that name the argument; the
kernels check dynamic ones with OP_REQUIRES.
"""

import numbers

import numpy as np
import tensorflow as tf

MAX_QSGD_LEVELS = 32767
_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_MAX_ELEMENTS = 2**31 - 1



# ----------------------------------------------------------------------------
# Argument checks (static values only; the kernels check dynamic ones).

def _is_int(value):
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def _flat_float(x, arg="x"):
    """Flattens `x` and returns (original flat, float32 flat, static size or None)."""
    x = tf.convert_to_tensor(x)
    if x.dtype not in _FLOATS:
        raise TypeError(
            f"Argument `{arg}` must be a floating-point tensor (float16, bfloat16, "
            f"float32 or float64); received dtype={x.dtype.name}. Cast it first, "
            f"e.g. `tf.cast({arg}, tf.float32)`.")
    flat = tf.reshape(x, [-1])
    flat32 = flat if x.dtype == tf.float32 else tf.cast(flat, tf.float32)
    size = x.shape.num_elements()
    if size is not None and size > _MAX_ELEMENTS:
        raise ValueError(f"Argument `{arg}` has {size} elements; the ops index with int32 "
                         f"and allow at most 2**31 - 1. Compress it in chunks.")
    return flat, flat32, size


def _k(k, n):
    if not _is_int(k):
        if tf.is_tensor(k) and k.dtype.is_integer:
            return tf.cast(k, tf.int32)
        raise TypeError(f"Argument `k` must be an integer or an integer tensor; "
                        f"received k={k!r}.")
    if k < 0 or (n is not None and k > n):
        size = "an unknown number of" if n is None else str(n)
        raise ValueError(f"Argument `k` must be in [0, n]; received k={k} for a tensor of "
                         f"{size} elements. Use a smaller k, e.g. `k_for_ratio(n, ratio)`.")
    return tf.constant(k, tf.int32)


def _count(n, arg="n"):
    if _is_int(n):
        if not 0 <= n <= _MAX_ELEMENTS:
            raise ValueError(f"Argument `{arg}` must be in [0, 2**31 - 1]; received {arg}={n}. "
                             f"Pass the number of elements that was encoded.")
        return tf.constant(n, tf.int32)
    if tf.is_tensor(n) and n.dtype.is_integer:
        return tf.cast(n, tf.int32)
    raise TypeError(f"Argument `{arg}` must be an integer or an integer tensor; "
                    f"received {arg}={n!r}.")


def _seed(seed):
    if _is_int(seed):
        if not -2**63 <= seed < 2**63:
            raise ValueError(f"Argument `seed` must fit in int64; received seed={seed}.")
        return tf.constant(seed, tf.int64)
    if tf.is_tensor(seed) and seed.dtype.is_integer:
        return tf.cast(seed, tf.int64)
    raise TypeError(f"Argument `seed` must be an integer or an integer tensor; "
                    f"received seed={seed!r}. Fold the step into it, e.g. "
                    f"`seed = base_seed * 1_000_003 + step`.")


def _levels(levels):
    if not _is_int(levels) or not 1 <= levels <= MAX_QSGD_LEVELS:
        raise ValueError(f"Argument `levels` must be an integer in [1, {MAX_QSGD_LEVELS}]; "
                         f"received levels={levels!r}. QSGD rounds |x_i|/||x|| * levels to "
                         f"an integer; 2**b - 1 levels use b + 1 bits per element.")
    return int(levels)


def _bucket_size(bucket_size):
    if not _is_int(bucket_size) or not 0 <= bucket_size <= _MAX_ELEMENTS:
        raise ValueError(f"Argument `bucket_size` must be an integer >= 0; received "
                         f"bucket_size={bucket_size!r}. QSGD normalises each bucket of "
                         f"bucket_size consecutive values by its own norm (0 means one "
                         f"bucket for the whole tensor; the paper uses 512).")
    return int(bucket_size)


QSGD_NORMS = ("l2", "max")


def _qsgd_norm(norm):
    if norm not in QSGD_NORMS:
        raise ValueError(f"Argument `norm` must be one of {QSGD_NORMS}; received "
                         f"norm={norm!r}. 'max' scales each bucket by its largest "
                         f"magnitude (lower variance), 'l2' by its L2 norm (the paper's).")
    return norm


def _bits(bits):
    if not _is_int(bits) or not 1 <= bits <= 8:
        raise ValueError(f"Argument `bits` must be an integer in [1, 8]; received "
                         f"bits={bits!r}. Codes are uint8, so at most 8 bits each.")
    return int(bits)


def _out_dtype(dtype):
    dtype = tf.as_dtype(dtype)
    if dtype not in _FLOATS:
        raise TypeError(f"Argument `dtype` must be float16, bfloat16, float32 or float64; "
                        f"received dtype={dtype.name}.")
    return dtype


def _cast(x, dtype):
    return x if dtype == tf.float32 else tf.cast(x, dtype)


def _uint8(t, arg):
    t = tf.convert_to_tensor(t)
    if t.dtype != tf.uint8:
        raise TypeError(f"Argument `{arg}` must be a uint8 tensor; received "
                        f"dtype={t.dtype.name}. Cast it with `tf.cast({arg}, tf.uint8)` "
                        f"once its values are known to fit.")
    return tf.reshape(t, [-1])


# ----------------------------------------------------------------------------
# Sizes.

def k_for_ratio(n, ratio):
    """Number of elements a sparsifier keeps: max(1, round(ratio * n)), at most n.

    Args:
        n: number of elements, an int >= 0.
        ratio: fraction kept, in (0, 1]; 0.01 (1%) or 0.001 are typical for top-k.

    Returns:
        An int in [0, n] (0 only when n == 0).
    """
    if not isinstance(ratio, numbers.Real) or not 0.0 < ratio <= 1.0:
        raise ValueError(f"Argument `ratio` must be in (0, 1]; received ratio={ratio!r}. "
                         f"It is the fraction of elements kept, e.g. 0.01 for 1%.")
    if not _is_int(n) or n < 0:
        raise ValueError(f"Argument `n` must be an integer >= 0; received n={n!r}.")
    return 0 if n == 0 else min(n, max(1, round(ratio * n)))


def qsgd_bits(levels):
    """Bits per element of a QSGD payload: ceil(log2(levels + 1)) + 1 (sign)."""
    return int(_levels(levels)).bit_length() + 1


def qsgd_num_buckets(n, bucket_size):
    """Number of QSGD norms for n elements: 1 if bucket_size == 0 or n <= bucket_size,
    else ceil(n / bucket_size)."""
    bucket_size = _bucket_size(bucket_size)
    if bucket_size == 0 or n <= bucket_size:
        return 1
    return -(-n // bucket_size)


def packed_size(n, bits):
    """Bytes of a payload of n codes of `bits` bits: ceil(n * bits / 8)."""
    return (n * bits + 7) // 8
