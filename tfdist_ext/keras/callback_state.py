"""What Keras' stock callbacks remember between epochs, given to a replacement worker.

`EarlyStopping`, `ReduceLROnPlateau` and `ModelCheckpoint(save_best_only=True)`
decide at the end of each epoch from its logs, which are the same on every
worker, and from counters they keep themselves (the best value so far, epochs
without improvement). A replacement that joins a running `fit` starts them
afresh: it would stop, or lower the learning rate, at another epoch than the
members, and train on alone with other weights. So at an admission the members'
leader writes its callbacks' counters to the members' store (`publish`), and the
replacement sets them on its own callbacks of the same classes, matched in order
(`receive`); `EarlyStopping(restore_best_weights=True)`'s kept weights travel
as one more broadcast from rank 0 (`share_best_weights`).

The replacement must pass the same callbacks as the members (it runs the same
script). Other callbacks' state is not carried: a callback that counts epochs
itself starts its count at the replacement's join.
"""

import json
import logging

import keras
import numpy as np
import tensorflow as tf

log = logging.getLogger("tfdist_ext")

# (class name in keras.callbacks, the attributes that carry its decisions across epochs)
_COUNTERS = (
    ("EarlyStopping", ("wait", "stopped_epoch", "best", "best_epoch")),
    ("ReduceLROnPlateau", ("wait", "best", "cooldown_counter")),
    ("ModelCheckpoint", ("best",)),
)
_INTEGERS = ("wait", "stopped_epoch", "best_epoch", "cooldown_counter")
_WAIT_SECONDS = 10.0  # the leader wrote them before the state broadcast the replacement received


def _key(generation):
    return f"keras-callbacks/{generation}"


def _of_class(callbacks, name):
    kind = getattr(keras.callbacks, name)
    return [c for c in callbacks if isinstance(c, kind)]


def _plain(value):
    return None if value is None else float(np.asarray(value))


def counters(callbacks) -> dict:
    """The counters of `callbacks` (class name -> one dict per callback of that class,
    in order), with "best_weights": whether an `EarlyStopping` keeps weights."""
    found = {}
    for name, attributes in _COUNTERS:
        for callback in _of_class(callbacks, name):
            values = {a: _plain(getattr(callback, a)) for a in attributes
                      if hasattr(callback, a)}
            if name == "EarlyStopping":
                values["best_weights"] = getattr(callback, "best_weights", None) is not None
            found.setdefault(name, []).append(values)
    return found


def set_counters(callbacks, found) -> list:
    """Sets `found` (`counters` of the same callbacks on another worker) on
    `callbacks`. Returns, for each `EarlyStopping` whose weights the other worker
    keeps, in order, this worker's callback in its place (None where this
    worker's callbacks differ: the weights are received and dropped)."""
    keeping = []
    for name, values in found.items():
        mine = _of_class(callbacks, name)
        if len(mine) != len(values):
            log.warning("tfdist_ext: this worker's fit has %d %s callback(s), the members' "
                        "%d: their state is not carried over; pass the same callbacks on "
                        "every worker.", len(mine), name, len(values))
            mine = [None] * len(values)
        for callback, state in zip(mine, values):
            if state.pop("best_weights", False):
                keeping.append(callback)
            if callback is None:
                continue
            for attribute, value in state.items():
                whole = value is not None and attribute in _INTEGERS
                setattr(callback, attribute, int(value) if whole else value)
    return keeping


def publish(kv, generation, callbacks):
    """The members' leader, at the admission of generation `generation`: writes
    its callbacks' counters to the members' store `kv`."""
    kv.set(_key(generation), json.dumps(counters(callbacks)))


def receive(kv, generation, callbacks) -> list:
    """A replacement admitted in generation `generation`: sets the members'
    counters on its callbacks. Returns the `EarlyStopping` callbacks whose
    weights it must receive (`share_best_weights`); none, with a warning, when
    the leader's store does not answer."""
    try:
        found = json.loads(kv.get(_key(generation), _WAIT_SECONDS))
    except (TimeoutError, OSError) as err:
        log.warning("tfdist_ext: the members' callback state (EarlyStopping, "
                    "ReduceLROnPlateau) did not arrive (%s): this worker's callbacks start "
                    "afresh.", err)
        return []
    return set_counters(callbacks, found)


class _Array:
    """A numpy array with the part of a variable's interface `state_sync.broadcast` uses."""

    name = "an EarlyStopping callback's kept weight"

    def __init__(self, array):
        self.value = np.asarray(array)

    @property
    def shape(self):
        return tf.TensorShape(self.value.shape)

    @property
    def dtype(self):
        return tf.as_dtype(self.value.dtype)

    def assign(self, tensor):
        self.value = np.asarray(tensor)


def share_best_weights(broadcast, model, keeping, receiving):
    """Rank 0's kept weights of the `EarlyStopping` callbacks `keeping` to every member.

    Args:
        broadcast: `Recovery.broadcast_state`.
        model: The model (the weights' shapes, on a replacement).
        keeping: The callbacks, the same number on every member: the members' own
            ones that keep weights (`keeping_weights`), the replacement's from
            `receive` (None: received, not kept).
        receiving: Whether this worker is the replacement (it has no weights to send).
    """
    if not keeping:
        return
    arrays = [[_Array(w) for w in (model.get_weights() if receiving else c.best_weights)]
              for c in keeping]
    broadcast([a for group in arrays for a in group])
    for callback, group in zip(keeping, arrays):
        if callback is not None:
            callback.best_weights = [a.value for a in group]


def keeping_weights(callbacks) -> list:
    """The `EarlyStopping` callbacks among `callbacks` that keep weights now."""
    return [c for c in _of_class(callbacks, "EarlyStopping")
            if getattr(c, "best_weights", None) is not None]
