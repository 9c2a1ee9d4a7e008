"""A replacement traces its step as a member before it asks to join.

Once the members admit a replacement (`Recovery.admit`), they wait in their next
step's collectives for its first step, which would trace Keras' train function.
`rehearsal` configures the strategy for the members the replacement expects to
join (`expected`) with UCX communicators that are not wired up (`UcxEngine`'s
`wire`), for that trace to happen before it asks; the communicators of the
generation it joins take over the same handle slots (`collectives.ucx_slots`),
so the traced function runs on them. Given other members, it traces again
(`tfdist_ext.keras.members_fit.join`).
"""

import contextlib

from tfdist_ext.elastic import membership


def expected(found, me: int) -> tuple:
    """The members a replacement `me` expects once admitted: those it `found`
    running and itself, in the order `Recovery.admit` gives (`membership.admitted`)."""
    return membership.admitted(tuple(w for w in found if w != me), (me,))


@contextlib.contextmanager
def rehearsal(strategy, recovery):
    """Within the block, `strategy` is configured as a member of the `expected`
    members without wired-up communicators (`Strategy.reconfigure_workers` with
    ``wire=False``), and `recovery.rehearsing` is True, so that the replacement
    traces as a member that caught up (`seam.Elastic.behind`): its Keras
    reductions are the members' all-reduces. Yields those members; `Recovery.join`
    configures the strategy for the members it is given.
    """
    members = expected(recovery.found, recovery.me)
    strategy.reconfigure_workers(membership.position(members, recovery.me), len(members),
                                 recovery.generation, wire=False, chief=False)
    recovery.rehearsing = True
    try:
        yield members
    finally:
        recovery.rehearsing = False
