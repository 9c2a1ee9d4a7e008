"""A bound on how long a worker waits for the rest of its TF_CONFIG cluster.

TF's coordination service waits for every task named in TF_CONFIG before
`Strategy()` returns, with no effective limit: a peer that crashed before it
started its server, or was never scheduled, leaves the others waiting. During
that wait the main thread is inside TF's C++ runtime, where no Python
exception reaches it and which holds the GIL, so no Python thread of the
process can act either. `join_within` therefore watches from a small child
process (this file run as a script, standard library only): when the cluster
has not come together in time it prints which workers' ports do not answer and
ends the worker with SIGKILL. The watch `tfdist_ext.early` starts at import
is kept here (`watch_import`, `release`), so the launcher can end it without
importing TensorFlow.
"""

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from typing import Iterator, List, Optional, Tuple

DEFAULT_SECONDS = 600.0


ADVICE = (f"Raise it when the workers of a job start far apart (default "
          f"{DEFAULT_SECONDS:g}).")


def peers(jobs, task_type: str, task_index: int) -> List[Tuple[str, int, str]]:
    """(job, index, "host:port") of every task in `jobs` except this one."""
    return [(job, i, address) for job, addresses in sorted(jobs.items())
            for i, address in enumerate(addresses) if (job, i) != (task_type, task_index)]


def silent(tasks, connect_seconds: float = 1.0) -> List[Tuple[str, int, str]]:
    """The tasks whose address refuses or ignores a TCP connection."""
    missing = []
    for job, index, address in tasks:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), connect_seconds):
                pass
        except (OSError, ValueError):
            missing.append((job, index, address))
    return missing


def message(seconds: float, tasks, missing, hint: str = "") -> str:
    """What the watcher prints when the cluster did not come together in `seconds`.

    When every peer's port answers, `hint` (the caller's likelier cause for
    such a job, e.g. `tfdist_ext.elastic.starting.startup_hint`) follows the
    generic advice.
    """
    head = f"tfdist_ext.Strategy: the cluster did not come together within {seconds:g} s"
    if missing:
        names = ", ".join(f"{job} {index} ({address})" for job, index, address in missing)
        return (f"{head}: no answer from {names}. Every task in TF_CONFIG must start; read "
                "that worker's log, or raise `Strategy(startup_timeout=...)` when workers "
                "start far apart.")
    names = ", ".join(f"{job} {index}" for job, index, _ in tasks)
    text = (f"{head}: every peer's port answers ({names}) but not all of them joined; "
            "check that every worker was given the same TF_CONFIG cluster.")
    return f"{text} {hint}" if hint else text


class Watch:
    """A watcher child process that kills this one unless stopped within `seconds`.

    Args:
        seconds: The bound; 0 waits forever (no child is started).
        spec: The validated TF_CONFIG (`tfdist_ext.cluster.ClusterSpec`), or
            None; with None or a single worker there is nobody to wait for.
        hint: Added to the message when every peer answers but the join did
            not end (`message`).
    """

    def __init__(self, seconds: float, spec, hint: str = ""):
        self._child = None
        if not seconds or spec is None or spec.num_workers < 2:
            return
        watch = {"seconds": seconds, "jobs": spec.jobs, "task_type": spec.task_type,
                 "task_index": spec.task_index, "pid": os.getpid(), "hint": hint}
        self._child = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(watch)],
            stdin=subprocess.PIPE)

    def stop(self) -> None:
        """Ends the watch (the join is over, one way or the other); idempotent."""
        child, self._child = self._child, None
        if child is not None:
            child.stdin.close()  # end of file tells the child to exit
            child.wait()


# The watch `tfdist_ext.early.prepare` starts when a TF_CONFIG job imports
# tfdist_ext, until the first op joins the cluster or `release` ends it.
_import_watch: Optional[Watch] = None


def watch_import(spec, hint: str = "") -> None:
    """Starts the import-time watch of a TF_CONFIG job (`DEFAULT_SECONDS`; one per
    process); `hint` as in `Watch`."""
    global _import_watch  # pylint: disable=global-statement
    _import_watch = Watch(DEFAULT_SECONDS, spec, hint)


def import_watched() -> bool:
    """Whether the import-time watch still runs."""
    return _import_watch is not None


def release() -> None:
    """Ends the import-time watch, if it runs (`tfdist_ext.early.release`).

    A strategy's own `startup_timeout` takes over; the launcher calls it too,
    since a TF_CONFIG in its own environment is not its cluster.
    """
    global _import_watch  # pylint: disable=global-statement
    watch, _import_watch = _import_watch, None
    if watch is not None:
        watch.stop()


@contextlib.contextmanager
def join_within(seconds: float, spec, hint: str = "") -> Iterator[None]:
    """Runs the body (the cluster join); kills this process if it outlasts `seconds`.

    Args:
        seconds: The bound; 0 waits forever.
        spec: The validated TF_CONFIG (`tfdist_ext.cluster.ClusterSpec`), or
            None without one; with None or a single worker there is nobody
            to wait for and the body runs unwatched.
        hint: As in `Watch`.
    """
    watch = Watch(seconds, spec, hint)
    try:
        yield
    finally:
        watch.stop()


def _watch(spec) -> None:
    """The child's side: waits for end of file on stdin or the deadline."""
    ended, _, _ = select.select([sys.stdin], [], [], spec["seconds"])
    if ended:
        return
    tasks = peers(spec["jobs"], spec["task_type"], spec["task_index"])
    sys.stderr.write(message(spec["seconds"], tasks, silent(tasks), spec["hint"]) + "\n")
    sys.stderr.flush()
    os.kill(spec["pid"], signal.SIGKILL)


if __name__ == "__main__":
    _watch(json.loads(sys.argv[1]))
