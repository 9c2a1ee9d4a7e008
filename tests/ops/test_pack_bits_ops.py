"""Generic bit packing (pack_bits / unpack_bits) against a numpy reference."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist_ext import ops
from tests.ops.quantize_reference import reference_pack


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_pack_unpack_round_trip(bits, n):
    codes = np.random.default_rng(bits * 1000 + n).integers(0, 2**bits, n).astype(np.uint8)
    packed = ops.pack_bits(codes, bits)
    assert packed.shape == (ops.packed_size(n, bits),)
    np.testing.assert_array_equal(packed.numpy(), reference_pack(codes, bits))
    np.testing.assert_array_equal(ops.unpack_bits(packed, bits, n).numpy(), codes)


def test_pack_unpack_in_tf_function_with_dynamic_n():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.uint8)])
    def round_trip(codes):
        return ops.unpack_bits(ops.pack_bits(codes, 5), 5, tf.size(codes))

    codes = np.arange(31, dtype=np.uint8)
    np.testing.assert_array_equal(round_trip(codes).numpy(), codes)


def test_pack_bits_invalid_arguments():
    with pytest.raises(ValueError, match=r"Argument `bits` must be an integer in \[1, 8\]; "
                                         r"received bits=9"):
        ops.pack_bits(np.zeros(3, np.uint8), 9)
    with pytest.raises(ValueError, match=r"received bits=0"):
        ops.unpack_bits(np.zeros(3, np.uint8), 0, 3)
    with pytest.raises(TypeError, match=r"Argument `codes` must be a uint8 tensor; "
                                        r"received dtype=int32"):
        ops.pack_bits(tf.constant([1, 2]), 2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"codes\[2\] = 8 does not fit in bits=3"):
        ops.pack_bits(np.array([1, 7, 8, 0], np.uint8), 3)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`packed` has 1 bytes but n=9 codes of 1 bits need 2"):
        ops.unpack_bits(np.zeros(1, np.uint8), 1, 9)
