"""Which members are dead: the check the survivors make before they agree.

A member is dead when neither its TF server answers a health check
(`HEALTH_TRIES` tries of `HEALTH_TIMEOUT_SECONDS`) nor its elastic store
answers. TF's channel to a replacement can fail for a while after the old
process died, and a replacement not yet admitted answers at a dead member's
TF address: the store the members know (the old process's until an
admission) decides. A dead member is GONE when its server refused (its
process ended) and UNREACHABLE when nothing answered (stopped, hung, or the
network between them broke): `fencing` counts the two apart.
"""

from typing import Dict, Iterable, Mapping, Optional

from tfdist_ext import _compat, liveness
from tfdist_ext.elastic import store

HEALTH_TIMEOUT_SECONDS = 2.0
HEALTH_TRIES = 2
GONE, UNREACHABLE = "gone", "unreachable"


def store_answers(address: str) -> bool:
    """Whether the elastic store at `address` answers within `HEALTH_TIMEOUT_SECONDS`."""
    return store.Client(address).answers(HEALTH_TIMEOUT_SECONDS)


def dead_members(members: Iterable[int], me: int, stores: Mapping[int, str],
                 known: Optional[Mapping[int, str]] = None) -> Dict[int, str]:
    """The workers of `members` other than `me` that do not answer: {worker: GONE or
    UNREACHABLE}.

    Args:
        members: TF_CONFIG indices of the members.
        me: This worker's index (not checked).
        stores: Each member's store address ("host:port").
        known: Members the dead-peer watcher (`liveness`) already found dead,
            with their kind: taken as they are, not checked again.
    """
    known = known or {}
    dead = {}
    for worker in members:
        if worker == me:
            continue
        if worker in known:
            dead[worker] = known[worker]
            continue
        for attempt in range(HEALTH_TRIES):
            try:
                _compat.check_peer_health(liveness.task_name("worker", worker),
                                          int(HEALTH_TIMEOUT_SECONDS * 1000))
                break
            except Exception as err:  # pylint: disable=broad-except  (a failure is a miss)
                if attempt + 1 == HEALTH_TRIES and not store_answers(stores[worker]):
                    dead[worker] = UNREACHABLE if liveness.timed_out(err) else GONE
    return dead
