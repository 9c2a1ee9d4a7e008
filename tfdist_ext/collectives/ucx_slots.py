"""Handle slots: the communicator an op of the UCX engine runs on, chosen at run time.

A UCX op names its communicator by an int64 handle attribute, fixed when a
function is traced. An elastic job makes new communicators at every membership
change (`tfdist_ext.elastic`); a function traced for an earlier membership of
the same world size and rank could run on them but for that handle. So the
engine builds its ops on a slot per (engine key, world size, rank) instead,
and each new engine of that key makes the slot address its own communicator
once it is wired up (`TfdistUcxAlias`): the functions traced before run on the
newest communicators without tracing again.
"""

_slots = {}  # (key, world size, rank) -> the slot handle
_owners = {}  # (key, world size, rank) -> the communicator handle the slot addresses


def take_over(ops, key, world_size, first_rank, handles):
    """Makes the slots of `key` for ranks ``first_rank ...`` address `handles` (this
    process's new communicators); returns the slot handles to build ops with."""
    slots = []
    for i, handle in enumerate(handles):
        where = (key, world_size, first_rank + i)
        _slots[where] = int(ops.tfdist_ucx_alias(_slots.get(where, 0), handle))
        _owners[where] = int(handle)
        slots.append(_slots[where])
    return slots


def release(ops, handles):
    """Empties the slots that address one of `handles` (communicators about to be
    destroyed), so that they do not keep them alive; the slot handles stay
    valid: the next `take_over` of their key fills them again. An op run on an
    empty slot fails, naming it."""
    for where, owner in list(_owners.items()):
        if owner in handles:
            ops.tfdist_ucx_destroy(_slots[where])
            del _owners[where]
