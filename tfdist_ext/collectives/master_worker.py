r"""Master-worker all-reduce: everyone sends to rank 0, rank 0 sends the sum back.

Reference: the parameter-server pattern (M. Li et al., "Scaling Distributed
Machine Learning with the Parameter Server", OSDI 2014) with a single server;
the flat "gather then broadcast" baseline of Thakur, Rabenseifner, Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005.

Round 0: every rank r > 0 sends its whole buffer to rank 0, which adds the
buffers in rank order (1, 2, ..., p-1). Round 1: rank 0 sends the sum to every
rank, which copies it. The sum is computed once, so all ranks end
bit-identical.

Tuning: only 2 rounds, but rank 0 receives and sends (p-1) full buffers, so its
link is p-1 times busier than in ring. Use for tiny messages on few ranks, or
as a reference baseline; never for large buffers.

    p = 5:      1   2
                 \ /
            3 --- 0 --- 4     round 0: all -> 0 (add), round 1: 0 -> all (copy)
"""

from tfdist_ext.collectives.schedule import (
    Recv,
    Round,
    Send,
    register_schedule,
)


def _rounds(p: int, rank: int, n: int) -> tuple[Round, ...]:
    if rank == 0:
        gather = tuple(Recv(peer, 0, n, True) for peer in range(1, p))
        scatter = tuple(Send(peer, 0, n) for peer in range(1, p))
        return (gather, scatter)
    return ((Send(0, 0, n),), (Recv(0, 0, n, False),))


schedule = register_schedule("master_worker", _rounds, "MasterWorker")
