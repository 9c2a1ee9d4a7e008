"""Worker meetings through TF's coordination service: exchanging strings, barriers.

`Strategy.exchange` and `Strategy.barrier` are built on these. Both use the
coordination service a multi-worker TF job runs anyway (docs/tf_internals.md),
so they need no other service, and both are eager and blocking: every worker
must make the same calls in the same order.
"""

import base64
import threading
import time

import tensorflow as tf

from tfdist_ext import _compat

_FOREVER_SECONDS = None  # exchanges wait as long as the store allows
_CHECK_SECONDS = 1.0  # how often a wait that can be stopped asks whether to stop


class KeyValue:
    """`set` / `get` on the coordination service's key-value store.

    The interface every meeting place offers (`tfdist_ext.elastic.store.Client`
    is the other): keys are set once; `get` waits up to `seconds` (None: as
    long as the store allows).
    """

    def set(self, key: str, value: str):
        _compat.coordination_service_kv()[0](key, str(value))

    def get(self, key: str, seconds=None) -> str:
        get_value = _compat.coordination_service_kv()[1]
        if seconds is not None:
            return get_value(key, timeout_in_ms=max(int(seconds * 1000), 1))
        return get_value(key)


def exchange(prefix: str, value, num_workers: int, worker_index: int, kv=None,
             stopped=None) -> list:
    """Every worker's `value` (as a string), in worker order.

    Args:
        prefix: A key prefix unique to this exchange, the same on every worker.
        value: This worker's value.
        num_workers: Workers in the job.
        worker_index: This worker's index.
        kv: Where to meet (`KeyValue` by default).
        stopped: Asked while waiting (see `get_all_unless_stopped`); a reason ends
            the wait with `tf.errors.AbortedError` naming it. None: wait as long
            as the store allows.
    """
    kv = kv or KeyValue()
    kv.set(f"{prefix}/{worker_index}", str(value))
    keys = [f"{prefix}/{w}" for w in range(num_workers)]
    if stopped is not None:
        return get_all_unless_stopped(kv, keys, stopped)
    return [kv.get(key, _FOREVER_SECONDS) for key in keys]


def exchange_ranks(prefix: str, mine, first_rank: int, world_size: int, kv, seconds: float,
                   stopped=None) -> list:
    """Every rank's bytes, in rank order: this worker's ranks (`first_rank` on)
    publish `mine` under ``prefix/<rank>``; the other ranks' are read from `kv`.

    Args:
        seconds: How long to wait for each other rank's value.
        stopped: Asked every second of waiting; a reason (a string) ends the wait
            with `tf.errors.AbortedError` naming it, e.g. a peer found dead, which
            will never publish its value.
    """
    for i, value in enumerate(mine):
        kv.set(f"{prefix}/{first_rank + i}", base64.b64encode(value).decode())
    everyone = []
    for rank in range(world_size):
        local = rank - first_rank
        if 0 <= local < len(mine):
            everyone.append(mine[local])
        else:
            value = get_unless_stopped(kv, f"{prefix}/{rank}", seconds, stopped)
            everyone.append(base64.b64decode(value))
    return everyone


def get_unless_stopped(kv, key: str, seconds: float, stopped=None) -> str:
    """`kv.get(key, seconds)`, asking `stopped()` every second of the wait (see
    `exchange_ranks`)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if stopped is None or left <= _CHECK_SECONDS:
            return kv.get(key, max(left, 0.001))
        try:
            return kv.get(key, _CHECK_SECONDS)
        except (tf.errors.DeadlineExceededError, TimeoutError):
            reason = stopped()
            if reason:
                raise tf.errors.AbortedError(  # pylint: disable=raise-missing-from
                    None, None, f"Stopped waiting for {key!r} in the store: {reason}")


def get_all_unless_stopped(kv, keys, stopped, poll_seconds: float = 0.2) -> list:
    """The values of `keys`, each awaited without a timeout, or `tf.errors.AbortedError`
    once `stopped()` (asked every `poll_seconds`) gives a reason, e.g. a peer found
    dead, which will never set its key.

    The reads block in a helper thread: on TF's coordination service a read that
    times out stays pending until its key is set, so reads in short timeouts would
    leave one pending call per timeout. After a stop that thread stays blocked.
    """
    values, done = [], threading.Event()
    failure = []

    def read():
        try:
            values.extend(kv.get(key) for key in keys)
        except Exception as err:  # pylint: disable=broad-except  (re-raised below)
            failure.append(err)
        done.set()

    threading.Thread(target=read, name="tfdist-store-read", daemon=True).start()
    while not done.wait(poll_seconds):
        reason = stopped()
        if reason:
            raise tf.errors.AbortedError(
                None, None, f"Stopped waiting for {keys[min(len(values), len(keys) - 1)]!r} "
                f"in the store: {reason}")
    if failure:
        raise failure[0]
    return values


def barrier(prefix: str, number: int, timeout: float, num_workers: int, worker_index: int):
    """Returns when every worker has reached barrier `number` under `prefix`.

    Args:
        prefix: A key prefix for the strategy's barriers.
        number: How many barriers this worker passed before this one.
        timeout: Seconds to wait (0 waits as long as TF allows).
        num_workers: Workers in the job (for the message).
        worker_index: This worker's index (for the message).

    Raises:
        TimeoutError: Not every worker arrived within `timeout`.
    """
    try:
        _compat.coordination_barrier(f"{prefix}/{number}", int(timeout * 1000) or 2**31 - 1)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
            tf.errors.InternalError) as err:
        raise TimeoutError(
            f"strategy.barrier() number {number}: not every one of the {num_workers} "
            f"workers arrived within {timeout:g} s (worker {worker_index} waited). "
            "Every worker must call barrier() the same number of times; raise `timeout` "
            f"when they arrive far apart. TF said: {err.message}") from None
