"""A worker stops within seconds when a peer dies or freezes, naming the peer.

Without a launcher (plain TF_CONFIG processes on real hosts) nothing tells a
worker that a peer was killed or stopped: its collective waits until the
engine's progress timeout. Here every worker of a multi-worker job runs a
watcher thread that asks each other worker's TensorFlow server for its health
(TF's CheckPeerHealth RPC, the one MultiWorkerMirroredStrategy uses) every
`INTERVAL_SECONDS`. A peer that fails `MISSES` checks in a row (refused at
once when its process died; no answer within the timeout when it is stopped,
its host hung or the network broke) is dead: the watcher fails this worker's
collectives on both engines (TF's `abort_collective_ops`, the UCX engine's
abort op) with an error naming it, so the step in progress raises and the
script exits. A killed peer is found within about 1 s, a stopped one within
`MISSES * (INTERVAL_SECONDS + timeout)` (5 s by default); a script that then
ends with that error exits at once, skipping TF's slow teardown.

A worker that ends first writes so into the coordination service's key-value
store: normally, and its peers stop watching it; with an error of its own, and
its peers stop at once naming that error (a thread of each worker waits in the
store for that report with one read that blocks: a read with a timeout stays
pending on the service until its key is set, so reading it every round would
grow the chief's memory without bound).

In elastic training a worker that was itself frozen (SIGSTOP, a paused VM) and
runs again finds so from its own clock (a thread that sleeps `INTERVAL_SECONDS`
woke more than `FROZEN_SECONDS` late) and tells its abort callbacks, naming
itself: its peers may have removed it meanwhile (`tfdist_ext.elastic.fencing`
decides).
Tuning: ``TFDIST_PEER_TIMEOUT`` (seconds, default 2) bounds each health check;
raise it on congested or very slow links, where a check can queue behind
gradient traffic. ``TFDIST_PEER_TIMEOUT=0`` turns the watcher off (the
engines' own timeouts still apply).
"""

import atexit
import logging
import os
import sys
import threading
import time
from typing import Callable, List, Optional

from tfdist_ext import _compat

log = logging.getLogger("tfdist_ext")
TIMEOUT_VARIABLE = "TFDIST_PEER_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 2.0
INTERVAL_SECONDS = 0.5
MISSES = 2
RETRY_SECONDS = 5.0  # how often the wait for a failure report retries an unreachable store
WATCHED_HEARTBEAT_MS = 60_000  # TF's coordination heartbeat while the watcher runs
# A sleep this much late means the process stood still (a thread starved of the GIL
# wakes within milliseconds); shorter than the peers need to remove it (about 5 s).
FROZEN_SECONDS = 3.0
UNREACHABLE = "no answer"  # how a problem of a stopped or cut-off peer starts
# A replacement's checks may fail on TF's stale channel to the dead process: the
# UCX collectives' own no-progress timeout covers a death in this time.
REWATCH_GRACE_SECONDS = 30.0
_DONE_KEY = "tfdist_ext/liveness/done/{task}"
_FAILED_KEY = "tfdist_ext/liveness/failed"
_watcher: Optional["Watcher"] = None


def timeout_from_env(environ=os.environ) -> float:
    """The health check timeout in seconds (0: no watcher).

    Raises:
        ValueError: the variable is not a number >= 0; the message names it.
    """
    text = environ.get(TIMEOUT_VARIABLE, "")
    if not text:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"Environment variable {TIMEOUT_VARIABLE}={text!r} must be a number "
                         f"of seconds >= 0 (default {DEFAULT_TIMEOUT_SECONDS:g}; 0 turns the "
                         "dead-peer watcher off).")
    return value


def coordination_heartbeat_ms(environ=os.environ) -> int:
    """The heartbeat timeout (ms) for TF's coordination service, elastic or not:
    `WATCHED_HEARTBEAT_MS` while the watcher runs, 0 (TF's default, 10 s) with
    ``TFDIST_PEER_TIMEOUT=0`` or an invalid value (`Strategy()` reports it).

    With the watcher on, the service's heartbeat only backs it up: the watcher
    names a dead or stopped peer within 5 s, while the service fails the whole
    job, every worker at once, when one heartbeat of a live worker waits more
    than the timeout in the chief's RPC thread pool, which the chief's other
    RPCs share.
    """
    try:
        return WATCHED_HEARTBEAT_MS if timeout_from_env(environ) > 0 else 0
    except ValueError:
        return 0


def task_name(job: str, index: int) -> str:
    return f"/job:{job}/replica:0/task:{index}"


