"""Quantizing kernels: QSGD, TernGrad, sign, 8-bit min-max, and generic bit packing.

See `tfdist_ext.ops.compression` for the overview and conventions.
"""

import tensorflow as tf

from tfdist_ext.ops import _loader
from tfdist_ext.ops._checks import (
    _bits,
    _bucket_size,
    _cast,
    _count,
    _flat_float,
    _is_int,
    _levels,
    _out_dtype,
    _qsgd_norm,
    _seed,
    _uint8,
    qsgd_num_buckets,
)


def qsgd_encode(x, levels, seed, bucket_size=512, norm="l2"):
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
        norm: "l2" (the paper's ||bucket||_2) or "max" (max |x_i| of the
            bucket). With "max" the largest value sits on the top level and
            the others spread over all levels, so the per-value error is at
            most norm / levels and the variance at most d / (4 s^2) *
            max_i x_i^2, far below the L2 bound for the same bits. Decoding
            is the same for both. Defaults to "l2".

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
                                             bucket_size=bucket_size, norm=_qsgd_norm(norm))


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
