"""The alpha-beta-gamma cost of a schedule, computed from the schedule itself.

Reference: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005 (the alpha + n*beta +
n*gamma cost model).

Model: every rank has one full-duplex link (it can send and receive at full
speed at the same time, to any peers), rounds run in lock-step, so a round
lasts as long as its busiest rank:

    t(round) = alpha * max over ranks of max(messages sent, messages received)
             + beta  * max over ranks of max(bytes sent, bytes received)
             + gamma * max over ranks of bytes reduced (Recv with reduce=True)

and the total is the sum over the rounds in which any rank does anything.
Alpha is charged per message because each message is its own collective op
with its own start-up cost, so a master receiving p-1 messages in one round
pays (p-1) alpha: master_worker and all_to_all lose on small messages at large
world sizes, as they do in practice. Because costs come from the schedules, a
new algorithm needs no formula here. `two_level_cost` extends the model to ranks
grouped into hosts that share one link between hosts (hierarchical all-reduce).

Example:
    >>> model = CostModel(alpha=5e-6, beta=1 / 12.5e9, gamma=1 / 50e9)
    >>> best_algorithm(["ring", "tree"], 8, 64 << 20, 4, model)[0]
    'ring'
"""

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence

from tfdist_ext.collectives.schedule import (
    ALGORITHMS,
    Recv,
    Schedule,
    Send,
    all_schedules,
    schedule_fn,
)
from tfdist_ext.registry import positive_int

# Per non-empty round: (max messages on one rank's link, max elements on one
# rank's link, max elements reduced by one rank).
RoundStats = tuple[tuple[int, int, int], ...]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Cluster constants of the alpha-beta-gamma model (user-tuned or calibrated).

    Args:
        alpha: Seconds of start-up per message.
        beta: Seconds per byte on one rank's link (1 / bandwidth).
        gamma: Seconds per byte reduced (1 / reduction throughput).
    """

    alpha: float
    beta: float
    gamma: float

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise ValueError(
                    f"Argument `{field.name}` of CostModel must be a finite "
                    f"float >= 0 (seconds); received {value!r}.")
            object.__setattr__(self, field.name, float(value))


def _round_stats(schedules: Sequence[Schedule]) -> RoundStats:
    stats = []
    for i in range(len(schedules[0].rounds) if schedules else 0):
        messages = link = reduced = 0
        for s in schedules:
            sends = [x.stop - x.start for x in s.rounds[i] if isinstance(x, Send)]
            recvs = [x for x in s.rounds[i] if isinstance(x, Recv)]
            messages = max(messages, len(sends), len(recvs))
            link = max(link, sum(sends), sum(x.stop - x.start for x in recvs))
            reduced = max(reduced, sum(x.stop - x.start for x in recvs if x.reduce))
        if link:
            stats.append((messages, link, reduced))
    return tuple(stats)


def _seconds(stats: RoundStats, itemsize: int, model: CostModel) -> float:
    return sum(model.alpha * messages + model.beta * link * itemsize
               + model.gamma * reduced * itemsize for messages, link, reduced in stats)


@functools.lru_cache(maxsize=4096)
def cached_round_stats(name: str, world_size: int, num_elements: int) -> RoundStats:
    """Per round of `name`'s schedules: (messages, elements on the busiest link, elements
    reduced), the same on every rank's critical path (cached)."""
    return _round_stats(all_schedules(name, world_size, num_elements))


def schedule_cost(schedules: Sequence[Schedule], itemsize: int,
                  model: CostModel) -> float:
    """Modelled seconds of the schedules of all ranks (in rank order)."""
    positive_int("itemsize", itemsize)
    return _seconds(_round_stats(schedules), itemsize, model)


