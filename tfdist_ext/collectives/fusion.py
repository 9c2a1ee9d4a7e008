"""Tensor fusion: many gradients -> a few flat buffers per dtype -> back again.

Collectives have a fixed cost per round (docs/tf_internals.md), so the
strategy reduces a few large flat buffers instead of many small tensors.
Tensors are grouped by dtype (one buffer holds one dtype), then packed with
TF's own rule for `CommunicationOptions.bytes_per_pack`
(`cross_device_utils.group_by_size`: packs of at least `bytes_per_pack` bytes,
in order; 0 makes one pack per dtype). As in TF's native path the list is
reversed first, so the first pack holds the gradients backprop produces first.
"""

import tensorflow as tf

from tfdist_ext import _compat


def fused_all_reduce(tensors, reduce_flat, bytes_per_pack: int = 0, plan=None):
    """Reduces dense tensors through flat per-dtype buffers.

    Args:
        tensors: Dense tensors with static shapes (any dtypes), in variable
            (forward) order; their reverse is the order backprop produces them.
        reduce_flat: ``reduce_flat(flat_1d_tensor, shapes) -> reduced tensor``
            of the same length and dtype, where `shapes` are the static shapes
            of the tensors concatenated in the buffer, in order; called once
            per pack, in the same order on every replica (the packing depends
            only on shapes and dtypes).
        bytes_per_pack: As `tf.distribute.experimental.CommunicationOptions`
            (used when `plan` is None).
        plan: Optional ``plan(sizes_in_bytes, itemsize) -> buckets`` (a
            bucketing planner): sizes and buckets in backward order, each bucket
            a tuple of consecutive positions; one pack per bucket.

    Returns:
        The reduced tensors, in the order and shapes of `tensors`.
    """
    results = [None] * len(tensors)
    for dtype, indices in _by_dtype(tensors).items():
        backward = indices[::-1]
        if plan is None:
            order = iter(backward)  # packs keep the order of their input
            packs = [[next(order) for _ in pack] for pack in _compat.group_by_size(
                [tensors[i] for i in backward], bytes_per_pack)]
        else:
            sizes = [tensors[i].shape.num_elements() * dtype.size for i in backward]
            packs = [[backward[p] for p in bucket] for bucket in plan(sizes, dtype.size)]
        for pack in packs:
            shapes = [tensors[i].shape for i in pack]
            reduced = reduce_flat(_concat([tensors[i] for i in pack]), shapes)
            for i, piece in zip(pack, _split(reduced, shapes)):
                results[i] = piece
    return results


def densified(values):
    """IndexedSlices made dense for a fused all-reduce, and the way back.

    Each IndexedSlices whose dense shape is static is replaced by its dense
    tensor, and a vector of its row counts (how often each row appears in its
    indices) is appended to the values: summed with the others, it says which
    rows any replica touched. `restore` turns the reduced dense tensor back into
    IndexedSlices of those rows, so that an optimizer's sparse update touches the
    rows one process's would. One difference stays: a row looked up several
    times arrives summed, so Keras' Adam squares the sum where one process
    squares each lookup's gradient (SGD and momentum are the same either way).
    On the wire: the dense tensor plus 1/row-width more, 2(p-1)/p x of it per
    worker, against TF's all-gather of every worker's rows: dense wins unless a
    batch touches a small fraction of a large vocabulary, and costs a dense
    copy's memory.

    Args:
        values: A flat list of tensors and IndexedSlices.

    Returns:
        ``(values, restore)``: the values to reduce, and ``restore(reduced)``,
        which takes their reduced results and returns one per original value.
    """
    out, slots = list(values), []
    for i, v in enumerate(values):
        if not isinstance(v, tf.IndexedSlices) or v.dense_shape is None:
            continue
        shape = tf.TensorShape(tf.get_static_value(v.dense_shape))
        if not shape.is_fully_defined():
            continue
        out[i] = tf.convert_to_tensor(v)
        ones = tf.ones(tf.shape(v.indices)[:1], v.values.dtype)
        out.append(tf.math.unsorted_segment_sum(ones, v.indices, shape[0]))
        slots.append((i, len(out) - 1, v.dense_shape))

    def restore(reduced):
        reduced = list(reduced)
        for i, counts, dense_shape in slots:
            rows = tf.reshape(tf.where(reduced[counts] > 0), [-1])
            reduced[i] = tf.IndexedSlices(tf.gather(reduced[i], rows), rows, dense_shape)
        return reduced[:len(values)]

    return out, restore


def partition(values, supported_dtypes):
    """Sorts the values of one all-reduce by how they travel.

    Args:
        values: A flat list of tensors, IndexedSlices or tensor-likes.
        supported_dtypes: The dtypes the fused path reduces.

    Returns:
        ``(values, native, empty, fused)``: `values` with every value but
        IndexedSlices converted to a tensor, and the indices of those TF's
        native path reduces (IndexedSlices, no static shape, another dtype),
        of empty tensors (no communication) and of the tensors to fuse.
    """
    values = list(values)
    native, empty, fused = [], [], []
    for i, v in enumerate(values):
        if isinstance(v, tf.IndexedSlices):
            native.append(i)
            continue
        values[i] = v = tf.convert_to_tensor(v)
        if not v.shape.is_fully_defined() or v.dtype not in supported_dtypes:
            native.append(i)
        elif v.shape.num_elements() == 0:
            empty.append(i)
        else:
            fused.append(i)
    return values, native, empty, fused


def flatten_by_dtype(tensors):
    """Concatenates dense tensors into one flat buffer per dtype.

    Args:
        tensors: Dense tensors with static shapes.

    Returns:
        ``(buffers, restore)``: the flat buffers, in order of each dtype's first
        appearance, and ``restore(buffers)`` which splits buffers of the same
        lengths and dtypes back into tensors of the original shapes and order.
    """
    groups = list(_by_dtype(tensors).values())
    buffers = [_concat([tensors[i] for i in group]) for group in groups]
    shapes = [t.shape for t in tensors]

    def restore(flat_buffers):
        results = [None] * len(shapes)
        for group, flat in zip(groups, flat_buffers):
            for i, piece in zip(group, _split(flat, [shapes[i] for i in group])):
                results[i] = piece
        return results

    return buffers, restore


def _by_dtype(tensors):
    """dtype -> indices of `tensors` of that dtype, dtypes in order of first appearance."""
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


def _concat(tensors):
    """One flat buffer of `tensors` (no copy for a single tensor)."""
    flats = [tf.reshape(t, [-1]) for t in tensors]
    return flats[0] if len(flats) == 1 else tf.concat(flats, 0)


def _split(flat, shapes):
    """`_concat`'s inverse: pieces of `flat` with the given static shapes."""
    pieces = [flat] if len(shapes) == 1 else tf.split(flat, [s.num_elements() for s in shapes])
    return [tf.reshape(piece, shape) for piece, shape in zip(pieces, shapes)]