class Watcher:
    """Checks the health of `peers` from a daemon thread until `stop`.

    Args:
        me: This worker's task name ("/job:worker/replica:0/task:0").
        peers: (task name, "host:port") of every other worker.
        timeout: Seconds each health check may take.
        keep_watching: After a dead peer, go on watching the others (elastic
            training survives it) instead of stopping.
    """

    def __init__(self, me: str, peers, timeout: float, keep_watching: bool = False):
        self.me, self.timeout = me, timeout
        self.keep_watching = keep_watching
        self.peers = dict(peers)
        self._misses = {task: 0 for task in self.peers}
        self._grace = {}  # task -> until when its failed checks do not count
        self._alive = {}  # task -> a second opinion that counts during its grace
        self._reported = set()  # failure reports (the store's) acted on
        self.aborts: List[Callable[[str, str], None]] = []  # (reason, dead task)
        self.reason: Optional[str] = None
        self.frozen_seconds: Optional[float] = None  # the longest time this process stood
        self._stop = threading.Event()
        self._failure: Optional[str] = None  # the store's "<task> <its error>"
        self._thread = threading.Thread(target=self._run, name="tfdist-liveness", daemon=True)
        self._reports = threading.Thread(target=self._await_failure, name="tfdist-failures",
                                         daemon=True)
        self._clock = threading.Thread(target=self._tick, name="tfdist-clock", daemon=True)

    def start(self):
        if self.keep_watching:  # a replacement: the death it replaces is not news
            self._reported.add(_stored(_FAILED_KEY, timeout_in_ms=1))
        self._thread.start()
        self._reports.start()
        if self.keep_watching:
            self._clock.start()

    def stop(self):
        self._stop.set()

    def watch_again(self, task: str, address: str, grace: float,
                    alive: Optional[Callable[[], bool]] = None):
        """Watches `task` again (a replacement took the place of a dead one); its failed
        checks count only after a success or `grace` seconds (TF's channel to the old
        process may keep failing for a while), or when `alive()`, asked then, says no."""
        self._misses[task] = 0
        self._grace[task] = time.monotonic() + grace
        self._alive[task] = alive
        self.peers[task] = address

    def _await_failure(self):
        """Waits for the first failing worker's report in the store (set once: the
        store refuses to set a key again), retrying while the service is unreachable."""
        while not self._stop.is_set():
            try:
                self._failure = _compat.coordination_key_value(_FAILED_KEY, timeout_in_ms=0)
                return
            except Exception:  # pylint: disable=broad-except  (no service: a replacement)
                self._stop.wait(RETRY_SECONDS)

    def _run(self):
        misses = self._misses
        while not self._stop.wait(INTERVAL_SECONDS):
            failed = self._failure
            if (failed is not None and failed not in self._reported
                    and failed.split(" ", 1)[0] in self.peers):
                self._reported.add(failed)  # a replacement of that task is new
                task, error = failed.split(" ", 1)
                self._fail(task, f"its script ended with {error}")
                if not self.keep_watching:
                    return
                del self.peers[task]
                continue
            for task in list(self.peers):
                if self._stop.is_set():
                    return
                problem = self._check(task)
                if problem is None:
                    misses[task] = 0
                    self._grace.pop(task, None)
                elif (time.monotonic() < self._grace.get(task, 0.0)
                      and (self._alive.get(task) is None or self._alive[task]())):
                    continue
                elif _stored(_DONE_KEY.format(task=task), timeout_in_ms=100) is not None:
                    del self.peers[task]  # it finished its script: nothing to watch
                else:
                    misses[task] += 1
                    if misses[task] >= MISSES:
                        self._fail(task, problem)
                        if not self.keep_watching:
                            return
                        del self.peers[task]

    def _tick(self):
        """Finds that this process was frozen: a sleep that woke far too late."""
        while True:
            before = time.monotonic()
            if self._stop.wait(INTERVAL_SECONDS):
                return
            late = time.monotonic() - before - INTERVAL_SECONDS
            if late > FROZEN_SECONDS:
                self.frozen_seconds = max(self.frozen_seconds or 0.0, late)
                reason = (f"tfdist_ext: {self.me} itself did not run for {late:.0f} s "
                          "(stopped, or its host paused); its peers may have gone on without "
                          "it.")
                log.warning("%s", reason)
                for abort in self.aborts:
                    try:
                        abort(reason, self.me)
                    except Exception as err:  # pylint: disable=broad-except
                        log.warning("tfdist_ext: aborting collectives failed: %s", err)

    def _check(self, task) -> Optional[str]:
        try:
            _compat.check_peer_health(task, int(self.timeout * 1000))
            return None
        except Exception as err:  # pylint: disable=broad-except  (any failure is a miss)
            text = " ".join(str(getattr(err, "message", err)).split())
            if self.keep_watching and restarted(err):
                return None  # a replacement with the same task name: alive
            if timed_out(err):
                return (f"{UNREACHABLE} to {MISSES} health checks of {self.timeout:g} s "
                        "(stopped, hung or unreachable)")
            return f"its server is gone ({type(err).__name__}: {text[:200]})"

    def _fail(self, task, problem):
        then = ("Aborting the collectives in flight (elastic training)."
                if self.keep_watching else f"Stopping {self.me}'s collectives.")
        self.reason = f"tfdist_ext: peer {task} ({self.peers[task]}) failed: {problem}. {then}"
        log.error("%s", self.reason)
        for abort in self.aborts:
            try:
                abort(self.reason, task)
            except Exception as err:  # pylint: disable=broad-except
                log.warning("tfdist_ext: aborting collectives failed: %s", err)


