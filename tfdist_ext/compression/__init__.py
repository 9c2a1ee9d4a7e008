"""What is sent: gradient compressors (`Strategy(compression=...)`).

Registered names: "none", "fp16", "bf16", "topk", "topk_approx", "randomk",
"qsgd", "terngrad", "sign", "int8", "powersgd", "adaptive". See `Compressor` for the
interface the strategy calls (a reduction hook per gradient bucket, `hooks`),
`PayloadCompressor` for the compress / decompress compressors and
`compress_with_feedback` for error feedback.
"""

from tfdist_ext.compression.base import COMPRESSORS, Compressor, fold_seed, get
from tfdist_ext.compression.payload import NoCompression, PayloadCompressor
from tfdist_ext.compression.adaptive import Adaptive
from tfdist_ext.compression.bf16 import BF16
from tfdist_ext.compression.error_feedback import (compress_with_feedback,
                                                   compress_with_momentum_correction)
from tfdist_ext.compression.fp16 import FP16
from tfdist_ext.compression.reduction_hooks import Bucket, Communicator, reduce_bucket
from tfdist_ext.compression.int8 import Int8
from tfdist_ext.compression.powersgd import PowerSGD
from tfdist_ext.compression.qsgd import QSGD
from tfdist_ext.compression.randomk import RandomK
from tfdist_ext.compression.sign import Sign
from tfdist_ext.compression.terngrad import TernGrad
from tfdist_ext.compression.topk import TopK, TopKApprox

__all__ = [
    "Adaptive",
    "BF16",
    "Bucket",
    "COMPRESSORS",
    "Communicator",
    "FP16",
    "QSGD",
    "Compressor",
    "Int8",
    "NoCompression",
    "PayloadCompressor",
    "PowerSGD",
    "RandomK",
    "Sign",
    "TernGrad",
    "TopK",
    "TopKApprox",
    "compress_with_feedback",
    "compress_with_momentum_correction",
    "fold_seed",
    "get",
    "reduce_bucket",
]
