"""Butterfly (recursive doubling) all-reduce: full-buffer pairwise exchanges.

Reference: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005 (recursive doubling).

In round k, rank r and rank r XOR 2^k exchange their whole buffers and both
add what they receive; after log2(p) rounds every rank holds the sum. Each
round is one pairwise exchange-and-sum (a 2-member all-reduce for the graph
engine). Both partners compute a + b and b + a, which are bit-identical.

Non-powers of two use fold-in/fold-out (see `fold.py`): the first 2(p - p')
ranks pair up, odd ranks hand their buffer to their even partner before the
butterfly and get the result back after it: floor(log2 p) + 2 rounds.

Tuning: the fewest rounds of any full-exchange algorithm, log2(p), but every
round moves the whole buffer. Best for small messages (latency-bound, e.g.
scalars, metrics, small layers) on powers of two; prefer halving_doubling or
ring when the buffer is large.

    p = 4:   round 0           round 1
             0 <-> 1           0 <---> 2
             2 <-> 3           1 <---> 3
"""

from tfdist_ext.collectives.fold import fold
from tfdist_ext.collectives.schedule import (
    Recv,
    Round,
    Send,
    register_schedule,
)


def _core(p: int, rank: int, n: int) -> tuple[Round, ...]:
    """Recursive doubling on a power of two `p`."""
    peers = [rank ^ (1 << k) for k in range(p.bit_length() - 1)]
    return tuple((Send(peer, 0, n), Recv(peer, 0, n, True)) for peer in peers)


def _rounds(p: int, rank: int, n: int) -> tuple[Round, ...]:
    return fold(p, rank, n, _core)


schedule = register_schedule("butterfly", _rounds, "Butterfly")
