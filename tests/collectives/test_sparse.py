"""Embedding gradients (IndexedSlices): by default an all-gather of every replica's
rows on the strategy's engine (one process's answer for every optimizer); with
`sparse_as_dense=True` reduced dense, fused with the other gradients.

Logical CPU replicas in this process (3: odd, not a power of two).
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.collectives import fusion
from tfdist_ext.ops import ucx as ucx_ops

NO_UCX = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")
VOCAB, DIM = 37, 5


def _slices(replica, rows=7):
    """Replica `replica`'s embedding gradient: `rows` rows (repeated ids included)."""
    rng = np.random.default_rng(replica)
    ids = rng.integers(0, VOCAB, rows).astype(np.int64)
    ids[-1] = ids[0]  # a repeated id: its rows add up
    values = rng.standard_normal((rows, DIM)).astype(np.float32)
    return ids, values


def _reduce(replicas=3, **kwargs):
    strategy = tfdist_ext.Strategy(num_replicas=replicas, **kwargs)
    dense = np.random.default_rng(9).standard_normal(11).astype(np.float32)

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        rank = ctx.replica_id_in_sync_group
        parts = [tf.IndexedSlices(tf.constant(v), tf.constant(i),
                                  tf.constant([VOCAB, DIM], tf.int64))
                 for i, v in (_slices(r) for r in range(replicas))]
        chosen = parts[0]  # replica `rank`'s own (one graph for every replica)
        for r in range(1, replicas):
            chosen = tf.IndexedSlices(
                tf.where(tf.equal(rank, r), parts[r].values, chosen.values),
                tf.where(tf.equal(rank, r), parts[r].indices, chosen.indices),
                chosen.dense_shape)
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, [chosen, tf.constant(dense)])

    fn = tf.function(lambda: strategy.run(replica_fn))
    ops = {op.type for op in fn.get_concrete_function().graph.get_operations()}
    return strategy.experimental_local_results(fn()), ops, dense


def _expected(replicas=3):
    total, rows = np.zeros((VOCAB, DIM), np.float32), set()
    for r in range(replicas):
        ids, values = _slices(r)
        np.add.at(total, ids, values)
        rows |= set(ids.tolist())
    return total, sorted(rows)


@NO_UCX
@pytest.mark.parametrize("engine", ["ucx", "tf"])
def test_sparse_as_dense_reduces_on_the_engine_and_gives_the_touched_rows(engine):
    results, ops, dense = _reduce(engine=engine, sparse_as_dense=True)
    total, rows = _expected()
    for embedding, other in results:
        assert isinstance(embedding, tf.IndexedSlices)
        assert sorted(embedding.indices.numpy().tolist()) == rows
        np.testing.assert_allclose(tf.convert_to_tensor(embedding).numpy(), total,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(other.numpy(), 3 * dense, rtol=1e-6)
    assert "CollectiveGatherV2" not in ops
    if engine == "ucx":
        assert "TfdistUcxRun" in ops and not [op for op in ops if "Collective" in op], ops


@pytest.mark.parametrize("engine", ["ucx", "tf"])
def test_by_default_they_are_all_gathered_on_the_strategys_engine(engine):
    if engine == "ucx" and ucx_ops.problem() is not None:
        pytest.skip("UCX engine not built")
    results, ops, _ = _reduce(engine=engine)
    ids = np.concatenate([_slices(r)[0] for r in range(3)])
    values = np.concatenate([_slices(r)[1] for r in range(3)])
    for embedding, _other in results:
        assert isinstance(embedding, tf.IndexedSlices)
        np.testing.assert_array_equal(embedding.indices.numpy(), ids)  # replica order
        np.testing.assert_array_equal(embedding.values.numpy(), values)
    if engine == "ucx":
        assert "TfdistUcxAllGatherV" in ops and not [op for op in ops if "Collective" in op], ops
    else:
        assert "CollectiveGatherV2" in ops


def _gather_uneven(engine, dtype, index_dtype, reduce_op):
    """Replica r has ROWS[r] rows (one has none), unknown when traced; returns
    each replica's result as (indices, values) arrays."""
    rows = (4, 0, 9)
    strategy = tfdist_ext.Strategy(num_replicas=3, engine=engine)

    def replica_fn():
        ctx = tf.distribute.get_replica_context()

        def part(r):
            ids = tf.range(rows[r], dtype=index_dtype) * 3 + r
            values = tf.reshape(tf.range(rows[r] * 2 * DIM, dtype=tf.float32), [-1, 2, DIM])
            return ids, tf.cast(values / 8 + r, dtype)

        ids, values = tf.switch_case(ctx.replica_id_in_sync_group,
                                     [lambda r=r: part(r) for r in range(3)])
        slices = tf.IndexedSlices(values, ids, tf.constant([40, 2, DIM], tf.int64))
        return ctx.all_reduce(reduce_op, slices)

    results = tf.function(lambda: strategy.run(replica_fn))()
    return [(r.indices.numpy(), r.values.numpy(), r.values.shape.as_list())
            for r in strategy.experimental_local_results(results)]


@NO_UCX
@pytest.mark.parametrize("dtype,index_dtype,reduce_op", [
    (tf.float32, tf.int64, "SUM"), (tf.float16, tf.int32, "MEAN"),
    (tf.bfloat16, tf.int64, "SUM"), (tf.float64, tf.int32, "MEAN")])
def test_uneven_and_empty_replicas_give_tfs_answer(dtype, index_dtype, reduce_op):
    op = getattr(tf.distribute.ReduceOp, reduce_op)
    ours = _gather_uneven("ucx", dtype, index_dtype, op)
    # TF's own all-gather has no bfloat16: numpy's answer there.
    expected_ids = np.concatenate([np.arange(n) * 3 + r for r, n in enumerate((4, 0, 9))])
    expected = np.concatenate([
        tf.cast(np.arange(n * 2 * DIM, dtype=np.float32).reshape(-1, 2, DIM) / 8 + r,
                dtype).numpy() for r, n in enumerate((4, 0, 9))])
    if reduce_op == "MEAN":
        expected = (tf.constant(expected) / tf.cast(3, dtype)).numpy()
    tfs = (_gather_uneven("tf", dtype, index_dtype, op) if dtype != tf.bfloat16
           else [(expected_ids, expected, None)] * 3)
    for (ids, values, shape), (tf_ids, tf_values, _) in zip(ours, tfs):
        assert shape == [13, 2, DIM] and ids.dtype == index_dtype.as_numpy_dtype
        np.testing.assert_array_equal(ids, tf_ids)
        np.testing.assert_array_equal(values, tf_values)
        np.testing.assert_array_equal(ids, expected_ids)
        # A traced MEAN may multiply by 1/3 where eager code divides: one rounding apart.
        np.testing.assert_allclose(values.astype(np.float64), expected.astype(np.float64),
                                   rtol=2e-3 if dtype.size == 2 else 1e-12)


@NO_UCX
def test_an_all_gather_with_wrong_counts_fails_naming_them():
    from tfdist_ext.collectives import ucx_engine  # pylint: disable=import-outside-toplevel
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:3]
    engine = ucx_engine.engine_for("test-counts", devices, 3, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`counts\[0\]` is 5 but this "
                                                            r"rank's input has 2 elements"):
        engine.all_gather_v(tf.zeros([2]), 0, counts=tf.constant([5, 1, 1], tf.int64))
    with pytest.raises(ValueError, match=r"Argument `flat` must be a 1-D tensor; received "
                                         r"shape \(2, 2\)"):
        engine.all_gather_v(tf.zeros([2, 2]), 0)


