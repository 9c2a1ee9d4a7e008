"""Preemption: SIGTERM to any worker stops every worker at the same step, backed up.

Schedulers (Kubernetes, Slurm) send SIGTERM some seconds before SIGKILL. TF's
coordination service installs its own SIGTERM handler (for its preemption
notices), so without this a worker trains on until it is killed and nothing
is saved. A `tfdist_ext.Strategy` replaces that handler with `Preemption`'s:

1. The handler sets this worker's stop request (a variable).
2. Every synchronous training step all-reduces the requests together with
   the local batch sizes (`tfdist_ext.keras.uneven`), so every worker learns
   of the request after the same step.
3. `StopOnPreemption` (added to every `fit`) reads the agreed answer every
   `CHECK_EVERY` steps of the `fit` and at each epoch end (the same points on
   every worker; a read is a host round trip, so not every step), then writes each
   `keras.callbacks.BackupAndRestore` backup of the `fit` (weights and
   `Strategy.state`), waits until every worker has, and raises
   `SystemExit(EXIT_CODE)`. A job of one worker checks its own request after
   every step.

Restarting the job (by hand or with `tfdist-run --max-restarts`) resumes
from that backup at the start of the interrupted epoch (the next one after a
stop at an epoch's end), with the weights of the step where training
stopped. The time to stop is up to `CHECK_EVERY` training steps plus the
backup. Relaxed sync policies (no per-step collective) are not covered: their
workers stop at SIGTERM without a common step. In elastic training only the
worker that got SIGTERM leaves, and the others go on
(`tfdist_ext.elastic.leaving`).
"""

import itertools
import logging
import signal
import threading

import keras
import tensorflow as tf

from tfdist_ext import _compat

log = logging.getLogger("tfdist_ext")

EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a process ended by SIGTERM
# Steps between two reads of the agreed stop (each read is a host round trip).
CHECK_EVERY = 8
_stops = itertools.count()  # the same sequence on every worker (SPMD)


class Preemption:
    """This worker's stop request and the workers' agreed answer, as variables.

    Args:
        device: Where the two scalar variables live (this worker's first
            replica device).
    """

    def __init__(self, device):
        with _compat.init_scope(), tf.device(device):
            self.requested = _compat.ResourceVariable(0.0, trainable=False,
                                                      name="tfdist_stop_requested")
            self.agreed = _compat.ResourceVariable(0.0, trainable=False,
                                                   name="tfdist_stop_agreed")
            # The same for `model.stop_training` set on some workers only
            # (`tfdist_ext.keras.stop_training`).
            self.stop_requested = _compat.ResourceVariable(
                0.0, trainable=False, name="tfdist_fit_stop_requested")
            self.stop_agreed = _compat.ResourceVariable(0.0, trainable=False,
                                                        name="tfdist_fit_stop_agreed")
        self.signal_name = None
        self.alone = False

    def leave_alone(self):
        """From now on a request makes only this worker leave (elastic training:
        `tfdist_ext.elastic.leaving`); the others go on."""
        self.alone = True

    def install_handler(self):
        """Handles SIGTERM from now on (in the main thread only; else a no-op)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, _frame):
        self.signal_name = signal.Signals(signum).name
        log.warning("tfdist_ext: received %s; %s", self.signal_name,
                    "this worker leaves the job after the next training step and the others "
                    "go on." if self.alone else "all workers will stop after the next "
                    "training step and write their backups.")
        self.requested.assign(1.0)

    def request(self):
        """Asks every worker to stop at a common step (what SIGTERM does)."""
        self._on_signal(signal.SIGTERM, None)


class StopOnPreemption(keras.callbacks.Callback):
    """Ends `fit` on every worker after the step where a stop was agreed (see module doc).

    Args:
        strategy: The `tfdist_ext.Strategy`.
        backups: The `keras.callbacks.BackupAndRestore` callbacks of this `fit`.
    """

    def __init__(self, strategy, backups):
        super().__init__()
        self.strategy = strategy
        self.preemption = strategy.preemption
        self.backups = list(backups)
        self.epoch = 0
        self.steps = 0  # steps of this fit (`wrap_fit` makes one callback per fit)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.strategy.num_workers > 1 and self.steps % CHECK_EVERY:
            return
        if self._stop_agreed():
            self._stop(self.epoch, f"in epoch {self.epoch} after batch {batch}")

    def on_epoch_end(self, epoch, logs=None):
        if self._stop_agreed():  # resume with the next epoch: this one is complete
            self._stop(epoch + 1, f"at the end of epoch {epoch}")

    def _stop_agreed(self) -> bool:
        if self.strategy.num_workers < 2:
            return self.preemption.signal_name is not None
        return float(self.preemption.agreed.numpy()) > 0

    def _stop(self, resume_epoch, where):
        for backup in self.backups:
            backup._current_epoch = resume_epoch  # pylint: disable=protected-access
            backup._save_model()  # pylint: disable=protected-access
        self.strategy.exchange(f"preempted/{next(_stops)}", 1)  # everyone has saved
        log.warning("tfdist_ext: stopped by a preemption request %s%s; exiting with code %d.",
                    where, f", backup in {self.backups[0].backup_dir}" if self.backups else
                    " (no BackupAndRestore callback: nothing was saved)", EXIT_CODE)
        raise SystemExit(EXIT_CODE)
