"""Worker meetings through TF's coordination service: exchanging strings, barriers.

`Strategy.exchange` and `Strategy.barrier` are built on these. Both use the
coordination service a multi-worker TF job runs anyway (TF_NOTES.md section
7), so they need no other service, and both are eager and blocking: every
worker must make the same calls in the same order.
"""

import tensorflow as tf

from tfdist_ext import _compat


def exchange(prefix: str, value, num_workers: int, worker_index: int) -> list:
    """Every worker's `value` (as a string), in worker order.

    Args:
        prefix: A key prefix unique to this exchange, the same on every worker.
        value: This worker's value.
        num_workers: Workers in the job.
        worker_index: This worker's index.
    """
    set_value, get_value = _compat.coordination_service_kv()
    set_value(f"{prefix}/{worker_index}", str(value))
    return [get_value(f"{prefix}/{w}") for w in range(num_workers)]


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
