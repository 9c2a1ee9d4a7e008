"""Round-robin all-reduce: ranks take turns adding to one travelling buffer.

Our definition (there is no single standard one): the unpipelined, unchunked
chain baseline, i.e. a ring all-reduce with one chunk instead of p. It is the
"sequential" reduction that pipelined rings improve upon (P. Patarasuk,
X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 69(2), 2009, discuss why chunking and pipelining matter).

Reduce, rounds 0 .. p-2: in round k rank k sends its whole (partial-sum)
buffer to rank k + 1, which adds it; the running sum travels 0 -> 1 -> ... ->
p-1 and each rank adds its own contribution in turn. Broadcast, rounds p-1 ..
2p-3: the final sum continues around the ring, p-1 -> 0 -> 1 -> ... -> p-2,
and each rank copies it. One rank is busy per round.

The sum is computed once, along one chain, then copied: all ranks end
bit-identical.

Tuning: 2(p-1) rounds, each moving the whole buffer: the slowest algorithm for
large buffers and for many ranks. Use it only as a baseline to measure the
others against, or for p = 2.

    p = 4:   reduce:     0 -(+)-> 1 -(+)-> 2 -(+)-> 3
             broadcast:  3 -(=)-> 0 -(=)-> 1 -(=)-> 2
"""

from tfdist_ext.collectives.schedule import (
    Recv,
    Round,
    Send,
    register_schedule,
)


def _rounds(p: int, rank: int, n: int) -> tuple[Round, ...]:
    rounds = []
    for k in range(2 * (p - 1)):
        sender = k % p  # the buffer keeps going around: 0, 1, ..., p-1, 0, ...
        receiver = (sender + 1) % p
        if rank == sender:
            rounds.append((Send(receiver, 0, n),))
        elif rank == receiver:
            rounds.append((Recv(sender, 0, n, reduce=k < p - 1),))
        else:
            rounds.append(())
    return tuple(rounds)


schedule = register_schedule("round_robin", _rounds, "RoundRobin")
