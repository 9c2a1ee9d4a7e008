"""Injected failures for tests and benchmarks of elastic training.

    model.fit(..., callbacks=[tfdist_ext.elastic.KillAt(worker=2, step=10)])

kills worker 2's process (SIGKILL, as a preempted machine) when it starts its
10th training step; every other worker ignores the callback, so the same
script runs everywhere.
"""

import json
import os
import signal as signal_lib

import keras


class KillAt(keras.callbacks.Callback):
    """Kills this process at the start of training step `step` if it is worker `worker`.

    Args:
        worker: TF_CONFIG task index of the worker to kill.
        step: Training steps counted from the start of `fit` (across
            epochs, from 0).
        signal: The signal to send (SIGKILL: no clean-up runs; SIGSTOP
            freezes the process instead).
    """

    def __init__(self, worker: int, step: int, signal=signal_lib.SIGKILL):
        super().__init__()
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise ValueError(f"Argument `worker` must be an integer >= 0; received {worker!r}.")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"Argument `step` must be an integer >= 0; received {step!r}.")
        self.worker, self.step, self.signal = worker, step, signal
        self._steps = 0
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        self._me = config.get("task", {}).get("index")

    def on_train_batch_begin(self, batch, logs=None):
        if self._me == self.worker and self._steps == self.step:
            os.kill(os.getpid(), self.signal)
        self._steps += 1
