"""A worker asked to stop (SIGTERM) leaves the running job; the others go on.

Schedulers send SIGTERM some seconds before they take a machine away. In
elastic training the worker that got it does not stop the job: its stop
request travels in every training step's all-reduce
(`tfdist_ext.keras.preemption`), so after the same step every member knows
that someone asked. Then, between that step and the next:

1. Every member writes whether it leaves into the members' meeting place
   (the leader's store) and reads everyone's answer (`agree`).
2. The others go on as a new generation without the leavers
   (`leave`, through `Recovery.change`): no step is discarded, as every member finished the
   same one with the same weights; from the next batch the stayers share the
   global batch. Each then acknowledges (`acknowledge`).
3. A leaver waits for the stayers' acknowledgements (its store may be the
   meeting place) and ends its process with exit code 0.

If the stayers would be fewer than `Elastic(min_workers=...)`, nobody leaves:
every worker stops after writing its backups, as without elastic training.
"""

import logging
import time
from typing import Callable, Iterable, List

log = logging.getLogger("tfdist_ext")


def agree(kv_set: Callable, kv_get: Callable, prefix: str, me: int, members: Iterable[int],
          leaving: bool, seconds: float) -> List[int]:
    """Every member's answer to "do you leave?"; returns the leavers in the members' order.

    Args:
        kv_set, kv_get: The meeting place's `set(key, value)` and
            `get(key, seconds)`.
        prefix: Unique to this agreement, the same on every member.
        me: This worker's TF_CONFIG index.
        members: The members now, the chief first.
        leaving: Whether this worker was asked to stop.
        seconds: How long to wait for each member's answer (TimeoutError after).
    """
    kv_set(f"{prefix}/leave/{me}", "1" if leaving else "0")
    return [w for w in members if kv_get(f"{prefix}/leave/{w}", seconds) == "1"]


def acknowledge(kv_set: Callable, prefix: str, me: int):
    """A stayer: it goes on without the leavers (they may end now). The leaver whose
    store holds the key may end as soon as the key is stored, before its answer reaches
    this worker: a connection it closed then is no error."""
    try:
        kv_set(f"{prefix}/left/{me}", "1")
    except ConnectionError:
        pass


def wait_acknowledged(kv_get: Callable, prefix: str, stayers: Iterable[int], seconds: float):
    """A leaver: returns once every stayer acknowledged (TimeoutError after `seconds` each)."""
    for worker in stayers:
        kv_get(f"{prefix}/left/{worker}", seconds)


def leave(recovery, steps: int, leaving: bool, reason: str = "asked to stop") -> str:
    """Every member, after the step whose all-reduce carried a stop request.

    Args:
        recovery: The strategy's `tfdist_ext.elastic.recovery.Recovery`.
        steps: Training steps this worker ran in this `fit` (the same on every member).
        leaving: Whether this worker was asked to stop.
        reason: Why the leavers leave, for the logs ("asked to stop", or "a
            straggler" for one `tfdist_ext.elastic.stragglers` found).

    Returns:
        "leave" (this worker ends now), "stay" (it goes on without the leavers)
        or "stop" (the stayers would be fewer than `min_workers`: every worker
        stops as without elastic training).
    """
    generation = recovery.next_generation()
    prefix, kv = f"leave/{generation}", recovery.kv()
    seconds = recovery.options.recover_seconds
    leavers = agree(kv.set, kv.get, prefix, recovery.me, recovery.members, leaving, seconds)
    stayers = tuple(w for w in recovery.members if w not in leavers)
    if not leavers:
        return "stay"
    if len(stayers) < recovery.options.min_workers:
        log.warning("tfdist_ext: worker(s) %s were asked to stop; %d would be left, fewer than "
                    "Elastic(min_workers=%d): every worker stops.", leavers, len(stayers),
                    recovery.options.min_workers)
        return "stop"
    if leaving:
        wait_acknowledged(kv.get, prefix, stayers, seconds)
        log.warning("tfdist_ext: worker %d leaves the job after step %d (%s); "
                    "%d worker(s) %s go on.", recovery.me, steps, reason, len(stayers),
                    list(stayers))
        return "leave"
    recovery.change(generation, stayers)
    acknowledge(kv.set, prefix, recovery.me)
    recovery.leaves.append({"generation": generation, "step": steps, "left": leavers,
                            "members": list(stayers), "time": time.time(), "reason": reason})
    log.warning("tfdist_ext: worker(s) %s left after step %d (%s); %d worker(s) %s "
                "go on (generation %d), no step discarded.", leavers, steps, reason,
                len(stayers), list(stayers), generation)
    return "stay"
