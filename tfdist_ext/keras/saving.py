"""Files the chief saves are there for every worker once its own save returns.

tf.keras 2's saving under MultiWorkerMirroredStrategy took collectives, so a
worker's `model.save` returned only when the chief's had too, and scripts
(TF's "Multi-worker training with Keras" tutorial among them) save on every
worker (the others into a temporary directory) and then load the chief's
file. Keras 3 saves without communicating, so the other workers read before
the chief has written. Under a multi-worker `tfdist_ext.Strategy`,
`keras.Model.save`, `keras.Model.save_weights` and
`tf.train.CheckpointManager.save` called outside `fit` count their calls on
each worker:
the chief publishes its n-th save of each kind through the coordination
service when it is written, and another worker's n-th save returns only once
the chief's n-th has (the chief never waits, so a save made on the chief
alone is free). A worker that saves more often than the chief waits
`WAIT_SECONDS`, then warns and goes on. For any other point where workers
must meet, use `tfdist_ext.Strategy.barrier()`. Saves inside `fit` (Keras'
callbacks) are left alone: the chief writes where asked and the others into
private directories (`tfdist_ext.keras.worker_callbacks`), and relaxed sync
policies may let `save_best_only` decide differently per worker.
"""

import collections
import contextlib
import functools
import logging
import threading

import tensorflow as tf

log = logging.getLogger("tfdist_ext")
WAIT_SECONDS = 300.0
_lock = threading.Lock()
_cluster = {}  # "strategy": the process's multi-worker strategy, "counts": per kind
_fitting = threading.local()


def register(strategy) -> bool:
    """Records the process's multi-worker `strategy` (its cluster), once.

    Returns:
        True the first time a strategy of several workers registers: then
        `tfdist_ext.keras.patches` wraps the save methods with `published`.
    """
    with _lock:
        if strategy.num_workers < 2 or _cluster:
            return False
        _cluster.update(strategy=strategy, counts=collections.Counter())
        return True


def published(original, kind):
    """A save method that, once it has saved, waits for (or publishes) the chief's save."""

    @functools.wraps(original)
    def save(*args, **kwargs):
        result = original(*args, **kwargs)
        after_save(kind)
        return result

    return save


@contextlib.contextmanager
def inside_fit():
    """Saves made in the context (by `fit`'s callbacks) are not counted."""
    previous, _fitting.active = getattr(_fitting, "active", False), True
    try:
        yield
    finally:
        _fitting.active = previous


def after_save(kind: str) -> None:
    """The chief: says its save of `kind` is written; others: wait for the chief's."""
    if getattr(_fitting, "active", False):
        return
    strategy = _cluster["strategy"]
    with _lock:
        _cluster["counts"][kind] += 1
        count = _cluster["counts"][kind]
    key = f"tfdist/saved/{kind}/{count}"
    kv = strategy.membership.kv()  # worker 0 may have died since the start
    if strategy.worker_index == 0:
        kv.set(key, "1")
        return
    try:
        kv.get(key, WAIT_SECONDS)
    except (tf.errors.DeadlineExceededError, TimeoutError, OSError):
        log.warning(
            "tfdist_ext: worker %d's save number %d (%s) returned without the chief's: "
            "the chief has not made that many saves in %g s. Call the save on every "
            "worker (the others into a temporary path), or meet with strategy.barrier().",
            strategy.worker_index, count, kind, WAIT_SECONDS)
