"""QSGD: unbiased stochastic quantization to a few levels per sign, per bucket."""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression.base import COMPRESSORS, check_int
from tfdist_ext.compression.payload import PayloadCompressor
from tfdist_ext.ops._checks import QSGD_NORMS
from tfdist_ext.ops.compression import MAX_QSGD_LEVELS, qsgd_num_buckets


@COMPRESSORS.register("qsgd")
@dataclasses.dataclass(frozen=True)
class QSGD(PayloadCompressor):
    """Quantizes |x_i| / norm(bucket) stochastically to `levels` levels (unbiased).

    Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient
    Quantization and Encoding" (NeurIPS 2017, https://arxiv.org/abs/1610.02132).
    As in the paper, the buffer is quantized in buckets of `bucket_size`
    consecutive values, each normalised by its own L2 norm (the paper's
    experiments use d = 512). Each element costs ceil(log2(levels + 1)) + 1
    bits: levels=1 -> 2 bits, 7 -> 4 bits (8x smaller than float32), 127 -> 8
    bits; each bucket adds a 32-bit norm. Decoding is unbiased, so no error
    feedback is needed.

    Norm: the paper's analysis scales each bucket by its L2 norm (`norm="l2"`).
    The default scales by the bucket's largest magnitude (`norm="max"`, as
    TernGrad does), which puts that value on the top level and spreads the
    others over all levels: the variance is at most d / (4 levels^2) *
    max_i x_i^2 per bucket, on typical gradients far below the L2 variant's
    for the same bits. Keep "max" unless you need the paper's exact scheme;
    "l2" trains worse.

    Tuning (L2): the variance of a bucket of d values is at most
    min(d / levels^2, sqrt(d) / levels) * ||bucket||^2. Smaller buckets give
    lower variance (each value is measured against a smaller norm, so it uses
    more of the levels) but cost +32 bits per bucket: d = 512 with levels=7
    costs 4.06 bits/value, d = 128 costs 4.25. With one norm for a large buffer
    (`bucket_size=0`), |x_i| / ||x|| * levels is almost always < 1, so nearly
    every value rounds to level 0 or 1 and training degrades. More levels
    reduce the variance too (levels=15: 5 bits). Rounding must be independent
    across replicas: pass `replica_seed(seed, rank)`.

    Payload: (norms float32 [num_buckets], packed codes uint8
    [ceil(n * bits / 8)]), num_buckets = 1 if bucket_size == 0 or
    n <= bucket_size, else ceil(n / bucket_size). Not reducible (each replica
    has its own norms): all-gathered.

    Args:
        levels: Quantization levels per sign, in [1, 32767]. Defaults to 7.
        bucket_size: Values per bucket (one norm each), an integer >= 0; 0
            means one bucket for the whole buffer. Defaults to 512.
        norm: "max" or "l2": what each bucket is scaled by. Defaults to "max".
        error_feedback: Keep the quantization error. Defaults to False: the
            codes are unbiased, and feeding back the L2 variant's large error
            can make training diverge.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
    """

    levels: int = 7
    bucket_size: int = 512
    norm: str = "max"
    error_feedback: bool = False
    warmup_steps: int = 0

    reducible = False

    def __post_init__(self):
        super().__post_init__()
        owner = type(self).__name__
        check_int(owner, "levels", self.levels, minimum=1, maximum=MAX_QSGD_LEVELS)
        check_int(owner, "bucket_size", self.bucket_size, minimum=0, maximum=2**31 - 1)
        if self.norm not in QSGD_NORMS:
            raise ValueError(
                f"Argument `norm` of {owner} must be one of {QSGD_NORMS}; received "
                f"{self.norm!r}.")

    @property
    def bits(self):
        """Bits per element: ceil(log2(levels + 1)) + 1."""
        return ops.qsgd_bits(self.levels)

    def num_buckets(self, num_elements):
        """Number of norms sent for a buffer of n elements."""
        return qsgd_num_buckets(num_elements, self.bucket_size)

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([self.num_buckets(num_elements)], tf.float32),
                tf.TensorSpec([ops.packed_size(num_elements, self.bits)], tf.uint8))

    def _compress(self, flat, n, seed):
        return ops.qsgd_encode(flat, self.levels, seed, bucket_size=self.bucket_size,
                               norm=self.norm)

    def _decompress(self, payload, n, dtype, seed):
        norms, packed = payload
        return ops.qsgd_decode(norms, packed, n, self.levels, bucket_size=self.bucket_size,
                               dtype=dtype)
