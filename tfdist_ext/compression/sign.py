"""Scaled sign compression (EF-SignSGD): 1 bit per element."""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression.base import COMPRESSORS
from tfdist_ext.compression.payload import PayloadCompressor


@COMPRESSORS.register("sign")
@dataclasses.dataclass(frozen=True)
class Sign(PayloadCompressor):
    """Sends sign(x_i) and one scale, mean |x| (keeps the L1 norm).

    Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
    Compression Schemes" (ICML 2019, https://arxiv.org/abs/1901.09847). 32x
    smaller than float32. Biased: keep error feedback on (the default), which
    makes it converge like SGD; without it sign compression can diverge.
    Deterministic (the seed is unused). Payload: (scale float32 [1], packed
    signs uint8 [ceil(n / 8)]). Not reducible: all-gathered.

    Args:
        error_feedback: Keep the compression error. Defaults to True.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
    """

    error_feedback: bool = True
    warmup_steps: int = 0

    reducible = False
    momentum_caution = (
        "each value is sent as its sign, and error feedback returns the magnitude late, which"
        " the optimizer's momentum amplifies: it may end several points below synchronous "
        "momentum SGD, and on some models the loss climbs back to the chance level (the "
        "divergence guard stops it); it stays close with plain SGD and Adam. "
        "compression='int8' is safer")

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([1], tf.float32),
                tf.TensorSpec([ops.packed_size(num_elements, 1)], tf.uint8))

    def _compress(self, flat, n, seed):
        scale, packed = ops.sign_encode(flat)
        return tf.reshape(scale, [1]), packed

    def _decompress(self, payload, n, dtype, seed):
        scale, packed = payload
        return ops.sign_decode(tf.reshape(scale, []), packed, n, dtype)
