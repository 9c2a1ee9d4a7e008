"""Which elements of the flattened weights each replica's optimizer owns (pure)."""

import dataclasses
from typing import List, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Partition:
    """The weights, flattened in order and padded, cut into `world` equal shards.

    Attributes:
        sizes: Elements of each weight, in the optimizer's order.
        world: Replicas sharing the state (N).
    """

    sizes: Tuple[int, ...]
    world: int

    @classmethod
    def of(cls, sizes: Sequence[int], world: int) -> "Partition":
        if world < 1:
            raise ValueError(f"world={world!r}: must be >= 1")
        if any(s < 0 for s in sizes):
            raise ValueError(f"sizes={list(sizes)!r}: must be >= 0")
        return cls(tuple(int(s) for s in sizes), int(world))

    @property
    def total(self) -> int:
        """Elements of all weights."""
        return sum(self.sizes)

    @property
    def shard(self) -> int:
        """Elements per replica: ceil(total / world), at least 1."""
        return max(1, -(-self.total // self.world))

    @property
    def padded(self) -> int:
        """Elements of the flat buffer cut into shards (zeros after `total`)."""
        return self.shard * self.world

    def bounds(self, rank: int) -> Tuple[int, int]:
        """[start, stop) of replica `rank`'s shard within the padded buffer."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank={rank!r}: must be in [0, {self.world})")
        return rank * self.shard, (rank + 1) * self.shard

    def pieces(self, rank: int) -> List[Tuple[int, int, int]]:
        """(weight index, start, stop) of the flattened weights in `rank`'s shard, in order."""
        start, stop = self.bounds(rank)
        out, offset = [], 0
        for index, size in enumerate(self.sizes):
            lo, hi = max(start, offset), min(stop, offset + size)
            if lo < hi:
                out.append((index, lo - offset, hi - offset))
            offset += size
        return out

    def owned(self, rank: int) -> int:
        """Elements of real weights (not padding) in replica `rank`'s shard."""
        start, stop = self.bounds(rank)
        return max(0, min(stop, self.total) - start)
