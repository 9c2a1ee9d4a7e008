"""Injected failures for tests and benchmarks of elastic training.

    model.fit(..., callbacks=[tfdist_ext.elastic.KillAt(worker=2, step=10)])

kills worker 2's process (SIGKILL, as a preempted machine) when it starts its
10th training step; every other worker ignores the callback, and so does a
worker started again in place of a dead one, so the same script runs
everywhere.
"""

import json
import os
import signal as signal_lib

import keras

from tfdist_ext import frontends


class KillAt(keras.callbacks.Callback):
    """Kills this process at the start of training step `step` if it is worker `worker`.

    Args:
        worker: TF_CONFIG task index of the worker to kill.
        step: Training steps counted from the start of `fit` (across
            epochs, from 0); with ``phase="test"`` validation steps.
        signal: The signal to send (SIGKILL: no clean-up runs; SIGSTOP
            freezes the process instead).
        phase: "train", or "test" to kill during `fit`'s validation.
    """

    def __init__(self, worker: int, step: int, signal=signal_lib.SIGKILL, phase="train"):
        super().__init__()
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise ValueError(f"Argument `worker` must be an integer >= 0; received {worker!r}.")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"Argument `step` must be an integer >= 0; received {step!r}.")
        if phase not in ("train", "test"):
            raise ValueError(f"Argument `phase` must be 'train' or 'test'; received {phase!r}.")
        self.worker, self.step, self.signal, self.phase = worker, step, signal, phase
        self._steps = 0
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        self._me = config.get("task", {}).get("index")

    def _step(self, phase):
        if phase == self.phase:
            if self._me == self.worker and self._steps == self.step and not self._replacement():
                os.kill(os.getpid(), self.signal)
            self._steps += 1

    def _replacement(self):
        ours = frontends.our_strategy(self.model.distribute_strategy)
        return ours is not None and ours.elastic is not None and ours.elastic.replacement

    def on_train_batch_begin(self, batch, logs=None):
        self._step("train")

    def on_test_batch_begin(self, batch, logs=None):
        self._step("test")
