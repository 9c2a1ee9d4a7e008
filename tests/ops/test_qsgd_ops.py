"""QSGD (one norm and bucketed) against numpy references."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.ops.compression import qsgd_num_buckets
from tests.ops.quantize_reference import (
    DRAWS,
    HITS,
    SIGMAS,
    gradient_like,
    mean_decoded,
    reference_pack,
    reference_qsgd,
    reference_unpack,
)


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
# arithmetic and the same counter-based uniform numbers): quantize_reference.py.

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
