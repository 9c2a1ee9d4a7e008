"""TernGrad, scaled sign and int8 min-max against numpy references."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import ops
from tests.ops.quantize_reference import (
    DRAWS,
    HITS,
    SIGMAS,
    gradient_like,
    mean_decoded,
    reference_pack,
    reference_unpack,
)

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
