"""A replacement worker's way into a running elastic job.

A replacement (a dead worker's script started again with its TF_CONFIG and
TFDIST_ELASTIC=1) learns the members' store addresses from their answer at
its start (`beacon`), posts a join request to every member's store (`ask`)
and waits in its own store for the admission (`wait_admitted`). Whichever
member leads when it next looks (the first of the members: the leader may
change while the replacement starts) finds the request in its own store
(`pending`), and after the members' next step writes the admission into the
replacement's store (`tfdist_ext.elastic.recovery.Recovery.admit`).

A replacement runs its script from the start, so it can join only in the `fit`
the members run: each request names the replacement's fit (counted per
strategy), and a replacement in another fit is refused (`refusal`, `JoinRefused`)
before it traces anything where the members' answer already tells, else by the
leader; so is one whose script runs `evaluate` or `predict` before its first fit
(`inference_first`). It then exits with `tfdist_ext.launch.elastic_env.EXIT_LATE`,
and the launcher does not start it again.
"""

import json
import os
import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tfdist_ext import coordination
from tfdist_ext.elastic import beacon, fencing, starting, store
from tfdist_ext.elastic.membership import MembershipError

POLL_SECONDS = 2.0  # how often a waiting replacement checks that a member still answers
ANSWER_SECONDS = 2.0


class JoinRefused(MembershipError):
    """A replacement the running job cannot take in: its script is in another `fit`, or
    runs `evaluate` or `predict` before one."""


def request_key(prefix: str, worker: int, nonce: str, fit: int) -> str:
    return f"{prefix}/join/{worker}/{nonce}-fit{fit}"


def request_fit(request: str) -> int:
    """The `fit` (1 for the script's first) the replacement of `request` runs; 0 where
    the request does not say (another version's: refused, as no fit is 0)."""
    head, _, fit = request.rpartition("-fit")
    return int(fit) if head and fit.isdigit() else 0


def refusal(worker: int, theirs: int, ours: int) -> str:
    """Why worker `worker`, in fit `theirs` of its script, cannot join fit `ours`."""
    return (f"tfdist_ext: worker {worker} replaces a dead worker and asked to join in fit "
            f"{theirs} of its script (a replacement runs the script from the start), but "
            f"the running job is in fit {ours}: a replacement joins only in the fit the "
            "members run. The job goes on without it. To use every worker again, restart "
            "the whole job (from keras.callbacks.BackupAndRestore's backup); to let "
            "replacements join at any point, train in one fit (callbacks can change the "
            "learning rate or unfreeze layers between epochs).")


def inference_first(me: int) -> JoinRefused:
    """The refusal of replacement `me`, whose script runs `evaluate` or `predict` before
    the fit it could join in (it has no members to run them with)."""
    return JoinRefused(
        f"tfdist_ext: worker {me} replaces a dead worker, but its script runs evaluate or "
        "predict before a fit (a replacement runs the script from the start and joins at a "
        "training step of the members' fit): it cannot join. The job goes on without it. "
        "To let replacements join, evaluate after the fit or as its validation "
        "(validation_data).")


def check_fit(me: int, mine: int, members: Optional[int]):
    """Raises JoinRefused if the members run another fit than this replacement's
    `mine` (`members`: theirs, as they answered; None: not known)."""
    if members is not None and members != mine:
        raise JoinRefused(refusal(me, mine, members))


def requester(request: str) -> int:
    """The worker whose join request `request` (a `request_key`) is."""
    return int(request.split("/")[-2])


def admitted_key(request: str) -> str:
    """The key of the admission that answers the join request `request`."""
    return request.replace("/join/", "/admitted/", 1)


def pending(items: Mapping[str, str], members: Iterable[int],
            handled: Iterable[str]) -> Dict[int, Tuple[str, str]]:
    """The join requests to act on: worker -> (request key, its store address).

    Args:
        items: A store's keys under "<prefix>/join/" and their values.
        members: The workers in the job now (their old requests are done).
        handled: Request keys admitted before.

    Only a worker's latest request counts (nonces sort by time): an older one
    names a store that died with an earlier replacement.
    """
    latest: Dict[int, Tuple[str, str]] = {}
    for key in sorted(items):
        latest[requester(key)] = (key, items[key])
    members, handled = set(members), set(handled)
    return {worker: request for worker, request in latest.items()
            if worker not in members and request[0] not in handled}


