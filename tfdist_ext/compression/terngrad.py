"""TernGrad: unbiased ternary quantization, 2 bits per element."""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression.base import COMPRESSORS
from tfdist_ext.compression.payload import PayloadCompressor


@COMPRESSORS.register("terngrad")
@dataclasses.dataclass(frozen=True)
class TernGrad(PayloadCompressor):
    """Sends sign(x_i) * max|x| with probability |x_i| / max|x|, else 0.

    Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in
    Distributed Deep Learning" (NeurIPS 2017, https://arxiv.org/abs/1705.07878).
    Unbiased, 2 bits per element (16x smaller than float32). The variance grows
    with max|x|: the paper clips gradients to 2.5 standard deviations and
    quantizes per layer; large fused buffers with outliers train worse.
    Rounding must be independent across replicas: pass
    `replica_seed(seed, rank)`. Payload: (scale float32 [1], packed uint8
    [ceil(n / 4)]). Not reducible: all-gathered.

    Args:
        error_feedback: Keep the quantization error. Defaults to False.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
    """

    error_feedback: bool = False
    warmup_steps: int = 0

    reducible = False
    caution = (
        "TernGrad sends each value as -1, 0 or +1 times the buffer's largest magnitude, "
        "unbiased but with a large variance: at its defaults it may end several points below "
        "synchronous SGD and Adam, and tens of points below (or diverge) with momentum SGD; "
        "compression='int8' or 'qsgd' is safer")

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([1], tf.float32),
                tf.TensorSpec([ops.packed_size(num_elements, 2)], tf.uint8))

    def _compress(self, flat, n, seed):
        scale, packed = ops.terngrad_encode(flat, seed)
        return tf.reshape(scale, [1]), packed

    def _decompress(self, payload, n, dtype, seed):
        scale, packed = payload
        return ops.terngrad_decode(tf.reshape(scale, []), packed, n, dtype)
