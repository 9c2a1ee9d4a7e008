"""All-reduce algorithms as data: the `Schedule` contract shared by every engine.

An algorithm is a pure function ``schedule(world_size, rank, num_elements)``
that returns, for one rank, the point-to-point steps it performs, grouped in
rounds. The numpy simulator (`simulator.py`), the cost model (`cost.py`) and
the TensorFlow engines all read the same schedules, so adding an algorithm is
adding one file that registers a schedule function in `ALGORITHMS`.

Semantics (the contract every engine implements):
    * Rounds run in lock-step on all ranks; every rank's schedule has the same
      number of rounds (idle ranks have empty rounds ``()``).
    * Within a round, every `Send` reads the buffer as it was at the START of
      the round; all `Recv` steps of the round are applied afterwards, in the
      order listed. A rank may therefore send and receive the same range in
      one round: a pairwise exchange-and-sum (one 2-member all-reduce).
    * Several Sends from rank p to rank r in one round are matched, in order,
      with r's Recvs from p in that round; lengths must agree.
    * Ranges are element indices into the flat buffer and are never empty.
    * ``world_size == 1`` or ``num_elements == 0`` gives zero rounds.
    * All ranks must end with bit-identical buffers, for float dtypes too: an
      algorithm reduces each element in one expression tree, then copies it.
"""

import dataclasses
import itertools
from collections.abc import Callable

from tfdist_ext.registry import Registry, positive_int

ALGORITHMS = Registry("allreduce")


class ScheduleError(ValueError):
    """A schedule breaks the contract (unmatched Recv, bad range, ...)."""


@dataclasses.dataclass(frozen=True)
class Send:
    """Send ``buf[start:stop]`` to rank `peer`."""

    peer: int
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Recv:
    """Receive ``stop - start`` elements from `peer` into ``buf[start:stop]``.

    ``reduce=True`` adds them to the buffer, ``reduce=False`` overwrites it.
    """

    peer: int
    start: int
    stop: int
    reduce: bool


Step = Send | Recv
Round = tuple[Send | Recv, ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The rounds one rank executes for an all-reduce of `num_elements`."""

    rank: int
    world_size: int
    num_elements: int
    rounds: tuple[Round, ...]


ScheduleFn = Callable[[int, int, int], Schedule]
RoundsFn = Callable[[int, int, int], tuple[Round, ...]]


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """Splits ``range(start, stop)`` into `parts` contiguous near-equal chunks.

    Sizes differ by at most one; the first ``(stop - start) % parts`` chunks
    get the extra element, so chunks may be empty when there are few elements.

    Example:
        >>> split(0, 10, 4)
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    size, extra = divmod(stop - start, parts)
    bounds = [start]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (i < extra))
    return list(itertools.pairwise(bounds))


def send(peer: int, start: int, stop: int) -> Round:
    """``(Send(...),)``, or ``()`` when the range is empty."""
    return (Send(peer, start, stop),) if stop > start else ()


def recv(peer: int, start: int, stop: int, reduce: bool) -> Round:
    """``(Recv(...),)``, or ``()`` when the range is empty."""
    return (Recv(peer, start, stop, reduce),) if stop > start else ()


def build(world_size: int, rank: int, num_elements: int,
          rounds_fn: RoundsFn) -> Schedule:
    """Validates arguments and wraps ``rounds_fn(world_size, rank, n)``.

    Handles the trivial cases once for every algorithm: a single rank or an
    empty buffer needs no communication, so `rounds_fn` is not called.

    Raises:
        ValueError: naming the bad argument and the value received.
    """
    positive_int("world_size", world_size)
    positive_int("num_elements", num_elements, minimum=0)
    if isinstance(rank, bool) or not isinstance(rank, int) or not (
            0 <= rank < world_size):
        raise ValueError(
            f"Argument `rank` must be an integer in [0, world_size={world_size}"
            f"); received {rank!r}.")
    if world_size == 1 or num_elements == 0:
        return Schedule(rank, world_size, num_elements, ())
    rounds = tuple(tuple(r) for r in rounds_fn(world_size, rank, num_elements))
    return Schedule(rank, world_size, num_elements, rounds)


def register_schedule(name: str, rounds_fn: RoundsFn, class_name: str) -> ScheduleFn:
    """Registers the algorithm whose rounds `rounds_fn(p, rank, n)` builds.

    Creates the registry entry (a frozen dataclass named `class_name` with a
    `schedule` method) and returns the module-level schedule function.
    """

    def schedule(world_size: int, rank: int, num_elements: int) -> Schedule:
        return build(world_size, rank, num_elements, rounds_fn)

    schedule.__doc__ = f"The {name} all-reduce schedule of `rank`."
    entry = dataclasses.make_dataclass(
        class_name, [], frozen=True,
        namespace={"schedule": lambda self, world_size, rank, num_elements:
                   schedule(world_size, rank, num_elements),
                   "__doc__": f"Registry entry for the {name} all-reduce.",
                   "__module__": rounds_fn.__module__})
    ALGORITHMS.register(name)(entry)
    return schedule


def schedule_fn(algorithm) -> ScheduleFn:
    """The schedule function for a registered name, dict, instance or callable."""
    if isinstance(algorithm, (str, dict)):
        return ALGORITHMS.get(algorithm).schedule
    if hasattr(algorithm, "schedule"):
        return algorithm.schedule
    if callable(algorithm):
        return algorithm
    raise TypeError(
        f"Argument `algorithm` must be a registered name "
        f"({', '.join(ALGORITHMS.names())}), a configuration object or a "
        f"function (world_size, rank, num_elements) -> Schedule; received "
        f"{algorithm!r} of type {type(algorithm).__name__}.")


def all_schedules(algorithm, world_size: int,
                  num_elements: int) -> tuple[Schedule, ...]:
    """The schedules of every rank, in rank order."""
    fn = schedule_fn(algorithm)
    return tuple(fn(world_size, rank, num_elements) for rank in range(world_size))


def encode(schedule: Schedule) -> list:
    """The flat int list a UCX engine's op reads.

    ``[rounds, (steps, (kind, peer, start, stop)*)*]``, where kind is 0 for a
    send, 1 for a receive that adds, 2 for one that overwrites.
    """
    flat = [len(schedule.rounds)]
    for round_ in schedule.rounds:
        flat.append(len(round_))
        for step in round_:
            kind = 0 if isinstance(step, Send) else (1 if step.reduce else 2)
            flat += [kind, step.peer, step.start, step.stop]
    return flat
