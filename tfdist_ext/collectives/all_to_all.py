r"""All-to-all ("direct", two-shot) all-reduce: every rank talks to every rank.

References: the reduce-scatter + all-gather decomposition of R. Rabenseifner,
"Optimization of Collective Reduction Operations", ICCS 2004, with each phase
done as one direct all-to-all exchange instead of log2(p) halving steps; the
same pattern as the "two-shot" all-reduce of TensorRT-LLM and PyTorch
symmetric memory.

The buffer is cut into p near-equal chunks; rank r owns chunk r.
Round 0 (reduce-scatter): every rank sends chunk j to rank j, for all j != r;
rank r adds the p-1 pieces of chunk r it receives, in rank order.
Round 1 (all-gather): rank r sends its finished chunk r to every other rank,
which copies it.

Why two rounds and not the "one-shot" variant (send the whole buffer to
everyone, everyone sums locally, 1 round)? In this schedule model a rank adds
received data into its own buffer, so rank r's sum always starts from its own
contribution: x_r + x_a + x_b + ... . Float addition is not associative, so for
p >= 3 no receive order makes that expression identical on all ranks, and the
engines require bit-identical replicas. Here each chunk is reduced on exactly
one rank and then copied, so all ranks end bit-identical (the simulator checks
this for float dtypes too).

Tuning: bandwidth-optimal (2(p-1)/p of the buffer leaves each rank) in only 2
rounds, but each rank exchanges p-1 concurrent messages per round, so on real
networks per-message overheads and incast grow with p. Best for small to medium
world sizes on a full-bisection switch (one node, NVLink/NVSwitch, a single
top-of-rack switch). The alpha-beta-gamma model charges alpha per round, not
per message, so it flatters this algorithm at large p.

    p = 4, round 0 and round 1 use the same full mesh:
            0 ----- 1
            | \   / |
            |   X   |
            | /   \ |
            3 ----- 2
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
    peers = [peer for peer in range(p) if peer != rank]
    mine = chunks[rank]
    scatter = [step for peer in peers for step in send(peer, *chunks[peer])]
    scatter += [step for peer in peers for step in recv(peer, *mine, reduce=True)]
    gather = [step for peer in peers for step in send(peer, *mine)]
    gather += [step for peer in peers
               for step in recv(peer, *chunks[peer], reduce=False)]
    return (tuple(scatter), tuple(gather))


schedule = register_schedule("all_to_all", _rounds, "AllToAll")
