"""All-gather, reduce-scatter and broadcast as schedules, for the UCX engine.

Both use the `Schedule` contract of `schedule.py`, so the simulator checks
them like any all-reduce.

All-gather (ring, Patarasuk & Yuan 2009): the buffer holds p blocks of n
elements, rank r's own data in block r. In round s rank r forwards block
(r - s) mod p to r + 1 and receives block (r - s - 1) mod p from r - 1;
after p - 1 rounds every rank has every block. Bandwidth-optimal: each rank
sends (p - 1) n elements.

Reduce-scatter (ring, the first half of the ring all-reduce): the buffer
holds p blocks of n elements; in round s rank r sends block (r - s - 1) mod p
to r + 1 and adds block (r - s - 2) mod p received from r - 1; after p - 1
rounds rank r holds the sum of block r over every rank (ZeRO stage 2:
each rank's own shard of the summed gradient). Each rank sends (p - 1) n.

Broadcast (binomial tree): with v = (rank - root) mod p, in round k the ranks
v < 2^k send the whole buffer to v + 2^k. ceil(log2 p) rounds.

    p = 5, root 0:   round 0: 0->1   round 1: 0->2, 1->3   round 2: 0->4
"""

from tfdist_ext.collectives.schedule import Schedule, recv, send


def _ring(world_size: int, rank: int, block: int, first: int, reduce: bool) -> Schedule:
    """p - 1 ring rounds over p blocks: in round s rank r sends block (r - s + first)
    mod p to r + 1 and receives block (r - s + first - 1) mod p from r - 1."""
    p, total = world_size, world_size * block
    if p == 1 or block == 0:
        return Schedule(rank, p, total, ())
    right, left = (rank + 1) % p, (rank - 1) % p
    rounds = []
    for s in range(p - 1):
        out, inc = (rank - s + first) % p, (rank - s + first - 1) % p
        rounds.append(send(right, out * block, (out + 1) * block)
                      + recv(left, inc * block, (inc + 1) * block, reduce=reduce))
    return Schedule(rank, p, total, tuple(rounds))


def all_gather_schedule(world_size: int, rank: int, block: int) -> Schedule:
    """Ring all-gather of `world_size` blocks of `block` elements."""
    return _ring(world_size, rank, block, first=0, reduce=False)


def reduce_scatter_schedule(world_size: int, rank: int, block: int) -> Schedule:
    """Ring reduce-scatter of `world_size` blocks of `block` elements: rank r sums block r."""
    return _ring(world_size, rank, block, first=-1, reduce=True)


def broadcast_schedule(world_size: int, rank: int, num_elements: int, root: int = 0) -> Schedule:
    """Binomial-tree broadcast of `num_elements` from `root`."""
    p = world_size
    if not 0 <= root < p:
        raise ValueError(f"Argument `root` must be a rank in [0, {p}); received {root!r}.")
    if p == 1 or num_elements == 0:
        return Schedule(rank, p, num_elements, ())
    v = (rank - root) % p
    rounds, k = [], 1
    while k < p:
        step = ()
        if v < k and v + k < p:
            step = send((v + k + root) % p, 0, num_elements)
        elif k <= v < 2 * k:
            step = recv((v - k + root) % p, 0, num_elements, reduce=False)
        rounds.append(step)
        k *= 2
    return Schedule(rank, p, num_elements, tuple(rounds))
