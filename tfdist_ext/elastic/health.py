"""Which members are dead: the check the survivors make before they agree.

A member is dead when neither its TF server answers a health check
(`HEALTH_TRIES` tries of `HEALTH_TIMEOUT_SECONDS`) nor its elastic store
answers. TF's channel to a replacement can fail for a while after the old
process died, and a replacement not yet admitted answers at a dead member's
TF address: the store the members know (the old process's until an
admission) decides. When TF's check says a new process answers at the
member's address (an admitted replacement's, which TF still takes for the
process it replaced), its store is given `STORE_PATIENCE_SECONDS` to answer:
a process that is alive but starved of CPU answers late, one that ended
refuses at once. A dead member is GONE when its server refused (its
process ended) and UNREACHABLE when nothing answered (stopped, hung, or the
network between them broke): `fencing` counts the two apart.
"""

import logging
import time
from typing import Dict, Iterable, Mapping, Optional

from tfdist_ext import _compat, liveness
from tfdist_ext.elastic import store

log = logging.getLogger("tfdist_ext")
HEALTH_TIMEOUT_SECONDS = 2.0
HEALTH_TRIES = 2
# How long the store of a member whose TF server answered as a new process may take to
# answer: raise it on machines loaded far beyond their cores.
STORE_PATIENCE_SECONDS = 12.0
GONE, UNREACHABLE = "gone", "unreachable"


def store_answers(address: str) -> bool:
    """Whether the elastic store at `address` answers within `HEALTH_TIMEOUT_SECONDS`."""
    return store_alive(address, patience=0.0)


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
                if attempt + 1 < HEALTH_TRIES:
                    continue
                patience = STORE_PATIENCE_SECONDS if liveness.restarted(err) else 0.0
                if not store_alive(stores[worker], patience):
                    dead[worker] = UNREACHABLE if liveness.timed_out(err) else GONE
                    log.warning("tfdist_ext: worker %d counts as dead: its TF server failed "
                                "the health check (%s: %s) and its store at %s refused or "
                                "stayed silent for %.0f s.", worker, type(err).__name__,
                                " ".join(str(err).split())[:160], stores[worker],
                                max(patience, HEALTH_TIMEOUT_SECONDS))
    return dead


def store_alive(address: str, patience: float) -> bool:
    """Whether the store at `address` answers, asked for `HEALTH_TIMEOUT_SECONDS` and
    again while it stays silent, until `patience` seconds have passed; a refused or
    broken connection (no process serves it) is an answer: False at once."""
    client, deadline = store.Client(address), time.monotonic() + patience
    while True:
        reached = client.reach(HEALTH_TIMEOUT_SECONDS)
        if reached is not None:
            return reached
        if time.monotonic() >= deadline:
            return False
