"""Error feedback: carry what compression dropped into the next step.

A pure function; the strategy owns the residual variables (one per compressed
buffer, same shape and dtype, initialised to zeros and tracked so checkpoints
carry them) and assigns the returned residual after each step:

    corrected_t = g_t + r_{t-1}                  (r_0 = 0)
    payload_t   = compress(corrected_t)
    sent_t      = decompress(payload_t)          (what the other replicas see)
    r_t         = corrected_t - sent_t

Invariant (telescoping): after T steps

    sent_1 + ... + sent_T + r_T == g_1 + ... + g_T

up to floating-point rounding of the additions, so nothing is ever lost, only
delayed (Seide et al. 2014; Stich et al. 2018; Karimireddy et al. 2019). This is
what makes biased compressors (top-k, random-k, sign) converge.

Momentum correction (Deep Gradient Compression, Lin et al., ICLR 2018,
https://arxiv.org/abs/1712.01887, section 3.2) moves momentum SGD's velocity
in front of the compressor, so that what is delayed is the velocity, not the
raw gradient. With momentum m and a second per-buffer state u:

    u_t         = m * u_{t-1} + g_t
    corrected_t = u_t + r_{t-1}
    sent_t      = decompress(compress(corrected_t))
    r_t         = corrected_t - sent_t
    u_t         = 0 where sent_t != 0               (momentum factor masking,
                                                     unless momentum_masking=False)

and the optimizer must then apply plain SGD (no momentum of its own). The
invariant above holds with u_t in place of g_t. Masking restarts the momentum
of every coordinate that was just sent (its velocity has been applied), so
with nothing dropped (ratio 1, or a dense warm-up step) this is plain SGD; at
1% most coordinates are unsent most of the time and keep their momentum.
Without masking the dense limit is momentum SGD. Dense warm-up steps
(`warmup_steps`) send the raw gradient and leave u untouched.
"""

import tensorflow as tf


def compress_with_feedback(compressor, flat, residual, seed):
    """Compresses `flat + residual` and returns the payload and the new residual.

    Args:
        compressor: A `tfdist_ext.compression.Compressor`.
        flat: 1-D float gradient buffer of static length n.
        residual: The residual of the previous step, same shape and dtype as
            `flat` (zeros at first). Unused, and may be None, when
            `compressor.error_feedback` is False.
        seed: The int64 seed for `compressor.compress` (after `replica_seed`).
            Shared-seed compressors (random-k) also need it to decompress.

    Returns:
        (payload, new_residual). Without error feedback, `residual` is
        returned unchanged (so the strategy need not create the variable).
        If `flat + residual` holds a non-finite value (e.g. a loss-scale
        overflow step that the optimizer skips), the residual is also kept
        unchanged rather than poisoned with NaN for the rest of training.

    Raises:
        TypeError: `residual`'s dtype differs from `flat`'s.
        ValueError: `residual`'s shape differs from `flat`'s.
    """
    flat = tf.convert_to_tensor(flat)
    if not compressor.error_feedback:
        return compressor.compress(flat, seed), residual
    payload, new_residual, _ = _feedback(compressor, flat, residual, seed)
    return payload, new_residual


def compress_with_momentum_correction(compressor, flat, residual, velocity, seed):
    """DGC's momentum correction and factor masking around `compress_with_feedback`.

    Args:
        compressor: A `Compressor` with `error_feedback` and `momentum` > 0.
        flat: 1-D float gradient buffer of static length n.
        residual: The accumulated unsent velocity r (zeros at first).
        velocity: The local momentum u (zeros at first), same shape and dtype.
        seed: As in `compress_with_feedback`.

    Returns:
        (payload, new_residual, new_velocity). On a non-finite step both
        states are kept unchanged.
    """
    flat = tf.convert_to_tensor(flat)
    velocity = tf.convert_to_tensor(velocity)
    _check_state("velocity", velocity, flat)
    momentum = tf.constant(compressor.momentum, flat.dtype)
    accumulated = momentum * tf.reshape(velocity, tf.shape(flat)) + flat
    payload, new_residual, sent = _feedback(compressor, accumulated, residual, seed)
    finite = tf.reduce_all(tf.math.is_finite(accumulated))
    new_velocity = tf.reshape(accumulated, tf.shape(velocity))
    if compressor.momentum_masking:
        was_sent = tf.reshape(tf.not_equal(sent, 0), tf.shape(velocity))
        new_velocity = tf.where(was_sent, tf.zeros_like(velocity), new_velocity)
    return payload, new_residual, tf.where(finite, new_velocity, velocity)


def _check_state(name, state, flat):
    if state.dtype != flat.dtype:
        raise TypeError(
            f"Argument `{name}` must have the gradient's dtype {flat.dtype.name}; "
            f"received {state.dtype.name}. Create the variable with `tf.zeros_like(flat)`.")
    if not state.shape.is_compatible_with(flat.shape):
        raise ValueError(
            f"Argument `{name}` must have the gradient's shape {flat.shape}; "
            f"received {state.shape}.")


def _feedback(compressor, flat, residual, seed):
    """(payload, new residual, sent) for `flat + residual`."""
    residual = tf.convert_to_tensor(residual)
    _check_state("residual", residual, flat)
    corrected = flat + residual
    payload = compressor.compress(corrected, seed)
    sent = compressor.decompress(payload, corrected.shape.num_elements(), corrected.dtype,
                                 seed=seed)
    new_residual = tf.reshape(corrected, [-1]) - sent
    finite = tf.reduce_all(tf.math.is_finite(corrected))
    new_residual = tf.where(finite, tf.reshape(new_residual, tf.shape(residual)), residual)
    return payload, new_residual, sent
