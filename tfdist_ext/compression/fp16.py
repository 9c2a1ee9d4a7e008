"""Half-precision (IEEE float16) compression: 2 bytes per element, reducible."""

import dataclasses

import tensorflow as tf

from tfdist_ext.compression.base import COMPRESSORS
from tfdist_ext.compression.payload import PayloadCompressor


class CastCompressor(PayloadCompressor):
    """Sends the buffer cast to `wire_dtype`; payloads are summed by all-reduce.

    Decompression casts back to the buffer's dtype, so the error is the cast's
    rounding (relative 2**-11 for float16, 2**-8 for bfloat16); a buffer
    already in `wire_dtype` is sent unchanged. No error feedback: the rounding
    error is unbiased enough that the published recipes do without it.
    """

    wire_dtype = None

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([num_elements], self.wire_dtype),)

    def _compress(self, flat, n, seed):
        return (tf.cast(flat, self.wire_dtype),)

    def _decompress(self, payload, n, dtype, seed):
        return tf.cast(payload[0], dtype)


@COMPRESSORS.register("fp16")
@dataclasses.dataclass(frozen=True)
class FP16(CastCompressor):
    """Casts gradients to float16 for the all-reduce (2x smaller than float32).

    float16 keeps 11 significant bits but only the range +-65504: gradients
    (or their sum over replicas, which the all-reduce computes in float16)
    beyond it become inf, and magnitudes below 6e-8 flush to zero. Use it with
    loss scaling or when gradients are known to be moderate; prefer "bf16"
    (float32's range, 8 significant bits) otherwise. Payload: (float16 [n],).
    """

    wire_dtype = tf.float16
