"""Reduction hooks: a user-written compressor runs inside the strategy, counted."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext import compression
from tfdist_ext.compression import Bucket, Communicator
from tests.compression.test_strategy_compression import _reduce


@dataclasses.dataclass(frozen=True)
class HalfSum(compression.Compressor):
    """The example of docs/guide/gradients.md: one all-reduce of the bucket in float16."""

    def reduce(self, bucket, comm, state):
        summed = comm.all_reduce(tf.cast(bucket.flat, tf.float16))
        return tf.cast(summed, bucket.flat.dtype)


@dataclasses.dataclass(frozen=True)
class Recorder(compression.Compressor):
    """Records what the hook receives; sums exactly, with a per-bucket counter."""

    seen: list = dataclasses.field(default_factory=list, compare=False)

    def reduce(self, bucket, comm, state):
        self.seen.append((bucket.key, bucket.shapes, bucket.replica, comm.rank,
                          comm.world_size))
        calls = state.buffer(f"{bucket.key}_calls", bucket.replica, 1, tf.float32,
                             initial=lambda: tf.constant([10.0]))
        with tf.control_dependencies([calls.assign_add([1.0])]):
            return comm.all_reduce(bucket.flat)


def _grads(world):
    rng = np.random.default_rng(3)
    return [[rng.normal(size=(30, 4)).astype("float32"), rng.normal(size=(7,)).astype("float32")]
            for _ in range(world)]


def test_user_hook_equals_the_fp16_compressor_and_counts_half_the_bytes():
    world = 3
    grads = _grads(world)
    mine = tfdist_ext.Strategy(num_replicas=world, allreduce="ring", compression=HalfSum())
    builtin = tfdist_ext.Strategy(num_replicas=world, allreduce="ring", compression="fp16")
    for a, b in zip(_reduce(mine, grads), _reduce(builtin, grads)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    stats = mine.communication_stats()
    assert stats["bytes_sent"] * 2 == stats["dense_bytes"] == \
        builtin.communication_stats()["dense_bytes"]


def test_hook_receives_shapes_key_ranks_and_keeps_state():
    world = 2
    recorder = Recorder()
    strategy = tfdist_ext.Strategy(num_replicas=world, compression=recorder)
    grads = _grads(world)
    for _ in range(2):
        out = _reduce(strategy, grads)
    np.testing.assert_allclose(out[0][1], grads[0][0] + grads[1][0], rtol=1e-6)
    # One call per replica and trace (each _reduce traces a new tf.function),
    # gradients in backward (reverse) order.
    assert recorder.seen == 2 * [("b0_float32_127",
                                  (tf.TensorShape([7]), tf.TensorShape([30, 4])),
                                  replica, replica, world) for replica in range(world)]
    calls = strategy.state.residuals["b0_float32_127_calls"]
    assert [v.numpy().tolist() for v in calls] == [[12.0], [12.0]]


def test_warmup_and_uncompressible_buckets_never_reach_the_hook():
    @dataclasses.dataclass(frozen=True)
    class Failing(compression.Compressor):
        warmup_steps: int = 0

        def reduce(self, bucket, comm, state):
            return tf.zeros_like(bucket.flat)  # visibly wrong if used

    world = 2
    grads = [[np.arange(5, dtype="int32") + r] for r in range(world)]
    strategy = tfdist_ext.Strategy(num_replicas=world, compression=Failing())
    np.testing.assert_array_equal(_reduce(strategy, grads)[0][0], [1, 3, 5, 7, 9])
    strategy = tfdist_ext.Strategy(num_replicas=world, compression=Failing(warmup_steps=1))
    floats = _grads(world)
    first = _reduce(strategy, floats)
    np.testing.assert_allclose(first[1][0], floats[0][1] + floats[1][1], rtol=1e-6)
    assert not _reduce(strategy, floats)[1][0].any()  # step 1: the hook's zeros


def test_bucket_split_and_communicator_checks():
    bucket = Bucket(flat=tf.range(10.0), shapes=(tf.TensorShape([2, 3]), tf.TensorShape([4])),
                    key="b0", replica=0, step=tf.constant(0, tf.int64))
    first, second = bucket.split()
    assert first.shape == (2, 3) and second.numpy().tolist() == [6, 7, 8, 9]
    comm = Communicator(all_reduce=lambda t: t, all_gather=lambda t: t,
                        reduce_bytes=lambda n, dtype: n * dtype.size, world_size=3, rank=1)
    comm.all_reduce(tf.zeros([5]))
    comm.all_gather(tf.zeros([4], tf.int32))
    assert comm.bytes_sent == 20 + 2 * 16 and comm.fork().bytes_sent == 0
    with pytest.raises(TypeError, match=r"Communicator.all_gather takes a 1-D int32 tensor; "
                                        r"received float32 of shape \(4,\)\. Pack payloads"):
        comm.all_gather(tf.zeros([4]))


@pytest.mark.parametrize("world_size", [1, 3])
def test_packed_payloads_come_back_one_dimensional_in_rank_order(world_size):
    from tfdist_ext.compression import transport

    dtypes = [tf.int8, tf.uint8, tf.float16, tf.bfloat16, tf.int32, tf.float32, tf.float64]
    rng = np.random.default_rng(0)
    replicas = [[tf.cast(rng.integers(-100, 100, size=n), dtype)
                 for dtype, n in zip(dtypes, [5, 3, 7, 1, 0, 2, 3])]
                for _ in range(world_size)]
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in replicas[0]]
    gathered = tf.concat([transport.pack(payload) for payload in replicas], 0)
    fields = transport.unpack_gathered(gathered, specs, world_size)
    for j, (spec, field) in enumerate(zip(specs, fields)):
        assert field.dtype == spec.dtype
        assert field.shape == [world_size * spec.shape[0]], (spec.dtype.name, field.shape)
        expected = np.concatenate([replicas[r][j].numpy() for r in range(world_size)])
        np.testing.assert_array_equal(field.numpy(), expected)
