"""Where a sharded optimizer's state lives, and state restored before it existed.

A model's optimizer under `zero_stage=1` has, per weight and kind of slot
("momentum", "velocity", ...), an empty slot variable; each replica of this
process has a variable per weight for its block of it and an optimizer over
them (`step.shard_state`) whose slots of the same kinds hold that replica's
part. This module keeps
the links between them (weak: they go with the optimizer) and, for a file
loaded before the first step made the replicas' optimizers, the loaded state
until they are made (`keep_pending`, `take_pending`). `restore` writes a
replica's part of whole slots into its optimizer.
"""

import threading
import weakref

import numpy as np

_lock = threading.Lock()
_replicas = weakref.WeakKeyDictionary()  # optimizer -> {replica: (blocks, its optimizer)}
_replica_optimizers = weakref.WeakSet()
_slots = weakref.WeakKeyDictionary()  # optimizer -> {id(slot): (slot, weight, kind)}
_kinds = weakref.WeakKeyDictionary()  # replica's optimizer -> {kind: [slot per block]}
_unshared = weakref.WeakKeyDictionary()  # optimizer -> ids of its whole, own variables
_layouts = weakref.WeakKeyDictionary()  # optimizer -> paths of the sharded weights, in order
_pending = weakref.WeakKeyDictionary()  # optimizer -> [arrays, replicas still to serve]
# A replica's optimizer has its own step counter and learning rate (the step sets both).
NOT_SHARED = ("iteration", "learning_rate")


def path_of(weight) -> str:
    """A weight's Keras path (its name when it has none)."""
    return getattr(weight, "path", None) or weight.name


def is_replica_optimizer(optimizer) -> bool:
    """Whether `optimizer` is one replica's optimizer over its shard."""
    return optimizer in _replica_optimizers


def add_replica(optimizer, replica: int, blocks, own) -> None:
    """Records `own`, replica `replica`'s optimizer over `blocks`, for `optimizer`."""
    with _lock:
        _replicas.setdefault(optimizer, {})[replica] = (blocks, own)


def mark_replica_optimizer(own) -> None:
    """Marks `own` as a replica's optimizer (before it makes its slots)."""
    _replica_optimizers.add(own)


def replicas(optimizer) -> dict:
    """{replica id: (block variables, their optimizer)} of this process's replicas."""
    with _lock:
        return dict(_replicas.get(optimizer, {}))


def add_slot(optimizer, slot, weight, kind: str) -> None:
    """Records that `slot`, an empty variable of `optimizer`, stands for `weight`'s `kind`."""
    with _lock:
        _slots.setdefault(optimizer, {})[id(slot)] = (slot, weight, kind)


def slot_of(optimizer, variable):
    """(weight, kind) that `variable` of `optimizer` stands for, or None."""
    found = _slots.get(optimizer, {}).get(id(variable))
    return None if found is None or found[0] is not variable else found[1:]


def owner_of(optimizer, variable):
    """(the sharded optimizer, weight, kind) `variable` of `optimizer` stands for, or None.

    The sharded optimizer is `optimizer` or, for a `LossScaleOptimizer`, its inner one.
    """
    for owner in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        found = slot_of(owner, variable) if owner is not None else None
        if found is not None:
            return (owner,) + found
    return None


def add_unshared(optimizer, variable) -> None:
    """Records `variable` of `optimizer` as whole per replica and its own (an accumulator)."""
    with _lock:
        _unshared.setdefault(optimizer, set()).add(id(variable))


def add_kind(own, kind: str, variable) -> None:
    """Records `variable` as replica optimizer `own`'s next slot of `kind` (one per
    weight, in the weights' order)."""
    with _lock:
        _kinds.setdefault(own, {}).setdefault(kind, []).append(variable)


def kinds(own) -> dict:
    """{kind: [slot variable over each weight's block]} of a replica's optimizer."""
    return {kind: list(slots) for kind, slots in _kinds.get(own, {}).items()}


def set_layout(optimizer, weights) -> None:
    """The weights the step shards, in the partition's order."""
    _layouts[optimizer] = tuple(path_of(w) for w in weights)


def layout(optimizer):
    """(paths, weights) in shard order: the step's, or before any step the slots' weights."""
    weights = {}
    for _, weight, _ in _slots.get(optimizer, {}).values():
        weights.setdefault(path_of(weight), weight)
    paths = _layouts.get(optimizer) or tuple(weights)
    return paths, [weights[p] for p in paths]


def keep_pending(optimizer, arrays: dict, local_replicas: int) -> None:
    """Keeps loaded slots until this process's `local_replicas` replica optimizers exist.

    Args:
        arrays: {(weight path, kind): the whole slot as a numpy array}.
        local_replicas: Replicas of this process (each takes the state once).
    """
    with _lock:
        _pending[optimizer] = [arrays, local_replicas]


def take_pending(optimizer):
    """The slots kept for `optimizer`, or None; dropped once every replica took them."""
    with _lock:
        entry = _pending.get(optimizer)
        if entry is None:
            return None
        entry[1] -= 1
        if entry[1] <= 0:
            del _pending[optimizer]
        return entry[0]


def shared_variables(optimizer, own):
    """(the model optimizer's variable, `own`'s counterpart) for the variables besides
    slots, the step counter and learning rate (e.g. Nadam's `u_product`): the model's
    optimizer keeps them, and the step copies them into `own`.

    Both optimizers are of one class and config and make these variables in the
    same order; their names may differ (Keras numbers unnamed variables).
    """
    slots = {id(v) for per_kind in kinds(own).values() for v in per_kind}
    theirs = [v for v in own.variables if id(v) not in slots]
    unshared = _unshared.get(optimizer, set())
    mine = [v for v in optimizer.variables
            if slot_of(optimizer, v) is None and id(v) not in unshared]
    if [tuple(v.shape) for v in mine] != [tuple(v.shape) for v in theirs]:
        raise RuntimeError(f"{type(optimizer).__name__}'s variables besides its slots differ "
                           f"from those of its replica's copy ({[v.name for v in mine]} vs "
                           f"{[v.name for v in theirs]}); zero_stage=1 cannot shard it. Use "
                           "zero_stage=0.")
    return [(m, t) for m, t in zip(mine, theirs) if m.name not in NOT_SHARED]


def restore(own, replica: int, plan, paths, arrays: dict) -> None:
    """Writes replica `replica`'s part of whole slots into its optimizer `own`.

    Args:
        own: The replica's optimizer over its shard.
        replica: Its replica id.
        plan: The `Partition` of the weights named by `paths`.
        paths: Paths of the sharded weights, in the partition's order.
        arrays: {(weight path, kind): the whole slot}.

    Raises:
        ValueError: `arrays` lacks a slot the optimizer has.
    """
    for kind, variables in kinds(own).items():
        for (index, lo, hi), variable in zip(plan.pieces(replica), variables):
            key = (paths[index], kind)
            if key not in arrays:
                raise ValueError(f"The loaded optimizer state has no {kind!r} slot for weight "
                                 f"{paths[index]!r}: it was saved from another model or "
                                 "optimizer. Load a file saved with the same model and "
                                 "optimizer class.")
            part = np.asarray(arrays[key]).reshape(-1)[lo:hi]
            padding = np.zeros([plan.block(index) - part.size], part.dtype)
            variable.assign(np.concatenate([part, padding]).astype(
                getattr(variable.dtype, "name", variable.dtype)))
