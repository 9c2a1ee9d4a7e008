"""Sparsifying kernels: top-k (exact and sampled), random-k, and the gathered-payload sum.

See `tfdist_ext.ops.compression` for the overview and conventions.
"""

import numbers


import tensorflow as tf

from tfdist_ext.ops import _loader
from tfdist_ext.ops._checks import (
    _count,
    _flat_float,
    _k,
    _seed,
)


def top_k(x, k):
    """Exact top-k of `x` by magnitude.

    Returns exactly the k entries with the largest |x| of the flattened `x`:
    their signed values and their positions, sorted by position ascending (the
    layout `sparse_to_dense` and all-gather want; no sort by value). Ties in |x|
    go to the lower position, so the result is deterministic. NaN ranks above
    every number. O(n): two passes over `x` (a histogram of the magnitudes'
    high bits, then collecting the boundary candidates) and a selection among
    about k candidates, multithreaded over the intra-op pool. It is faster
    than `tf.math.top_k(tf.abs(x), k, sorted=False)`, the more so the larger
    the tensor.

    Top-k sparsification (Aji & Heafield 2017; Lin et al. 2018) needs error
    feedback (accumulate what was not sent) to converge; ratios of 0.1%-1% are
    usual.

    Args:
        x: floating-point tensor of any shape, flattened; n < 2**31 elements.
        k: int or int32 scalar tensor in [0, n].

    Returns:
        (values, indices): `values` [k] in x's dtype, `indices` [k] int32.

    Raises:
        ValueError: a static `k` outside [0, n].
        TypeError: `x` is not floating point.
    """
    flat, flat32, n = _flat_float(x)
    values, indices = _loader.load().tfdist_top_k(flat32, _k(k, n))
    if flat.dtype != tf.float32:
        values = tf.gather(flat, indices)
    return values, indices


def top_k_approx(x, k, sample_fraction=0.01, seed=0):
    """Top-k by magnitude with a sampled threshold (Deep Gradient Compression).

    Following Lin et al. 2018 ("Deep Gradient Compression", ICLR), the
    magnitude threshold is estimated from ceil(sample_fraction * n) random
    positions (at least 1024), lowered by three standard errors, and one pass
    keeps |x| >= threshold; the k largest candidates are returned. If the
    sample over-estimated the threshold (fewer than k candidates, about 0.1% of
    calls) the exact algorithm of `top_k` finishes the job. So the result is
    always exactly k elements, sorted by position, and is the same set `top_k`
    returns (ties to the lower position): "approximate" is the threshold, which
    saves `top_k`'s histogram pass. Use it on large tensors; on small ones
    (n < ~100k) the two cost the same.

    Args:
        x: floating-point tensor of any shape, flattened; n < 2**31 elements.
        k: int or int32 scalar tensor in [0, n].
        sample_fraction: fraction of x sampled, in (0, 1]. Defaults to 0.01;
            DGC uses 0.001-0.01. Smaller samples are faster to draw but give a
            looser threshold (more candidates).
        seed: int or int64 scalar tensor choosing the sample. Only the running
            time depends on it.

    Returns:
        (values, indices): `values` [k] in x's dtype, `indices` [k] int32.
    """
    if not isinstance(sample_fraction, numbers.Real) or not 0.0 < sample_fraction <= 1.0:
        raise ValueError(f"Argument `sample_fraction` must be in (0, 1]; received "
                         f"sample_fraction={sample_fraction!r}. DGC samples 0.001-0.01.")
    flat, flat32, n = _flat_float(x)
    values, indices = _loader.load().tfdist_top_k_approx(
        flat32, _k(k, n), _seed(seed), sample_fraction=float(sample_fraction))
    if flat.dtype != tf.float32:
        values = tf.gather(flat, indices)
    return values, indices


def random_k(x, k, seed):
    """k distinct random positions of `x` and the values there.

    The positions depend only on (seed, n, k), never on `x`: workers passing the
    same seed at a step pick the same positions, so their payloads can be summed
    with an all-reduce instead of gathered (Stich et al. 2018, "Sparsified SGD
    with memory"). Drawn uniformly (Floyd's algorithm, SplitMix64 counter-based
    generator), returned sorted ascending. Pass a different seed every step
    (e.g. fold in the step counter), and use error feedback.

    Args:
        x: floating-point tensor of any shape, flattened; n < 2**31 elements.
        k: int or int32 scalar tensor in [0, n].
        seed: int or integer scalar tensor.

    Returns:
        (values, indices): `values` [k] in x's dtype, `indices` [k] int32.
    """
    flat, _, n = _flat_float(x)
    return _loader.load().tfdist_random_k(flat, _k(k, n), _seed(seed))


def sparse_to_dense(values, indices, n):
    """Sums sparse payloads into a dense vector of n elements.

    dense[i] = sum of values[j] over all j with indices[j] == i, so the
    concatenated (values, indices) of W workers (length W*k each, after an
    all-gather) become their sum. Summation follows input order, so the result
    is deterministic. float16/bfloat16 values are summed in float32.

    Args:
        values: floating-point vector.
        indices: integer vector of the same length, each in [0, n).
        n: int or integer scalar tensor, the dense size.

    Returns:
        Dense vector [n] in values' dtype; reshape it to the gradient's shape.

    Raises:
        tf.errors.InvalidArgumentError: an index outside [0, n) (the message
            names the first offending position and value).
    """
    flat, flat32, _ = _flat_float(values, "values")
    indices = tf.convert_to_tensor(indices)
    if not indices.dtype.is_integer:
        raise TypeError(f"Argument `indices` must be an integer tensor; received "
                        f"dtype={indices.dtype.name}.")
    indices = tf.reshape(indices, [-1])
    if indices.dtype != tf.int32:  # clip first so a wide index cannot wrap into range
        indices = tf.cast(tf.clip_by_value(tf.cast(indices, tf.int64), -1, 2**31 - 1), tf.int32)
    native = flat if flat.dtype in (tf.float32, tf.float64) else flat32
    dense = _loader.load().tfdist_sparse_to_dense(native, indices, _count(n))
    return tf.cast(dense, flat.dtype) if dense.dtype != flat.dtype else dense
