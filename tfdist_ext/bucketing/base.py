"""Bucketing planners: how gradients are grouped into fused reductions.

`None` (the default) reduces all gradients of a dtype as one fused buffer.
"""

import dataclasses

from tfdist_ext.registry import Registry, positive_int

PLANNERS = Registry("bucketing")


class Planner:
    """Base class of all bucketing planners (frozen dataclasses)."""


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


def get(identifier):
    """A planner from a name, dict or instance; None means one bucket."""
    return PLANNERS.get(identifier)
