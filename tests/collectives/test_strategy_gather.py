"""`strategy.gather` (what Keras' `predict` concatenates its outputs with across
workers) on the UCX engine: every replica's value along an axis, in rank order, as
numpy concatenates them, whatever the lengths along that axis (zero included).

Logical CPU replicas in this process: 2 and 3 (odd, not a power of two). Elastic jobs
need it on the engine: TF's own gather is wired for the first members only
(tests/elastic/test_elastic.py gathers after a replacement joined).
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.ops import ucx as ucx_ops

pytestmark = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")

DTYPES = [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.bool]


@functools.lru_cache(maxsize=None)
def _strategy(replicas, engine="ucx"):
    return tfdist_ext.Strategy(num_replicas=replicas, engine=engine)


def _value(replica, dtype, axis, lengths):
    """Replica `replica`'s tensor: `lengths[replica]` long along `axis`, shape (n, 2, 3)
    with n moved to `axis`."""
    n = lengths[replica]
    values = np.arange(n * 6).reshape(n, 2, 3) + 100 * replica
    values = np.moveaxis(values, 0, axis)
    return values % 2 == 1 if dtype == tf.bool else values.astype(dtype.as_numpy_dtype)


def _gather(strategy, dtype, axis, lengths):
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(_value(context.replica_id_in_sync_group, dtype, axis,
                                           lengths)))
    return strategy.gather(per_replica, axis=axis)


@pytest.mark.parametrize("replicas,lengths", [(2, (3, 1)), (3, (2, 0, 5)), (3, (4, 4, 4))])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_gather_equals_numpy_along_each_axis(replicas, lengths, dtype):
    strategy = _strategy(replicas)
    for axis in (0, 1, -1):
        got = _gather(strategy, dtype, axis, lengths)
        want = np.concatenate([_value(r, dtype, axis, lengths) for r in range(replicas)],
                              axis=axis)
        assert got.dtype == dtype and tuple(got.shape) == want.shape, (axis, got.shape)
        np.testing.assert_array_equal(np.asarray(got.numpy(), want.dtype), want)


OTHER_DTYPES = [tf.int8, tf.uint8, tf.int16, tf.uint16, tf.uint32, tf.uint64, tf.complex64,
                tf.complex128]


@pytest.mark.parametrize("dtype", OTHER_DTYPES, ids=lambda d: d.name)
def test_dtypes_the_engine_lacks_are_widened_or_sent_as_words_exactly(dtype):
    # Narrow integers travel widened (cast), 8- and 16-byte dtypes as int64 words
    # (bitcast): extremes and imaginary parts come back bit for bit, on the engine.
    lengths, numpy_type = (2, 0, 5), dtype.as_numpy_dtype

    def value(replica, axis):
        base = _value(replica, tf.int64, axis, lengths)
        if dtype.is_complex:
            return (base + 1j * (base + 0.5)).astype(numpy_type)
        return np.iinfo(numpy_type).max - base.astype(numpy_type)  # wraps where narrow

    strategy = _strategy(3)
    for axis in (0, 1, -1):
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda context, axis=axis: tf.constant(value(context.replica_id_in_sync_group,
                                                         axis)))
        got = strategy.gather(per_replica, axis=tf.constant(axis))  # known when traced
        want = np.concatenate([value(r, axis) for r in range(3)], axis=axis)
        assert got.dtype == dtype and tuple(got.shape) == want.shape, (axis, got.shape)
        np.testing.assert_array_equal(got.numpy(), want)
    graph = tf.function(lambda: strategy.gather(per_replica, axis=tf.constant(-1))
                        ).get_concrete_function()
    assert "TfdistUcxAllGatherV" in {op.type for op in graph.graph.get_operations()}


def test_gather_runs_on_the_engine_and_equals_tfs_own():
    # The traced gather holds the engine's variable-length all-gather, not TF's op.
    lengths = (2, 0, 5)
    ours = _strategy(3)
    graph = tf.function(lambda: _gather(ours, tf.float32, 0, lengths)).get_concrete_function()
    ops = {op.type for op in graph.graph.get_operations()}
    assert "TfdistUcxAllGatherV" in ops and "CollectiveGatherV2" not in ops, sorted(ops)
    theirs = _gather(_strategy(3, "tf"), tf.float32, 0, lengths)
    np.testing.assert_array_equal(_gather(ours, tf.float32, 0, lengths).numpy(), theirs.numpy())


def test_another_dimension_of_length_0_and_allreduce_native():
    # Another dimension of length 0 (TF's own gather crashes the process there): the
    # lengths along the axis add up. allreduce="native" keeps TF's gather, no engine op.
    zero = _strategy(3).experimental_distribute_values_from_function(
        lambda context: tf.zeros([context.replica_id_in_sync_group + 1, 0, 2]))
    assert tuple(_strategy(3).gather(zero, axis=0).shape) == (6, 0, 2)
    last = _strategy(3).experimental_distribute_values_from_function(
        lambda context: tf.zeros([2, 0, context.replica_id_in_sync_group + 1]))
    assert tuple(_strategy(3).gather(last, axis=-1).shape) == (2, 0, 6)
    native = tfdist_ext.Strategy(num_replicas=3, allreduce="native")
    lengths = (2, 1, 5)
    graph = tf.function(lambda: _gather(native, tf.float32, 0, lengths)).get_concrete_function()
    assert "TfdistUcxAllGatherV" not in {op.type for op in graph.graph.get_operations()}
    np.testing.assert_array_equal(
        _gather(native, tf.float32, 0, lengths).numpy(),
        np.concatenate([_value(r, tf.float32, 0, lengths) for r in range(3)]))


def test_values_that_differ_in_another_dimension_are_refused_naming_the_shapes():
    # Replica 1's second dimension is 3, the others' 2: no concatenation exists (TF's own
    # gather fails too); the engine's gather used to return wrong rows.
    unequal = _strategy(3).experimental_distribute_values_from_function(
        lambda context: tf.zeros([2, 3 if context.replica_id_in_sync_group == 1 else 2]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"strategy.gather along axis 0: the replicas hold values that "
                             r"differ in another dimension \(x: those dimensions, a row per "
                             r"replica\).*x \(strided_slice:0\) = \] \[\[2\]\[3\]\[2\]\]"):
        _strategy(3).gather(unequal, axis=0)
