r"""Binomial-tree all-reduce: reduce to rank 0, then broadcast from rank 0.

Reference: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005 (binomial reduce and
broadcast).

Reduce, rounds k = 0 .. ceil(log2 p) - 1 (distance d = 2^k): every rank r with
r mod 2d == d sends its whole buffer to r - d, which adds it. Rank 0 then
holds the sum. Broadcast replays the tree top-down (d = 2^(K-1) .. 1), copying.
Works for any p without folding: missing children are simply skipped.

The sum is computed once, at the root, then copied, so all ranks end
bit-identical.

Tuning: 2 ceil(log2 p) rounds, each moving the whole buffer; the root's link is
the bottleneck. Good for small messages on non-powers of two (no fold rounds);
butterfly needs half the rounds on powers of two, and ring or halving_doubling
win for large buffers.

    p = 5, reduce (broadcast runs the arrows backwards):

            0          round 2: 4 -> 0
          / | \        round 1: 2 -> 0
         1  2  4       round 0: 1 -> 0, 3 -> 2
            |
            3
"""

from tfdist_ext.collectives.schedule import (
    Recv,
    Round,
    Send,
    register_schedule,
)


def _rounds(p: int, rank: int, n: int) -> tuple[Round, ...]:
    distances = [1 << k for k in range((p - 1).bit_length())]
    reduce, broadcast = [], []
    for d in distances:
        if rank % (2 * d) == d:
            reduce.append((Send(rank - d, 0, n),))
            broadcast.append((Recv(rank - d, 0, n, False),))
        elif rank % (2 * d) == 0 and rank + d < p:
            reduce.append((Recv(rank + d, 0, n, True),))
            broadcast.append((Send(rank + d, 0, n),))
        else:
            reduce.append(())
            broadcast.append(())
    return tuple(reduce + broadcast[::-1])


schedule = register_schedule("tree", _rounds, "Tree")
