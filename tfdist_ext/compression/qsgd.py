"""QSGD: unbiased stochastic quantization to a few levels per sign."""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression.base import COMPRESSORS, Compressor, check_int
from tfdist_ext.ops.compression import MAX_QSGD_LEVELS


@COMPRESSORS.register("qsgd")
@dataclasses.dataclass(frozen=True)
class QSGD(Compressor):
    """Quantizes |x_i| / ||x||_2 stochastically to `levels` levels (unbiased).

    Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient
    Quantization and Encoding" (NeurIPS 2017, https://arxiv.org/abs/1610.02132).
    Each element costs ceil(log2(levels + 1)) + 1 bits: levels=1 -> 2 bits,
    7 -> 4 bits (8x smaller than float32), 127 -> 8 bits. Decoding is unbiased,
    so no error feedback is needed; the variance grows like
    min(n / levels^2, sqrt(n) / levels) * ||x||^2, so prefer buckets of at most
    ~1M elements and levels >= 7 (one norm per buffer). Rounding must be
    independent across replicas: pass `replica_seed(seed, rank)`.
    Payload: (norm float32 [1], packed codes uint8 [ceil(n * bits / 8)]).
    Not reducible (each replica has its own norm): all-gathered.

    Args:
        levels: Quantization levels per sign, in [1, 32767]. Defaults to 7.
        error_feedback: Keep the quantization error. Defaults to False.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
    """

    levels: int = 7
    error_feedback: bool = False
    warmup_steps: int = 0

    reducible = False

    def __post_init__(self):
        super().__post_init__()
        check_int(type(self).__name__, "levels", self.levels, minimum=1,
                  maximum=MAX_QSGD_LEVELS)

    @property
    def bits(self):
        """Bits per element: ceil(log2(levels + 1)) + 1."""
        return ops.qsgd_bits(self.levels)

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([1], tf.float32),
                tf.TensorSpec([ops.packed_size(num_elements, self.bits)], tf.uint8))

    def _compress(self, flat, n, seed):
        norm, packed = ops.qsgd_encode(flat, self.levels, seed)
        return tf.reshape(norm, [1]), packed

    def _decompress(self, payload, n, dtype, seed):
        norm, packed = payload
        return ops.qsgd_decode(tf.reshape(norm, []), packed, n, self.levels, dtype)
