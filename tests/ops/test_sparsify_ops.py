"""top_k, top_k_approx, random_k and sparse_to_dense against numpy references."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import ops


def reference_top_k(x, k):
    """Positions of the k largest |x|, ties to the lower position, ascending."""
    x = np.asarray(x, np.float32).reshape(-1)
    order = np.lexsort((np.arange(x.size), -np.abs(x)))  # by |x| desc, then index asc
    return np.sort(order[:k]).astype(np.int32)


def with_ties(n, seed):
    """Random values where a third are rounded to integers, so many |x| are equal."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * 3
    x[::3] = np.round(x[::3])
    return x


TOP_K = [ops.top_k, lambda x, k: ops.top_k_approx(x, k, seed=7)]
TOP_K_IDS = ["exact", "approx"]


@pytest.mark.parametrize("top_k", TOP_K, ids=TOP_K_IDS)
@pytest.mark.parametrize("n,k", [(1, 1), (7, 3), (13, 5), (999, 1), (1001, 10), (4099, 2048),
                                 (200_003, 2000), (300_001, 7)])
def test_top_k_matches_numpy_with_ties(top_k, n, k):
    x = with_ties(n, seed=n)
    values, indices = top_k(x, k)
    want = reference_top_k(x, k)
    np.testing.assert_array_equal(indices.numpy(), want)
    np.testing.assert_array_equal(values.numpy(), x[want])


@pytest.mark.parametrize("top_k", TOP_K, ids=TOP_K_IDS)
def test_top_k_all_equal_magnitudes_take_lowest_indices(top_k):
    x = np.where(np.arange(50_001) % 2 == 0, 1.5, -1.5).astype(np.float32)
    values, indices = top_k(x, 777)
    np.testing.assert_array_equal(indices.numpy(), np.arange(777))
    np.testing.assert_array_equal(values.numpy(), x[:777])


@pytest.mark.parametrize("top_k", TOP_K, ids=TOP_K_IDS)
def test_top_k_zeros_and_edge_sizes(top_k):
    x = np.zeros(100_000, np.float32)
    x[[5, 50, 99_999]] = [-1.0, 2.0, 0.5]
    _, indices = top_k(x, 10)  # 3 non-zeros, then the lowest-index zeros
    np.testing.assert_array_equal(indices.numpy(), [0, 1, 2, 3, 4, 5, 6, 7, 50, 99_999])
    for n, k in [(0, 0), (5, 0), (5, 5)]:
        x = with_ties(n, seed=1)
        values, indices = top_k(x, k)
        assert values.shape == (k,) and indices.shape == (k,)
        np.testing.assert_array_equal(indices.numpy(), np.arange(k))


def test_top_k_flattens_keeps_dtype_and_works_in_tf_function():
    x = with_ties(6 * 7 * 11, seed=3).reshape(6, 7, 11)
    want = reference_top_k(x, 40)
    for dtype in (tf.float16, tf.bfloat16, tf.float64):
        xd = tf.constant(x, dtype)
        values, indices = ops.top_k(xd, 40)
        assert values.dtype == dtype
        np.testing.assert_array_equal(
            indices.numpy(), reference_top_k(tf.cast(xd, tf.float32).numpy(), 40))
    compiled = tf.function(lambda t: ops.top_k_approx(t, 40, seed=1))
    values, indices = compiled(tf.constant(x))
    np.testing.assert_array_equal(indices.numpy(), want)
    assert compiled.get_concrete_function(tf.constant(x)).output_shapes[1] == [40]


def test_top_k_approx_seed_only_changes_the_sample():
    x = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float32)
    want = reference_top_k(x, 10_000)
    for seed in range(3):
        _, indices = ops.top_k_approx(x, 10_000, sample_fraction=0.001, seed=seed)
        np.testing.assert_array_equal(indices.numpy(), want)


def test_top_k_invalid_arguments():
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match=r"Argument `k` must be in \[0, n\]; received k=12 "
                                         r"for a tensor of 10 elements"):
        ops.top_k(x, 12)
    with pytest.raises(ValueError, match=r"received k=-1"):
        ops.top_k_approx(x, -1)
    with pytest.raises(ValueError, match=r"Argument `sample_fraction` must be in \(0, 1\]; "
                                         r"received sample_fraction=1.5"):
        ops.top_k_approx(x, 1, sample_fraction=1.5)
    with pytest.raises(TypeError, match=r"Argument `x` must be a floating-point tensor .* "
                                        r"received dtype=int32"):
        ops.top_k(tf.range(10), 3)
    # A dynamic k reaches the kernel, whose message names the argument and value.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`k` must be in \[0, n\]; received k=11 for a tensor of 10"):
        ops.top_k(x, tf.constant(11))


