"""Bucketing planners: how gradients are grouped into fused reductions.

A planner is a frozen dataclass registered in `PLANNERS` whose `plan` is a pure
function of (gradient sizes in bytes, per-layer backward seconds, alpha, beta),
all in BACKWARD order (index 0 = the last layer's gradient, produced first),
returning a tuple of buckets, each a tuple of consecutive indices. Every rank
must plan identically, so pass them identical (broadcast) inputs.

`None` (the strategy's default) means one bucket of everything: all gradients
of a dtype are reduced as one fused buffer (`model.single_bucket`).
"""

import dataclasses

from tfdist_ext.bucketing.model import Plan, check_inputs
from tfdist_ext.registry import Registry, positive_int

PLANNERS = Registry("bucketing")


class Planner:
    """Base class of all bucketing planners (frozen dataclasses)."""

    #: Whether `plan` uses per-gradient backward times (the strategy profiles them).
    uses_backward_times = False

    def plan(self, sizes, backward_times, alpha, beta) -> Plan:
        """Buckets of consecutive gradient indices, in backward order.

        Args:
            sizes: Gradient sizes in bytes, backward order.
            backward_times: Seconds of each layer's backward (same order), or
                None when unknown (then every gradient counts as ready at 0).
            alpha: Seconds per message (e.g. `Calibration.alpha`).
            beta: Seconds per byte (e.g. `Calibration.beta`).

        Raises:
            ValueError: Negative or non-finite values, or lengths that differ.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement plan().")


@PLANNERS.register("fixed")
@dataclasses.dataclass(frozen=True)
class FixedSize(Planner):
    """Packs gradients, in backward order, into buckets of at most `bytes_per_bucket`.

    The Horovod / PyTorch DDP scheme (DDP's default bucket is 25 MiB). Smaller
    buckets start communicating earlier but pay the per-message latency more
    often; on slow links with few large layers prefer 25-64 MiB, on fast links
    with many small layers 1-4 MiB.

    Args:
        bytes_per_bucket: Maximum bucket size in bytes (a single larger tensor
            gets a bucket of its own). Defaults to 25 MiB.
    """

    bytes_per_bucket: int = 25 << 20

    def __post_init__(self):
        positive_int("bytes_per_bucket", self.bytes_per_bucket)

    def plan(self, sizes, backward_times=None, alpha=0.0, beta=0.0) -> Plan:
        """Greedy packing to the cap; times, alpha and beta are only validated."""
        sizes, _, _, _ = check_inputs(sizes, backward_times, alpha, beta)
        buckets, current, current_bytes = [], [], 0
        for i, size in enumerate(sizes):
            if current and current_bytes + size > self.bytes_per_bucket:
                buckets.append(tuple(current))
                current, current_bytes = [], 0
            current.append(i)
            current_bytes += size
        if current:
            buckets.append(tuple(current))
        return tuple(buckets)


def get(identifier):
    """A planner from a name, dict or instance; None means one bucket."""
    return PLANNERS.get(identifier)
