"""The members of a job, as the strategy and Keras see them: the elastic seam.

`tfdist_ext.Strategy.membership` has the interface of `Members`: `Fixed` when
every worker stays for the whole job, `Elastic` (around `recovery.Recovery`)
under `Strategy(elastic=True)`. The strategy and `tfdist_ext.keras` call it
where a job whose members change behaves differently (where workers meet, how
Keras' input is split, what a collective between steps does when a worker
dies, who writes the chief's files, what each step's all-reduce also carries)
and never test whether training is elastic. `for_strategy` makes the right one.
"""

import contextlib
import logging
from typing import Callable, Optional, Protocol, Sequence

from tfdist_ext import _compat, coordination, liveness
from tfdist_ext.elastic import options as options_lib
from tfdist_ext.elastic import recovery as recovery_lib

log = logging.getLogger("tfdist_ext")
OUTSIDE_KERAS = (
    "The survivors of a death go on inside Keras' fit, evaluate and predict only; a "
    "worker's death in a custom training loop stops the job. To survive deaths, train "
    "with model.fit (override Model.train_step for a custom step), or run without "
    "elastic and restart the whole job from a checkpoint (tfdist-run --max-restarts N, "
    "tf.train.CheckpointManager or keras.callbacks.BackupAndRestore).")


class Members(Protocol):
    """The workers of a job and what changes when they change."""

    changes: bool
    """Whether the members may change during the job (a death, a replacement):
    per-step shares are then computed, never assumed from the replica count, and
    workers cannot count on meeting at the same calls (a replacement has not
    made the members' earlier ones)."""

    behind: bool
    """A replacement between its start and its first training step with the
    members: their meetings of that stretch are long past."""

    changed: bool
    """The members differ from the job's start (or this worker joined a running
    job): replica state cannot come from TF's broadcast."""

    recovery: Optional[recovery_lib.Recovery]
    """What the survivors of a death do, and its record (None when fixed)."""

    stragglers: object
    """The straggler monitor (`tfdist_ext.elastic.stragglers.Monitor`) or None."""

    def kv(self):
        """Where the members meet: the interface of `coordination.KeyValue`."""

    def data_split(self) -> tuple:
        """(part, parts): this worker's share of each global batch, by which Keras'
        input is split (ints, or int64 variables that follow the members)."""

    def on_promotion(self, callback: Callable[[], None]):
        """A context within which `callback()` runs if this worker becomes the chief."""

    def between_steps(self, run: Callable, alone: Callable):
        """`run()`, a collective outside a step function; `alone()` if the members
        changed during it."""

    def in_keras(self):
        """A context around Keras' `fit`, `evaluate` and `predict`: where the members
        may change (elsewhere, in a custom training loop, a death stops the job)."""

    def before_run(self) -> None:
        """At every `Strategy.run`: says once if it runs where the members cannot change."""

    def step_flags(self) -> list:
        """Float32 tensors of shape [1] to sum over the workers at every step."""

    def agree_flags(self, totals: Sequence) -> None:
        """Takes the sums of `step_flags` (in their order), within the step."""

    def watch(self, cluster_spec, abort_collectives: Callable[[str, str], None]) -> None:
        """Starts the dead-peer watcher (`liveness.watch`) for these members;
        `abort_collectives(reason, task)` fails the strategy's TF collectives."""


class Fixed:
    """The members of a job without elastic training: every worker, throughout.

    Args:
        worker_index: This worker's index in TF_CONFIG.
        num_workers: The job's workers.
    """

    changes = False
    behind = False
    changed = False
    recovery = None
    stragglers = None

    def __init__(self, worker_index: int, num_workers: int):
        self._split = (worker_index, num_workers)

    def kv(self):
        return coordination.KeyValue()

    def data_split(self) -> tuple:
        return self._split

    def on_promotion(self, callback):  # pylint: disable=unused-argument
        return contextlib.nullcontext()

    def between_steps(self, run, alone):  # pylint: disable=unused-argument
        return run()

    def in_keras(self):
        return contextlib.nullcontext()

    def before_run(self) -> None:
        pass

    def step_flags(self) -> list:
        return []

    def agree_flags(self, totals) -> None:
        pass

    def watch(self, cluster_spec, abort_collectives) -> None:
        liveness.watch(cluster_spec, abort_collectives)


