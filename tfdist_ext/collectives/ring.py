"""Ring all-reduce: reduce-scatter then all-gather around a ring.

Reference: P. Patarasuk, X. Yuan, "Bandwidth optimal all-reduce algorithms
for clusters of workstations", J. Parallel Distrib. Comput. 69(2), 2009.

The buffer is cut into p near-equal chunks (sizes differ by at most one).
Reduce-scatter, rounds 0 .. p-2: rank r sends chunk (r - s) mod p to r + 1 and
adds chunk (r - s - 1) mod p received from r - 1; afterwards rank r owns the
full sum of chunk (r + 1) mod p. All-gather, p - 1 more rounds: the finished
chunks travel once more around the ring and are copied.

Each element is reduced once along one chain and then copied, so all ranks
end bit-identical.

Tuning: 2(p-1) rounds but only 2(p-1)/p of the buffer leaves each rank, the
bandwidth optimum, on any p. Best for large buffers; its latency term grows
linearly with p, so prefer butterfly or tree for small messages.

    p = 4:     0 ---> 1
               ^      |
               |      v
               3 <--- 2
"""

from tfdist_ext.collectives.schedule import (
    Round,
    register_schedule,
    recv,
    send,
    split,
)


def _rounds(p: int, rank: int, n: int) -> tuple[Round, ...]:
    chunks = split(0, n, p)
    right, left = (rank + 1) % p, (rank - 1) % p
    rounds = []
    for s in range(p - 1):  # reduce-scatter
        out, inc = chunks[(rank - s) % p], chunks[(rank - s - 1) % p]
        rounds.append(send(right, *out) + recv(left, *inc, reduce=True))
    for s in range(p - 1):  # all-gather
        out, inc = chunks[(rank + 1 - s) % p], chunks[(rank - s) % p]
        rounds.append(send(right, *out) + recv(left, *inc, reduce=False))
    return tuple(rounds)


schedule = register_schedule("ring", _rounds, "Ring")
