"""Which elements of each weight each replica's optimizer owns, and the buckets the
step moves them in (pure).

Every weight is cut into `world` equal blocks (the last padded with zeros):
replica r owns block r of every weight, so its shard is one block per weight,
in the weights' order, and every weight is gathered whole from one block of
each replica. Several small weights travel together in a bucket, laid out
rank-major (block 0 of each, then block 1 of each, ...): a bucket's
reduce-scatter leaves replica r its blocks, and its all-gather of the
replicas' blocks is the bucket's weights.
"""

import dataclasses
from typing import List, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Partition:
    """The weights, each cut into `world` equal blocks.

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

    def block(self, index: int) -> int:
        """Elements of each of weight `index`'s blocks: ceil(size / world)."""
        return -(-self.sizes[index] // self.world)

    @property
    def shard(self) -> int:
        """Elements per replica: one block of every weight."""
        return sum(self.block(i) for i in range(len(self.sizes)))

    @property
    def padded(self) -> int:
        """Elements of all replicas' shards together (the weights and their padding)."""
        return self.shard * self.world

    def pieces(self, rank: int) -> List[Tuple[int, int, int]]:
        """(weight index, start, stop) of replica `rank`'s block of every weight, in order.

        A block past a weight's end is empty (start == stop) and the part of a
        block past it is padding: replica `rank`'s block of weight i holds
        `block(i)` elements, stop - start of them real.
        """
        if not 0 <= rank < self.world:
            raise ValueError(f"rank={rank!r}: must be in [0, {self.world})")
        return [(i, *self.piece(rank, i)) for i in range(len(self.sizes))]

    def piece(self, rank: int, index: int) -> Tuple[int, int]:
        """(start, stop) of replica `rank`'s block within weight `index` (`pieces`)."""
        size, width = self.sizes[index], self.block(index)
        return min(rank * width, size), min((rank + 1) * width, size)

    def owned(self, rank: int) -> int:
        """Elements of real weights (not padding) in replica `rank`'s shard."""
        return sum(hi - lo for _, lo, hi in self.pieces(rank))

    def buckets(self, max_elements: int) -> List[List[int]]:
        """Consecutive weights grouped so that each group's blocks of all replicas hold
        at most `max_elements` (a larger weight is a group alone); every weight once."""
        groups, current, held = [], [], 0
        for i in range(len(self.sizes)):
            size = self.block(i) * self.world
            if current and held + size > max_elements:
                groups.append(current)
                current, held = [], 0
            current.append(i)
            held += size
        return groups + ([current] if current else [])
