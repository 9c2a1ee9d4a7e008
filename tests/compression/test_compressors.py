"""Every compressor against numpy references: round trip, payload shapes and
bytes, the sum of an all-gather, the sum of an all-reduce, and validation."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import compression
from tfdist_ext.compression import (
    BF16,
    FP16,
    QSGD,
    Int8,
    NoCompression,
    RandomK,
    Sign,
    TernGrad,
    TopK,
    TopKApprox,
)

NAMES = ["bf16", "fp16", "int8", "none", "qsgd", "randomk", "sign", "terngrad", "topk",
         "topk_approx"]  # the payload compressors tested here
REGISTERED = sorted(NAMES + ["powersgd", "adaptive"])  # test_powersgd.py, test_adaptive.py
# A compressor added in its own file registers itself; the tests here name the known ones.
DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
ALL = [compression.get(name) for name in NAMES] + [TopK(ratio=0.2), RandomK(ratio=0.3),
                                                   QSGD(levels=1), QSGD(levels=1000),
                                                   QSGD(bucket_size=64), QSGD(bucket_size=0)]
WORLD = 3
DRAWS = 200  # encodings averaged in the unbiasedness tests


def gradient(n, seed, dtype=tf.float32):
    """Distinct magnitudes spanning a few orders, some exact zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * rng.choice([0.01, 1.0, 5.0], n)
    x[::17] = 0.0
    return tf.constant(x, dtype)


def ids(c):
    return repr(c)


# ----------------------------------------------------------------------------
# Registry and configuration

def test_registered_names_and_lookups():
    assert set(REGISTERED) <= set(compression.COMPRESSORS.names())
    assert compression.get("topk") == TopK()
    assert compression.get({"name": "qsgd", "levels": 3}) == QSGD(levels=3)
    assert compression.get({"name": "qsgd", "bucket_size": 128}) == QSGD(bucket_size=128)
    assert compression.get(None) == NoCompression()
    instance = TopKApprox(ratio=0.1, sample_fraction=0.5)
    assert compression.get(instance) is instance
    assert TopK(0.001) == TopK(ratio=0.001)
    for name in compression.COMPRESSORS.names():
        assert compression.get(name).name == name


def test_unknown_name_lists_all():
    valid = ", ".join(repr(n) for n in compression.COMPRESSORS.names())
    with pytest.raises(ValueError, match=f"Unknown compression 'topkk'. Valid names: {valid}."):
        compression.get("topkk")
    with pytest.raises(ValueError, match=r"QSGD got unknown option\(s\) \['ratio'\]"):
        compression.get({"name": "qsgd", "ratio": 0.1})


def test_defaults_and_flags():
    assert TopK() == TopK(ratio=0.01, error_feedback=True, warmup_steps=0)
    assert TopKApprox().sample_fraction == 0.01 and TopKApprox().error_feedback
    assert RandomK().error_feedback and RandomK().shared_seed and RandomK().reducible
    assert QSGD().levels == 7 and not QSGD().error_feedback and QSGD().bits == 4
    assert QSGD().bucket_size == 512
    assert Sign().error_feedback and not TernGrad().error_feedback
    assert not Int8().error_feedback
    for c in (NoCompression(), FP16(), BF16()):
        assert c.reducible and not c.error_feedback and c.warmup_steps == 0
    for c in (TopK(), TopKApprox(), QSGD(), TernGrad(), Sign(), Int8()):
        assert not c.reducible and not c.shared_seed
    with pytest.raises(dataclasses.FrozenInstanceError):
        TopK().ratio = 0.5
    assert len({TopK(), TopK(), QSGD()}) == 2  # hashable, usable as tf.function keys


