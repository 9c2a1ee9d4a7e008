"""Tensor fusion: many gradients -> a few flat buffers per dtype -> back again.

Collectives have a fixed cost per round (~0.3-0.5 ms measured, TF_NOTES.md
section 3), so the strategy reduces a few large flat buffers instead of many
small tensors. Tensors are grouped by dtype (one buffer holds one dtype), then
packed with TF's own rule for `CommunicationOptions.bytes_per_pack`
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
        reduce_flat: ``reduce_flat(flat_1d_tensor) -> reduced tensor`` of the
            same length and dtype; called once per pack, in the same order on
            every replica (the packing depends only on shapes and dtypes).
        bytes_per_pack: As `tf.distribute.experimental.CommunicationOptions`
            (used when `plan` is None).
        plan: Optional ``plan(sizes_in_bytes, itemsize) -> buckets`` (a
            bucketing planner): sizes and buckets in backward order, each bucket
            a tuple of consecutive positions; one pack per bucket.

    Returns:
        The reduced tensors, in the order and shapes of `tensors`.
    """
    by_dtype = {}  # dtype -> indices, in order of first appearance
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    results = [None] * len(tensors)
    for dtype, indices in by_dtype.items():
        backward = indices[::-1]
        if plan is None:
            order = iter(backward)  # packs keep the order of their input
            packs = [[next(order) for _ in pack] for pack in _compat.group_by_size(
                [tensors[i] for i in backward], bytes_per_pack)]
        else:
            sizes = [tensors[i].shape.num_elements() * dtype.size for i in backward]
            packs = [[backward[p] for p in bucket] for bucket in plan(sizes, dtype.size)]
        for pack in packs:
            members = [tensors[i] for i in pack]
            flats = [tf.reshape(t, [-1]) for t in members]
            reduced = reduce_flat(flats[0] if len(flats) == 1 else tf.concat(flats, 0))
            pieces = [reduced] if len(pack) == 1 else tf.split(
                reduced, [t.shape.num_elements() for t in members])
            for i, piece in zip(pack, pieces):
                results[i] = tf.reshape(piece, tensors[i].shape)
    return results


def flatten_by_dtype(tensors):
    """Concatenates dense tensors into one flat buffer per dtype.

    Args:
        tensors: Dense tensors with static shapes.

    Returns:
        ``(buffers, restore)``: the flat buffers, in order of each dtype's first
        appearance, and ``restore(buffers)`` which splits buffers of the same
        lengths and dtypes back into tensors of the original shapes and order.
    """
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    groups = list(by_dtype.values())
    buffers = [tf.concat([tf.reshape(tensors[i], [-1]) for i in group], 0)
               for group in groups]
    shapes = [t.shape for t in tensors]

    def restore(flat_buffers):
        results = [None] * len(shapes)
        for group, flat in zip(groups, flat_buffers):
            sizes = [shapes[i].num_elements() for i in group]
            for i, piece in zip(group, tf.split(flat, sizes)):
                results[i] = tf.reshape(piece, shapes[i])
        return results

    return buffers, restore
