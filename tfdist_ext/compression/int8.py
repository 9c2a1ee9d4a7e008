"""8-bit min-max quantization: 1 byte per element."""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression.base import COMPRESSORS
from tfdist_ext.compression.payload import PayloadCompressor


@COMPRESSORS.register("int8")
@dataclasses.dataclass(frozen=True)
class Int8(PayloadCompressor):
    """Rounds each element to one of 256 levels between the buffer's min and max.

    4x smaller than float32; the error is at most (max - min) / 510 per element
    (half a step), deterministic and slightly biased. A few large outliers
    stretch the range and lose the small values: quantize per layer or per
    bucket, or turn `error_feedback` on to carry the rounding error forward.
    The seed is unused. Payload: (min and max float32 [2], codes uint8 [n]).
    Not reducible (each replica has its own range): all-gathered.

    Args:
        error_feedback: Keep the rounding error. Defaults to False.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
    """

    error_feedback: bool = False
    warmup_steps: int = 0

    reducible = False

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([2], tf.float32), tf.TensorSpec([num_elements], tf.uint8))

    def _compress(self, flat, n, seed):
        min_value, max_value, codes = ops.int8_encode(flat)
        return tf.stack([min_value, max_value]), codes

    def _decompress(self, payload, n, dtype, seed):
        bounds, codes = payload
        return ops.int8_decode(bounds[0], bounds[1], codes, dtype)
