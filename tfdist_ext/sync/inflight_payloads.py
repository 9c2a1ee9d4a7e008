"""Compressed rounds for the policies that hold a reduction in flight (SSP, DGA).

A round started at step t is summed while later steps compute and is read at
step t + d, so it must be one all-reduce of tensors fixed at step t: the
compressor must be a reducible payload compressor (fp16, bf16, random-k with
its shared seed). Each gradient buffer becomes its payload (with error
feedback when the compressor keeps it: the residual is per replica and
buffer, under the key ``inflight_b<k>_<dtype>_<n>``, so checkpoints carry it),
the payloads travel instead of the buffers, and the sum and this replica's own
contribution are decompressed d steps later with the seed of step t.

With error feedback the pipelined update stays consistent: a replica applies
its full gradient locally and later swaps what it actually sent for the sum
of what everyone sent, so the unsent residual is applied locally until a later
round sends it, then exchanged like the rest.
"""

import tensorflow as tf

from tfdist_ext.compression import NoCompression, PayloadCompressor, compress_with_feedback
from tfdist_ext.compression.transport import buffer_seed


def check(policy_name, compressor):
    """Raises ValueError unless `compressor` can travel in an in-flight round."""
    if isinstance(compressor, NoCompression):
        return
    name = getattr(compressor, "name", type(compressor).__name__)
    if not (isinstance(compressor, PayloadCompressor) and compressor.reducible):
        raise ValueError(
            f"Arguments `sync` and `compression` conflict: sync={policy_name!r} holds each "
            f"step's gradient all-reduce in flight, which takes one-round reducible "
            f"compressors ('fp16', 'bf16', 'randomk'); compression={name!r} needs "
            f"{'two all-reduces' if name == 'powersgd' else 'an all-gather'} per step. Use "
            f"one of those, or sync='sync' with compression={name!r}.")
    if compressor.momentum:
        raise ValueError(
            f"Arguments `sync` and `compression` conflict: sync={policy_name!r} applies "
            "gradients steps late, to which DGC momentum correction (compression momentum="
            f"{compressor.momentum!r}) does not apply. Set it to 0.")


class Payloads:
    """Compresses a step's buffers into wire tensors and decompresses rounds.

    Args:
        compressor: A reducible `PayloadCompressor` (or "none": identity).
        state: The strategy's `StrategyState` (residuals).
        first_rank: Global rank of local replica 0.
    """

    def __init__(self, compressor, state, first_rank):
        self.compressor = compressor
        self.state = state
        self.first_rank = first_rank
        self.active = not isinstance(compressor, NoCompression)
        self._specs = None  # per buffer: (key, num_elements, dtype, payload lengths)

    def compress(self, step, replica, buffers):
        """(wire tensors, residual updates) of this replica's buffers at `step`."""
        if not self.active:
            return list(buffers), []
        specs, wire, updates = [], [], []
        for k, flat in enumerate(buffers):
            n = flat.shape.num_elements()
            key = f"inflight_b{k}_{flat.dtype.name}_{n}"
            residual = (self.state.residual(key, replica, n, flat.dtype)
                        if self.compressor.error_feedback else None)
            seed = buffer_seed(self.compressor, key, step, self.first_rank + replica)
            payload, new_residual = compress_with_feedback(
                self.compressor, flat, None if residual is None else residual.read_value(),
                seed)
            if residual is not None:
                updates.append(residual.assign(new_residual))
            specs.append((key, n, flat.dtype, [t.shape.num_elements() for t in payload]))
            wire += list(payload)
        self._specs = specs
        return wire, updates

    def decompress(self, step, replica, wire):
        """The dense buffers of a round's wire tensors (a sum or one contribution).

        `wire` may hold tensors or numpy arrays (a drain); `step` is the round's.
        """
        if not self.active:
            return list(wire)
        out, i = [], 0
        for key, n, dtype, lengths in self._specs:
            payload = tuple(tf.convert_to_tensor(t) for t in wire[i:i + len(lengths)])
            i += len(lengths)
            seed = buffer_seed(self.compressor, key, step, self.first_rank + replica)
            out.append(self.compressor.decompress(payload, n, dtype, seed=seed))
        return out