def test_densified_converts_static_shapes_and_restores_the_touched_rows():
    ids, values = _slices(0)
    small = tf.IndexedSlices(tf.constant(values), tf.constant(ids),
                             tf.constant([VOCAB, DIM], tf.int64))
    no_shape = tf.IndexedSlices(tf.constant(values), tf.constant(ids))
    out, restore = fusion.densified([small, no_shape, tf.constant(1.0)])
    assert len(out) == 4  # the row counts of `small` appended
    expected = np.zeros((VOCAB, DIM), np.float32)
    np.add.at(expected, ids, values)
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-6)
    assert out[3].numpy().sum() == len(ids) and isinstance(out[1], tf.IndexedSlices)
    back = restore(out)
    assert len(back) == 3 and sorted(back[0].indices.numpy()) == sorted(set(ids.tolist()))


def test_a_bad_value_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"Argument `sparse_as_dense` must be True or False; "
                                         r"received 'yes'"):
        tfdist_ext.Strategy(num_replicas=3, sparse_as_dense="yes")


def _fit(optimizer, strategy=None):
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, size=(200, 6)).astype("int32")
    y = (x.sum(axis=1) % 3).astype("int32")
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((6,), dtype="int32"),
                                  keras.layers.Embedding(VOCAB, DIM),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
        model.compile(optimizer=optimizer(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # Batches of 30 over 3 replicas, 200 samples: the last batch is partial.
    return model.fit(x, y, batch_size=30, epochs=2, shuffle=False, verbose=0).history["loss"]


@NO_UCX
def test_fits_give_the_one_process_answer():
    """Adam by default and momentum SGD with sparse_as_dense; Adam with sparse_as_dense
    differs a little (each row's summed gradient squared, not each lookup's)."""
    def adam():
        return keras.optimizers.Adam(0.01)

    def sgd():
        return keras.optimizers.SGD(0.1, momentum=0.9)

    np.testing.assert_allclose(
        _fit(adam, tfdist_ext.Strategy(num_replicas=3, engine="ucx")), _fit(adam), rtol=1e-5)
    np.testing.assert_allclose(
        _fit(sgd, tfdist_ext.Strategy(num_replicas=3, engine="ucx", sparse_as_dense=True)),
        _fit(sgd), rtol=1e-5)
    dense_adam = _fit(adam, tfdist_ext.Strategy(num_replicas=3, engine="ucx",
                                                sparse_as_dense=True))
    np.testing.assert_allclose(dense_adam, _fit(adam), rtol=1e-2)
