"""Random-k sparsification with a shared seed: reducible by all-reduce."""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression.base import COMPRESSORS, accumulation_dtype
from tfdist_ext.compression.payload import RatioCompressor


@COMPRESSORS.register("randomk")
@dataclasses.dataclass(frozen=True)
class RandomK(RatioCompressor):
    """Sends the values at k random positions that every replica agrees on.

    Stich, Cordonnier & Jaggi, "Sparsified SGD with memory" (NeurIPS 2018,
    https://arxiv.org/abs/1809.07599). The positions depend only on (seed, n,
    k), so with the same seed on every replica (`shared_seed`) they coincide:
    only the k values are sent (no indices) and the payloads are summed by an
    ordinary all-reduce, which scales better than top-k's all-gather. Random
    positions carry less of the gradient than top-k, so error feedback is
    essential; use a larger ratio than for top-k (1%-10%) and a fresh seed
    every step. `decompress` needs the seed to re-derive the positions.

    Args:
        ratio: Fraction of elements sent, in (0, 1]. Defaults to 0.01.
        error_feedback: Keep the unsent remainder. Defaults to True.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
        momentum: DGC momentum correction when > 0, as in `TopK`. Defaults
            to 0 (off).
        momentum_masking: DGC's momentum factor masking, as in `TopK`.
            Defaults to True.
    """

    ratio: float = 0.01
    error_feedback: bool = True
    warmup_steps: int = 0
    momentum: float = 0.0
    momentum_masking: bool = True

    reducible = True
    shared_seed = True
    caution = (
        "random-k 1% sends a random 1% of each gradient and error feedback returns the rest "
        "about 100 steps late: at its defaults it may end many points below synchronous SGD "
        "and Adam, and diverge with momentum SGD; compression='topk' at the same `ratio`, or "
        "'adaptive', is safer")

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([self.k(num_elements)], tf.as_dtype(dtype)),)

    def _compress(self, flat, n, seed):
        values, _ = ops.random_k(flat, self.k(n), seed)
        return (values,)

    def _indices(self, n, seed):
        # The positions depend only on (seed, n, k); the placeholder's values are unused.
        _, indices = ops.random_k(tf.zeros([n], tf.float16), self.k(n), seed)
        return indices

    def _decompress(self, payload, n, dtype, seed):
        return ops.sparse_to_dense(payload[0], self._indices(n, seed), n)

    def _decompress_sum(self, gathered, n, dtype, world_size, seed):
        values = tf.reshape(gathered[0], [world_size, self.k(n)])
        values = tf.reduce_sum(tf.cast(values, accumulation_dtype(dtype)), 0)
        return ops.sparse_to_dense(values, self._indices(n, seed), n)
