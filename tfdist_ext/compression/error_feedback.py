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
    residual = tf.convert_to_tensor(residual)
    if residual.dtype != flat.dtype:
        raise TypeError(
            f"Argument `residual` must have the gradient's dtype {flat.dtype.name}; "
            f"received {residual.dtype.name}. Create the residual variable with "
            f"`tf.zeros_like(flat)`.")
    if not residual.shape.is_compatible_with(flat.shape):
        raise ValueError(
            f"Argument `residual` must have the gradient's shape {flat.shape}; "
            f"received {residual.shape}.")
    corrected = flat + residual
    payload = compressor.compress(corrected, seed)
    sent = compressor.decompress(payload, corrected.shape.num_elements(), corrected.dtype,
                                 seed=seed)
    new_residual = tf.reshape(corrected, [-1]) - sent
    finite = tf.reduce_all(tf.math.is_finite(corrected))
    new_residual = tf.where(finite, tf.reshape(new_residual, tf.shape(residual)), residual)
    return payload, new_residual
