"""Gradient-compression kernels (C++ custom ops) as plain TensorFlow functions.

These are the building blocks of `tfdist_ext.compression`; they hold no state
and do no error feedback. Every encoder flattens its input, works on any shape
and works eagerly and inside `tf.function`.

    sparsifiers  -> (values, indices int32), indices ascending
        top_k          exact k largest |x|                  O(n), deterministic
        top_k_approx   sampled threshold (DGC)              faster, seed-driven
        random_k       k positions from (seed, n, k) only   same on every worker
        sparse_to_dense  sums gathered (values, indices) payloads
    quantizers   -> (scale(s), packed uint8 payload); decode(...) -> float [n]
        qsgd      s levels, ceil(log2(s+1))+1 bits    unbiased; a norm per bucket
        terngrad  {-1, 0, +1} * max|x|, 2 bits        unbiased
        sign      {-1, +1} * mean|x|, 1 bit           biased: use error feedback
        int8      min-max, 8 bits                     |error| <= (max-min)/510

Dtypes: the kernels compute in float32. float16, bfloat16 and float64 inputs are
accepted and cast to float32 (exact for float16/bfloat16; float64 is rounded, so
float64 magnitudes that differ only beyond float32 precision rank as ties).
Selections return the original values in the input dtype; decoders return
float32 unless `dtype` says otherwise.

Payload layout: n codes of b bits are a little-endian bit stream, code i in
stream bits [i*b, (i+1)*b) least significant bit first, stream bit j in bit
j % 8 of byte j // 8; `packed_size(n, b)` = ceil(n*b/8) bytes.

TensorFlow flushes subnormal float32 values to zero, so a quantization step
below 1.2e-38 (norm / levels for QSGD, (max - min) / 255 for int8) decodes as
zero; the encoders themselves stay exact for such tiny tensors.

Stochastic ops take an explicit int64 `seed`: the same seed gives the same
output on any machine and thread count. Fold the step counter into it (e.g.
`seed = base_seed * 1_000_003 + step`) so every step draws fresh noise.
"""

import numbers

import numpy as np
import tensorflow as tf

from tfdist_ext.ops import _loader

MAX_QSGD_LEVELS = 32767
_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_MAX_ELEMENTS = 2**31 - 1

for _op in ("TfdistTopK", "TfdistTopKApprox", "TfdistRandomK", "TfdistSparseToDense",
            "TfdistQsgdEncode", "TfdistQsgdDecode", "TfdistTerngradEncode",
            "TfdistTerngradDecode", "TfdistSignEncode", "TfdistSignDecode",
            "TfdistInt8Encode", "TfdistInt8Decode", "TfdistPackBits", "TfdistUnpackBits"):
    tf.no_gradient(_op)


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


# ----------------------------------------------------------------------------
# Sparsification.

