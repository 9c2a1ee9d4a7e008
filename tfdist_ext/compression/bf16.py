"""bfloat16 compression: 2 bytes per element, float32's range, reducible."""

import dataclasses

import tensorflow as tf

from tfdist_ext.compression.base import COMPRESSORS
from tfdist_ext.compression.fp16 import CastCompressor


@COMPRESSORS.register("bf16")
@dataclasses.dataclass(frozen=True)
class BF16(CastCompressor):
    """Casts gradients to bfloat16 for the all-reduce (2x smaller than float32).

    bfloat16 has float32's exponent range, so nothing overflows, but only 8
    significant bits (relative error up to 2**-8 per element, and the
    all-reduce sums in bfloat16). A safe first choice on slow links; use "fp16"
    when 3 more bits of precision matter and the range is known to fit.
    Payload: (bfloat16 [n],).
    """

    wire_dtype = tf.bfloat16
