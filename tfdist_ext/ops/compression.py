"""Gradient-compression kernels (C++ custom ops) as plain TensorFlow functions.

These are the building blocks of `tfdist_ext.compression`; they hold no state
and do no error feedback. Every encoder flattens its input, works on any shape
and works eagerly and inside `tf.function`.

    sparsifiers  -> (values, indices int32), indices ascending
        top_k          exact k largest |x|                  O(n), deterministic
        top_k_approx   sampled threshold (DGC)              faster, seed-driven
        random_k       k positions from (seed, n, k) only   same on every worker
        sparse_to_dense  sums gathered (values, indices) payloads
    quantizers   -> (scale(s), packed uint8 payload); decode(...) -> float [n]
        qsgd      s levels, ceil(log2(s+1))+1 bits    unbiased; a norm per bucket
        terngrad  {-1, 0, +1} * max|x|, 2 bits        unbiased
        sign      {-1, +1} * mean|x|, 1 bit           biased: use error feedback
        int8      min-max, 8 bits                     |error| <= (max-min)/510

Dtypes: the kernels compute in float32. float16, bfloat16 and float64 inputs are
accepted and cast to float32 (exact for float16/bfloat16; float64 is rounded, so
float64 magnitudes that differ only beyond float32 precision rank as ties).
Selections return the original values in the input dtype; decoders return
float32 unless `dtype` says otherwise.

Payload layout: n codes of b bits are a little-endian bit stream, code i in
stream bits [i*b, (i+1)*b) least significant bit first, stream bit j in bit
j % 8 of byte j // 8; `packed_size(n, b)` = ceil(n*b/8) bytes.

TensorFlow flushes subnormal float32 values to zero, so a quantization step
below 1.2e-38 (norm / levels for QSGD, (max - min) / 255 for int8) decodes as
zero; the encoders themselves stay exact for such tiny tensors.

Stochastic ops take an explicit int64 `seed`: the same seed gives the same
output on any machine and thread count. Fold the step counter into it (e.g.
`seed = base_seed * 1_000_003 + step`) so every step draws fresh noise.
"""

import tensorflow as tf

from tfdist_ext.ops._checks import (  # noqa: F401  (re-exported)
    MAX_QSGD_LEVELS,
    k_for_ratio,
    packed_size,
    qsgd_bits,
    qsgd_num_buckets,
)
from tfdist_ext.ops.quantize import (  # noqa: F401  (re-exported)
    int8_decode,
    int8_encode,
    pack_bits,
    qsgd_decode,
    qsgd_encode,
    sign_decode,
    sign_encode,
    terngrad_decode,
    terngrad_encode,
    unpack_bits,
)
from tfdist_ext.ops.sparsify import (  # noqa: F401  (re-exported)
    random_k,
    sparse_to_dense,
    top_k,
    top_k_approx,
)

# The kernels have no gradients: compression happens after backprop.
for _op in ("TfdistTopK", "TfdistTopKApprox", "TfdistRandomK", "TfdistSparseToDense",
            "TfdistQsgdEncode", "TfdistQsgdDecode", "TfdistTerngradEncode",
            "TfdistTerngradDecode", "TfdistSignEncode", "TfdistSignDecode",
            "TfdistInt8Encode", "TfdistInt8Decode", "TfdistPackBits", "TfdistUnpackBits"):
    tf.no_gradient(_op)