def top_k(x, k):
    """Exact top-k of `x` by magnitude.

    Returns exactly the k entries with the largest |x| of the flattened `x`:
    their signed values and their positions, sorted by position ascending (the
    layout `sparse_to_dense` and all-gather want; no sort by value). Ties in |x|
    go to the lower position, so the result is deterministic. NaN ranks above
    every number. O(n): two passes over `x` (a histogram of the magnitudes'
    high bits, then collecting the boundary candidates) and a selection among
    about k candidates, multithreaded over the intra-op pool. Measured 8x
    faster than `tf.math.top_k(tf.abs(x), k, sorted=False)` at 1M elements and
    20-30x at 16M-64M (k = 1%).

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


# ----------------------------------------------------------------------------
# Quantization.

def qsgd_encode(x, levels, seed, bucket_size=512):
    """QSGD: unbiased stochastic quantization to `levels` levels per sign, per bucket.

    Alistarh et al. 2017 ("QSGD: Communication-Efficient SGD via Gradient
    Quantization and Encoding", NeurIPS). The flat input is split into buckets
    of `bucket_size` consecutive elements, each with its own L2 norm; with
    s = levels, |x_i| / ||bucket(x_i)||_2 * s is rounded down or up at random
    (up with probability equal to its fractional part), so decoding is
    unbiased: E[x_hat] = x. Each element costs ceil(log2(s + 1)) + 1 bits
    (`qsgd_bits`): s = 1 -> 2 bits, 7 -> 4, 127 -> 8, plus 32 bits per bucket.
    The variance grows like min(d / s^2, sqrt(d) / s) * ||x||^2 for buckets of
    d elements, so small buckets (the paper uses d = 512) keep it low; one
    norm for a large vector (bucket_size=0) rounds nearly everything to 0 or 1.

    Args:
        x: floating-point tensor of any shape, flattened.
        levels: int s in [1, 32767].
        seed: int or integer scalar tensor; the same seed gives the same codes.
        bucket_size: int d >= 0, elements per bucket; 0 (or d >= n) means one
            bucket for the whole tensor. Defaults to 512.

    Returns:
        (norms, packed): float32 [qsgd_num_buckets(n, bucket_size)] bucket norms
        and uint8 [ceil(n * bits / 8)] codes (layout independent of d). A
        bucket holding a non-finite value gets a non-finite norm (and decodes
        to NaN).
    """
    levels = _levels(levels)
    bucket_size = _bucket_size(bucket_size)
    _, flat32, _ = _flat_float(x)
    return _loader.load().tfdist_qsgd_encode(flat32, _seed(seed), levels=levels,
                                             bucket_size=bucket_size)


def qsgd_decode(norms, packed, n, levels, bucket_size=512, dtype=tf.float32):
    """Decodes `qsgd_encode`'s payload: x_hat_i = norms[i // d] / levels * level_i * sign_i.

    Args:
        norms: float32 [num_buckets] from the encoder (a scalar is accepted
            for one bucket).
        packed: uint8 payload from the encoder.
        n: number of elements encoded (int or integer scalar tensor).
        levels: the encoder's `levels`.
        bucket_size: the encoder's `bucket_size` d. Defaults to 512.
        dtype: float dtype of the result. Defaults to `tf.float32`.

    Returns:
        Vector [n]; reshape it to x's shape.
    """
    levels = _levels(levels)
    bucket_size = _bucket_size(bucket_size)
    dtype = _out_dtype(dtype)
    norms = tf.reshape(tf.cast(norms, tf.float32), [-1])
    if _is_int(n):
        _count(n)
        want = qsgd_num_buckets(n, bucket_size)
        have = norms.shape.num_elements()
        if have is not None and have != want:
            raise ValueError(f"Argument `norms` has {have} elements but n={n} with "
                             f"bucket_size={bucket_size} needs {want} (one norm per bucket). "
                             f"Pass the n and bucket_size used to encode.")
    out = _loader.load().tfdist_qsgd_decode(norms, _uint8(packed, "packed"), _count(n),
                                            levels=levels, bucket_size=bucket_size)
    return _cast(out, dtype)


def terngrad_encode(x, seed):
    """TernGrad: unbiased ternary quantization to {-1, 0, +1} * max|x|, 2 bits each.

    Wen et al. 2017 ("TernGrad: Ternary Gradients to Reduce Communication",
    NeurIPS): element i becomes sign(x_i) * max|x| with probability
    |x_i| / max|x|, else 0. Unbiased. The paper clips gradients to 2.5 standard
    deviations first to keep max|x| (and the variance) small; do that before
    calling this if outliers are common.

    Args:
        x: floating-point tensor of any shape, flattened.
        seed: int or integer scalar tensor; the same seed gives the same codes.

    Returns:
        (scale, packed): float32 scalar max|x| and uint8 [ceil(n / 4)], codes 0
        (zero), 1 (+1), 2 (-1).
    """
    _, flat32, _ = _flat_float(x)
    return _loader.load().tfdist_terngrad_encode(flat32, _seed(seed))


def terngrad_decode(scale, packed, n, dtype=tf.float32):
    """Decodes `terngrad_encode`'s payload to scale * {0, +1, -1}; vector [n]."""
    dtype = _out_dtype(dtype)
    out = _loader.load().tfdist_terngrad_decode(tf.cast(scale, tf.float32),
                                                _uint8(packed, "packed"), _count(n))
    return _cast(out, dtype)


def sign_encode(x):
    """Scaled sign: 1 bit per element, scale = mean |x| (EF-SignSGD).

    Karimireddy et al. 2019 ("Error Feedback Fixes SignSGD and other Gradient
    Compression Schemes", ICML): sending sign(x) with the scale ||x||_1 / n
    keeps the L1 norm. Biased, so it needs error feedback to converge. Zero
    (and -0.0) and NaN encode as +.

    Args:
        x: floating-point tensor of any shape, flattened.

    Returns:
        (scale, packed): float32 scalar mean |x| (0 when n == 0) and uint8
        [ceil(n / 8)], bit 1 for x_i < 0.
    """
    _, flat32, _ = _flat_float(x)
    return _loader.load().tfdist_sign_encode(flat32)


def sign_decode(scale, packed, n, dtype=tf.float32):
    """Decodes `sign_encode`'s payload to +scale (bit 0) / -scale (bit 1); vector [n]."""
    dtype = _out_dtype(dtype)
    out = _loader.load().tfdist_sign_decode(tf.cast(scale, tf.float32),
                                            _uint8(packed, "packed"), _count(n))
    return _cast(out, dtype)


def int8_encode(x):
    """8-bit min-max quantization, round to nearest.

    code_i = round((x_i - min) / (max - min) * 255). `int8_decode` is within
    (max - min) / 510 of x_i (half a step), plus float32 rounding of a few ulp
    of max(|min|, |max|). Deterministic and biased (by at most half a step);
    4x smaller than float32. A constant x decodes exactly. NaN or Inf in x make
    min and max NaN, so the decoded tensor is NaN (loss-scaling checks see it).

    Args:
        x: floating-point tensor of any shape, flattened.

    Returns:
        (min, max, codes): float32 scalars (0, 0 for an empty x) and uint8 [n].
    """
    _, flat32, _ = _flat_float(x)
    return _loader.load().tfdist_int8_encode(flat32)


def int8_decode(min_value, max_value, codes, dtype=tf.float32):
    """Decodes `int8_encode`: min + code * (max - min) / 255; vector [n]."""
    dtype = _out_dtype(dtype)
    out = _loader.load().tfdist_int8_decode(tf.cast(min_value, tf.float32),
                                            tf.cast(max_value, tf.float32),
                                            _uint8(codes, "codes"))
    return _cast(out, dtype)


def pack_bits(codes, bits):
    """Packs uint8 codes below 2**bits into ceil(n * bits / 8) bytes.

    Args:
        codes: uint8 tensor of any shape, flattened; every code < 2**bits (a
            larger one raises InvalidArgumentError naming its position).
        bits: int in [1, 8].

    Returns:
        uint8 vector [ceil(n * bits / 8)] in the layout of this module's docstring.
    """
    bits = _bits(bits)
    return _loader.load().tfdist_pack_bits(_uint8(codes, "codes"), bits=bits)


def unpack_bits(packed, bits, n):
    """Inverse of `pack_bits`: n uint8 codes of `bits` bits.

    Args:
        packed: uint8 vector of exactly ceil(n * bits / 8) bytes.
        bits: int in [1, 8], as packed.
        n: number of codes (int or integer scalar tensor).

    Returns:
        uint8 vector [n].
    """
    bits = _bits(bits)
    return _loader.load().tfdist_unpack_bits(_uint8(packed, "packed"), _count(n), bits=bits)