def test_k_for_ratio():
    assert ops.k_for_ratio(1000, 0.01) == 10
    assert ops.k_for_ratio(10, 0.001) == 1
    assert ops.k_for_ratio(0, 0.5) == 0
    assert ops.k_for_ratio(10, 1.0) == 10
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=rf"Argument `ratio` must be in \(0, 1\]; "
                                             rf"received ratio={bad}"):
            ops.k_for_ratio(100, bad)


def test_random_k_depends_only_on_seed_n_k():
    n, k = 10_007, 500
    x1 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x2 = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    v1, i1 = ops.random_k(x1, k, seed=42)
    _, i2 = ops.random_k(x2, k, seed=42)
    _, i3 = ops.random_k(x1, k, seed=tf.constant(43, tf.int64))
    i1, i2, i3 = i1.numpy(), i2.numpy(), i3.numpy()
    np.testing.assert_array_equal(i1, i2)
    assert not np.array_equal(i1, i3)
    for idx in (i1, i3):
        assert idx.size == k and np.all(np.diff(idx) > 0) and idx[0] >= 0 and idx[-1] < n
    np.testing.assert_array_equal(v1.numpy(), x1[i1])


@pytest.mark.parametrize("n,k", [(0, 0), (1, 1), (9, 0), (9, 9), (64, 33), (1000, 999), (4097, 5)])
def test_random_k_sizes(n, k):
    x = np.arange(n, dtype=np.float64)
    values, indices = ops.random_k(x, k, seed=3)
    idx = indices.numpy()
    assert idx.shape == (k,) and len(set(idx.tolist())) == k and np.all(np.diff(idx) > 0)
    assert values.dtype == tf.float64
    np.testing.assert_array_equal(values.numpy(), x[idx])


def test_random_k_is_uniform():
    # Each position is picked with probability k/n; over 400 seeds the counts are
    # Binomial(400, 0.25): mean 100, sd ~8.7.
    counts = np.zeros(40)
    for seed in range(400):
        counts[ops.random_k(np.zeros(40, np.float32), 10, seed=seed)[1].numpy()] += 1
    assert np.all(np.abs(counts - 100) < 6 * 8.7), counts


def test_random_k_invalid_arguments():
    with pytest.raises(ValueError, match=r"received k=4 for a tensor of 3 elements"):
        ops.random_k(np.ones(3, np.float32), 4, seed=0)
    with pytest.raises(TypeError, match=r"Argument `seed` must be an integer"):
        ops.random_k(np.ones(3, np.float32), 1, seed=0.5)


def test_sparse_to_dense_sums_duplicates():
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
    indices = np.array([3, 0, 3, 9, 0], np.int32)
    want = np.zeros(10, np.float32)
    np.add.at(want, indices, values)
    np.testing.assert_array_equal(ops.sparse_to_dense(values, indices, 10).numpy(), want)
    dense = ops.sparse_to_dense(tf.constant(values, tf.float64), indices.astype(np.int64), 10)
    assert dense.dtype == tf.float64
    assert ops.sparse_to_dense(np.zeros(0, np.float32), np.zeros(0, np.int32), 4).shape == (4,)


def test_sparse_to_dense_of_gathered_top_k_payloads():
    rng = np.random.default_rng(9)
    grads = [rng.standard_normal(5000).astype(np.float32) for _ in range(4)]
    payloads = [ops.top_k(g, 50) for g in grads]
    values = tf.concat([v for v, _ in payloads], 0)
    indices = tf.concat([i for _, i in payloads], 0)
    want = np.zeros(5000, np.float32)
    for g in grads:
        idx = reference_top_k(g, 50)
        want[idx] += g[idx]
    np.testing.assert_allclose(ops.sparse_to_dense(values, indices, 5000).numpy(), want,
                               rtol=1e-6)


def test_sparse_to_dense_out_of_range():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[2\] = 10 is out of range \[0, n\) for n=10"):
        ops.sparse_to_dense(np.ones(3, np.float32), np.array([0, 9, 10], np.int32), 10)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[0\] = -1"):
        ops.sparse_to_dense(np.ones(1, np.float32), np.array([-1], np.int32), 10)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\] = 2147483647"):
        ops.sparse_to_dense(np.ones(2, np.float32), np.array([1, 2**32 + 1], np.int64), 10)
    with pytest.raises(ValueError, match=r"Argument `n` must be in \[0, 2\*\*31 - 1\]; "
                                         r"received n=-5"):
        ops.sparse_to_dense(np.ones(1, np.float32), np.array([0], np.int32), -5)
