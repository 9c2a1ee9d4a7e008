"""QSGD, TernGrad, scaled sign, int8 and bit packing against numpy references."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.ops.compression import qsgd_num_buckets

DRAWS = 400  # encodings averaged in the unbiasedness tests
SIGMAS = 6.0  # allowed deviation of a mean, in standard errors (n elements at once)
# Elements rounded up with a tiny probability p are Poisson, not normal: one lucky
# draw moves their mean by step / DRAWS, which can exceed SIGMAS standard errors.
# So the bound also allows two such draws (three or more have probability
# ~(DRAWS * p)^3 / 6 for those elements).
HITS = 2


def reference_pack(codes, bits):
    """Little-endian bit stream: code i in bits [i*bits, (i+1)*bits), LSB first."""
    codes = np.asarray(codes, np.uint32).reshape(-1)
    stream = ((codes[:, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(stream, bitorder="little")


def reference_unpack(packed, bits, n):
    stream = np.unpackbits(np.asarray(packed, np.uint8), bitorder="little")[:n * bits]
    return (stream.reshape(n, bits).astype(np.uint32) << np.arange(bits)).sum(1)


def gradient_like(n, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([0.01, 1.0, 5.0], n)).astype(np.float32)
    x[::17] = 0.0
    return x


def mean_decoded(encode_decode, n):
    total = np.zeros(n, np.float64)
    for seed in range(DRAWS):
        total += encode_decode(seed)
    return total / DRAWS


# ----------------------------------------------------------------------------
# QSGD

@pytest.mark.parametrize("levels", [1, 4, 127, 1000])
def test_qsgd_is_unbiased_and_on_the_lattice(levels):
    n = 301
    x = gradient_like(n, seed=levels)
    norm = np.linalg.norm(x.astype(np.float64))
    unit = norm / levels
    level = np.abs(x) / unit
    frac = level - np.floor(level)

    def draw(seed):
        q_norm, packed = ops.qsgd_encode(x, levels, seed)
        assert packed.shape == (ops.packed_size(n, ops.qsgd_bits(levels)),)
        x_hat = ops.qsgd_decode(q_norm, packed, n, levels).numpy().astype(np.float64)
        # Each element is sign(x) * unit * (floor or ceil of its level).
        lattice = np.round(np.abs(x_hat) / unit)
        assert np.all((lattice == np.floor(level + 1e-5)) | (lattice == np.ceil(level - 1e-5)))
        assert np.all((x_hat == 0) | (np.sign(x_hat) == np.sign(x)))
        return x_hat

    np.testing.assert_allclose(ops.qsgd_encode(x, levels, 0)[0].numpy(), norm, rtol=1e-6)
    mean = mean_decoded(draw, n)
    stderr = unit * np.sqrt(frac * (1 - frac) / DRAWS)
    assert np.all(np.abs(mean - x) <= SIGMAS * stderr + HITS * unit / DRAWS + 1e-6 * norm)


def test_qsgd_payload_layout_and_seeds():
    x = gradient_like(1001, seed=1)
    norm, packed = ops.qsgd_encode(x, 7, seed=5)
    again = ops.qsgd_encode(tf.reshape(x, [7, 11, 13]), 7, seed=tf.constant(5))[1]
    other = ops.qsgd_encode(x, 7, seed=6)[1]
    np.testing.assert_array_equal(packed.numpy(), again.numpy())
    assert not np.array_equal(packed.numpy(), other.numpy())
    # 4 bits per element: (level << 1) | sign, in the documented stream layout;
    # the default buckets of 512 values give 2 norms.
    assert norm.shape == (2,)
    codes = reference_unpack(packed.numpy(), 4, 1001)
    want = (np.repeat(norm.numpy(), 512)[:1001] / 7 * (codes >> 1)
            * np.where(codes & 1, -1.0, 1.0))
    np.testing.assert_allclose(ops.qsgd_decode(norm, packed, 1001, 7).numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(reference_pack(codes, 4), packed.numpy())


def test_qsgd_zero_empty_and_non_finite():
    norm, packed = ops.qsgd_encode(np.zeros(9, np.float32), 3, 0)
    assert norm.numpy() == 0
    np.testing.assert_array_equal(ops.qsgd_decode(norm, packed, 9, 3).numpy(), np.zeros(9))
    norm, packed = ops.qsgd_encode(np.zeros(0, np.float32), 3, 0)
    assert packed.shape == (0,) and ops.qsgd_decode(norm, packed, 0, 3).shape == (0,)
    x = np.ones(5, np.float32)
    x[2] = np.inf
    assert not np.isfinite(ops.qsgd_decode(*ops.qsgd_encode(x, 3, 0), 5, 3).numpy()).any()


def test_qsgd_invalid_arguments():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"Argument `levels` must be an integer in "
                                         r"\[1, 32767\]; received levels=0"):
        ops.qsgd_encode(x, 0, seed=0)
    with pytest.raises(ValueError, match=r"received levels=2.5"):
        ops.qsgd_encode(x, 2.5, seed=0)
    with pytest.raises(ValueError, match=r"Argument `norm` must be one of \('l2', 'max'\); "
                                         r"received norm='linf'"):
        ops.qsgd_encode(x, 3, seed=0, norm="linf")
    with pytest.raises(TypeError, match=r"Argument `x` must be a floating-point tensor .* "
                                        r"received dtype=int64"):
        ops.qsgd_encode(np.ones(4, np.int64), 3, seed=0)
    norm, packed = ops.qsgd_encode(x, 3, seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`packed` has 2 bytes but n=40 codes of 3 bits need 15"):
        ops.qsgd_decode(norm, packed, 40, 3)


# ----------------------------------------------------------------------------
# QSGD buckets, against an exact numpy model of the kernel (same float32
# arithmetic and the same counter-based uniform numbers).

_M64 = (1 << 64) - 1


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _M64
    return z ^ (z >> 31)


def _fmix32(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85ebca6b)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xc2b2ae35)
    return h ^ (h >> np.uint32(16))


def reference_uniform24(seed, n, stream=0x7173676471736764):
    """compression_common.h's Uniform24Stream (QSGD salt) for elements 0..n-1."""
    key = _mix64(_mix64((seed & _M64) ^ stream))
    k0, k1 = np.uint32(key & 0xffffffff), np.uint32(key >> 32)
    i = np.arange(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        return (_fmix32(_fmix32((i * np.uint32(0x9e3779b9)) ^ k0) ^ k1) >> np.uint32(8))


def reference_qsgd(x, levels, seed, bucket_size, norms):
    """Codes of the kernel, given its float32 bucket norms."""
    n = x.size
    d = n if bucket_size == 0 or n <= bucket_size else bucket_size
    norm_of = np.repeat(norms, d)[:n] if n else np.zeros(0, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (levels / norm_of.astype(np.float64)).astype(np.float32)
        v = np.abs(x) * scale  # float32, as in the kernel
        floor = np.where(np.isfinite(v), v, 0).astype(np.int32)
    frac = v - floor.astype(np.float32)
    u = reference_uniform24(seed, n).astype(np.float32)
    level = np.minimum(floor + (u < frac * np.float32(2**24)), levels)
    level = np.where(norm_of > 0, level, 0)  # zero buckets: all codes 0
    return (level << 1) | ((x < 0) & (level != 0))


@pytest.mark.parametrize("n, bucket_size", [
    (1000, 128),   # not a multiple: last bucket of 104
    (1024, 128),   # a multiple
    (1001, 512),   # the default, last bucket of 489
    (777, 7),      # buckets that straddle packed bytes
    (300, 512),    # n < bucket_size: one bucket
    (512, 512),    # n == bucket_size: one bucket
    (0, 512),      # empty: one zero norm
    (1000, 0),     # 0: one bucket
    (5, 1),        # one element per bucket
    (70_001, 2048),  # several chunks and blocks
])
@pytest.mark.parametrize("levels", [3, 7])
@pytest.mark.parametrize("norm", ["l2", "max"])
def test_qsgd_buckets_match_numpy_reference(n, bucket_size, levels, norm):
    x = gradient_like(n, seed=n + bucket_size)
    x[3 * n // 4:] *= 1e-3  # very different bucket scales
    num_buckets = qsgd_num_buckets(n, bucket_size)
    assert num_buckets == (1 if bucket_size == 0 or n <= bucket_size
                           else -(-n // bucket_size))
    norms, packed = ops.qsgd_encode(x, levels, 17, bucket_size=bucket_size, norm=norm)
    assert norms.shape == (num_buckets,) and norms.dtype == tf.float32
    bits = ops.qsgd_bits(levels)
    assert packed.shape == (ops.packed_size(n, bits),)
    d = max(bucket_size, 1) if num_buckets > 1 else max(n, 1)
    x64 = x.astype(np.float64)
    norm_fn = np.linalg.norm if norm == "l2" else (lambda b: np.max(np.abs(b), initial=0.0))
    want_norms = [norm_fn(x64[k * d:(k + 1) * d]) for k in range(num_buckets)]
    np.testing.assert_allclose(norms.numpy(), want_norms, rtol=1e-6)
    codes = reference_qsgd(x, levels, 17, bucket_size, norms.numpy())
    if norm == "max" and n:  # each bucket's largest value sits on the top level
        assert np.max(codes >> 1) == levels
    np.testing.assert_array_equal(packed.numpy(), reference_pack(codes, bits))
    unit = (np.repeat(norms.numpy(), d)[:n] / np.float32(levels)).astype(np.float32)
    want = np.where(codes & 1, -1, 1) * ((codes >> 1).astype(np.float32) * unit)
    got = ops.qsgd_decode(norms, packed, n, levels, bucket_size=bucket_size)
    np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))


def test_qsgd_bucket_size_zero_is_the_one_norm_encoding():
    x = gradient_like(3000, seed=3)
    one_norm, one_packed = ops.qsgd_encode(x, 7, 4, bucket_size=0)
    big_norm, big_packed = ops.qsgd_encode(x, 7, 4, bucket_size=10**6)
    np.testing.assert_array_equal(one_packed.numpy(), big_packed.numpy())
    np.testing.assert_array_equal(one_norm.numpy(), big_norm.numpy())
    np.testing.assert_allclose(one_norm.numpy(), [np.linalg.norm(x.astype(np.float64))],
                               rtol=1e-6)


def test_qsgd_is_unbiased_per_bucket():
    n, d, levels = 320, 64, 3
    x = gradient_like(n, seed=31)
    x[:d] *= 1e-4  # a tiny bucket next to large ones: must not be swamped
    x[2 * d:3 * d] *= 100.0
    norms = np.array([np.linalg.norm(x[k * d:(k + 1) * d].astype(np.float64))
                      for k in range(n // d)])
    unit = np.repeat(norms, d) / levels
    level = np.abs(x) / unit
    frac = level - np.floor(level)

    def draw(seed):
        q_norms, packed = ops.qsgd_encode(x, levels, seed, bucket_size=d)
        x_hat = ops.qsgd_decode(q_norms, packed, n, levels, bucket_size=d).numpy()
        x_hat = x_hat.astype(np.float64)
        lattice = np.round(np.abs(x_hat) / unit)
        assert np.all((lattice == np.floor(level + 1e-5)) | (lattice == np.ceil(level - 1e-5)))
        return x_hat

    mean = mean_decoded(draw, n)
    stderr = unit * np.sqrt(frac * (1 - frac) / DRAWS)
    assert np.all(np.abs(mean - x) <= SIGMAS * stderr + HITS * unit / DRAWS + 1e-6 * unit)
    # The small bucket is resolved to its own scale, not rounded to zero.
    assert np.abs(mean[:d] - x[:d]).max() < 0.1 * np.abs(x[:d]).max()


def test_qsgd_buckets_reduce_the_variance():
    n, levels, draws = 1 << 17, 7, 4
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)

    def mse(bucket_size, norm="l2"):
        total = 0.0
        for seed in range(draws):
            norms, packed = ops.qsgd_encode(x, levels, seed, bucket_size=bucket_size,
                                            norm=norm)
            x_hat = ops.qsgd_decode(norms, packed, n, levels, bucket_size=bucket_size)
            total += np.sum((x_hat.numpy().astype(np.float64) - x) ** 2)
        return total / draws

    one, bucketed, max_norm = mse(0), mse(512), mse(512, "max")
    # One norm: |x_i| / ||x|| * 7 ~ 0.02, so the variance is ~ unit * sum|x_i|; with
    # buckets of 512 it is ~ sqrt(n / 512) = 16 times smaller.
    assert one / bucketed > 8, (one, bucketed)
    # The paper's bound (Lemma 3.1): E||x_hat - x||^2 <= min(d / s^2, sqrt(d) / s) ||x||^2.
    squares = np.sum(x.astype(np.float64) ** 2)
    assert bucketed <= np.sqrt(512) / levels * squares
    # Max norm: each value lands on one of two neighbouring levels of its bucket,
    # unit = max / s apart, so the variance is <= unit^2 / 4 per value. Normal data
    # (max ~ 3.4 sigma over 512 values) gives ~0.06 ||x||^2 where L2 gives ~1.6.
    units = np.repeat([np.max(np.abs(b)) for b in x.reshape(-1, 512)], 512) / levels
    assert max_norm <= np.sum(units.astype(np.float64) ** 2) / 4
    assert bucketed / max_norm > 10, (bucketed, max_norm)


def test_qsgd_in_tf_function_with_dynamic_n():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def round_trip(x):
        norms, packed = ops.qsgd_encode(x, 7, 3, bucket_size=16)
        return norms, ops.qsgd_decode(norms, packed, tf.size(x), 7, bucket_size=16)

    x = gradient_like(100, seed=9)
    norms, x_hat = round_trip(x)
    assert norms.shape == (7,)
    eager = ops.qsgd_decode(*ops.qsgd_encode(x, 7, 3, bucket_size=16), 100, 7, bucket_size=16)
    np.testing.assert_array_equal(x_hat.numpy(), eager.numpy())
    static = tf.function(lambda x: ops.qsgd_encode(x, 7, 3, bucket_size=16)).get_concrete_function(
        tf.TensorSpec([100], tf.float32))
    assert static.structured_outputs[0].shape == [7]


@pytest.mark.parametrize("bad", [-1, 2.5, True, "512", None])
def test_qsgd_invalid_bucket_size(bad):
    message = (r"Argument `bucket_size` must be an integer >= 0; received "
               rf"bucket_size={bad!r}\.".replace("'", "'"))
    with pytest.raises(ValueError, match=message):
        ops.qsgd_encode(np.ones(4, np.float32), 7, 0, bucket_size=bad)
    with pytest.raises(ValueError, match=message):
        ops.qsgd_decode(np.ones(1, np.float32), np.zeros(2, np.uint8), 4, 7, bucket_size=bad)
    with pytest.raises(ValueError, match=message):
        qsgd_num_buckets(4, bad)


def test_qsgd_decode_checks_the_number_of_norms():
    x = gradient_like(1000, seed=2)
    norms, packed = ops.qsgd_encode(x, 7, 0, bucket_size=100)
    with pytest.raises(ValueError, match=r"Argument `norms` has 10 elements but n=1000 with "
                                         r"bucket_size=128 needs 8 \(one norm per bucket\)"):
        ops.qsgd_decode(norms, packed, 1000, 7, bucket_size=128)
    # Dynamic n: the kernel checks it.
    decode = tf.function(lambda n: ops.qsgd_decode(norms, packed, n, 7, bucket_size=128))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"TfdistQsgdDecode: `norms` has 10 elements but n=1000 with "
                             r"bucket_size=128 needs 8 \(one norm per bucket\)"):
        decode(tf.constant(1000))


# ----------------------------------------------------------------------------
# TernGrad

def test_terngrad_is_unbiased_and_ternary():
    n = 301
    x = gradient_like(n, seed=11)
    scale = np.abs(x).max()
    p = np.abs(x) / scale

    def draw(seed):
        t_scale, packed = ops.terngrad_encode(x, seed)
        assert t_scale.numpy() == scale and packed.shape == ((n + 3) // 4,)
        x_hat = ops.terngrad_decode(t_scale, packed, n).numpy().astype(np.float64)
        assert np.all(np.isin(x_hat, [0.0, scale, -scale]))
        assert np.all((x_hat == 0) | (np.sign(x_hat) == np.sign(x)))
        return x_hat

    mean = mean_decoded(draw, n)
    stderr = scale * np.sqrt(p * (1 - p) / DRAWS)
    assert np.all(np.abs(mean - x) <= SIGMAS * stderr + HITS * scale / DRAWS + 1e-6 * scale)
    # The largest element always survives.
    assert mean[np.argmax(np.abs(x))] == x[np.argmax(np.abs(x))]


def test_terngrad_seeds_and_zero_input():
    x = gradient_like(100, seed=2)
    a = ops.terngrad_encode(x, 1)[1].numpy()
    np.testing.assert_array_equal(a, ops.terngrad_encode(x, 1)[1].numpy())
    assert not np.array_equal(a, ops.terngrad_encode(x, 2)[1].numpy())
    scale, packed = ops.terngrad_encode(np.zeros(6, np.float32), 0)
    np.testing.assert_array_equal(ops.terngrad_decode(scale, packed, 6).numpy(), np.zeros(6))


# ----------------------------------------------------------------------------
# Scaled sign

@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_sign_round_trip(n):
    x = gradient_like(n, seed=n)
    if n:
        x[0] = -0.0  # zero, even negative zero, decodes as +scale
    scale, packed = ops.sign_encode(x)
    want_scale = np.abs(x.astype(np.float64)).mean() if n else 0.0
    np.testing.assert_allclose(scale.numpy(), want_scale, rtol=1e-6)
    np.testing.assert_array_equal(packed.numpy(), reference_pack(x < 0, 1))
    x_hat = ops.sign_decode(scale, packed, n).numpy()
    np.testing.assert_array_equal(x_hat, np.where(x < 0, -scale.numpy(), scale.numpy()))


def test_sign_decode_dtype_and_shape():
    x = tf.constant(gradient_like(60, seed=4).reshape(3, 4, 5), tf.bfloat16)
    scale, packed = ops.sign_encode(x)
    x_hat = ops.sign_decode(scale, packed, 60, dtype=tf.float16)
    assert x_hat.dtype == tf.float16 and x_hat.shape == (60,)


# ----------------------------------------------------------------------------
# 8-bit min-max

@pytest.mark.parametrize("n,spread", [(1, 1.0), (9, 1.0), (1000, 1e-3), (100_003, 50.0)])
def test_int8_error_bound(n, spread):
    x = (gradient_like(n, seed=n) * spread + spread).astype(np.float32)
    lo, hi, codes = ops.int8_encode(x)
    assert lo.numpy() == x.min() and hi.numpy() == x.max() and codes.dtype == tf.uint8
    x_hat = ops.int8_decode(lo, hi, codes).numpy()
    lo, hi = float(lo), float(hi)
    bound = (hi - lo) / 510 + 4 * np.finfo(np.float32).eps * max(abs(lo), abs(hi))
    assert np.max(np.abs(x_hat - x)) <= bound
    codes = codes.numpy()
    np.testing.assert_array_equal(codes[np.argmin(x)], 0)
    np.testing.assert_array_equal(codes[np.argmax(x)], 255 if hi > lo else 0)


def test_int8_constant_empty_and_non_finite():
    lo, hi, codes = ops.int8_encode(np.full(5, -2.5, np.float32))
    np.testing.assert_array_equal(ops.int8_decode(lo, hi, codes).numpy(), np.full(5, -2.5))
    lo, hi, codes = ops.int8_encode(np.zeros(0, np.float32))
    assert (lo.numpy(), hi.numpy(), codes.shape) == (0, 0, (0,))
    x = np.arange(4, dtype=np.float32)
    x[1] = np.nan
    assert np.isnan(ops.int8_decode(*ops.int8_encode(x)).numpy()).all()


def test_tiny_scales_do_not_overflow():
    # levels / norm, 2^24 / max|x| and 255 / (max - min) overflow float32 here, so
    # the encoders divide instead. (Decoded steps this small are subnormal, which
    # TensorFlow flushes to zero, so the codes are what can be checked.)
    x = np.array([0, 1, -2, 3, 0.5], np.float32) * np.float32(1e-37)
    x64 = x.astype(np.float64)
    _, packed = ops.qsgd_encode(x, 1000, seed=1)
    codes = reference_unpack(packed.numpy(), ops.qsgd_bits(1000), 5)
    level = np.abs(x64) / np.linalg.norm(x64) * 1000
    assert np.all((codes >> 1 == np.floor(level)) | (codes >> 1 == np.ceil(level)))
    assert np.all(((codes & 1) == 1) == (x < 0))
    scale, packed = ops.terngrad_encode(x, seed=1)
    x_hat = ops.terngrad_decode(scale, packed, 5).numpy()
    assert x_hat[3] == x[3] and np.all(np.isin(x_hat, [0, scale, -scale]))
    codes = ops.int8_encode(x)[2]
    want = np.floor((x64 - x64.min()) / (x64.max() - x64.min()) * 255 + 0.5)
    np.testing.assert_array_equal(codes.numpy(), want)


# ----------------------------------------------------------------------------
# Bit packing

@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_pack_unpack_round_trip(bits, n):
    codes = np.random.default_rng(bits * 1000 + n).integers(0, 2**bits, n).astype(np.uint8)
    packed = ops.pack_bits(codes, bits)
    assert packed.shape == (ops.packed_size(n, bits),)
    np.testing.assert_array_equal(packed.numpy(), reference_pack(codes, bits))
    np.testing.assert_array_equal(ops.unpack_bits(packed, bits, n).numpy(), codes)


def test_pack_unpack_in_tf_function_with_dynamic_n():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.uint8)])
    def round_trip(codes):
        return ops.unpack_bits(ops.pack_bits(codes, 5), 5, tf.size(codes))

    codes = np.arange(31, dtype=np.uint8)
    np.testing.assert_array_equal(round_trip(codes).numpy(), codes)


def test_pack_bits_invalid_arguments():
    with pytest.raises(ValueError, match=r"Argument `bits` must be an integer in \[1, 8\]; "
                                         r"received bits=9"):
        ops.pack_bits(np.zeros(3, np.uint8), 9)
    with pytest.raises(ValueError, match=r"received bits=0"):
        ops.unpack_bits(np.zeros(3, np.uint8), 0, 3)
    with pytest.raises(TypeError, match=r"Argument `codes` must be a uint8 tensor; "
                                        r"received dtype=int32"):
        ops.pack_bits(tf.constant([1, 2]), 2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"codes\[2\] = 8 does not fit in bits=3"):
        ops.pack_bits(np.array([1, 7, 8, 0], np.uint8), 3)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`packed` has 1 bytes but n=9 codes of 1 bits need 2"):
        ops.unpack_bits(np.zeros(1, np.uint8), 1, 9)


def test_outputs_do_not_depend_on_the_thread_count():
    """Every worker must get identical payloads for the same seed, whatever its threads."""
    script = (
        "import sys, hashlib, tensorflow as tf\n"
        "tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))\n"
        "from tfdist_ext import ops\n"
        "x = tf.random.stateless_normal([1_000_003], seed=[4, 5])\n"
        "h = hashlib.sha1()\n"
        "for t in [ops.top_k(x, 9000), ops.top_k_approx(x, 9000, seed=2),\n"
        "          ops.random_k(x, 9000, 9), ops.qsgd_encode(x, 15, 3),\n"
        "          ops.qsgd_encode(x, 7, 4, bucket_size=0),\n"
        "          ops.qsgd_encode(x, 7, 5, bucket_size=100_000),\n"
        "          ops.terngrad_encode(x, 3), ops.sign_encode(x), ops.int8_encode(x)]:\n"
        "    for a in t: h.update(a.numpy().tobytes())\n"
        "print('digest', h.hexdigest())\n")
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="2")
    digests = set()
    for threads in (1, 3):
        out = subprocess.run([sys.executable, "-c", script, str(threads)], env=env, cwd=root,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        digests.add(out.split("digest")[-1].strip())
    assert len(digests) == 1, digests
