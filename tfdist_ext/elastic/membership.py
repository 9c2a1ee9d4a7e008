"""Who is left after a failure: the survivors' agreement, through a key-value store.

Every survivor of generation g publishes what it saw (the workers it found
alive and how many training steps it ran); the first of them in the members'
order, the leader, waits for those workers' reports and publishes the new
membership: the workers that reported, in the same order, and the most steps
any of them ran (survivors that ran fewer skip the difference, so that every
member runs its next step together). Workers are named by their TF_CONFIG
index throughout; the order is the members' ranks: the chief first, so that it
stays the chief while it lives, then the others by index (`admitted`).
"""

import json
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

CHECK_SECONDS = 1.0  # how often the leader asks `gone` about a worker it waits for


class MembershipError(RuntimeError):
    """The survivors could not agree, or fewer than `min_workers` are left."""


class LeaderLost(MembershipError):
    """The leader of an agreement died or went silent during it: agree again."""


def survivors(members: Sequence[int], dead) -> Tuple[int, ...]:
    """`members` without `dead`, in order."""
    dead = set(dead)
    return tuple(m for m in members if m not in dead)


def position(members: Sequence[int], worker: int) -> int:
    """`worker`'s rank among `members`: its place among them by worker index. The
    chief, ``members[0]``, need not be rank 0; ranked by index, every worker is back at
    its own index whenever the job is back at full size, where its step function is
    kept (`traced_for`), whoever the chief is."""
    return sorted(members).index(worker)


def admitted(members: Sequence[int], joiners) -> Tuple[int, ...]:
    """The members once `joiners` are taken in: the chief (``members[0]``) first, then
    the other members and the joiners by worker index."""
    members = tuple(members)
    return members[:1] + tuple(sorted(set(members[1:]) | set(joiners)))


def check_enough(alive: Sequence[int], dead, min_workers: int, addresses: Dict[int, str]):
    """Raises MembershipError if fewer than `min_workers` are `alive` after `dead` died
    (`addresses`: every worker's TF_CONFIG address, to name them)."""
    if len(alive) < min_workers:
        dead = sorted(dead)
        raise MembershipError(
            f"tfdist_ext: worker(s) {dead} ({', '.join(addresses[w] for w in dead)}) "
            f"died; {len(alive)} worker(s) {list(alive)} are left, fewer than "
            f"Elastic(min_workers={min_workers}). Restart the job, or lower min_workers.")


def traced_for(members: Sequence[int], worker: int, addresses: Sequence[str]) -> tuple:
    """What a step function `worker` traced for `members` depends on: the world size,
    its rank and the members' hosts in rank order (the collectives' schedules; their
    communicators are the generation's, `collectives.ucx_slots`). A function traced
    for another membership with the same value runs unchanged. `addresses`: every
    worker's "host:port" (TF_CONFIG)."""
    hosts = tuple(addresses[w].rpartition(":")[0] for w in sorted(members))
    return len(members), position(members, worker), hosts


def agree(kv_set: Callable[[str, str], None], kv_get: Callable[[str, float], str],
          prefix: str, me: int, alive: Sequence[int], steps: int,
          timeout: float, gone: Optional[Callable[[int], bool]] = None,
          holds_state: bool = True) -> Tuple[Tuple[int, ...], int, Optional[int]]:
    """The new membership, the step every member resumes at and where the state is.

    Args:
        kv_set: Stores a key (each key once).
        kv_get: Reads a key, waiting up to the given seconds; raises when it
            is absent after them.
        prefix: Unique to this generation and job.
        me: This worker's index.
        alive: The workers this one found alive, itself included, in the
            members' order (the same on every survivor).
        steps: Training steps this worker ran (the failed one included).
        timeout: Seconds to wait for the others.
        gone: Asked every `CHECK_SECONDS` about a worker whose report the
            leader still waits for: True ends the wait for it (it died after
            this worker's health check, e.g. a replacement that crashed
            while joining), so the others do not wait out `timeout`.
        holds_state: Whether this worker holds the training state (False for a
            replacement whose state broadcast did not complete).

    Returns:
        (members, steps, source): the members in order, the most steps any
        ran, and the first member that holds the state, from which the members
        take it.

    Raises:
        MembershipError: this worker was left out (the others gave up on it),
            no member holds the state, or the leader did not publish within
            `timeout`.
    """
    alive = tuple(alive) if me in alive else tuple(alive) + (me,)
    leader = alive[0]
    try:
        return _agree(kv_set, kv_get, prefix, me, alive, leader, steps, timeout,
                      gone or (lambda worker: False), holds_state)
    except (OSError, EOFError) as err:  # the leader's store is unreachable
        raise LeaderLost(f"worker {me}: the meeting place of the survivors, worker "
                              f"{leader}'s store, failed ({type(err).__name__}: {err}): "
                              "it died too during the recovery.") from None


def _agree(kv_set, kv_get, prefix, me, alive, leader, steps, timeout, gone, holds_state):
    kv_set(f"{prefix}/report/{me}", json.dumps({"alive": alive, "steps": int(steps),
                                                "state": bool(holds_state)}))
    if me == leader:
        deadline = time.monotonic() + timeout
        reports: Dict[int, dict] = {}
        for worker in alive:
            report = _report(kv_get, f"{prefix}/report/{worker}", deadline,
                             lambda w=worker: w != me and gone(w))
            if report is not None:
                reports[worker] = report
        members = tuple(w for w in alive if w in reports)
        decision = {"members": members, "steps": max(r["steps"] for r in reports.values()),
                    "source": next((w for w in members if reports[w].get("state", True)),
                                   None)}
        kv_set(f"{prefix}/members", json.dumps(decision))
    else:
        try:
            # Twice the leader's wait: it may have noticed the death later than this one.
            decision = json.loads(kv_get(f"{prefix}/members", 2 * timeout))
        except (TimeoutError, KeyError) as err:
            raise LeaderLost(
                f"worker {me}: worker {leader}, the first survivor in the members' order, did "
                f"not announce the new membership within {2 * timeout:g} s ({err}); raise "
                "Elastic(recover_seconds=...) on slow links.") from None
    members = tuple(decision["members"])
    if me not in members:
        raise MembershipError(f"worker {me} was left out of the new membership {members} "
                              f"(the others did not hear from it within {timeout:g} s).")
    if decision["source"] is None:
        raise MembershipError(
            f"worker {me}: no survivor of {members} holds the model's and optimizer's "
            "state (each is a replacement whose admission failed before the state reached "
            "it; the members that held it died). Start the job again (BackupAndRestore "
            "resumes at its last backup).")
    return members, int(decision["steps"]), decision["source"]


def _report(kv_get, key, deadline, gone):
    """The report under `key`, or None when the deadline passed or `gone()` said so.

    A failed read of the store (a reset connection) is tried again until the
    deadline, as a read that found nothing is.
    """
    while True:
        began = time.monotonic()
        try:
            return json.loads(kv_get(key, max(min(deadline - began, CHECK_SECONDS), 0.001)))
        except ValueError:  # not a report: not a member
            return None
        except Exception:  # pylint: disable=broad-except  (nothing read yet)
            if deadline - time.monotonic() <= 0 or gone():
                return None
            time.sleep(max(0.0, 0.1 - (time.monotonic() - began)))  # no spinning
