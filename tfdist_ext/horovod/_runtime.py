"""Horovod's process model on a `tfdist_ext.Strategy` (the collectives are in
`_collectives`).

One process per worker, as Horovod: `init()` reads TF_CONFIG (written by
`tfdist-run`) and creates the `tfdist_ext.Strategy` that carries every call
(TF's collectives must be configured before the first TF operation, so call
`init()` first; with several GPUs per host it pins process `local_rank()` to
GPU `local_rank()`, the device pinning Horovod scripts do themselves).
`init(allreduce=..., compression=..., engine=...)` chooses the strategy's
all-reduce algorithm, compressor and bucketing.
"""

import logging
import os
import threading
from typing import Dict, List, Optional

import tensorflow as tf

from tfdist_ext import cluster

_WORKER_JOBS = ("chief", "worker")
log = logging.getLogger("tfdist_ext")

def topology(jobs: Dict[str, List[str]], task_type: str, task_index: int) -> Dict[str, int]:
    """Horovod's rank, size, local and cross ranks for one task of a TF_CONFIG cluster.

    Ranks follow the workers' order (chief first). A host is the address
    without its port; local ranks count the workers sharing this task's host,
    cross ranks count hosts in order of first appearance.
    """
    workers = [(job, i, address) for job in _WORKER_JOBS
               for i, address in enumerate(jobs.get(job, ()))]
    rank = next(r for r, (job, i, _) in enumerate(workers) if (job, i) == (task_type, task_index))
    hosts = [address.rpartition(":")[0] for _, _, address in workers]
    order = list(dict.fromkeys(hosts))
    mine = hosts[rank]
    return {"rank": rank, "size": len(workers),
            "local_rank": hosts[:rank].count(mine), "local_size": hosts.count(mine),
            "cross_rank": order.index(mine), "cross_size": len(order)}


class _State:
    def __init__(self):
        self.topology: Optional[Dict[str, int]] = None  # set by init()
        self.strategy_options: Dict = {}  # as the user passed them to init()
        self.base_options: Dict = {}  # what the Strategy was built with
        self.strategy = None
        self.by_compression: Dict[str, object] = {}
        self.lock = threading.Lock()


_STATE = _State()


def init(**strategy_options) -> None:
    """Starts Horovod's process model (reads TF_CONFIG; one process without it).

    Args:
        **strategy_options: `tfdist_ext.Strategy` options for the collectives
            (`allreduce`, `compression`, `bucketing`, `engine`,
            `startup_timeout`); `sync` is refused (Horovod is synchronous).

    Raises:
        ValueError: On a `num_replicas` or `sync` option, or a TF_CONFIG task
            that is not a worker.
    """
    for name in ("num_replicas", "sync"):
        if name in strategy_options:
            raise ValueError(
                f"Argument `{name}` is not available through hvd.init: the Horovod API "
                "runs one process per device with synchronous gradients. Use "
                "tfdist_ext.Strategy directly for relaxed synchronization.")
    for name in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"):
        if name in os.environ:
            log.warning("tfdist_ext.horovod: %s is not read; gradient fusion is set with "
                        "hvd.init(bucketing=...) (see tfdist_ext.bucketing).", name)
    spec = cluster.cluster_from_env()
    if spec is None:
        info = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1,
                "cross_rank": 0, "cross_size": 1}
    else:
        if spec.task_type not in _WORKER_JOBS:
            raise ValueError(f"hvd.init: TF_CONFIG task type {spec.task_type!r} is not a "
                             f"worker; the Horovod API runs on 'chief' and 'worker' tasks.")
        info = topology(spec.jobs, spec.task_type, spec.task_index)
    with _STATE.lock:
        if _STATE.strategy is not None:
            if strategy_options and strategy_options != _STATE.strategy_options:
                raise ValueError("hvd.init was already called with other options; call "
                                 "hvd.init once per process.")
            return
        if spec is not None and info["local_size"] > 1:
            _pin_gpu(info["local_rank"])
        from tfdist_ext.strategy import Strategy  # pylint: disable=import-outside-toplevel
        # Without TF_CONFIG this one process is the whole job: one replica, like Horovod.
        base = dict(strategy_options, num_replicas=1 if spec is None else None)
        _STATE.strategy = Strategy(**base)
        _STATE.topology = info
        _STATE.strategy_options = dict(strategy_options)
        _STATE.base_options = base


def _pin_gpu(local):
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) > 1:
        tf.config.set_visible_devices(gpus[local % len(gpus)], "GPU")


def shutdown() -> None:
    """Horovod's shutdown: a no-op (TF keeps its cluster until the process exits)."""


def is_initialized() -> bool:
    """Whether `init()` was called."""
    return _STATE.topology is not None


def _info(key: str) -> int:
    if _STATE.topology is None:
        raise ValueError(f"Horovod has not been initialized; call hvd.init() before "
                         f"hvd.{key}().")
    return _STATE.topology[key]


def rank() -> int:
    """This process's rank (0 is the chief)."""
    return _info("rank")


def size() -> int:
    """Number of processes."""
    return _info("size")


def local_rank() -> int:
    """Rank among the processes on this host."""
    return _info("local_rank")


def local_size() -> int:
    """Processes on this host."""
    return _info("local_size")


def cross_rank() -> int:
    """Index of this host."""
    return _info("cross_rank")


def cross_size() -> int:
    """Number of hosts."""
    return _info("cross_size")


def mpi_threads_supported() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    return False


def strategy(compression=None):
    """The `tfdist_ext.Strategy` behind the collectives.

    Args:
        compression: None for the one `init()` made; a tfdist_ext compressor
            (name, dict or `Compressor`) for one that differs from it only in
            its compressor, made on first use (every process must ask for the
            same compressors in the same order, as they do when they build the
            same optimizers).
    """
    if compression is None:
        _info("size")
        return _STATE.strategy
    from tfdist_ext import compression as compressors  # pylint: disable=import-outside-toplevel
    key = repr(compressors.get(compression))
    _info("size")
    with _STATE.lock:
        if key not in _STATE.by_compression:
            from tfdist_ext.strategy import Strategy  # pylint: disable=import-outside-toplevel
            _STATE.by_compression[key] = Strategy(
                **dict(_STATE.base_options, compression=compression))
        return _STATE.by_compression[key]