class Elastic:
    """The members of an elastic job: `Members` in terms of its `recovery.Recovery`.

    Args:
        recovery: The job's `recovery.Recovery`.
    """

    changes = True

    def __init__(self, recovery: recovery_lib.Recovery):
        self.recovery = recovery
        self._keras_calls = 0  # fit, evaluate and predict running (nested: fit's validation)
        self._warned = False

    @property
    def behind(self) -> bool:
        recovery = self.recovery
        return (recovery.joining and not recovery.rehearsing) or recovery.catching_up

    @property
    def changed(self) -> bool:
        return self.recovery.joining or self.recovery.generation > 0

    @property
    def stragglers(self):
        return self.recovery.stragglers

    def kv(self):
        return self.recovery.kv()

    def data_split(self) -> tuple:
        return self.recovery.data_split()

    def on_promotion(self, callback):
        return self.recovery.on_promotion(callback)

    def between_steps(self, run, alone):
        """Survives a death inside Keras' `fit`, `evaluate` or `predict` only; elsewhere
        (a custom training loop reading its distributed dataset) the error is raised."""
        if not self._keras_calls:
            return run()
        return self.recovery.between_steps(run, alone)

    @contextlib.contextmanager
    def in_keras(self):
        self._keras_calls += 1
        try:
            yield
        finally:
            self._keras_calls -= 1

    def before_run(self) -> None:
        """Warns once at a `Strategy.run` outside Keras' `fit`, `evaluate` and `predict`
        (a custom training loop): a death there stops the job (`OUTSIDE_KERAS`)."""
        if not self._keras_calls and not self._warned:
            self._warned = True
            log.warning("tfdist_ext: elastic training: strategy.run outside Keras' fit, "
                        "evaluate and predict (a custom training loop). %s", OUTSIDE_KERAS)

    def step_flags(self) -> list:
        """The join request this worker saw (`admission.Requests`)."""
        return [self.recovery.join_flag.read_value()[None]]

    def agree_flags(self, totals) -> None:
        self.recovery.join_agreed.assign(totals[0])

    def watch(self, cluster_spec, abort_collectives) -> None:  # pylint: disable=unused-argument
        """A death aborts the members' UCX communicators (`Recovery.abort_communicators`)
        and, until the members first change, TF's collectives (its broadcast of initial
        values); the watcher keeps watching after it, for the deaths after. Outside Keras' `fit`,
        `evaluate` and `predict` the reason, which the failed collectives raise, says that
        the job stops (`OUTSIDE_KERAS`)."""
        def abort(reason, task):
            if not self._keras_calls:
                reason = (f"{reason} This worker is outside Keras' fit, evaluate and "
                          f"predict. {OUTSIDE_KERAS}")
            if self.recovery.abort_communicators(reason, task) and not self.changed:
                # TF's broadcast of initial values waits for the dead (`between_steps`)
                _compat.abort_collective_ops(reason)

        liveness.watch(cluster_spec, abort, keep_watching=True)


def for_strategy(strategy, options, key_prefix: str, cluster_spec) -> Members:
    """The members of `strategy`'s job: `Elastic` when `options` (an
    `options.Elastic`, None when off) asks for elastic training of several
    workers, else `Fixed`.

    Args:
        strategy: The `tfdist_ext.Strategy`, made but for its members.
        options: Its `options.Elastic`, or None.
        key_prefix: Unique to the strategy, the same on every worker.
        cluster_spec: The job's `cluster.ClusterSpec` (None without TF_CONFIG).

    Raises:
        ValueError: Elastic training with more than one replica on this worker.
    """
    if options is None or cluster_spec is None or cluster_spec.num_workers < 2:
        return Fixed(strategy.worker_index, strategy.num_workers)
    replicas = len(strategy.extended.worker_devices)
    if replicas != 1:
        raise ValueError(f"Argument `elastic` needs one replica per worker; this worker has "
                         f"{replicas}. Run one worker process per device.")
    recovery = recovery_lib.Recovery(strategy, options, key_prefix)
    if recovery.replacement:
        strategy.extended.step_down()
    if not _compat.recoverable_context():
        log.warning(
            "tfdist_ext: elastic training without %s=1 in the environment at import: the "
            "survivors of a death go on, but a worker started again cannot rejoin. Set it for "
            "every worker, as `tfdist-run --elastic` does.", options_lib.VARIABLE)
    return Elastic(recovery)
