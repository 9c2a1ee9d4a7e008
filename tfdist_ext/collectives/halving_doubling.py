"""Rabenseifner's all-reduce: recursive halving, then recursive doubling.

References: R. Rabenseifner, "Optimization of Collective Reduction Operations",
ICCS 2004; R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005.

Reduce-scatter by recursive halving: in round k (distance d = p/2, p/4, ..., 1)
rank r and r XOR d split their current range in two, each sends the half the
other keeps and adds the half it receives. After log2(p) rounds rank r owns
the full sum of 1/p of the buffer (segment r). All-gather by recursive doubling
replays the exchanges in reverse order, copying. Uneven splits are fine: both
partners split the same range the same way.

Each element is reduced once (on its owner's path) and then copied, so all
ranks end bit-identical. Non-powers of two use fold-in/fold-out (`fold.py`):
the first 2(p - p') ranks pair up, odd ranks hand their whole buffer to their
even partner first and get the result back at the end: 2 floor(log2 p) + 2
rounds.

Tuning: bandwidth-optimal like ring (2(p-1)/p of the buffer per rank) with
only 2 log2(p) rounds, so it is the best choice for medium and large buffers on
powers of two. The fold rounds move the whole buffer, so on other world sizes
ring usually wins for large buffers.

    p = 4, buffer [A B C D]:
    halving d=2:  0 <-> 2, 1 <-> 3   keep [A B] on 0,1   [C D] on 2,3
    halving d=1:  0 <-> 1, 2 <-> 3   rank r owns segment r fully reduced
    doubling d=1: 0 <-> 1, 2 <-> 3   copy: [A B] on 0,1  [C D] on 2,3
    doubling d=2: 0 <-> 2, 1 <-> 3   copy: everyone has [A B C D]
"""

from tfdist_ext.collectives.fold import fold
from tfdist_ext.collectives.schedule import (
    Round,
    register_schedule,
    recv,
    send,
    split,
)


def _core(p: int, rank: int, n: int) -> tuple[Round, ...]:
    """Rabenseifner on a power of two `p`."""
    steps = []  # (peer, kept range, given range) per halving round
    lo, hi = 0, n
    distance = p // 2
    while distance:
        lower, upper = split(lo, hi, 2)
        keep, give = (lower, upper) if rank & distance == 0 else (upper, lower)
        steps.append((rank ^ distance, keep, give))
        lo, hi = keep
        distance //= 2
    halving = [send(peer, *give) + recv(peer, *keep, reduce=True)
               for peer, keep, give in steps]
    doubling = [send(peer, *keep) + recv(peer, *give, reduce=False)
                for peer, keep, give in reversed(steps)]
    return tuple(halving + doubling)


def _rounds(p: int, rank: int, n: int) -> tuple[Round, ...]:
    return fold(p, rank, n, _core)


schedule = register_schedule("halving_doubling", _rounds, "HalvingDoubling")
