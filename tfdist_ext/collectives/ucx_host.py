"""Whether the UCX engine's ranks sum through shared memory: every rank maps
every peer's area (`custom_ops/ucx/host_group.h`), or none uses it."""

import logging

import tensorflow as tf

log = logging.getLogger("tfdist_ext")
# Reasons not to use shared memory that are choices or layouts, not failures.
_NOT_TRIED = (b"TFDIST_UCX_SHARED_MEMORY=0", b"its worker has several replicas",
              b"another machine")


def join(ops, handles, exchange, wanted, num_local, first_rank):
    """Maps every peer's shared memory from each of this worker's communicators.

    Args:
        ops: The loaded UCX op library.
        handles: This worker's communicator handles.
        exchange: ``exchange(mine, topic)``: every rank's bytes for `topic`.
        wanted: False when shared memory is turned off on this worker.
        num_local: This worker's replica count (several: not used).
        first_rank: This worker's first rank (rank 0 logs the reason).

    Returns:
        Whether every rank mapped every peer's area (then all-reduces use it).
    """
    problem = b""
    if not wanted:
        problem = _NOT_TRIED[0] + b" on its worker"
    elif num_local > 1:
        problem = _NOT_TRIED[1]
    identities, problems = [b""] * len(handles), [problem] * len(handles)
    if not problem:
        for i, handle in enumerate(handles):
            identities[i], problems[i] = (t.numpy() for t in ops.tfdist_ucx_host_identity(handle))
    identities = exchange(identities, "host")
    for i, handle in enumerate(handles):
        if not problems[i]:
            problems[i] = ops.tfdist_ucx_join_host(handle, tf.constant(identities)).numpy()
    problems = exchange(problems, "host-joined")
    usable = not any(problems)
    for handle in handles:
        ops.tfdist_ucx_use_host(handle, usable)
    first = next((rank for rank, p in enumerate(problems) if p), None)
    if first is not None and first_rank == 0:
        chosen = any(reason in problems[first] for reason in _NOT_TRIED)
        (log.info if chosen else log.warning)(
            "tfdist_ext: the UCX engine's all-reduces run their schedules, not through "
            "shared memory: rank %d: %s", first, problems[first].decode())
    return usable
