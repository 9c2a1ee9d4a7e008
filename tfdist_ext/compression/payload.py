"""Payload compressors: compress each replica's buffer, communicate, decompress.

A payload compressor turns a dense gradient buffer into a payload (a tuple of
1-D tensors of static shapes) and back. `reducible` payloads (fp16, bf16,
random-k with a shared seed) can be summed element-wise by an all-reduce; the
others (top-k, QSGD, TernGrad, sign, int8) are all-gathered and summed locally
by `decompress_sum`:

    replica r:  flat_r --compress--> payload_r = (t_1, ..., t_m), t_j of shape [L_j]
    reducible:      all_reduce(payload_r)  --decompress-->      sum_r flat_r (approx.)
    not reducible:  all_gather(payload_r)  --decompress_sum-->  sum_r flat_r (approx.)
                    (t_j of shape [world_size * L_j], replica r at [r*L_j:(r+1)*L_j])

That is their reduction hook (`transport.reduce_payload`, with error feedback
and DGC momentum correction around `compress`).

Every payload tensor is 1-D (scalars such as a norm are sent as shape [1]) and
its shape depends only on (number of elements, dtype, configuration), see
`payload_spec`, so every replica sends equally shaped tensors.

Seeds: `compress(flat, seed)` takes an int64 scalar. Fold the step (and the
bucket) into it so that every step draws fresh randomness, then pass it through
`replica_seed(seed, rank)`: compressors with `shared_seed` (random-k) need the
same seed on every replica, the stochastic quantizers (QSGD, TernGrad) need
independent seeds per replica.
"""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression import transport
from tfdist_ext.compression.base import (COMPRESSORS, Compressor, accumulation_dtype, as_seed,
                                         check_int, check_ratio, fold_seed)


def split_replicas(gathered, specs, world_size):
    """Per payload tensor, the list of its `world_size` replica parts."""
    return [tf.unstack(tf.reshape(t, [world_size, spec.shape[0]]), num=world_size)
            for t, spec in zip(gathered, specs)]


