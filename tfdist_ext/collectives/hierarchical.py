r"""Hierarchical all-reduce: reduce inside each host, all-reduce among host leaders, broadcast.

Reference: the two-level scheme of NCCL's and Horovod's hierarchical all-reduce
(A. Sergeev, M. Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", 2018, `HOROVOD_HIERARCHICAL_ALLREDUCE`); R. Thakur, R. Rabenseifner,
W. Gropp, IJHPCA 2005, for the building blocks.

Ranks are grouped into hosts (`hosts[r]` is rank r's host id); the lowest rank of
each host is its leader. Three phases, in lock-step rounds like every schedule:

    1. gather: every other rank of a host sends its whole buffer to the leader,
       which adds them in rank order (one round);
    2. the leaders all-reduce among themselves with any flat algorithm (`inter`,
       run on the H leaders as ranks 0..H-1 in host order); the other ranks idle;
    3. broadcast: each leader sends the sum to the ranks of its host (one round).

Only phase 2 crosses hosts, once per host, so a host's uplink carries
2 (H-1)/H of the buffer each way (ring; one full buffer for 2 hosts), whatever the number of
workers per host. A flat ring over P = H x W ranks carries 2 (P-1)/P of it per
crossing, and with ranks numbered host by host each host link is crossed once
per round each way: 1.5x the hierarchical volume for 2x2, 1.67x for 2x3, and
far more when ranks are interleaved across hosts.

Large buffers are cut into chunks that flow through the phases as a pipeline
(`chunk_elements`, `max_chunks`), so the gather and broadcast inside a host
overlap the leaders' exchange of other chunks.

Tuning: worth it when links between hosts are much slower than inside them (the
namespaces of `tfdist-run -H HxW`, machines on one switch vs across a WAN). The
leader's gather and broadcast move W-1 whole buffers over the host's own fast
path; on hosts with one worker the schedule is just `inter`. `inter="auto"`
picks the leaders' algorithm as for a flat all-reduce of H ranks; name one to
fix it. All ranks end bit-identical: the leaders by `inter`'s contract, the
others by copying.

    hosts = (0, 0, 1, 1), inter = ring:

        host 0: 1 -> 0     leaders: 0 <-> 2 (ring of 2)     0 -> 1
        host 1: 3 -> 2                                        2 -> 3
"""

import dataclasses
import functools
from typing import List, Tuple

from tfdist_ext.collectives import cost
from tfdist_ext.collectives.schedule import (
    ALGORITHMS,
    Recv,
    Round,
    Schedule,
    Send,
    build,
    schedule_fn,
    split,
)
from tfdist_ext.registry import positive_int

NAME = "hierarchical"


def host_groups(hosts: Tuple[int, ...]) -> Tuple[Tuple[int, ...], ...]:
    """Ranks of each host, hosts ordered by their lowest rank.

    Example:
        >>> host_groups((1, 0, 1, 0))
        ((0, 2), (1, 3))
    """
    groups = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    return tuple(sorted(tuple(g) for g in groups.values()))


def hosts_from_addresses(addresses, replicas_per_worker: int = 1) -> Tuple[int, ...]:
    """Host id of every rank from the workers' "host:port" addresses (TF_CONFIG).

    Workers whose addresses share the host part are one host; rank
    ``w * replicas_per_worker + i`` is local replica i of worker w.

    Example:
        >>> hosts_from_addresses(["10.0.0.1:5000", "10.0.0.1:5001", "10.0.0.2:5000"])
        (0, 0, 1)
    """
    ids = {}
    per_worker = [ids.setdefault(a.rsplit(":", 1)[0], len(ids)) for a in addresses]
    return tuple(h for h in per_worker for _ in range(replicas_per_worker))


# Links between hosts for inter="auto": 100 us per message, 1 Gbit/s, 4 GB/s adds.
# Only the ranking matters; it changes little over typical inter-host links.
INTER_MODEL = cost.CostModel(alpha=1e-4, beta=1 / 1.25e8, gamma=1 / 4e9)


@functools.lru_cache(maxsize=1024)
def _best_inter(num_hosts: int, num_elements: int) -> str:
    return cost.best_algorithm(None, num_hosts, 4 * num_elements, 4, INTER_MODEL)[0]


