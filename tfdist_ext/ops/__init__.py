"""The C++ custom ops of tfdist_ext, as Python functions.

The op library is built by setup.py from `custom_ops/` and loaded on first use;
when it is missing or was built for another TensorFlow, calling an op raises
`OpsUnavailableError` with the command that rebuilds it. The gradient-compression
kernels (top-k, random-k, QSGD, TernGrad, sign, int8, bit packing) are documented
in `tfdist_ext.ops.compression` and exported here.
"""

from tfdist_ext.ops._loader import OpsUnavailableError, build_problem, load
from tfdist_ext.ops.compression import (
    int8_decode,
    int8_encode,
    k_for_ratio,
    pack_bits,
    packed_size,
    qsgd_bits,
    qsgd_decode,
    qsgd_encode,
    qsgd_num_buckets,
    random_k,
    sign_decode,
    sign_encode,
    sparse_to_dense,
    terngrad_decode,
    terngrad_encode,
    top_k,
    top_k_approx,
    unpack_bits,
)


def build_info():
    """The TensorFlow version the loaded op library was compiled against."""
    return load().tfdist_build_info().numpy().decode()


__all__ = [
    "OpsUnavailableError", "build_info", "build_problem", "int8_decode", "int8_encode",
    "k_for_ratio", "load", "pack_bits", "packed_size", "qsgd_bits", "qsgd_decode",
    "qsgd_encode", "qsgd_num_buckets", "random_k", "sign_decode", "sign_encode",
    "sparse_to_dense", "terngrad_decode", "terngrad_encode", "top_k", "top_k_approx", "unpack_bits",
]
