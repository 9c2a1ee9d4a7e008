"""How one rank executes a `Schedule` with point-to-point collectives (pure Python).

The graph engine (`engine.py`) turns a `Plan` into TensorFlow ops; everything it
has to decide that both sides of a pair must agree on is decided here, from the
schedules alone, so it can be tested without TensorFlow:

* Segments. The buffer is split once at every range boundary of the rank's
  schedule; every `Send` / `Recv` then covers a run of whole segments
  ``[lo, hi)`` (concatenated to send, split back on receive).
* Exchanges. When, in one round, rank r sends range R to peer p and receives R
  from p with ``reduce=True`` (and p does the mirror image), the two transfers
  are one pairwise exchange-and-sum: a 2-member all-reduce, which is faster
  than two broadcasts. Both sides must choose the same way, so the test looks
  at both ranks' rounds; it also requires that no other Recv of the round
  touches R (the exchange's result is ``start-of-round R + peer's R``, which is
  only the schedule's meaning when nothing else is added to R in that round).
* Canonical order. Within a round the collectives of a pair (a, b), a < b,
  are numbered the same way on both sides: peers in increasing rank order, and
  per peer the exchange first, then a -> b transfers in schedule order, then
  b -> a transfers. The engine draws one instance key per collective in this
  order. Exchanges of one rank are chained by its ordering token in this order
  too, and "increasing peer" is a subsequence of one global order of pairs
  (sorted by (min, max)), so the chains cannot wait on each other in a cycle.
* Applying. Received data is applied in the schedule's order (Recv order), as
  `simulator.simulate` does, so the engine computes the same expression trees
  and replicas stay bit-identical.
"""

import bisect
import dataclasses
import functools

from tfdist_ext.collectives import verify
from tfdist_ext.collectives.schedule import Recv, Send, schedule_fn

EXCHANGE, SEND, RECV = "exchange", "send", "recv"


@dataclasses.dataclass(frozen=True)
class Comm:
    """One collective of this rank: `kind` with `peer` over segments [lo, hi)."""

    kind: str
    peer: int
    lo: int
    hi: int


@dataclasses.dataclass(frozen=True)
class Apply:
    """Write (``reduce=False``) or add the output of ``comms[comm]`` to [lo, hi)."""

    comm: int
    lo: int
    hi: int
    reduce: bool


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    comms: tuple[Comm, ...]
    applies: tuple[Apply, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Segments and rounds of one rank; ``bounds[i]:bounds[i + 1]`` is segment i."""

    bounds: tuple[int, ...]
    rounds: tuple[RoundPlan, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:]))


def _exchange_range(steps, me: int, peer: int):
    """(start, stop) if `me` exchanges-and-sums exactly one range with `peer`."""
    sends = [s for s in steps if isinstance(s, Send) and s.peer == peer]
    recvs = [s for s in steps if isinstance(s, Recv) and s.peer == peer]
    if len(sends) != 1 or len(recvs) != 1:
        return None
    send, recv = sends[0], recvs[0]
    if not recv.reduce or (send.start, send.stop) != (recv.start, recv.stop):
        return None
    if any(isinstance(s, Recv) and s is not recv and s.start < recv.stop and recv.start < s.stop
           for s in steps):
        return None  # something else is added to the range in this round
    return recv.start, recv.stop


@functools.lru_cache(maxsize=256)
def _schedules(algorithm, world_size: int, num_elements: int):
    verify.before_use(algorithm, world_size)
    fn = schedule_fn(algorithm)
    return tuple(fn(world_size, rank, num_elements) for rank in range(world_size))


@functools.lru_cache(maxsize=1024)
def make_plan(algorithm, world_size: int, rank: int, num_elements: int) -> Plan:
    """The `Plan` of `rank` for a registered algorithm name (or hashable spec)."""
    schedules = _schedules(algorithm, world_size, num_elements)
    mine = schedules[rank]
    bounds = sorted({0, num_elements} | {x for rnd in mine.rounds for s in rnd
                                         for x in (s.start, s.stop)})

    def segs(step):
        return bisect.bisect_left(bounds, step.start), bisect.bisect_left(bounds, step.stop)

    rounds = []
    for i, steps in enumerate(mine.rounds):
        comms, index = [], {}  # index: id(step) -> position in comms
        for peer in sorted({s.peer for s in steps}):
            exchange = _exchange_range(steps, rank, peer)
            if exchange and _exchange_range(schedules[peer].rounds[i], peer, rank) is None:
                exchange = None
            sends = [s for s in steps if isinstance(s, Send) and s.peer == peer]
            recvs = [s for s in steps if isinstance(s, Recv) and s.peer == peer]
            if exchange:
                index[id(recvs[0])] = len(comms)
                comms.append(Comm(EXCHANGE, peer, *segs(recvs[0])))
                continue
            first, second = (sends, recvs) if rank < peer else (recvs, sends)
            for step in first + second:
                index[id(step)] = len(comms)
                comms.append(Comm(SEND if isinstance(step, Send) else RECV, peer, *segs(step)))
        applies = []
        for step in steps:
            if isinstance(step, Recv):
                comm = comms[index[id(step)]]
                applies.append(Apply(index[id(step)], comm.lo, comm.hi,
                                     step.reduce and comm.kind != EXCHANGE))
        rounds.append(RoundPlan(tuple(comms), tuple(applies)))
    return Plan(tuple(bounds), tuple(rounds))


def simulate_plans(algorithm, world_size: int, inputs):
    """Runs the plans of all ranks on numpy arrays (a check of `make_plan` itself).

    Exchanges add the two start-of-round ranges; everything else follows the
    plan's order. Returns the final buffers in rank order.
    """
    import numpy as np  # pylint: disable=import-outside-toplevel

    n = len(inputs[0])
    plans = [make_plan(algorithm, world_size, r, n) for r in range(world_size)]
    bufs = [np.array(x, copy=True) for x in inputs]
    for i in range(len(plans[0].rounds) if n else 0):
        start = [b.copy() for b in bufs]
        pending = {}  # (src, dst, kind) -> list of payloads in order
        for r, plan in enumerate(plans):
            for c in plan.rounds[i].comms:
                lo, hi = plan.bounds[c.lo], plan.bounds[c.hi]
                if c.kind in (SEND, EXCHANGE):
                    pending.setdefault((r, c.peer, c.kind), []).append(start[r][lo:hi])
        for r, plan in enumerate(plans):
            outputs = []
            for c in plan.rounds[i].comms:
                lo, hi = plan.bounds[c.lo], plan.bounds[c.hi]
                if c.kind == RECV:
                    outputs.append(pending[(c.peer, r, SEND)].pop(0))
                elif c.kind == EXCHANGE:
                    outputs.append(start[r][lo:hi] + pending[(c.peer, r, EXCHANGE)].pop(0))
                else:
                    outputs.append(None)
            for a in plan.rounds[i].applies:
                lo, hi = plan.bounds[a.lo], plan.bounds[a.hi]
                bufs[r][lo:hi] = bufs[r][lo:hi] + outputs[a.comm] if a.reduce else outputs[a.comm]
    return bufs