@pytest.mark.parametrize("cls, kwargs, message", [
    (TopK, {"ratio": 0}, r"Argument `ratio` of TopK must be in \(0, 1\]; received 0\."),
    (TopK, {"ratio": 1.5}, r"Argument `ratio` of TopK must be in \(0, 1\]; received 1\.5\."),
    (TopK, {"ratio": -1}, r"Argument `ratio` of TopK must be in \(0, 1\]; received -1\."),
    (TopK, {"ratio": "1%"}, r"Argument `ratio` of TopK must be in \(0, 1\]; received '1%'\."),
    (TopKApprox, {"ratio": 0}, r"Argument `ratio` of TopKApprox must be in \(0, 1\]"),
    (TopKApprox, {"sample_fraction": 0},
     r"Argument `sample_fraction` of TopKApprox must be in \(0, 1\]; received 0\."),
    (RandomK, {"ratio": 1.5}, r"Argument `ratio` of RandomK must be in \(0, 1\]; received 1\.5"),
    (QSGD, {"levels": 0},
     r"Argument `levels` of QSGD must be an integer in \[1, 32767\]; received 0\."),
    (QSGD, {"levels": 40000}, r"`levels` of QSGD must be an integer in \[1, 32767\]"),
    (QSGD, {"levels": 2.5}, r"`levels` of QSGD must be an integer in \[1, 32767\]; received 2\.5"),
    (QSGD, {"bucket_size": -1},
     r"Argument `bucket_size` of QSGD must be an integer in \[0, 2147483647\]; received -1\."),
    (QSGD, {"bucket_size": 2.5}, r"Argument `bucket_size` of QSGD must be an integer in "),
    (QSGD, {"bucket_size": True}, r"Argument `bucket_size` of QSGD must be an integer in "),
    (TopK, {"warmup_steps": -1},
     r"Argument `warmup_steps` of TopK must be an integer >= 0; received -1\."),
    (Sign, {"warmup_steps": 1.0}, r"Argument `warmup_steps` of Sign must be an integer >= 0"),
    (TopK, {"error_feedback": "yes"},
     r"Argument `error_feedback` of TopK must be True or False; received 'yes' of type str\."),
    (QSGD, {"error_feedback": 1}, r"Argument `error_feedback` of QSGD must be True or False"),
    (QSGD, {"norm": "linf"},
     r"Argument `norm` of QSGD must be one of \('l2', 'max'\); received 'linf'\."),
    (TopK, {"momentum": 1.0}, r"Argument `momentum` of TopK must be in \[0, 1\); received 1\.0\."),
    (RandomK, {"momentum": -0.1}, r"Argument `momentum` of RandomK must be in \[0, 1\)"),
    (TopKApprox, {"momentum": 0.9, "error_feedback": False},
     r"Argument `momentum` of TopKApprox needs error_feedback=True .* received momentum=0\.9 "
     r"with error_feedback=False\."),
])
def test_invalid_arguments_name_argument_value_and_range(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)
    with pytest.raises(ValueError, match=message):
        compression.get({"name": cls.name, **kwargs})


@pytest.mark.parametrize("c", [compression.get(name) for name in NAMES], ids=ids)
def test_integer_gradients_raise_type_error(c):
    message = (rf"{type(c).__name__} \('{c.name}'\) compresses float16, bfloat16, float32 "
               rf"or float64 gradients; received dtype int32")
    with pytest.raises(TypeError, match=message):
        c.compress(tf.range(10), 0)
    with pytest.raises(TypeError, match=message):
        c.payload_bytes(10, tf.int32)


def test_misuse_of_decompress():
    with pytest.raises(ValueError, match=r"RandomK \('randomk'\) derives its indices from the "
                                         r"seed: pass the seed given to compress\(\)"):
        RandomK().decompress((tf.zeros([1]),), 100, tf.float32)
    with pytest.raises(ValueError, match=r"TopK \('topk'\) expects a payload tuple of 2 "
                                         r"tensor\(s\) \['float32', 'int32'\]"):
        TopK().decompress((tf.zeros([1]),), 100, tf.float32)
    with pytest.raises(ValueError, match=r"Payload tensor 1 of QSGD \('qsgd'\) for 100 elements "
                                         r"of float32 \(world_size=3\) must be uint8 of shape "
                                         r"\[150\]; received uint8 of shape \(50,\)"):
        QSGD().decompress_sum((tf.zeros([3]), tf.zeros([50], tf.uint8)), 100, tf.float32, 3)
    with pytest.raises(ValueError, match=r"needs a buffer of static size"):
        tf.function(lambda x: TopK().compress(x, 0)).get_concrete_function(
            tf.TensorSpec([None], tf.float32))
    with pytest.raises(ValueError, match=r"Argument `world_size` of TopK must be an integer >= 1"):
        TopK().decompress_sum((tf.zeros([1]), tf.zeros([1], tf.int32)), 100, tf.float32, 0)


