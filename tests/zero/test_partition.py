"""ZeRO's partition of the weights into blocks and buckets, and the block layouts (pure
planning and single-process TensorFlow; issue 49)."""

import numpy as np
import pytest

from tfdist_ext.zero import Partition


@pytest.mark.parametrize("sizes,world", [([5, 0, 7], 3), ([1], 4), ([0], 2), ([10, 3], 1),
                                         ([829], 3), ([6, 6], 2), ([7, 1, 2, 9], 4)])
def test_blocks_cover_every_weight_once(sizes, world):
    plan = Partition.of(sizes, world)
    assert sum(plan.owned(r) for r in range(world)) == plan.total == sum(sizes)
    # Replica r owns block r of every weight: each element once, in order within a weight.
    for i, size in enumerate(sizes):
        elements = [e for r in range(world) for w, lo, hi in plan.pieces(r) if w == i
                    for e in range(lo, hi)]
        assert elements == list(range(size))
        assert all(hi - lo <= plan.block(i) for r in range(world)
                   for w, lo, hi in plan.pieces(r) if w == i)
    assert plan.shard == sum(-(-s // world) for s in sizes)
    assert plan.padded == plan.shard * world >= plan.total
    assert plan.padded - plan.total <= len(sizes) * (world - 1)  # padding: < 1 per block


@pytest.mark.parametrize("cap", [1, 6, 12, 100])
def test_buckets_group_consecutive_weights_under_the_cap(cap):
    plan = Partition.of([5, 0, 7, 1, 1, 13], 3)
    buckets = plan.buckets(cap)
    assert [i for b in buckets for i in b] == list(range(6))
    for bucket in buckets:
        held = sum(plan.block(i) * 3 for i in bucket)
        assert held <= cap or len(bucket) == 1


def test_bad_partitions_are_named():
    with pytest.raises(ValueError, match=r"world=0: must be >= 1"):
        Partition.of([3], 0)
    with pytest.raises(ValueError, match=r"rank=2: must be in \[0, 2\)"):
        Partition.of([3], 2).pieces(2)


def test_rank_major_reduce_scatter_and_gather_layouts_round_trip():
    """A bucket laid out rank-major and cut into blocks is every replica's blocks; the
    blocks put back together are the weights (`blocks.rank_major`, `split`, `whole`)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfdist_ext.zero import blocks  # pylint: disable=import-outside-toplevel

    shapes = [(2, 3), (0,), (5,), (1,)]
    plan = Partition.of([int(np.prod(s)) for s in shapes], 3)
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=s).astype("float32") for s in shapes]
    flat = blocks.rank_major(weights, plan, [0, 1, 2, 3], tf.float32).numpy()
    width = plan.shard
    for r in range(3):
        mine = blocks.split(tf.constant(flat[r * width:(r + 1) * width]), plan, [0, 1, 2, 3])
        expected = [blocks.block(w, plan, i, r, tf.float32) for i, w in enumerate(weights)]
        for got, want in zip(mine, expected):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    for got, want in zip(blocks.whole(tf.constant(flat), plan, [0, 1, 2, 3], shapes), weights):
        np.testing.assert_array_equal(got.numpy(), want)
    # Each replica's blocks placed among zeros, summed: the all-gather (engine="tf").
    summed = sum(blocks.placed(tf.constant(flat[r * width:(r + 1) * width]), r, 3)
                 for r in range(3))
    np.testing.assert_array_equal(summed.numpy(), flat)
