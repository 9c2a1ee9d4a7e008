"""Fold-in / fold-out: run a power-of-two algorithm on any number of ranks.

Reference: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005 (all-reduce on a
number of processes that is not a power of two).

With p ranks and p' the largest power of two <= p, the first ``2 * (p - p')``
ranks pair up (0,1), (2,3), ...: in the fold-in round each odd rank sends its
whole buffer to its even partner, which adds it. The p' remaining ranks (the
even ones of the pairs and every rank >= 2 * (p - p')) run the power-of-two
algorithm as virtual ranks 0 .. p'-1; the odd ranks sit idle (empty rounds).
In the fold-out round each even partner sends the result back (copy).
Cost: two extra rounds that move the whole buffer, so prefer ring for large
buffers on non-powers of two.

    p = 6, p' = 4: ranks 0-3 pair up, ranks 4 and 5 join the core directly.

    fold-in    0 <-(+)- 1     2 <-(+)- 3     4        5
    core       v0             v1             v2       v3   (p' = 4 algorithm)
    fold-out   0 --(=)> 1     2 --(=)> 3     4        5
"""

import dataclasses

from tfdist_ext.collectives.schedule import Recv, Round, RoundsFn, Send


def fold(world_size: int, rank: int, num_elements: int,
         core: RoundsFn) -> tuple[Round, ...]:
    """Rounds of `rank` for `core` folded onto `world_size` ranks.

    Args:
        world_size: Number of ranks, any positive integer.
        rank: This rank.
        num_elements: Buffer length.
        core: ``core(p2, virtual_rank, num_elements)`` -> rounds whose peers
            are virtual ranks, for a power of two ``p2``; it must return the
            same number of rounds for every virtual rank.
    """
    p2 = 1 << (world_size.bit_length() - 1)
    extra = world_size - p2
    n = num_elements

    def real(virtual: int) -> int:
        return 2 * virtual if virtual < extra else virtual + extra

    if rank < 2 * extra and rank % 2:  # folded away: idle during the core
        idle = ((),) * len(core(p2, 0, n))
        return ((Send(rank - 1, 0, n),),) + idle + ((Recv(rank - 1, 0, n, False),),)
    virtual = rank // 2 if rank < 2 * extra else rank - extra
    rounds = tuple(
        tuple(dataclasses.replace(step, peer=real(step.peer)) for step in rnd)
        for rnd in core(p2, virtual, n))
    if extra == 0:
        return rounds
    if rank < 2 * extra:
        return ((Recv(rank + 1, 0, n, True),),) + rounds + ((Send(rank + 1, 0, n),),)
    return ((),) + rounds + ((),)
