"""Error feedback: nothing is lost, only delayed."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import compression
from tfdist_ext.compression import (
    QSGD,
    Int8,
    NoCompression,
    RandomK,
    Sign,
    TernGrad,
    TopK,
    TopKApprox,
    compress_with_feedback,
)

STEPS = 20
WITH_FEEDBACK = [TopK(), TopK(ratio=0.1), TopKApprox(ratio=0.05), RandomK(ratio=0.05), Sign(),
                 QSGD(error_feedback=True), TernGrad(error_feedback=True),
                 Int8(error_feedback=True)]


def gradients(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.standard_normal(n) * rng.choice([0.01, 1.0], n), dtype)
            for _ in range(STEPS)]


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("c", WITH_FEEDBACK, ids=repr)
def test_sent_plus_residual_is_the_sum_of_gradients(c, dtype):
    n = 500
    residual = tf.zeros([n], dtype)
    total_sent = np.zeros(n)
    grads = gradients(n, dtype)
    for step, grad in enumerate(grads):
        seed = c.replica_seed(compression.fold_seed(1234, step), 0)
        payload, residual = compress_with_feedback(c, grad, residual, seed)
        total_sent += c.decompress(payload, n, dtype, seed=seed).numpy()
        assert residual.dtype == dtype and residual.shape == [n]
    expected = sum(g.numpy().astype(np.float64) for g in grads)
    scale = np.max(np.abs(expected))
    rtol = 1e-5 if dtype == tf.float32 else 1e-12
    np.testing.assert_allclose(total_sent + residual.numpy(), expected, atol=rtol * scale)
    assert np.any(residual.numpy() != 0)  # lossy compressors leave something behind


def test_top_k_with_feedback_eventually_sends_every_coordinate():
    n, c = 100, TopK(ratio=0.05)  # 5 of 100 per step
    residual = tf.zeros([n])
    grad = tf.fill([n], 1.0)
    sent = np.zeros(n)
    for step in range(STEPS):
        payload, residual = compress_with_feedback(c, grad, residual, step)
        sent += c.decompress(payload, n, tf.float32).numpy()
    assert np.all(sent > 0)


def test_without_feedback_residual_passes_through():
    x = tf.constant(np.linspace(-1, 1, 64), tf.float32)
    payload, residual = compress_with_feedback(QSGD(), x, None, 3)
    assert residual is None
    np.testing.assert_array_equal(payload[1].numpy(), QSGD().compress(x, 3)[1].numpy())
    payload, residual = compress_with_feedback(NoCompression(), x, tf.ones([64]), 0)
    np.testing.assert_array_equal(residual.numpy(), np.ones(64))
    np.testing.assert_array_equal(payload[0].numpy(), x.numpy())


def test_in_tf_function_with_a_residual_variable():
    n, c = 256, RandomK(ratio=0.1)
    residual = tf.Variable(tf.zeros([n]), trainable=False)

    @tf.function
    def step(grad, seed):
        payload, new_residual = compress_with_feedback(c, grad, residual, seed)
        residual.assign(new_residual)
        return c.decompress(payload, n, tf.float32, seed=seed)

    grads = gradients(n, tf.float32)[:5]
    sent = sum(step(g, tf.constant(s, tf.int64)).numpy().astype(np.float64)
               for s, g in enumerate(grads))
    expected = sum(g.numpy().astype(np.float64) for g in grads)
    np.testing.assert_allclose(sent + residual.numpy(), expected, atol=1e-5)


def test_non_finite_gradient_keeps_the_residual():
    residual = tf.constant([0.5, -0.25, 0.0, 1.0])
    grad = tf.constant([1.0, np.inf, 2.0, 3.0])
    _, new_residual = compress_with_feedback(TopK(ratio=0.5), grad, residual, 0)
    np.testing.assert_array_equal(new_residual.numpy(), residual.numpy())


def test_residual_must_match_the_gradient():
    x = tf.zeros([8])
    with pytest.raises(TypeError, match="Argument `residual` must have the gradient's dtype "
                                        "float32; received float64"):
        compress_with_feedback(Sign(), x, tf.zeros([8], tf.float64), 0)
    with pytest.raises(ValueError, match=r"Argument `residual` must have the gradient's shape "
                                         r"\(8,\); received \(4,\)"):
        compress_with_feedback(Sign(), x, tf.zeros([4]), 0)


# ----------------------------------------------------------------------------
# DGC momentum correction

def reference_dgc(c, grads, n):
    """Lin et al. 2018, Algorithm 1 with momentum factor masking, in numpy (float64)."""
    u, v = np.zeros(n), np.zeros(n)
    sent_steps, accumulated = [], np.zeros(n)
    for step, grad in enumerate(grads):
        u = c.momentum * u + grad.numpy().astype(np.float64)
        accumulated += u
        v = v + u
        seed = c.replica_seed(compression.fold_seed(1234, step), 0)
        k = c.k(n)
        if isinstance(c, RandomK):
            indices = c._indices(n, seed).numpy()  # pylint: disable=protected-access
        else:
            indices = np.argsort(-np.abs(v), kind="stable")[:k]
        sent = np.zeros(n)
        sent[indices] = v[indices]
        v[indices] = 0.0
        if c.momentum_masking:
            u[indices] = 0.0
        sent_steps.append(sent)
    return sent_steps, v, accumulated


@pytest.mark.parametrize("c", [TopK(ratio=0.05, momentum=0.9), RandomK(ratio=0.1, momentum=0.5),
                               TopK(ratio=0.05, momentum=0.9, momentum_masking=False)],
                         ids=repr)
def test_momentum_correction_matches_dgc_and_keeps_the_invariant(c):
    n = 400
    grads = gradients(n, tf.float64, seed=3)
    residual, velocity = tf.zeros([n], tf.float64), tf.zeros([n], tf.float64)
    want_sent, want_residual, accumulated = reference_dgc(c, grads, n)
    total_sent = np.zeros(n)
    for step, grad in enumerate(grads):
        seed = c.replica_seed(compression.fold_seed(1234, step), 0)
        payload, residual, velocity = compression.compress_with_momentum_correction(
            c, grad, residual, velocity, seed)
        sent = c.decompress(payload, n, tf.float64, seed=seed).numpy()
        np.testing.assert_allclose(sent, want_sent[step], rtol=1e-12, atol=1e-12)
        total_sent += sent
    np.testing.assert_allclose(residual.numpy(), want_residual, rtol=1e-12, atol=1e-12)
    # Nothing is lost: sent + residual == the sum of the velocities u_t.
    np.testing.assert_allclose(total_sent + residual.numpy(), accumulated, rtol=1e-10)
    assert np.any(velocity.numpy() != 0)


def test_momentum_correction_sending_everything_is_sgd_or_momentum_sgd():
    n = 50
    grads = gradients(n, tf.float32)[:4]
    for masking in (True, False):
        c = TopK(ratio=1.0, momentum=0.9, momentum_masking=masking)
        residual, velocity, momentum = tf.zeros([n]), tf.zeros([n]), np.zeros(n)
        for step, grad in enumerate(grads):
            payload, residual, velocity = compression.compress_with_momentum_correction(
                c, grad, residual, velocity, step)
            momentum = 0.9 * momentum + grad.numpy()
            # Masked: every value was sent, so its momentum restarts (plain SGD);
            # unmasked: what is sent is momentum SGD's step.
            want = grad.numpy() if masking else momentum
            np.testing.assert_allclose(c.decompress(payload, n, tf.float32).numpy(), want,
                                       rtol=1e-6)
            assert not np.any(residual.numpy())
            assert np.any(velocity.numpy()) != masking


def test_momentum_correction_checks_its_state_and_skips_non_finite_steps():
    c = TopK(ratio=0.5, momentum=0.9)
    residual, velocity = tf.constant([0.5, -0.25, 0.0, 1.0]), tf.constant([1.0, 2.0, 3.0, 4.0])
    grad = tf.constant([1.0, np.nan, 2.0, 3.0])
    _, new_residual, new_velocity = compression.compress_with_momentum_correction(
        c, grad, residual, velocity, 0)
    np.testing.assert_array_equal(new_residual.numpy(), residual.numpy())
    np.testing.assert_array_equal(new_velocity.numpy(), velocity.numpy())
    with pytest.raises(ValueError, match=r"Argument `velocity` must have the gradient's shape "
                                         r"\(4,\); received \(3,\)"):
        compression.compress_with_momentum_correction(c, grad, residual, tf.zeros([3]), 0)