# ----------------------------------------------------------------------------
# Payloads: static shapes, bytes, dtypes

def test_payload_bytes_for_a_million_float32():
    n, f32 = 1_000_000, tf.float32
    expected = {"none": 4_000_000, "fp16": 2_000_000, "bf16": 2_000_000,
                "topk": 80_000, "topk_approx": 80_000, "randomk": 40_000,
                "qsgd": 4 * 1954 + 500_000, "terngrad": 4 + 250_000, "sign": 4 + 125_000,
                "int8": 8 + 1_000_000}
    assert {name: compression.get(name).payload_bytes(n, f32) for name in NAMES} == expected
    assert QSGD(levels=1).payload_bytes(n, f32) == 4 * 1954 + 250_000
    assert QSGD(levels=127).payload_bytes(n, f32) == 4 * 1954 + 1_000_000
    assert QSGD(bucket_size=128).payload_bytes(n, f32) == 4 * 7813 + 500_000
    assert QSGD(bucket_size=0).payload_bytes(n, f32) == 4 + 500_000
    assert QSGD(bucket_size=n).payload_bytes(n, f32) == 4 + 500_000
    assert QSGD(bucket_size=n - 1).payload_bytes(n, f32) == 8 + 500_000
    assert QSGD().payload_bytes(512, f32) == 4 + 256
    assert QSGD().payload_bytes(513, f32) == 8 + 257
    assert QSGD().payload_bytes(0, f32) == 4
    assert [s.shape for s in QSGD().payload_spec(1025, f32)] == [[3], [513]]
    assert TopK().payload_bytes(n, tf.float16) == 60_000
    assert TopK(ratio=1e-9).payload_bytes(n, f32) == 8  # at least one element


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("c", ALL, ids=ids)
def test_payload_is_static_and_matches_payload_bytes(c, dtype):
    n = 1000
    traced = tf.function(lambda flat, seed: c.compress(flat, seed)).get_concrete_function(
        tf.TensorSpec([n], dtype), tf.TensorSpec([], tf.int64))
    specs = c.payload_spec(n, dtype)
    assert len(traced.structured_outputs) == len(specs)
    for tensor, spec in zip(traced.structured_outputs, specs):
        assert tensor.shape.is_fully_defined() and tensor.shape.rank == 1
        assert tensor.shape == spec.shape and tensor.dtype == spec.dtype
    payload = c.compress(gradient(n, 1, dtype), 7)
    assert sum(t.numpy().nbytes for t in payload) == c.payload_bytes(n, dtype)
    dense = c.decompress(payload, n, dtype, seed=7)
    assert dense.dtype == dtype and dense.shape == [n]


@pytest.mark.parametrize("c", [compression.get(name) for name in NAMES], ids=ids)
def test_empty_buffer(c):
    payload = c.compress(tf.zeros([0]), 0)
    assert sum(t.numpy().nbytes for t in payload) == c.payload_bytes(0, tf.float32)
    assert c.decompress(payload, 0, tf.float32, seed=0).shape == [0]


# ----------------------------------------------------------------------------
# Round trips against numpy references

