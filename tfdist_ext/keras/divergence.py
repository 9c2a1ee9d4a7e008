"""Stops `fit` with an error when a relaxed mode or a compressor makes training diverge.

Relaxed synchronization (local SGD, DiLoCo, stale-synchronous, ...) and lossy
compression trade exactness for communication; with an optimizer or learning
rate they were not tuned for, they can blow a model up. Plain Keras would go on
printing `nan` for the rest of the run and save the ruined weights. Under such a
mode `fit` gets `DivergenceGuard` first in its callbacks (by
`Strategy.fit_callbacks`): after every training batch it reads the logged loss
and raises `DivergenceError`, naming the mode and the option to change, when the
loss is NaN or infinite, or above `EXPLODE_FACTOR` times the first batch's loss;
after every epoch it also raises when the epoch's mean loss has risen above
`COLLAPSE_FACTOR` times the best epoch's and above the first batch's: the
model lost what it had learned (measured: sign compression with momentum SGD
climbs back to the chance loss and stays there, accuracy at chance, with no
NaN and no loss above 2x the first).

The loss it reads is the one Keras logs: under relaxed modes, this worker's
(`Strategy.worker_local_reductions`). A NaN reaches every worker within one
averaging round, so the workers stop at the same point or, when one stops first,
the others' next collective fails within the engine's timeout naming it.

Tuning: raise `EXPLODE_FACTOR` for losses that legitimately grow far above
their first value (a loss that starts near 0); synchronous training without
compression is never guarded (its divergence is the optimizer's, as in Keras).
"""

import math

import keras

from tfdist_ext import compression as compression_lib
from tfdist_ext import sync as sync_lib

EXPLODE_FACTOR = 100.0  # a loss above this x the first batch's is taken as diverged
COLLAPSE_FACTOR = 2.0  # an epoch's mean loss above this x the best epoch's (and the first)


class DivergenceError(RuntimeError):
    """Training under a relaxed mode or a lossy compressor diverged (NaN or exploding loss)."""


class DivergenceGuard(keras.callbacks.Callback):
    """Raises `DivergenceError` at the first NaN/Inf or exploding batch loss.

    Args:
        mode: The mode in words, e.g. "sync='diloco'".
        advice: What to change, e.g. "lower `outer_learning_rate`".
        progress: Optional zero-argument callable with what the mode has done
            so far (e.g. "12 averaging rounds"), for the message.
    """

    def __init__(self, mode: str, advice: str, progress=None):
        super().__init__()
        self.mode, self.advice, self.progress = mode, advice, progress
        self.first = None
        self.best = None  # the lowest epoch-mean loss of this fit
        self.epoch = 0

    def on_train_begin(self, logs=None):
        self.first = self.best = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        loss = float(loss)
        if self.first is None and math.isfinite(loss):
            self.first = loss
            return
        if not math.isfinite(loss):
            what = f"the loss is {loss}"
        elif self.first is not None and self.first > 0 and loss > EXPLODE_FACTOR * self.first:
            what = (f"the loss {loss:.4g} is above {EXPLODE_FACTOR:g}x the first batch's "
                    f"{self.first:.4g}")
        else:
            return
        self._stop(f"batch {batch + 1}", what)

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or self.first is None or not math.isfinite(float(loss)):
            return  # a NaN stopped the batch already
        loss = float(loss)
        if (self.best is not None and self.first > 0 and loss > COLLAPSE_FACTOR * self.best
                and loss > self.first):
            self._stop("its end", f"the epoch's mean loss {loss:.4g} rose above "
                                  f"{COLLAPSE_FACTOR:g}x the best epoch's {self.best:.4g} and "
                                  f"above the first batch's {self.first:.4g}: the model lost "
                                  "what it had learned")
        self.best = loss if self.best is None else min(self.best, loss)

    def _stop(self, where, what):
        done = f" after {self.progress()}" if self.progress else ""
        raise DivergenceError(
            f"tfdist_ext: training diverged under {self.mode} at epoch {self.epoch + 1}, "
            f"{where}{done}: {what}. The weights are not usable; fit stopped. "
            f"To fix it: {self.advice}, or lower the learning rate; synchronous training "
            "(sync='sync', compression='none') is the exact reference.")


def guard_for(sync, compressor, runner=None):
    """The `DivergenceGuard` for a strategy's policy and compressor (None for exact sync).

    Args:
        sync: The `SyncPolicy`.
        compressor: The `Compressor`.
        runner: The policy's runner; its "sync_rounds" stat goes into the message.
    """
    parts, advice = [], []
    if not isinstance(sync, sync_lib.Synchronous):
        parts.append(f"sync={sync.name!r}")
        advice.append(sync.divergence_advice)
    if not isinstance(compressor, compression_lib.NoCompression):
        parts.append(f"compression={getattr(compressor, 'name', type(compressor).__name__)!r}")
        advice.append(getattr(compressor, "divergence_advice", "use compression='none'"))
    if not parts:
        return None
    progress = None
    if runner is not None and "sync_rounds" in runner.stats():
        progress = lambda: f"{runner.stats()['sync_rounds']} averaging rounds"  # noqa: E731
    return DivergenceGuard(", ".join(parts), "; ".join(advice), progress)