@dataclasses.dataclass(frozen=True)
class Hierarchical:
    """The hierarchical all-reduce for one host layout.

    Args:
        hosts: Host id of every rank, in rank order (any hashable ids; ranks
            with equal ids share a host). `hosts_from_addresses` builds it from
            TF_CONFIG.
        inter: Registered flat algorithm the host leaders run among themselves,
            or "auto" (the default): per chunk, the algorithm the flat cost
            model (`INTER_MODEL`) ranks fastest for the leaders, e.g. a single
            full exchange for two hosts (as few rounds as the ring's bytes),
            the ring for large chunks on more hosts.
        chunk_elements: Buffers of at least twice this many elements are cut
            into chunks of about this size (at most `max_chunks`) that flow
            through the three phases as a pipeline: while the leaders exchange
            chunk c, the next chunk is gathered and the previous one
            broadcast, so the phases inside a host hide behind the slow links.
            Smaller chunks hide more but add rounds (one per extra chunk).
        max_chunks: Upper bound on the pipeline's chunks.
    """

    hosts: Tuple[int, ...]
    inter: str = "auto"
    chunk_elements: int = 1 << 18
    max_chunks: int = 8
    name = NAME

    def __post_init__(self):
        object.__setattr__(self, "hosts", tuple(self.hosts))
        if not self.hosts:
            raise ValueError("Argument `hosts` must give the host of every rank; received "
                             "an empty layout.")
        if self.inter != "auto":
            ALGORITHMS.class_for(self.inter)  # unknown names list the valid ones
        positive_int("chunk_elements", self.chunk_elements)
        positive_int("max_chunks", self.max_chunks)

    def schedule(self, world_size: int, rank: int, num_elements: int) -> Schedule:
        if world_size != len(self.hosts):
            raise ValueError(
                f"The hierarchical layout `hosts` has {len(self.hosts)} ranks "
                f"({self.hosts}) but the all-reduce has world_size={world_size}; give "
                f"the host of every rank.")
        return build(world_size, rank, num_elements, self._rounds)

    def _rounds(self, p: int, rank: int, n: int) -> Tuple[Round, ...]:
        del p
        chunks = max(1, min(self.max_chunks, n // self.chunk_elements))
        groups = host_groups(self.hosts)
        rounds = []
        for c, (start, stop) in enumerate(split(0, n, chunks)):
            for s, steps in enumerate(self._phases(groups, rank, start, stop)):
                while len(rounds) <= c + s:
                    rounds.append(())
                rounds[c + s] += steps
        return tuple(rounds)

    def parts(self) -> Tuple[Tuple[str, int], ...]:
        """(algorithm, world size) of what this schedule runs inside it: the named
        `inter` on the host leaders (`verify.before_use` simulates it when it was
        written outside tfdist_ext; "auto" picks only built-in algorithms)."""
        if self.inter == "auto":
            return ()
        return ((self.inter, len(host_groups(self.hosts))),)

    def inter_algorithm(self, num_hosts: int, num_elements: int) -> str:
        """The flat algorithm the leaders run on a chunk of `num_elements`."""
        if self.inter != "auto":
            return self.inter
        return _best_inter(num_hosts, max(num_elements, 1))

    def _phases(self, groups, rank: int, start: int, stop: int) -> List[Round]:
        """The unpipelined rounds of `rank` for ``buf[start:stop]`` (`groups`: from
        `host_groups`)."""
        mine = next(g for g in groups if rank in g)
        leader, members = mine[0], mine[1:]
        leaders = [g[0] for g in groups]
        n = stop - start
        inter_fn = schedule_fn(self.inter_algorithm(len(groups), n))
        if rank == leader:
            gather = tuple(Recv(m, start, stop, True) for m in members)
            inter = [tuple(dataclasses.replace(step, peer=leaders[step.peer],
                                               start=start + step.start, stop=start + step.stop)
                           for step in rnd)
                     for rnd in inter_fn(len(groups), leaders.index(rank), n).rounds]
            broadcast = tuple(Send(m, start, stop) for m in members)
        else:
            gather, broadcast = (Send(leader, start, stop),), (Recv(leader, start, stop, False),)
            inter = [()] * len(inter_fn(len(groups), 0, n).rounds)
        if all(len(g) == 1 for g in groups):  # no host has a second rank: just `inter`
            return inter
        return [gather, *inter, broadcast]
