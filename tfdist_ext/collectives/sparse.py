"""Embedding gradients (IndexedSlices) all-gathered on the UCX engine.

A sum of IndexedSlices is every replica's rows side by side: TF's native path
all-gathers the indices and the values, and so does this, on the UCX engine
(shared memory on one host, UCX across hosts) instead of TF's collectives.
The result is the same IndexedSlices, rows in replica order, so an optimizer's
sparse update is exactly one process's. Row counts may differ between replicas
and be unknown when traced (a partial last batch): one small all-gather of the
counts precedes the rows' (`UcxEngine.all_gather_v`).

Tuning: a replica sends its rows once and receives everyone else's
(p x rows x row bytes per step), against 2(p-1)/p x the whole table for
`Strategy(sparse_as_dense=True)`. Gathering wins when a step touches less than
about 2/p of the table's rows (counting repeats); beyond that, or with many
workers, `sparse_as_dense=True` sends less (it changes Adam-style updates of
repeated rows slightly: see `collectives.fusion.densified`).
"""

import tensorflow as tf

from tfdist_ext.collectives import ucx_engine


def on_engine(value, engine: str) -> bool:
    """Whether `value` is IndexedSlices the UCX engine gathers (engine "ucx", a dtype it moves)."""
    return (engine == "ucx" and isinstance(value, tf.IndexedSlices)
            and value.values.dtype in ucx_engine.SUPPORTED_DTYPES)


def all_gather(engine, slices, local_index, group_size, mean=False, label="tfdist/sparse"):
    """Every replica's rows of `slices`, in replica order, as IndexedSlices.

    Args:
        engine: The `UcxEngine` of the strategy (unused when `group_size` is 1).
        slices: This replica's IndexedSlices.
        local_index: This replica's index on its worker.
        group_size: The number of replicas in all.
        mean: Divide the values by `group_size` (a MEAN reduction).
        label: Profiler label prefix of the collectives.

    Returns:
        IndexedSlices with every replica's indices and values concatenated.
    """
    values, indices = slices.values, slices.indices
    if group_size > 1:
        shape = tf.shape(values, out_type=tf.int64)
        rows = engine.all_gather(shape[:1], local_index, label + "/rows")
        indices = engine.all_gather_v(indices, local_index, label + "/indices", counts=rows)
        gathered = engine.all_gather_v(tf.reshape(values, [-1]), local_index,
                                       label + "/values", counts=rows * tf.reduce_prod(shape[1:]))
        values = tf.ensure_shape(tf.reshape(gathered, tf.concat([[-1], shape[1:]], 0)),
                                 [None] + values.shape[1:])
    if mean:
        values = values / tf.cast(group_size, values.dtype)
    return tf.IndexedSlices(values, indices, slices.dense_shape)
