"""Horovod's process model and collectives on a `tfdist_ext.Strategy`.

One process per worker, as Horovod: `init()` reads TF_CONFIG (written by
`tfdist-run`) and creates the `tfdist_ext.Strategy` that carries every call
(TF's collectives must be configured before the first TF operation, so call
`init()` first; with several GPUs per host it pins process `local_rank()` to
GPU `local_rank()`, the device pinning Horovod scripts do themselves).
Collectives work eagerly and inside `tf.function`; every worker must issue the
same collectives in the same order (as in Horovod). Gradients
(`DistributedGradientTape`, `DistributedOptimizer`) travel the strategy's
gradient path: its all-reduce algorithm, compressor and bucketing, chosen with
`init(allreduce=..., compression=..., engine=...)`; the other collectives are
plain all-reduces.
"""

import contextlib
import logging
import os
import threading
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from tfdist_ext import cluster

_WORKER_JOBS = ("chief", "worker")
log = logging.getLogger("tfdist_ext")


class _ReduceOp:
    """A Horovod reduction op (`hvd.Average`, `hvd.Sum`)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"hvd.{self.name}"


Average = _ReduceOp("Average")
Sum = _ReduceOp("Sum")
Adasum = _ReduceOp("Adasum")


class Compression:
    """Horovod's wire compression for `allreduce` and the distributed optimizers.

    `none` sends the values as they are; `fp16` sends floating-point tensors
    as float16 and casts the result back. For top-k, quantization, PowerSGD-like
    or error-feedback compression pass a tfdist_ext compressor to
    `init(compression=...)`.
    """

    class none:  # pylint: disable=invalid-name
        """No compression."""

        @staticmethod
        def compress(tensor):
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            del ctx
            return tensor

    class fp16:  # pylint: disable=invalid-name
        """Floating-point tensors travel as float16."""

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating and tensor.dtype != tf.float16:
                return tf.cast(tensor, tf.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tf.cast(tensor, ctx)


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
        self.strategy_options: Dict = {}
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
        _STATE.strategy = Strategy(num_replicas=1 if spec is None else None, **strategy_options)
        _STATE.topology = info
        _STATE.strategy_options = dict(strategy_options)


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
            options = dict(_STATE.strategy_options, compression=compression)
            if cluster.cluster_from_env() is None:
                options["num_replicas"] = 1
            _STATE.by_compression[key] = Strategy(**options)
        return _STATE.by_compression[key]


class _QuietEagerRun(logging.Filter):
    """Hides TF's "Using Strategy eagerly has significant overhead" for our own calls."""

    local = threading.local()

    def filter(self, record):
        return not (getattr(self.local, "active", False)
                    and "eagerly has significant overhead" in record.getMessage())


_FILTER = _QuietEagerRun()
tf.get_logger().addFilter(_FILTER)


@contextlib.contextmanager
def _quiet():
    _FILTER.local.active = True
    try:
        yield
    finally:
        _FILTER.local.active = False


def _run(fn, values, dist=None):
    """Runs `fn(*values)` in the (one) replica context of `dist` (default: init's)."""
    dist = dist or strategy()
    with _quiet():
        return dist.run(lambda *v: fn(dist, [tf.identity(x) for x in v]), args=tuple(values))


def reduce_op(op):
    """The `tf.distribute.ReduceOp` for a Horovod op (None means Average)."""
    if op is None or op is Average:
        return tf.distribute.ReduceOp.MEAN
    if op is Sum:
        return tf.distribute.ReduceOp.SUM
    raise ValueError(f"Argument `op` must be hvd.Average or hvd.Sum; received {op!r} "
                     "(Adasum is not supported).")


def _check_dtype(tensor, what):
    if tensor.dtype in (tf.string, tf.resource, tf.variant):
        raise ValueError(f"{what}: tensors of dtype {tensor.dtype.name} cannot be reduced; "
                         "send numbers.")


def _dense(tensor):
    return tf.convert_to_tensor(tensor)  # IndexedSlices too: reduced dense