def bf16_reference(x):
    """float32 -> bfloat16 -> float32, round to nearest even."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def test_cast_compressors_round_trip():
    n = 2000
    x = gradient(n, 2)
    np.testing.assert_array_equal(NoCompression().decompress(
        NoCompression().compress(x, 0), n, tf.float32), x.numpy())
    got = FP16().decompress(FP16().compress(x, 0), n, tf.float32).numpy()
    np.testing.assert_array_equal(got, x.numpy().astype(np.float16).astype(np.float32))
    got = BF16().decompress(BF16().compress(x, 0), n, tf.float32).numpy()
    np.testing.assert_array_equal(got, bf16_reference(x.numpy()))
    np.testing.assert_allclose(got, x.numpy(), rtol=2**-8)


@pytest.mark.parametrize("c", [TopK(ratio=0.05), TopKApprox(ratio=0.05, sample_fraction=0.1),
                               TopK(ratio=1.0)], ids=ids)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16], ids=lambda d: d.name)
def test_top_k_keeps_exactly_the_k_largest_magnitudes(c, dtype):
    n = 3001
    x = gradient(n, 3, dtype)
    ref = x.numpy()
    k = max(1, round(c.ratio * n))
    keep = np.argsort(-np.abs(ref.astype(np.float64)), kind="stable")[:k]
    expected = np.zeros_like(ref)
    expected[keep] = ref[keep]
    values, indices = c.compress(x, 11)
    assert values.shape == [k] and np.all(np.diff(indices.numpy()) > 0)
    np.testing.assert_array_equal(c.decompress((values, indices), n, dtype).numpy(), expected)


def test_random_k_sends_the_values_at_seed_determined_positions():
    n, c = 5000, RandomK(ratio=0.02)
    k = 100
    x = gradient(n, 4) + 100.0  # no zeros, so the kept positions are visible
    dense = c.decompress(c.compress(x, 5), n, tf.float32, seed=5).numpy()
    kept = np.flatnonzero(dense)
    assert kept.size == k
    np.testing.assert_array_equal(dense[kept], x.numpy()[kept])
    other = gradient(n, 5) + 100.0  # other data, same seed: same positions
    assert np.array_equal(np.flatnonzero(c.decompress(c.compress(other, 5), n, tf.float32,
                                                      seed=5).numpy()), kept)
    moved = c.decompress(c.compress(x, 6), n, tf.float32, seed=6).numpy()
    assert not np.array_equal(np.flatnonzero(moved), kept)


def test_sign_and_int8_within_documented_error():
    n = 3001
    x = gradient(n, 6).numpy()
    got = Sign().decompress(Sign().compress(x, 0), n, tf.float32).numpy()
    expected = np.where(x < 0, -1.0, 1.0) * np.mean(np.abs(x.astype(np.float64)))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    got = Int8().decompress(Int8().compress(x, 0), n, tf.float32).numpy()
    step = (x.max() - x.min()) / 255
    assert np.max(np.abs(got - x)) <= step / 2 * (1 + 1e-4)


def mean_of_draws(c, x, n):
    total = np.zeros(n)
    for seed in range(DRAWS):
        total += c.decompress(c.compress(x, seed), n, tf.float64).numpy()
    return total / DRAWS


@pytest.mark.parametrize("c", [QSGD(), QSGD(levels=1), QSGD(norm="l2"), TernGrad()], ids=ids)
def test_stochastic_quantizers_are_unbiased_and_on_their_lattice(c):
    n = 200
    x = gradient(n, 7, tf.float64)
    ref = x.numpy()
    if isinstance(c, QSGD):
        scale = np.linalg.norm(ref) if c.norm == "l2" else np.max(np.abs(ref))
        unit = scale / c.levels
    else:
        unit = np.max(np.abs(ref))
    once = c.decompress(c.compress(x, 1), n, tf.float64).numpy()
    np.testing.assert_allclose(once / unit, np.round(once / unit), atol=1e-4)
    assert np.all(np.abs(once) <= (c.levels if isinstance(c, QSGD) else 1) * unit * (1 + 1e-6))
    # Each element is one of two neighbouring lattice points: variance <= unit^2 / 4.
    bound = 6 * unit / 2 / np.sqrt(DRAWS) + 1e-6 * unit
    assert np.max(np.abs(mean_of_draws(c, x, n) - ref)) <= bound


def test_stochastic_quantizers_depend_on_the_seed():
    x = gradient(500, 8)
    for c in (QSGD(), TernGrad()):
        a, b, a2 = (c.compress(x, s)[1].numpy() for s in (1, 2, 1))
        assert np.array_equal(a, a2) and not np.array_equal(a, b)


@pytest.mark.parametrize("norm", ["max", "l2"])
def test_qsgd_quantizes_each_bucket_against_its_own_norm(norm):
    n, c = 1000, QSGD(bucket_size=100, norm=norm)
    x = gradient(n, 9, tf.float64).numpy()
    x[500:600] *= 1e-3
    norms, packed = c.compress(x, 3)
    norm_fn = np.linalg.norm if norm == "l2" else (lambda b: np.max(np.abs(b)))
    want = [norm_fn(x[k * 100:(k + 1) * 100]) for k in range(10)]
    np.testing.assert_allclose(norms.numpy(), want, rtol=1e-6)
    unit = np.repeat(want, 100) / c.levels
    once = c.decompress((norms, packed), n, tf.float64).numpy()
    np.testing.assert_allclose(once / unit, np.round(once / unit), atol=1e-4)
    bound = 6 * unit / 2 / np.sqrt(DRAWS) + 1e-6 * unit
    assert np.all(np.abs(mean_of_draws(c, x, n) - x) <= bound)


# ----------------------------------------------------------------------------
# Sums over replicas

def replica_payloads(c, n, dtype, seed):
    """Three replicas' payloads; shared-seed compressors get one seed."""
    seeds = [c.replica_seed(seed, rank) for rank in range(WORLD)]
    payloads = [c.compress(gradient(n, 20 + rank, dtype), seeds[rank]) for rank in range(WORLD)]
    return payloads, seeds


