"""Where sync policies enter Keras' `fit`: three wrapped methods, installed once.

Keras 3 all-reduces every gradient and applies it in one private method, and
its `fit` offers no seam for "do not all-reduce this step". A strategy whose
sync policy has a runner (`tfdist_ext.sync`) installs these wrappers (the
private classes come from `tfdist_ext._compat`); they change nothing for any
other strategy:

* `TFOptimizer._backend_update_step`: the runner's `update_step` replaces
  "all-reduce gradients, then apply" (TF_NOTES.md section 1).
* `TensorFlowTrainer.make_train_function`: lets the runner wrap the model's
  train step (model averaging), and, for relaxed policies, runs the train
  function with `Strategy.reduce` kept on this worker (`sync.runner`).
* `TensorFlowTrainer.fit`: adds `SyncCallback` first in the callback list.
"""

import functools
import threading

import keras

from tfdist_ext import _compat

_lock = threading.Lock()
_installed = False


def install():
    """Installs the wrappers (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        optimizer_cls, trainer_cls = _compat.TFOptimizer, _compat.TensorFlowTrainer
        optimizer_cls._backend_update_step = _wrap_update_step(  # pylint: disable=protected-access
            optimizer_cls._backend_update_step)  # pylint: disable=protected-access
        trainer_cls.make_train_function = _wrap_make_train_function(
            trainer_cls.make_train_function)
        trainer_cls.fit = _wrap_fit(trainer_cls.fit)
        _installed = True


def runner_of(strategy):
    """The sync-policy runner of `strategy` (None for other strategies and "sync")."""
    return getattr(strategy, "sync_runner", None)


def _wrap_update_step(original):
    @functools.wraps(original)
    def update_step(self, grads, trainable_variables, learning_rate):
        runner = runner_of(self._distribution_strategy)  # pylint: disable=protected-access
        if runner is None:
            return original(self, grads, trainable_variables, learning_rate)
        return runner.update_step(self, grads, trainable_variables, learning_rate)

    return update_step


def _wrap_make_train_function(original):
    @functools.wraps(original)
    def make_train_function(self, force=False):
        runner = runner_of(self.distribute_strategy)
        if runner is None or (self.train_function is not None and not force):
            return original(self, force=force)
        step = runner.wrap_train_step(self, self.train_step)
        if step is not self.train_step:
            self.train_step = step  # instance attribute, read by `_make_function`
            try:
                original(self, force=force)
            finally:
                del self.train_step
        else:
            original(self, force=force)
        if runner.worker_local_logs:
            self.train_function = _worker_local(self.train_function,
                                                self.distribute_strategy)
        return self.train_function

    return make_train_function


def _worker_local(train_function, strategy):
    @functools.wraps(train_function)
    def run(iterator):
        with strategy.worker_local_reductions():
            return train_function(iterator)

    return run


def _wrap_fit(original):
    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        runner = runner_of(self.distribute_strategy)
        if runner is None:
            return original(self, *args, **kwargs)
        if len(args) > 5:  # x, y, batch_size, epochs, verbose, callbacks, ...
            args = list(args)
            args[5] = _with_sync_callback(args[5], runner)
        else:
            kwargs["callbacks"] = _with_sync_callback(kwargs.get("callbacks"), runner)
        return original(self, *args, **kwargs)

    return fit


def _with_sync_callback(callbacks, runner):
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return [SyncCallback(runner)] + list(callbacks or [])


class SyncCallback(keras.callbacks.Callback):
    """Drains the sync policy before evaluation, at epoch ends and at the end of `fit`.

    Added by `fit` itself for strategies with a relaxed sync policy; listed
    first, so later callbacks (ModelCheckpoint, EarlyStopping) see one model.
    """

    def __init__(self, runner):
        super().__init__()
        self.runner = runner
        self._dirty = False

    def on_train_begin(self, logs=None):
        self.runner.on_train_begin(self.model)

    def on_train_batch_end(self, batch, logs=None):
        self._dirty = True

    def _drain(self):
        if self._dirty:
            self.runner.drain(self.model)
            self._dirty = False

    def on_test_begin(self, logs=None):
        self._drain()

    def on_epoch_end(self, epoch, logs=None):
        self._drain()

    def on_train_end(self, logs=None):
        self._drain()
