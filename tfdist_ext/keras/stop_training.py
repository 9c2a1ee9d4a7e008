"""`model.stop_training` set on some workers only: every worker stops at one step.

A callback that stops training from what only its own worker sees (a time
budget read from its own clock, a file, a signal of its own) left that
worker's `fit` while the others waited for it in the next step's all-reduce
until the engine's no-progress timeout (30 s), and then failed with an error
that named no callback. `AgreeOnStop`, the last callback of every synchronous
`fit` on several workers, makes them stop together:

- At an epoch's end the workers exchange their `stop_training` (one exchange
  through the coordination service per epoch): when any worker set it, every
  worker stops there, as one process would. A peer that fails meanwhile ends
  the wait as soon as the dead-peer watcher finds it (`tfdist_ext.liveness`),
  with an error naming it.
- After a batch, a worker that set it records so in the store for that step
  and waits up to `WAIT_SECONDS` for every other worker's record. The first
  decision written is everyone's: "now" (every worker set it after this
  step: all stop here, as one process would) or "later" (some worker is
  already in the next step): the workers that set it train on, their request
  goes into the next step's all-reduce with the preemption requests
  (`tfdist_ext.keras.preemption`), and every worker stops at the next reading
  of the agreed answer, every `preemption.CHECK_EVERY` steps.

Callbacks that decide from what every worker sees alike (EarlyStopping,
TerminateOnNaN, ReduceLROnPlateau's cooldown) thus stop at the step and epoch
one process would. Not under elastic training, whose replacements count the
steps of a `fit` from their join.
"""

import itertools
import time

import keras

from tfdist_ext import coordination, liveness
from tfdist_ext.keras import preemption as preemption_lib

WAIT_SECONDS = 2.0  # how long a worker that stopped after a batch waits for the others'
_fits = itertools.count()  # the same sequence on every worker (SPMD)
_NOW, _LATER = "now", "later"


class AgreeOnStop(keras.callbacks.Callback):
    """Makes every worker's `model.stop_training` the same (see module doc).

    Args:
        strategy: The `tfdist_ext.Strategy` (several workers, synchronous).
        kv: Where the records of a stop after a batch meet
            (`coordination.KeyValue` by default).
    """

    def __init__(self, strategy, kv=None):
        super().__init__()
        self.strategy = strategy
        self.requests = strategy.preemption
        self.kv = kv or coordination.KeyValue()
        self.fit = 0
        self.steps = 0
        self.pending = False  # this worker asked for a stop at a later step

    def on_train_begin(self, logs=None):
        self.fit, self.steps, self.pending = next(_fits), 0, False
        self.requests.stop_requested.assign(0.0)
        self.requests.stop_agreed.assign(0.0)

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps % preemption_lib.CHECK_EVERY == 0 and \
                float(self.requests.stop_agreed.numpy()) > 0:
            self.model.stop_training = True
            return
        if self.pending:
            self.model.stop_training = False
        elif self.model.stop_training and self._decide() == _LATER:
            self.model.stop_training = False
            self.pending = True
            self.requests.stop_requested.assign(1.0)

    def on_epoch_end(self, epoch, logs=None):
        mine = int(bool(self.model.stop_training) or self.pending)
        # A peer that failed never writes its flag: the dead-peer watcher's finding
        # ends the wait (it aborts the collectives only).
        flags = coordination.exchange(f"tfdist/stop-training/{self.fit}/epoch-{epoch}", mine,
                                      self.strategy.num_workers, self.strategy.worker_index,
                                      self.kv, stopped=liveness.failure)
        self.model.stop_training = any(int(flag) for flag in flags)

    def _decide(self) -> str:
        """"now" when every worker set `stop_training` after this step, else "later"."""
        prefix = f"tfdist/stop-training/{self.fit}/{self.steps}"
        me = self.strategy.worker_index
        self.kv.set(f"{prefix}/{me}", "1")
        deadline = time.monotonic() + WAIT_SECONDS
        everyone = all(self._arrived(f"{prefix}/{worker}", deadline)
                       for worker in range(self.strategy.num_workers) if worker != me)
        try:
            self.kv.set(f"{prefix}/decision", _NOW if everyone else _LATER)
        except Exception:  # pylint: disable=broad-except  (another worker decided first)
            pass
        return self.kv.get(f"{prefix}/decision", WAIT_SECONDS)

    def _arrived(self, key: str, deadline: float) -> bool:
        try:
            self.kv.get(key, max(deadline - time.monotonic(), 0.001))
            return True
        except Exception:  # pylint: disable=broad-except  (not set in time)
            return False