def timed_out(err) -> bool:
    """Whether a failed health check found nobody answering (stopped, hung, unreachable),
    rather than a server that is gone."""
    text = str(getattr(err, "message", err))
    return "Deadline" in type(err).__name__ or "deadline" in text.lower()


def failure() -> Optional[str]:
    """Why the process's watcher stopped this worker's collectives (a peer failed or
    stopped), or None: for waits outside the collectives, which it cannot abort."""
    return None if _watcher is None else _watcher.reason


def frozen_seconds() -> Optional[float]:
    """The longest time this process stood still (elastic training's watcher only;
    None: never longer than `FROZEN_SECONDS`)."""
    return None if _watcher is None else _watcher.frozen_seconds


def restarted(err) -> bool:
    """Whether a failed health check says the peer's process was replaced: TF knows its
    earlier incarnation, and the new one answered (elastic training takes it in)."""
    text = str(getattr(err, "message", err))
    return "FailedPrecondition" in type(err).__name__ and "incarnation" in text


def _stored(key, timeout_in_ms) -> Optional[str]:
    """The coordination store's value of `key`, or None (absent, or the service is gone)."""
    try:
        return _compat.coordination_key_value(key, timeout_in_ms=timeout_in_ms)
    except Exception:  # pylint: disable=broad-except
        return None


def _announce_exit(watcher: Watcher):
    """At exit: tells the peers how this worker ended; after a dead peer, exits at once."""
    watcher.stop()
    error = getattr(sys, "last_value", None)
    if watcher.reason is None or (watcher.keep_watching and error is None):
        key, value = _DONE_KEY.format(task=watcher.me), "done"
        if error is not None:  # the first failing worker's error, for every peer to name
            key, value = _FAILED_KEY, f"{watcher.me} {type(error).__name__}: {error}"[:500]
        try:
            _compat.coordination_service_kv()[0](key, value)
        except Exception:  # pylint: disable=broad-except  (set already, or the service is gone)
            pass
    elif error is not None:
        # The script ended with an uncaught error after a peer died: its handlers and
        # `finally` blocks have run. TF's teardown (input pipelines, the coordination
        # service's shutdown with a dead peer) takes seconds more; skip it.
        exit_now(1)


def exit_now(code: int):
    """Ends the process with `code` at once, its logs and output flushed, skipping TF's
    teardown (which waits for peers at the coordination service's shutdown)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def watch(spec, abort: Callable[[str, str], None],
          keep_watching: bool = False) -> Optional[Watcher]:
    """Starts (once per process) watching the other workers of `spec`; adds `abort`.

    Args:
        spec: The job's `cluster.ClusterSpec` (parameter servers are not watched).
        abort: Called with the reason and the dead peer's task name when a
            peer is found dead.
        keep_watching: As in `Watcher` (elastic training); set by the first
            strategy that starts the watcher.

    Returns:
        The process's watcher, or None with fewer than 2 workers or
        ``TFDIST_PEER_TIMEOUT=0``.
    """
    global _watcher  # pylint: disable=global-statement
    if _watcher is None:
        timeout = timeout_from_env()
        jobs = spec.without_servers().jobs
        if timeout == 0 or sum(len(a) for a in jobs.values()) < 2:
            return None
        me = task_name(spec.task_type, spec.task_index)
        peers = [(task_name(job, i), address) for job, addresses in jobs.items()
                 for i, address in enumerate(addresses) if task_name(job, i) != me]
        _watcher = Watcher(me, peers, timeout, keep_watching)
        atexit.register(_announce_exit, _watcher)
        _watcher.start()
    _watcher.aborts.append(abort)
    return _watcher


def rewatch(task: str, address: str, grace: float = REWATCH_GRACE_SECONDS,
            alive: Optional[Callable[[], bool]] = None):
    """Watches `task` ("/job:worker/replica:0/task:2", at "host:port") again: it was
    found dead and a replacement took its place (elastic training). `alive`: asked
    while a failed check does not count yet (e.g. whether the replacement's store
    answers), so that a replacement dying at once is found at once too."""
    if _watcher is not None and task != _watcher.me:
        _watcher.watch_again(task, address, grace, alive)
