"""All-reduce schedules written outside tfdist_ext are simulated before an engine runs them.

A schedule can keep every rule of `schedule.py` (what `simulator.validate` checks) and
still not compute a sum: a Recv that overwrites where it should add, a range nobody sends.
Such a mistake gives wrong gradients and no error, and with logical replicas it may not
even show, because the UCX engine sums in process and never runs the schedule.
`before_use` runs `simulator.check_allreduce` for the world size an engine is about to
use, once per algorithm and world size in a process, and refuses a wrong schedule with
an error naming it. The algorithms of this package are checked by its tests for world
sizes 1-9 and are not simulated again; one that runs another algorithm inside it (the
hierarchical schedule's `inter` on the host leaders) names it in `parts()`, and that
one is checked at its own world size.

Example:
    >>> before_use("ring", 3)   # built in: returns at once
"""

import functools

from tfdist_ext.collectives import simulator
from tfdist_ext.collectives.schedule import ALGORITHMS, ScheduleError

PACKAGE = "tfdist_ext."


def _resolved(algorithm):
    """The registered entry for a name or configuration, else `algorithm` itself."""
    return ALGORITHMS.get(algorithm) if isinstance(algorithm, (str, dict)) else algorithm


def _defined_here(algorithm) -> bool:
    """True when the algorithm's code is part of tfdist_ext."""
    owner = algorithm if not hasattr(algorithm, "schedule") else type(algorithm)
    return getattr(owner, "__module__", "").startswith(PACKAGE)


def sizes(world_size: int) -> tuple[int, ...]:
    """The buffer lengths simulated: one element, and lengths that split unevenly."""
    return tuple(sorted({1, world_size + 1, 4 * world_size + 3}))


@functools.lru_cache(maxsize=None)
def before_use(algorithm, world_size: int) -> None:
    """Returns when `algorithm` all-reduces correctly at `world_size`; cached.

    Args:
        algorithm: A registered name, a hashable configuration object or a schedule
            function, as the engines receive it.
        world_size: The ranks that will run it.

    Raises:
        ValueError: The schedule breaks the contract of `schedule.py` or does not
            leave the sum on every rank, naming the algorithm, the world size and how
            to reproduce it with `tfdist_ext.collectives.check_allreduce`.
    """
    resolved = _resolved(algorithm)
    if _defined_here(resolved):
        for part, size in getattr(resolved, "parts", tuple)():
            before_use(part, size)
        return
    for n in sizes(world_size):
        try:
            simulator.check_allreduce(algorithm, world_size, n)
        except (AssertionError, ScheduleError) as err:
            raise ValueError(
                f"Argument `allreduce`: the algorithm {algorithm!r} is not an all-reduce "
                f"at world_size={world_size}: {err} Reproduce it with "
                f"tfdist_ext.collectives.check_allreduce({algorithm!r}, {world_size}, {n}) "
                "and fix its rounds (the contract is in tfdist_ext/collectives/schedule.py), "
                "or pick a built-in algorithm.") from None
