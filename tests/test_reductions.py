"""What a reduction reduces travels with the call (`tfdist_ext.reductions`), real collectives.

Three logical CPU replicas under top-k compression: a batched all-reduce that
names no `Reduction` is a gradient reduction (compressed, counted), one that
names DENSE is the exact sum and uncounted, PSEUDO_GRADIENTS is compressed
under its own state keys, and a `Reduction`'s compressor (or
`compressing_gradients_with`) replaces the strategy's for that call only.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext import _compat, compression, reductions

WORLD = 3
SIZE = 1000


def _values(strategy):
    rng = np.random.default_rng(3)
    grads = [rng.normal(size=SIZE).astype("float32") for _ in range(WORLD)]
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(grads[ctx.replica_id_in_sync_group]))
    return values, np.sum(grads, axis=0)


def _batch_reduce(strategy, values, options=None):
    @tf.function
    def reduce(v):
        return strategy.extended.batch_reduce_to(_compat.ReduceOp.SUM, [(v, v)],
                                                 options=options)[0]

    return [r.numpy() for r in strategy.experimental_local_results(reduce(values))]


def _replica_all_reduce(strategy, values):
    @tf.function
    def step(v):
        return strategy.run(
            lambda t: tf.distribute.get_replica_context().all_reduce("SUM", t), args=(v,))

    return [r.numpy() for r in strategy.experimental_local_results(step(values))]


def _topk():
    return tfdist_ext.Strategy(num_replicas=WORLD, allreduce="ring", compression="topk")


def _residual_keys(strategy):
    return sorted(strategy.extended.cross_device_ops.state.residuals)


def test_a_reduction_that_names_nothing_is_a_gradient_reduction():
    strategy = _topk()
    values, exact = _values(strategy)
    for result in (_replica_all_reduce(strategy, values), _batch_reduce(strategy, values)):
        assert np.count_nonzero(result[0]) < SIZE // 2  # top-k: most entries unsent
        assert not np.allclose(result[0], exact)
    stats = strategy.communication_stats()
    assert stats["reductions"] == 2 and 0 < stats["bytes_sent"] < stats["dense_bytes"]
    assert _residual_keys(strategy) and not any(k.startswith("delta_")
                                                for k in _residual_keys(strategy))


def test_a_dense_reduction_is_the_exact_sum_and_uncounted():
    strategy = _topk()
    values, exact = _values(strategy)
    for result in _batch_reduce(strategy, values, reductions.options(reductions.DENSE)):
        np.testing.assert_allclose(result, exact, rtol=1e-5, atol=1e-5)
    assert strategy.communication_stats()["reductions"] == 0
    assert _residual_keys(strategy) == []


def test_pseudo_gradients_are_compressed_under_their_own_keys():
    strategy = _topk()
    values, exact = _values(strategy)
    result = _batch_reduce(strategy, values, reductions.options(reductions.PSEUDO_GRADIENTS))
    assert not np.allclose(result[0], exact)
    assert strategy.communication_stats()["reductions"] == 1
    keys = _residual_keys(strategy)
    assert keys and all(k.startswith("delta_") for k in keys)


def test_a_reductions_compressor_replaces_the_strategys_for_that_call_only():
    strategy = _topk()
    values, exact = _values(strategy)
    plain = reductions.Reduction(reductions.GRADIENTS, compression.NoCompression())
    np.testing.assert_allclose(_batch_reduce(strategy, values, reductions.options(plain))[0],
                               exact, rtol=1e-5, atol=1e-5)
    with strategy.extended.compressing_gradients_with(compression.NoCompression()):
        np.testing.assert_allclose(_replica_all_reduce(strategy, values)[0], exact,
                                   rtol=1e-5, atol=1e-5)
    assert not np.allclose(_replica_all_reduce(strategy, values)[0], exact)  # back to top-k
    stats = strategy.communication_stats()
    assert stats["reductions"] == 3


def test_the_options_carry_the_reduction_through_tfs_merge():
    strategy_options = reductions.ReductionOptions.from_options(
        tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1024))
    dense = reductions.options(reductions.DENSE, tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=5.0))
    merged = strategy_options.merge(dense)
    assert merged.reduction == reductions.Reduction(reductions.DENSE)
    assert (merged.bytes_per_pack, merged.timeout_seconds) == (1024, 5.0)
    assert strategy_options.merge(None).reduction is None
    plain = strategy_options.merge(tf.distribute.experimental.CommunicationOptions())
    assert reductions.of(plain) is None and reductions.of(None) is None
    assert "reduction=Reduction(kind='dense'" in str(merged)


def test_bad_reductions_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"Argument `kind`: 'metrics' is not a reduction "
                                         r"kind; pass one of 'gradients', 'pseudo_gradients', "
                                         r"'dense'"):
        reductions.Reduction("metrics")
    with pytest.raises(ValueError, match=r"Argument `compressor`: .* with kind='dense'; "
                                         r"dense reductions are never compressed"):
        reductions.Reduction(reductions.DENSE, compression.get("fp16"))
