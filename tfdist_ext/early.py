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
the `startup_timeout` of a strategy created before the first op).
"""

import threading
from typing import Optional

from tfdist_ext import startup

_POLL_SECONDS = 0.2
_watch: Optional[startup.Watch] = None


def prepare() -> bool:
    """Configures TF's context for this process's TF_CONFIG worker task.

    `import tfdist_ext` calls it; call it yourself after setting TF_CONFIG in
    a process that imported `tfdist_ext` before. Does nothing without (or with
    an invalid) TF_CONFIG, with one worker, for tasks other than
    "worker" and "chief", or when TF already created its context.

    Returns:
        Whether the context was configured.
    """
    global _watch  # pylint: disable=global-statement
    from tfdist_ext import _compat, cluster  # pylint: disable=import-outside-toplevel
    try:
        spec = cluster.cluster_from_env()
    except ValueError:
        return False  # `Strategy()` reports what is wrong with TF_CONFIG
    if spec is None or spec.task_type not in ("worker", "chief") or spec.num_workers < 2:
        return False
    jobs = spec.without_servers()
    resolver = jobs.resolver()
    if not _compat.prepare_multi_worker_context(resolver.cluster_spec(), spec.task_type,
                                                spec.task_index):
        return False
    _watch = startup.Watch(startup.DEFAULT_SECONDS, spec)
    threading.Thread(target=_stop_when_joined, name="tfdist-join-watch",
                     daemon=True).start()
    return True


def release() -> None:
    """Ends the import-time watch (a strategy's own `startup_timeout` takes over)."""
    global _watch  # pylint: disable=global-statement
    watch, _watch = _watch, None
    if watch is not None:
        watch.stop()


def _stop_when_joined() -> None:
    from tfdist_ext import _compat  # pylint: disable=import-outside-toplevel
    event = threading.Event()
    while _watch is not None and not _compat.context_initialized():
        event.wait(_POLL_SECONDS)
    release()