def predict(algorithm_name: str, world_size: int, num_bytes: int, itemsize: int,
            model: CostModel) -> float:
    """Modelled seconds to all-reduce `num_bytes` with a registered algorithm.

    Raises:
        ValueError: unknown name (the message lists valid ones), or
            `num_bytes` not a whole number of `itemsize`-byte elements.
    """
    ALGORITHMS.class_for(algorithm_name)
    positive_int("itemsize", itemsize)
    positive_int("num_bytes", num_bytes, minimum=0)
    if num_bytes % itemsize:
        raise ValueError(
            f"Argument `num_bytes` must be a multiple of `itemsize` "
            f"({itemsize}); received {num_bytes}.")
    stats = cached_round_stats(algorithm_name, world_size, num_bytes // itemsize)
    return _seconds(stats, itemsize, model)


def best_algorithm(candidates: Iterable[str] | None, world_size: int,
                   num_bytes: int, itemsize: int,
                   model: CostModel) -> tuple[str, float]:
    """The fastest candidate under `model`, and its modelled seconds.

    Args:
        candidates: Registered names to choose from; None means all of them.
        world_size, num_bytes, itemsize, model: as in `predict`.

    Returns:
        ``(name, seconds)``; ties go to the alphabetically first name, so
        every rank picks the same algorithm from the same inputs.
    """
    if candidates is None:
        candidates = ALGORITHMS.names()
    elif isinstance(candidates, str):
        candidates = [candidates]
    names = sorted(set(candidates))
    if not names:
        raise ValueError(
            f"Argument `candidates` must name at least one algorithm; valid "
            f"names: {', '.join(ALGORITHMS.names())}.")
    costs = [(predict(n, world_size, num_bytes, itemsize, model), n) for n in names]
    seconds, name = min(costs)
    return name, seconds


def two_level_cost(schedules: Sequence[Schedule], hosts: Sequence, itemsize: int,
                   intra: CostModel, inter: CostModel) -> float:
    """Modelled seconds of the schedules of all ranks when ranks share hosts.

    Two levels: inside a host every rank has its own link (`intra`'s alpha and
    beta, as in the flat model); between hosts each host has ONE link that all
    its ranks share (`inter`'s alpha and beta), as machines on a switch or the
    namespaces of `tfdist-run -H HxW`. A round lasts as long as the slower
    level, plus the reduction (`intra.gamma`):

        t(round) = max(intra.alpha * m_intra + intra.beta * b_intra,
                       inter.alpha * m_inter + inter.beta * b_host)
                 + intra.gamma * reduced

    with m_* the most messages one rank sends or receives at that level,
    b_intra the most bytes one rank moves inside its host and b_host the most
    bytes one host sends or receives across its link.

    Args:
        schedules: Every rank's schedule, in rank order.
        hosts: Host id of every rank (as `Hierarchical.hosts`).
        itemsize: Bytes per element.
        intra, inter: The two levels' constants.
    """
    positive_int("itemsize", itemsize)
    if len(hosts) != len(schedules):
        raise ValueError(f"Argument `hosts` must give the host of each of the "
                         f"{len(schedules)} ranks; received {len(hosts)}: {tuple(hosts)}.")
    total = 0.0
    for i in range(len(schedules[0].rounds) if schedules else 0):
        m_intra = m_inter = b_intra = reduced = 0
        out_of, into = {}, {}
        for s in schedules:
            me = hosts[s.rank]
            for outward in (True, False):
                steps = [x for x in s.rounds[i] if isinstance(x, Send) == outward]
                local = [x.stop - x.start for x in steps if hosts[x.peer] == me]
                remote = [x.stop - x.start for x in steps if hosts[x.peer] != me]
                m_intra, m_inter = max(m_intra, len(local)), max(m_inter, len(remote))
                b_intra = max(b_intra, sum(local))
                side = out_of if outward else into
                side[me] = side.get(me, 0) + sum(remote)
            reduced = max(reduced, sum(x.stop - x.start for x in s.rounds[i]
                                       if isinstance(x, Recv) and x.reduce))
        b_host = max([*out_of.values(), *into.values(), 0])
        if not (b_intra or b_host):
            continue
        total += max(intra.alpha * m_intra + intra.beta * b_intra * itemsize,
                     inter.alpha * m_inter + inter.beta * b_host * itemsize)
        total += intra.gamma * reduced * itemsize
    return total


@functools.lru_cache(maxsize=4096)
def elements_sent(algorithm_name: str, world_size: int, rank: int, num_elements: int) -> int:
    """Elements that `rank` sends in the schedule of `algorithm_name`.

    "native" counts as "ring" (TF's native all-reduce is a ring). Used by the
    strategy's byte counters.
    """
    name = "ring" if algorithm_name == "native" else algorithm_name
    if world_size == 1 or num_elements == 0:
        return 0
    schedule = schedule_fn(name)(world_size, rank, num_elements)
    return sum(step.stop - step.start for rnd in schedule.rounds for step in rnd
               if isinstance(step, Send))
