"""Horovod's Keras callbacks (`hvd.callbacks`) on tfdist_ext."""

import logging

import keras
import numpy as np
import tensorflow as tf

from tfdist_ext.horovod import _collectives, _runtime
from tfdist_ext.keras.warmup import LearningRateWarmup

log = logging.getLogger("tfdist_ext")


def _model_and_optimizer_variables(model):
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        variables += [v for v in optimizer.variables if all(v is not m for m in variables)]
    return variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every process start from `root_rank`'s model and optimizer variables.

    Broadcasts the model's variables when training begins and, as Horovod,
    the model's and the optimizer's at the end of the first batch (the
    optimizer's variables exist by then), so every process continues from
    the root's first step.

    Args:
        root_rank: The process whose values win.
        device: Accepted for compatibility.
    """

    def __init__(self, root_rank, device=""):
        super().__init__()
        del device
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            _collectives.broadcast_variables(self.model.variables, self.root_rank)

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        _collectives.broadcast_variables(_model_and_optimizer_variables(self.model), self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics in `logs` by their average over processes.

    Put it before callbacks that read the metrics (ModelCheckpoint,
    ReduceLROnPlateau, ...).
    """

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or _runtime.size() == 1:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        values = [tf.constant(float(logs[k]), tf.float64) for k in names]
        for name, value in zip(names, _collectives.grouped_allreduce(values)):
            logs[name] = float(value.numpy())


class LearningRateWarmupCallback(LearningRateWarmup):
    """Horovod's warm-up: from `initial_lr / size()` to `initial_lr` over `warmup_epochs`.

    `tfdist_ext.keras.LearningRateWarmup` with `factor=hvd.size()`.
    `momentum_correction` is accepted but not applied (Keras compiles the
    momentum into the train step).
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        super().__init__(warmup_epochs=warmup_epochs, factor=float(_runtime.size()),
                         steps_per_epoch=steps_per_epoch, target_learning_rate=initial_lr,
                         verbose=verbose)
        if momentum_correction:
            log.info("hvd.callbacks.LearningRateWarmupCallback: momentum_correction is not "
                     "applied (Keras compiles the momentum into the train step).")


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier` from `start_epoch` to `end_epoch`.

    Args:
        initial_lr: The base rate.
        multiplier: A number, or a function of the (fractional) epoch.
        start_epoch: First epoch it applies to.
        end_epoch: First epoch it no longer applies to (None: to the end).
        staircase: True: once per epoch with the integer epoch; False: every
            batch with the fractional epoch.
        momentum_correction: Accepted, not applied.
        steps_per_epoch: Batches per epoch when `fit` cannot tell.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        del momentum_correction
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.steps_per_epoch = staircase, steps_per_epoch
        self._epoch = 0

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch):
        self.model.optimizer.learning_rate.assign(self.initial_lr * self.multiplier(epoch))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.staircase and self._active(epoch):
            self._set(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._active(self._epoch):
            return
        steps = self.steps_per_epoch or self.params.get("steps")
        if not steps:
            raise ValueError("LearningRateScheduleCallback(staircase=False) cannot tell the "
                             "batches per epoch: pass `steps_per_epoch`.")
        self._set(self._epoch + batch / steps)
