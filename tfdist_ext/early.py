"""Readies TensorFlow for a multi-worker job when `tfdist_ext` is imported.

TF fixes a process's device names when its eager context is created, at the
first op, tensor or device query. A multi-worker strategy must configure
collective ops before that, so scripts that load data or `adapt()`
preprocessing layers before creating the strategy used to fail with TF's
"Collective ops must be configured at program startup". With TF_CONFIG naming
this process a worker (or chief) of several, importing `tfdist_ext` configures
the job up front; TF joins the cluster lazily, at the first op, and everything
made from then on lives on the worker's devices, where the strategy finds it.

That first op blocks until every worker of TF_CONFIG has started, as
`Strategy()` does; a watcher bounds the wait (`startup.DEFAULT_SECONDS`, or
the `startup_timeout` of a strategy created before the first op). Co-located
workers share the host's cores (`share_cores`), and at exit the chief, whose
process hosts TF's coordination service, waits for the other workers to exit
first (`_finish_together`).
"""

import atexit
import logging
import os
import sys
import threading
import time
from typing import Optional

from tfdist_ext import frontends, startup
from tfdist_ext.elastic import starting
# `early.release()` ends the import-time watch, which lives in `startup`: the
# launcher releases it from there without importing this module.
from tfdist_ext.startup import release  # pylint: disable=unused-import

log = logging.getLogger("tfdist_ext")
_POLL_SECONDS = 0.2
_LOOPBACK = ("127.", "localhost", "[::1]")
# Seconds the chief (whose process hosts the coordination service) waits at
# exit for the other workers to exit.
EXIT_WAIT_SECONDS = 60.0


def prepare() -> bool:
    """Configures TF's context for this process's TF_CONFIG worker task.

    `import tfdist_ext` calls it; call it yourself after setting TF_CONFIG in
    a process that imported `tfdist_ext` before. Does nothing without (or with
    an invalid) TF_CONFIG, for tasks other than "worker" and "chief", or when TF
    already created its context. A job of one worker (`tfdist-run -np 1`) is
    readied too, so its script may also run TensorFlow before the strategy.

    Returns:
        Whether the context was configured.
    """
    from tfdist_ext import _compat, cluster, liveness  # pylint: disable=import-outside-toplevel
    try:
        spec = cluster.cluster_from_env()
    except ValueError:
        return False  # `Strategy()` reports what is wrong with TF_CONFIG
    if spec is None or spec.task_type not in ("worker", "chief") or not spec.num_workers:
        return False
    jobs = spec.without_servers()
    resolver = jobs.resolver()
    start = starting.at_import(spec)
    if not _compat.prepare_multi_worker_context(
            resolver.cluster_spec(), spec.task_type, spec.task_index,
            coordination=not start.joining, heartbeat_ms=liveness.coordination_heartbeat_ms(),
            recoverable=start.recoverable):
        return False
    share_cores(spec)
    frontends.get().prepare_workers(spec.worker_addresses)
    atexit.register(_finish_together, spec)
    startup.watch_import(spec, starting.startup_hint())
    threading.Thread(target=_stop_when_joined, name="tfdist-join-watch",
                     daemon=True).start()
    return True


def local_workers(spec) -> int:
    """How many workers of `spec` (this one included) run on this task's host."""

    def host(address):
        name = address.rpartition(":")[0]
        return "loopback" if name.startswith(_LOOPBACK) else name

    mine = host(spec.jobs[spec.task_type][spec.task_index])
    return max(1, sum(host(a) == mine for a in spec.worker_addresses))


def threads_per_worker(cores: int, workers: int) -> int:
    """TF's intra- and inter-op pool size for one of `workers` sharing `cores`."""
    return max(1, cores // max(1, workers))


def share_cores(spec) -> Optional[int]:
    """Sizes TF's thread pools as cores / workers on this host, unless the user did.

    Each TF process sizes its pools for the whole machine, so co-located
    workers oversubscribe the cores (torchrun sets OMP_NUM_THREADS=1 for the
    same reason). Left alone when TF_NUM_INTRAOP_THREADS or
    TF_NUM_INTEROP_THREADS is set, or with one worker on this host. Set them
    (or call `tf.config.threading.set_*_parallelism_threads` before the first
    op) to choose yourself.

    Returns:
        The pool size set, or None.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    workers = local_workers(spec)
    if workers < 2 or any(os.environ.get(v) for v in ("TF_NUM_INTRAOP_THREADS",
                                                        "TF_NUM_INTEROP_THREADS")):
        return None
    cores = len(os.sched_getaffinity(0))
    threads = threads_per_worker(cores, workers)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    if spec.task_index == 0:
        log.warning("tfdist_ext: %d workers share this host's %d cores: TensorFlow's "
                    "intra-op and inter-op pools have %d thread(s) each (set "
                    "TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS to choose).",
                    workers, cores, threads)
    return threads


def _finish_together(spec) -> None:
    """At exit, the chief (coordination leader) waits for the other workers to exit.

    The chief's process hosts TF's coordination service; a worker still
    finishing (its last steps, the teardown of its input pipeline) when the
    chief has gone loses its heartbeat and error polling ("StartAbort
    UNAVAILABLE: Failed to send RPC to coordination service") and can stall
    its exit. Bounded by `EXIT_WAIT_SECONDS`; skipped when the program ends
    with an uncaught exception, so a failing chief fails at once.
    """
    from tfdist_ext import _compat  # pylint: disable=import-outside-toplevel
    leader = "chief" if "chief" in spec.jobs else "worker"
    if ((spec.task_type, spec.task_index) != (leader, 0)
            or getattr(sys, "last_value", None) is not None
            or not _compat.context_initialized()):
        return
    others = startup.peers(spec.without_servers().jobs, spec.task_type, spec.task_index)
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while True:
        gone = startup.silent(others, 0.2)
        running = [f"{job} {i}" for job, i, address in others
                   if (job, i, address) not in gone]
        if not running:
            return
        if time.monotonic() > deadline:
            log.warning("tfdist_ext: the chief exits while %s still run%s, %g s after it "
                        "finished.", ", ".join(running), "s" if len(running) == 1 else "",
                        EXIT_WAIT_SECONDS)
            return
        time.sleep(0.05)


def _stop_when_joined() -> None:
    from tfdist_ext import _compat  # pylint: disable=import-outside-toplevel
    event = threading.Event()
    while startup.import_watched() and not _compat.context_initialized():
        event.wait(_POLL_SECONDS)
    release()
