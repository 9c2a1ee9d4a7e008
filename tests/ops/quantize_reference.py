"""Numpy references shared by the quantization op tests.

Bit packing, the counter-based uniform numbers of compression_common.h, an exact
model of the QSGD kernel, test data, and the tolerances of the unbiasedness
tests. Imported by tests/ops/test_*_ops.py.
"""

import numpy as np

DRAWS = 400  # encodings averaged in the unbiasedness tests
SIGMAS = 6.0  # allowed deviation of a mean, in standard errors (n elements at once)
# Elements rounded up with a tiny probability p are Poisson, not normal: one lucky
# draw moves their mean by step / DRAWS, which can exceed SIGMAS standard errors.
# So the bound also allows two such draws (three or more have probability
# ~(DRAWS * p)^3 / 6 for those elements).
HITS = 2


def reference_pack(codes, bits):
    """Little-endian bit stream: code i in bits [i*bits, (i+1)*bits), LSB first."""
    codes = np.asarray(codes, np.uint32).reshape(-1)
    stream = ((codes[:, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(stream, bitorder="little")


def reference_unpack(packed, bits, n):
    stream = np.unpackbits(np.asarray(packed, np.uint8), bitorder="little")[:n * bits]
    return (stream.reshape(n, bits).astype(np.uint32) << np.arange(bits)).sum(1)


def gradient_like(n, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([0.01, 1.0, 5.0], n)).astype(np.float32)
    x[::17] = 0.0
    return x


def mean_decoded(encode_decode, n):
    total = np.zeros(n, np.float64)
    for seed in range(DRAWS):
        total += encode_decode(seed)
    return total / DRAWS


# ----------------------------------------------------------------------------
# An exact numpy model of the QSGD kernel (same float32 arithmetic and the same
# counter-based uniform numbers).

_M64 = (1 << 64) - 1


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _M64
    return z ^ (z >> 31)


def _fmix32(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85ebca6b)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xc2b2ae35)
    return h ^ (h >> np.uint32(16))


def reference_uniform24(seed, n, stream=0x7173676471736764):
    """compression_common.h's Uniform24Stream (QSGD salt) for elements 0..n-1."""
    key = _mix64(_mix64((seed & _M64) ^ stream))
    k0, k1 = np.uint32(key & 0xffffffff), np.uint32(key >> 32)
    i = np.arange(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        return (_fmix32(_fmix32((i * np.uint32(0x9e3779b9)) ^ k0) ^ k1) >> np.uint32(8))


def reference_qsgd(x, levels, seed, bucket_size, norms):
    """Codes of the kernel, given its float32 bucket norms."""
    n = x.size
    d = n if bucket_size == 0 or n <= bucket_size else bucket_size
    norm_of = np.repeat(norms, d)[:n] if n else np.zeros(0, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (levels / norm_of.astype(np.float64)).astype(np.float32)
        v = np.abs(x) * scale  # float32, as in the kernel
        floor = np.where(np.isfinite(v), v, 0).astype(np.int32)
    frac = v - floor.astype(np.float32)
    u = reference_uniform24(seed, n).astype(np.float32)
    level = np.minimum(floor + (u < frac * np.float32(2**24)), levels)
    level = np.where(norm_of > 0, level, 0)  # zero buckets: all codes 0
    return (level << 1) | ((x < 0) & (level != 0))
