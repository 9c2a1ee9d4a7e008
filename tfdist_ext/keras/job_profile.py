"""Profiles every worker of a job into one TensorBoard log directory.

`tfdist-run --profile DIR --profile-steps A-B`, or the variables
``TFDIST_PROFILE_DIR=DIR`` and ``TFDIST_PROFILE_STEPS=A-B`` on every worker,
makes the first `fit` of each worker trace its training steps A to B (counted
from 0 across epochs) with TensorFlow's profiler and write
``DIR/plugins/profile/<run>/worker<i>.xplane.pb``: one session of
TensorBoard's Profile tab (xprof) with every worker as a host, the run named
by the chief's clock. tfdist_ext's collectives appear there as
``tfdist/<algorithm>/<bucket>`` (graph scopes and, on the UCX engine, the
executor thread's own spans).

Keras' own ``TensorBoard(profile_batch=...)`` callback still works under the
strategy and profiles the chief; this adds the other workers. Tuning: skip
the first steps (tracing and warm-up), and keep B - A small: a profile of a
few steps is tens of MB per worker.
"""

import logging
import os
import pathlib
import shutil
import tempfile
import time
from typing import Optional

import keras
import tensorflow as tf

from tfdist_ext.launch.profiling import DEFAULT_STEPS, DIR, STEPS, parse_steps

log = logging.getLogger("tfdist_ext")
_profiled = False  # one profile per process: the first fit that reaches step A


def from_env(strategy, environ=os.environ) -> Optional["JobProfile"]:
    """The profile callback for this process's next `fit`, or None.

    Raises:
        ValueError: ``TFDIST_PROFILE_STEPS`` is malformed.
    """
    if _profiled or not environ.get(DIR):
        return None
    steps = parse_steps(environ[STEPS]) if environ.get(STEPS) else DEFAULT_STEPS
    return JobProfile(strategy, environ[DIR], steps)


class JobProfile(keras.callbacks.Callback):
    """Traces training steps `steps[0]`..`steps[1]` of this worker into `logdir`.

    Args:
        strategy: The `tfdist_ext.Strategy` (for the worker index and the run name).
        logdir: The job's TensorBoard log directory.
        steps: First and last step to trace (inclusive, from 0 across epochs).
    """

    def __init__(self, strategy, logdir, steps):
        super().__init__()
        self.strategy, self.logdir, self.steps = strategy, pathlib.Path(logdir), steps
        self.step = -1
        self._scratch = None
        self.written: Optional[pathlib.Path] = None

    def on_train_batch_begin(self, batch, logs=None):
        self.step += 1
        if self.step == self.steps[0] and self._scratch is None and not _profiled:
            self._start()

    def on_train_batch_end(self, batch, logs=None):
        if self.step == self.steps[1] and self._scratch is not None:
            self._stop()

    def on_train_end(self, logs=None):
        if self._scratch is not None:  # fit ended before step B
            self._stop()

    def _start(self):
        global _profiled  # pylint: disable=global-statement
        _profiled = True
        # Every worker names the session alike: the chief's clock.
        self.run = self.strategy.exchange("tfdist_profile_run",
                                          time.strftime("%Y_%m_%d_%H_%M_%S"))[0]
        self._scratch = tempfile.mkdtemp(prefix="tfdist_profile_")
        tf.profiler.experimental.start(self._scratch)

    def _stop(self):
        tf.profiler.experimental.stop()
        traces = sorted(pathlib.Path(self._scratch).rglob("*.xplane.pb"))
        target = self.logdir / "plugins" / "profile" / self.run
        target.mkdir(parents=True, exist_ok=True)
        if traces:
            self.written = target / f"worker{self.strategy.worker_index}.xplane.pb"
            shutil.move(str(traces[-1]), self.written)
            log.info("tfdist_ext: profile of steps %d-%d written to %s", self.steps[0],
                     min(self.step, self.steps[1]), self.written)
        shutil.rmtree(self._scratch, ignore_errors=True)
        self._scratch = None