class PayloadCompressor(Compressor):
    """A compressor defined by `compress` / `decompress` of one replica's buffer.

    Subclasses implement `payload_spec`, `_compress` and `_decompress`; the
    public methods below validate their arguments, so every compressor reports
    misuse the same way.

    Attributes:
        reducible: Whether payloads of different replicas may be summed
            element-wise (all-reduce); otherwise they are all-gathered and
            summed by `decompress_sum`.
        shared_seed: Whether the seed passed to `compress` must be identical on
            every replica (random-k: the same indices everywhere). Also then
            `decompress` needs that seed.
    """

    reducible = True
    shared_seed = False

    def reduce(self, bucket, comm, state):
        """Compress (with error feedback), all-reduce or all-gather, decompress."""
        return transport.reduce_payload(self, bucket, comm, state)

    # -- Interface used by the strategy ------------------------------------

    def compress(self, flat, seed):
        """Compresses a 1-D float buffer of static length n.

        Args:
            flat: float16/bfloat16/float32/float64 tensor with a static number
                of elements (flattened).
            seed: int or int64 scalar tensor (see `replica_seed`).

        Returns:
            The payload: a tuple of 1-D tensors matching `payload_spec(n, dtype)`.

        Raises:
            TypeError: `flat` is not floating point.
            ValueError: `flat` has no static size.
        """
        flat, n = self._flat(flat)
        payload = tuple(self._compress(flat, n, as_seed(seed)))
        for tensor, spec in zip(payload, self.payload_spec(n, flat.dtype)):
            tensor.set_shape(spec.shape)
        return payload

    def decompress(self, payload, num_elements, dtype, seed=None):
        """The dense 1-D tensor [num_elements] of `dtype` a payload stands for.

        For a reducible compressor, `payload` may also be the element-wise sum
        of several replicas' payloads (then the result is their sum).

        Args:
            payload: A tuple from `compress` (or a sum of such tuples).
            num_elements: The static int n that was compressed.
            dtype: The dtype of the compressed buffer.
            seed: The seed passed to `compress`; required when `shared_seed`
                (random-k derives its indices from it), ignored otherwise.
        """
        n, dtype = self._check_size_and_dtype(num_elements, dtype)
        payload = self._check_payload(payload, n, dtype, 1)
        out = self._decompress(payload, n, dtype, self._decode_seed(seed))
        return tf.ensure_shape(tf.cast(out, dtype), [n])

    def decompress_sum(self, gathered, num_elements, dtype, world_size, seed=None):
        """The dense sum over replicas of all-gathered payloads.

        Args:
            gathered: The payload tuple after an all-gather over `world_size`
                replicas: each tensor of shape [L] became [world_size * L],
                replica r's part at [r*L:(r+1)*L].
            num_elements: The static int n each replica compressed.
            dtype: The dtype of the compressed buffers.
            world_size: Number of replicas gathered (a static int).
            seed: As in `decompress`.

        Returns:
            Dense [num_elements] tensor of `dtype`, the sum of the replicas'
            decompressed payloads (float16/bfloat16 summed in float32).
        """
        n, dtype = self._check_size_and_dtype(num_elements, dtype)
        world_size = check_int(type(self).__name__, "world_size", world_size, minimum=1)
        gathered = self._check_payload(gathered, n, dtype, world_size)
        out = self._decompress_sum(gathered, n, dtype, world_size, self._decode_seed(seed))
        return tf.ensure_shape(tf.cast(out, dtype), [n])

    def payload_spec(self, num_elements, dtype):
        """Static shapes and dtypes of the payload of n elements of `dtype`.

        Returns:
            A tuple of `tf.TensorSpec`, one per payload tensor, each 1-D.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement payload_spec().")

    def payload_bytes(self, num_elements, dtype):
        """Bytes one replica sends for a buffer of n elements of `dtype` (an int)."""
        n, dtype = self._check_size_and_dtype(num_elements, dtype)
        return sum(spec.shape.num_elements() * spec.dtype.size
                   for spec in self.payload_spec(n, dtype))

    def replica_seed(self, seed, rank):
        """The seed replica `rank` passes to `compress`.

        `seed` should already fold in the step and the bucket (`fold_seed`) and
        be the same on every replica. Shared-seed compressors get it unchanged;
        the others get the rank folded in, so that stochastic rounding is
        independent across replicas (that is what makes the average unbiased
        with lower variance).
        """
        return as_seed(seed) if self.shared_seed else fold_seed(seed, rank)

    # -- Hooks for subclasses ----------------------------------------------

    def _compress(self, flat, n, seed):
        raise NotImplementedError(f"{type(self).__name__} must implement _compress().")

    def _decompress(self, payload, n, dtype, seed):
        raise NotImplementedError(f"{type(self).__name__} must implement _decompress().")

    def _decompress_sum(self, gathered, n, dtype, world_size, seed):
        """Default: decompress each replica's part and add them up."""
        parts = split_replicas(gathered, self.payload_spec(n, dtype), world_size)
        acc = accumulation_dtype(dtype)
        return tf.add_n([tf.cast(self._decompress(tuple(p[r] for p in parts), n, acc, seed), acc)
                         for r in range(world_size)])

    def _check_size_and_dtype(self, num_elements, dtype):
        n = check_int(type(self).__name__, "num_elements", num_elements, minimum=0,
                      maximum=2**31 - 1)
        return n, self._check_dtype(dtype)

    def _flat(self, flat):
        flat = tf.convert_to_tensor(flat)
        self._check_dtype(flat.dtype)
        n = flat.shape.num_elements()
        if n is None:
            raise ValueError(
                f"Compressor {self._describe()} needs a buffer of static size (payload "
                f"shapes must be equal on every replica); received shape {flat.shape}.")
        return tf.reshape(flat, [n]), n

    def _check_payload(self, payload, n, dtype, world_size):
        specs = self.payload_spec(n, dtype)
        if isinstance(payload, tf.Tensor) or len(payload) != len(specs):
            raise ValueError(
                f"Compressor {self._describe()} expects a payload tuple of {len(specs)} "
                f"tensor(s) {[s.dtype.name for s in specs]}; received {payload!r}.")
        payload = tuple(tf.convert_to_tensor(t) for t in payload)
        for i, (tensor, spec) in enumerate(zip(payload, specs)):
            expected = [world_size * spec.shape[0]]
            if tensor.dtype != spec.dtype or not tensor.shape.is_compatible_with(expected):
                raise ValueError(
                    f"Payload tensor {i} of {self._describe()} for {n} elements of "
                    f"{dtype.name} (world_size={world_size}) must be {spec.dtype.name} "
                    f"of shape {expected}; received {tensor.dtype.name} of shape "
                    f"{tensor.shape}.")
        return payload

    def _decode_seed(self, seed):
        if not self.shared_seed:
            return None
        if seed is None:
            raise ValueError(
                f"Compressor {self._describe()} derives its indices from the seed: pass "
                f"the seed given to compress(), e.g. decompress(payload, n, dtype, "
                f"seed=seed).")
        return as_seed(seed)


class RatioCompressor(PayloadCompressor):
    """A compressor that sends k = max(1, round(ratio * n)) of a buffer's n elements.

    Subclasses are dataclasses with a `ratio` field (validated here).
    """

    def __post_init__(self):
        super().__post_init__()
        check_ratio(type(self).__name__, "ratio", self.ratio)

    def k(self, num_elements):
        """Elements sent for a buffer of n: max(1, round(ratio * n)), 0 if n == 0."""
        return ops.k_for_ratio(num_elements, self.ratio)


@COMPRESSORS.register("none")
@dataclasses.dataclass(frozen=True)
class NoCompression(PayloadCompressor):
    """Sends dense gradients unchanged (the default). Payload: (flat,)."""

    def payload_spec(self, num_elements, dtype):
        return (tf.TensorSpec([num_elements], tf.as_dtype(dtype)),)

    def _compress(self, flat, n, seed):
        return (flat,)

    def _decompress(self, payload, n, dtype, seed):
        return payload[0]