def grouped_allreduce(tensors, average=None, op=None, compression=Compression.none,
                      prescale_factor=1.0, postscale_factor=1.0, gradients=False,
                      dist=None):
    """All-reduces a list of tensors in one fused collective; returns the list.

    Args:
        tensors: Tensors of any numeric dtype (`IndexedSlices` are densified).
        average: Horovod's deprecated flag; True means `op=Average`.
        op: `hvd.Average` (default) or `hvd.Sum`.
        compression: `hvd.Compression.none` or `.fp16`.
        prescale_factor: Multiplies each input before the reduction.
        postscale_factor: Multiplies each result.
        gradients: Send through the strategy's gradient path (its compressor
            and bucketing); used by the distributed optimizers.
        dist: The `tfdist_ext.Strategy` to use (default: `strategy()`).
    """
    if average is not None:
        op = Average if average else Sum
    wanted = reduce_op(op)
    tensors = [_dense(t) for t in tensors]
    for t in tensors:
        _check_dtype(t, "hvd.allreduce")
    if prescale_factor != 1.0:
        tensors = [t * tf.cast(prescale_factor, t.dtype) for t in tensors]
    packed = [compression.compress(t) for t in tensors]
    bools = [t.dtype == tf.bool for t, _ in packed]
    wire = [tf.cast(t, tf.int32) if b else t for (t, _), b in zip(packed, bools)]
    # Integer tensors cannot be averaged in place: sum, then divide like Horovod.
    integer = [not t.dtype.is_floating and not t.dtype.is_complex for t in wire]
    op_for_wire = tf.distribute.ReduceOp.SUM if any(integer) else wanted

    def fn(dist, values):
        if not values:
            return []
        if gradients:
            return tf.distribute.get_replica_context().all_reduce(op_for_wire, values)
        return dist.all_reduce_dense(op_for_wire, values)

    reduced = _run(fn, wire, dist) if wire else []
    out = []
    for r, (_, ctx), b, is_int in zip(reduced, packed, bools, integer):
        if b:
            r = tf.cast(r, tf.bool)
        r = compression.decompress(r, ctx)
        if op_for_wire != wanted:
            r = (tf.truncatediv(r, tf.cast(size(), r.dtype)) if is_int
                     else r / tf.cast(size(), r.dtype))
        if postscale_factor != 1.0:
            r = r * tf.cast(postscale_factor, r.dtype)
        out.append(r)
    return out


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None):
    """All-reduces one tensor (average by default); see `grouped_allreduce`."""
    del device_dense, device_sparse, name
    return grouped_allreduce([tensor], average=average, op=op, compression=compression,
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor)[0]


def allgather(tensor, name=None):
    """Concatenates every process's tensor along axis 0 (first dimensions may differ)."""
    del name
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("hvd.allgather: the tensor must have at least one dimension "
                         "(it is concatenated along axis 0); received a scalar.")
    wire = tf.cast(tensor, tf.int32) if tensor.dtype == tf.bool else tensor
    gathered = _run(lambda dist, v: tf.distribute.get_replica_context().all_gather(v[0], 0),
                    [wire])
    return tf.cast(gathered, tf.bool) if tensor.dtype == tf.bool else gathered


def broadcast(tensor, root_rank, name=None):
    """Every process gets `root_rank`'s tensor (an all-reduce of it and zeros)."""
    del name
    tensor = tf.convert_to_tensor(tensor)
    return _broadcast_list([tensor], root_rank)[0]


def _broadcast_list(tensors, root_rank):
    count = size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < count:
        raise ValueError(f"Argument `root_rank` must be an integer in [0, {count}); "
                         f"received {root_rank!r}.")
    mine = rank() == root_rank
    wire = []
    for t in tensors:
        _check_dtype(t, "hvd.broadcast")
        w = tf.cast(t, tf.int32) if t.dtype == tf.bool else t
        wire.append(w if mine else tf.zeros_like(w))
    reduced = _run(lambda dist, v: dist.all_reduce_dense(tf.distribute.ReduceOp.SUM, v),
                   wire) if wire else []
    return [tf.cast(r, tf.bool) if t.dtype == tf.bool else r for r, t in zip(reduced, tensors)]


def broadcast_variables(variables, root_rank):
    """Assigns `root_rank`'s values to `variables` on every process."""
    variables = list(variables)
    values = _broadcast_list([tf.convert_to_tensor(v) for v in variables], root_rank)
    for var, value in zip(variables, values):
        var.assign(value)


def alltoall(tensor, splits=None, name=None) -> Tuple:
    """Scatters slices of `tensor` (axis 0, sizes `splits`, one per process) and
    gathers what every process sent here.

    Returns:
        (received tensor, received splits), as Horovod. Built on two
        all-gathers, so each process receives everything (fine for small
        tensors).
    """
    del name
    tensor = tf.convert_to_tensor(tensor)
    count = size()
    if splits is None:
        first = tf.shape(tensor)[0]
        splits = tf.fill([count], first // count)
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int32)
    all_splits = tf.reshape(allgather(splits), [count, count])  # row: sender
    everything = allgather(tensor)
    offsets = tf.concat([[0], tf.cumsum(tf.reshape(all_splits, [-1]))], 0)
    me = rank()
    pieces = [everything[offsets[s * count + me]:offsets[s * count + me + 1]]
              for s in range(count)]
    return tf.concat(pieces, 0), all_splits[:, me]
