"""A worker cut off from the others, or stopped and continued, never trains on alone.

Elastic training removes a member that stops answering: killed (its server
refuses connections), stopped (SIGSTOP, a paused VM: connections open but
nothing answers) or cut off by the network (nothing arrives). The last two
look the same from both sides, and the worker on the other side of a broken
network sees *its* peers as the ones that stopped answering. Two rules keep
such a worker from forming a job of its own (which would train on stale
weights and overwrite the job's checkpoints):

* Quorum (`check_quorum`): the workers that go on must be a strict majority
  of the members not known to be gone. A member whose server refused the
  health checks is gone (its process died); one that did not answer may be
  alive behind a broken link. With three workers, the two that can still
  reach each other go on without the third, and the third stops; two workers
  that lose each other both stop unless one of them is known dead.
* Frozen (`check_not_frozen`): a worker whose own clock shows that it stood
  still (`liveness.FROZEN_SECONDS`) asks the other members at once whether it
  is still one of them; when it is not, or nobody answers, its collectives in
  flight fail and it exits with an error that says so, instead of joining a
  new membership. Start it again to join as a replacement.
"""

from typing import Callable, Iterable, Mapping, Optional, Sequence

from tfdist_ext.elastic.membership import MembershipError

HOW_TO_RETURN = ("Start it again (the same command and TF_CONFIG, with TFDIST_ELASTIC=1) to "
                 "join the running job as a replacement.")


def check_quorum(me: int, members: Sequence[int], alive: Iterable[int],
                 gone: Iterable[int]):
    """Raises MembershipError unless `alive` is a strict majority of `members` not `gone`.

    Args:
        me: This worker's TF_CONFIG index.
        members: The members before the failure.
        alive: The members that answered (this worker included).
        gone: The members known to have died (their servers refused).
    """
    alive, gone = sorted(set(alive)), set(gone)
    voters = [w for w in members if w not in gone]
    silent = sorted(set(voters) - set(alive))
    if 2 * len(alive) > len(voters):
        return
    raise MembershipError(
        f"tfdist_ext: worker {me} cannot reach worker(s) {silent}, which did not answer "
        f"(stopped, or the network between them is broken); the {len(alive)} worker(s) "
        f"{alive} that can reach each other are not a majority of the {len(voters)} that "
        "may still be alive, so they stop rather than train on beside the others (which may "
        f"have gone on without them). {HOW_TO_RETURN}")


def check_not_frozen(me: int, generation: int, frozen_seconds: Optional[float],
                     running: Callable[[], Optional[Mapping]]):
    """Raises MembershipError if this worker was frozen and the job went on without it.

    Args:
        me: This worker's TF_CONFIG index.
        generation: Its generation (how many membership changes it took part in).
        frozen_seconds: How long its process did not run (None: it was not frozen).
        running: Returns the members' state as they answer it ("members",
            "generation"), or None when nobody answers.
    """
    if frozen_seconds is None:
        return
    state = running()
    where = f"worker {me} did not run for {frozen_seconds:.0f} s (SIGSTOP, a paused VM or host)"
    if state is None:
        raise MembershipError(
            f"tfdist_ext: {where}, and no other worker answers now: the job ended or went on "
            f"elsewhere; it exits rather than train alone on stale weights. {HOW_TO_RETURN}")
    if state["generation"] > generation and me not in state["members"]:
        raise MembershipError(
            f"tfdist_ext: {where}; the others removed it and went on without it as "
            f"{len(state['members'])} worker(s) {list(state['members'])} (generation "
            f"{state['generation']}), so it exits. {HOW_TO_RETURN}")


def members_state(prefix: str, peers: Sequence[str],
                  ask: Callable[[Sequence[str]], Optional[Mapping]]) -> Optional[Mapping]:
    """The state ({"members", "generation"}) of elastic strategy `prefix` as the workers
    at `peers` answer `ask` (`beacon.running_job`), or None."""
    answer = ask(peers) or {}
    return answer.get(prefix)