def tolerance(dtype):
    return {tf.float16: 2e-3, tf.bfloat16: 2e-2, tf.float32: 1e-6, tf.float64: 1e-12}[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("c", ALL, ids=ids)
def test_decompress_sum_of_an_all_gather_is_the_sum_of_decompressions(c, dtype):
    n, seed = 777, 42
    payloads, seeds = replica_payloads(c, n, dtype, seed)
    expected = sum(c.decompress(p, n, dtype, seed=s).numpy().astype(np.float64)
                   for p, s in zip(payloads, seeds))
    gathered = tuple(tf.concat(parts, 0) for parts in zip(*payloads))
    got = c.decompress_sum(gathered, n, dtype, WORLD, seed=seeds[0])
    assert got.dtype == dtype and got.shape == [n]
    scale = np.max(np.abs(expected)) + 1e-30
    np.testing.assert_allclose(got.numpy().astype(np.float64), expected,
                               atol=tolerance(dtype) * scale)
    traced = tf.function(lambda g: c.decompress_sum(g, n, dtype, WORLD, seed=seeds[0]))
    np.testing.assert_array_equal(traced(gathered).numpy(), got.numpy())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("c", [NoCompression(), FP16(), BF16(), RandomK(), RandomK(ratio=0.3)],
                         ids=ids)
def test_reducible_payloads_sum_like_their_decompressions(c, dtype):
    n, seed = 777, 43
    payloads, seeds = replica_payloads(c, n, dtype, seed)
    if c.shared_seed:
        assert len({int(s) for s in seeds}) == 1
    summed = tuple(tf.add_n(list(parts)) for parts in zip(*payloads))  # what all-reduce does
    got = c.decompress(summed, n, dtype, seed=seeds[0]).numpy()
    parts = [c.decompress(p, n, dtype, seed=s).numpy() for p, s in zip(payloads, seeds)]
    if isinstance(c, (RandomK, NoCompression)):  # the same additions in the same order
        np.testing.assert_array_equal(got, (parts[0] + parts[1]) + parts[2])
    else:  # the all-reduce adds in the wire dtype, so within its rounding
        eps = 2**-10 if isinstance(c, FP16) and dtype != tf.bfloat16 else 2**-7
        expected = sum(p.astype(np.float64) for p in parts)
        scale = np.max(np.abs(expected))
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=2 * eps * scale)


def test_replica_seeds():
    shared = [int(RandomK().replica_seed(9, rank)) for rank in range(4)]
    assert shared == [9] * 4
    own = [int(QSGD().replica_seed(9, rank)) for rank in range(4)]
    assert len(set(own)) == 4
    assert own == [int(QSGD().replica_seed(tf.constant(9, tf.int64), tf.constant(r)))
                   for r in range(4)]
    folded = compression.fold_seed(2**62, 3, 1)
    assert folded.dtype == tf.int64
    assert int(folded) == int(tf.function(compression.fold_seed)(tf.constant(2**62, tf.int64),
                                                                 3, 1))