def ask(prefix: str, me: int, own_address: str, stores: Mapping[int, str],
        members: Iterable[int], fit: int) -> Tuple[str, List[int]]:
    """Posts this replacement's join request (in its fit `fit`) to every member's
    store it can reach.

    Returns:
        (request key, the workers whose stores took it).

    Raises:
        MembershipError: no member's store answered.
    """
    key = request_key(prefix, me, f"{time.time():017.6f}-{os.getpid()}", fit)
    asked = []
    for worker in members:
        if worker == me or worker not in stores:
            continue
        try:
            store.Client(stores[worker]).set(key, own_address)
            asked.append(worker)
        except OSError:
            continue
    if not asked:
        raise MembershipError(
            f"worker {me} replaces a dead worker, but no member of the running job "
            f"({sorted(stores)}) answered at its store; the job may have ended. Start the "
            "replacement while the others train.")
    return key, asked


def wait_admitted(own: store.Store, request: str, stores: Mapping[int, str],
                  asked: List[int], seconds: float, me: int) -> str:
    """The admission (JSON) the members' leader writes into `own` store for `request`.

    Raises:
        JoinRefused: the leader refused it (the members run another fit).
        MembershipError: nothing within `seconds` (Elastic's join_seconds), or
            no store of the members asked answers any more (the job ended).
    """
    deadline = time.monotonic() + seconds
    while True:
        answer = own.wait(admitted_key(request), min(POLL_SECONDS,
                                                      max(deadline - time.monotonic(), 0)))
        if answer is not None:
            if "refused" in json.loads(answer):
                raise JoinRefused(json.loads(answer)["refused"])
            starting.in_the_job()
            return answer
        if time.monotonic() >= deadline:
            raise MembershipError(
                f"worker {me} was not taken into the running job within join_seconds="
                f"{seconds:g} s (asked workers {asked}). The members admit a replacement "
                "after their next step: raise join_seconds of Strategy(elastic=...) for "
                "steps that take longer.")
        if not any(store.Client(stores[w]).answers(ANSWER_SECONDS) for w in asked):
            raise MembershipError(
                f"worker {me} asked workers {asked} to take it into the running job, but "
                "they went away before they did: the job ended (or they died). Start the "
                "replacement while the others train.")


def members_now(prefix: str, me: int, addresses: Mapping[int, str]):
    """The running job's members (the chief first), their stores ({worker: "host:port"},
    this worker's left out) and their fit, as a member's beacon answers now
    (`beacon.running_job`), or None when no member answers. `addresses`: every
    worker's TF_CONFIG address."""
    state = fencing.members_state(prefix, [a for w, a in addresses.items() if w != me],
                                  beacon.running_job)
    if not state:
        return None
    stores = {int(w): a for w, a in state["stores"].items() if int(w) != me}
    return tuple(int(w) for w in state["members"]), stores, state.get("fit")


def stores_at_start(prefix: str, me: int, members: Sequence[int], own: str):
    """Every worker's store address, and the running job's members if this worker joins it.

    At the job's start the workers exchange their stores' addresses through TF's
    coordination service; a replacement has them from the members' answer at its
    start (`beacon.found`).

    Args:
        prefix: The elastic strategy's key prefix.
        me: This worker's TF_CONFIG index.
        members: Every worker of the job (TF_CONFIG order).
        own: This worker's store address.

    Returns:
        ({worker: "host:port"}, the members (the chief first), or None at a fresh start,
        the fit they run, or None).
    """
    running = beacon.found()
    if running is not None:  # this worker replaces a dead one
        if prefix not in running:
            raise MembershipError(
                f"worker {me} joins a running job, but the job has no elastic strategy "
                f"{prefix!r}: the replacement must run the same script.")
        stores = {int(w): a for w, a in running[prefix]["stores"].items()}
        stores[me] = own
        return (stores, [int(w) for w in running[prefix]["members"]],
                running[prefix].get("fit"))
    kv, key = coordination.KeyValue(), f"{prefix}/elastic/stores"
    try:
        kv.set(f"{key}/{me}", own)
    except tf.errors.AlreadyExistsError:
        raise MembershipError(
            f"worker {me} was started again while its job runs, but no member answered its "
            "query on UDP at start-up (sent to their TF_CONFIG ports; "
            "`tfdist_ext.elastic.beacon`): let UDP through on the TF_CONFIG ports.") from None
    stores = {w: own if w == me else kv.get(f"{key}/{w}") for w in members}
    # Every worker is here: a job started with this worker in it. A replacement that
    # found no job while its last members were failing meets none and waits here, out
    # of the job, until `tfdist-run --elastic` stops it with them.
    starting.in_the_job()
    return stores, None, None
