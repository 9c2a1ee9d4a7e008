"""Where sync policies enter Keras' `fit`: three wrapped methods, installed once.

Keras 3 all-reduces every gradient and applies it in one private method, and
its `fit` offers no seam for "do not all-reduce this step". The first
`tfdist_ext.Strategy` installs these wrappers (`tfdist_ext.keras.patches`
installs every patch and lists them; the private classes come from
`tfdist_ext._compat`); they change nothing for any other strategy:

* `TFOptimizer._backend_update_step`: the runner's `update_step` replaces
  "all-reduce gradients, then apply" (docs/tf_internals.md).
* `TensorFlowTrainer.make_train_function`: lets the runner wrap the model's
  train step (model averaging), and, for relaxed policies, runs the train
  function with `Strategy.reduce` kept on this worker (`sync.runner`); with
  `jit_compile` it (and `make_test_function`) has XLA compile the step around
  its collectives (`tfdist_ext.keras.xla`).
* `TensorFlowTrainer.fit`: adds the strategy's `fit_callbacks()`
  (`tfdist_ext.keras.fit_callbacks`) first in the callback list, has
  the file-writing Keras callbacks write once per job
  (`tfdist_ext.keras.worker_callbacks`); `.fit`, `.evaluate` and `.predict`
  pad the workers' datasets to a common number of batches
  (`tfdist_ext.keras.local_input.common_length`); `.fit` in synchronous training
  also ends on every worker at a common step after a SIGTERM
  (`tfdist_ext.keras.preemption`).

`tfdist_ext.keras.uneven` (installed with them) makes synchronous training
steps weight each replica's loss by its share of the global batch, and
`tfdist_ext.keras.optimizer_fixes` makes clipping, gradient accumulation and
loss-scale skips decide on the all-reduced gradients.
"""

import functools
import itertools
import logging

import keras
import tensorflow as tf

from tfdist_ext import frontends, zero
from tfdist_ext.keras import (data_order, local_input, members_fit, moved_momentum,
                              patch_check, preemption, saving, stop_training, uneven,
                              worker_callbacks, xla)

log = logging.getLogger("tfdist_ext")

_fits = itertools.count()  # the same sequence on every worker (SPMD)


def runner_of(strategy):
    """The sync-policy runner of `strategy` (None for other strategies and "sync")."""
    ours = frontends.our_strategy(strategy)
    return None if ours is None else ours.sync_runner


def wrap_update_step(original):
    """`TFOptimizer._backend_update_step` replaced by the runner's `update_step`."""

    @functools.wraps(original)
    def update_step(self, grads, trainable_variables, learning_rate):
        runner = runner_of(self._distribution_strategy)  # pylint: disable=protected-access
        if runner is None and zero.sharded(self):
            return zero.update_step(self, grads, trainable_variables, learning_rate)
        if runner is None:
            with moved_momentum.while_tracing(self):
                return original(self, grads, trainable_variables, learning_rate)
        return runner.update_step(self, grads, trainable_variables, learning_rate)

    return update_step


def wrap_make_train_function(original):
    """`TensorFlowTrainer.make_train_function` with the runner's or uneven's train step.

    Under `jit_compile` the step is compiled by XLA around its collectives
    (`tfdist_ext.keras.xla`).
    """

    @functools.wraps(original)
    def make_train_function(self, force=False):
        strategy = self.distribute_strategy
        runner = runner_of(strategy)
        if self.train_function is not None and not force:
            return original(self, force=force)
        if runner is not None:
            step = runner.wrap_train_step(self, self.train_step)
        elif uneven.applies(strategy):
            step = uneven.weighted_train_step(self.train_step, strategy, self.run_eagerly)
        else:
            step = self.train_step
        _build_with_step(self, strategy, "train_step", step, lambda: original(self, force=force))
        if runner is not None and runner.worker_local_logs:
            self.train_function = _worker_local(self.train_function, strategy)
        self.train_function = members_fit.of(strategy).wrap(self.train_function, self, "train")
        return self.train_function

    return make_train_function


def wrap_make_test_function(original):
    """`TensorFlowTrainer.make_test_function`, XLA-compiled around its collectives."""

    @functools.wraps(original)
    def make_test_function(self, force=False):
        if self.test_function is not None and not force:
            return original(self, force=force)
        strategy = self.distribute_strategy
        step = (uneven.weighted_test_step(self.test_step, strategy, self.run_eagerly)
                if uneven.applies(strategy) else self.test_step)
        _build_with_step(self, strategy, "test_step", step,
                         lambda: original(self, force=force))
        self.test_function = members_fit.of(strategy).wrap(self.test_function, self, "test")
        return self.test_function

    return make_test_function


def _build_with_step(model, strategy, name, step, build):
    """Runs Keras' `build()` with `step` as the model's `name` method.

    Keras' `_make_function` reads the step from the model, so `step` is set as
    an instance attribute for the duration of `build()` (one the user set is
    put back).
    """
    if frontends.our_strategy(strategy) is not None and xla.applies(model, strategy):
        step = xla.clustered(step)
        build = functools.partial(xla.build_without_whole_step_jit, model, build)
    if step == getattr(model, name):
        build()
        return
    own = model.__dict__.get(name)
    setattr(model, name, step)
    try:
        build()
    finally:
        if own is None:
            delattr(model, name)
        else:
            setattr(model, name, own)


def _worker_local(train_function, strategy):
    @functools.wraps(train_function)
    def run(iterator):
        with strategy.worker_local_reductions():
            return train_function(iterator)

    return run


def wrap_fit(original):
    """`TensorFlowTrainer.fit` with the strategy's callbacks, padding and preemption."""

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        strategy = self.distribute_strategy
        if frontends.our_strategy(strategy) is None:
            return original(self, *args, **kwargs)
        patch_check.require_for(self, strategy)
        with strategy.membership.in_keras():  # where a death is survived (elastic)
            return _fit(original, self, strategy, list(args), kwargs)

    return fit


def _fit(original, model, strategy, args, kwargs):
    """The body of `wrap_fit`'s `fit` for a `tfdist_ext.Strategy` (`args` a list)."""
    members = members_fit.of(strategy)
    extra = strategy.fit_callbacks() + members.fit_callbacks(model)
    _check_data_order(strategy, args, kwargs)
    for position, name in ((0, "x"), (7, "validation_data")):
        _replace_argument(args, kwargs, position, name,
                          lambda data: local_input.common_length(data, strategy))
    if len(args) > 5:  # x, y, batch_size, epochs, verbose, callbacks, ...
        args[5] = _with_callbacks(args[5], extra)
        callbacks = args[5]
    else:
        kwargs["callbacks"] = _with_callbacks(kwargs.get("callbacks"), extra)
        callbacks = kwargs["callbacks"]
    with worker_callbacks.for_this_worker(callbacks, strategy):
        if strategy.sync_runner is None and not isinstance(
                callbacks, keras.callbacks.CallbackList):
            backups = [c for c in callbacks or []
                       if isinstance(c, keras.callbacks.BackupAndRestore)]
            stop = [preemption.StopOnPreemption(strategy, backups)]
            if strategy.num_workers > 1 and not members.changes:
                stop.append(stop_training.AgreeOnStop(strategy))
            if len(args) > 5:
                args[5] = list(args[5] or []) + stop
            else:
                kwargs["callbacks"] = list(kwargs["callbacks"] or []) + stop
        _begin_fit(members, model, args, kwargs)
        try:
            with saving.inside_fit(), moved_momentum.during_fit(strategy, model.optimizer):
                return original(model, *args, **kwargs)
        except tf.errors.FailedPreconditionError as err:
            if local_input.is_short_dataset(err):
                raise local_input.short_dataset_error(err, "fit") from err
            raise
        finally:
            strategy.keep_logs_local(False)  # also when fit raised (sync="async")


def _begin_fit(members, model, args, kwargs):
    """`members.begin_fit` with fit's callbacks and initial epoch, wherever passed."""
    positional = len(args) > 5  # x, y, batch_size, epochs, verbose, callbacks, ...
    callbacks, epoch = members.begin_fit(
        model, args[5] if positional else kwargs.get("callbacks"))
    if positional:
        args[5] = callbacks
    else:
        kwargs["callbacks"] = callbacks
    if epoch is None:
        return
    if len(args) > 11:
        args[11] = epoch
    else:
        kwargs["initial_epoch"] = epoch


def _check_data_order(strategy, args, kwargs):
    """Same TF seed for Keras' shuffle of arrays; a warning when inputs differ."""
    if strategy.num_workers < 2:
        return
    number = next(_fits)
    x = args[0] if args else kwargs.get("x")
    y = args[1] if len(args) > 1 else kwargs.get("y")
    data_order.check(strategy, f"data-order/{number}", x, y)
    shuffle = args[8] if len(args) > 8 else kwargs.get("shuffle", True)
    if shuffle and not isinstance(x, tf.data.Dataset):
        data_order.agree_shuffle_seed(strategy, f"shuffle-seed/{number}")


def wrap_inference(original):
    """`evaluate` / `predict`: the workers' datasets padded to a common length."""

    @functools.wraps(original)
    def run(self, *args, **kwargs):
        strategy = self.distribute_strategy
        if frontends.our_strategy(strategy) is None:
            return original(self, *args, **kwargs)
        patch_check.require_for(self, strategy)
        with strategy.membership.in_keras():  # where a death is survived (elastic)
            return _inference(original, self, strategy, list(args), kwargs)

    return run


def _inference(original, model, strategy, args, kwargs):
    """The body of `wrap_inference`'s `run` for a `tfdist_ext.Strategy`."""
    # Keras' fit passes `_use_cached_eval_dataset` to its validation's `evaluate`.
    members_fit.of(strategy).begin_inference(
        model, within_fit=bool(kwargs.get("_use_cached_eval_dataset")))
    _replace_argument(args, kwargs, 0, "x",
                      lambda data: local_input.common_length(data, strategy))
    try:
        return original(model, *args, **kwargs)
    except tf.errors.FailedPreconditionError as err:
        if local_input.is_short_dataset(err):
            raise local_input.short_dataset_error(err, original.__name__) from err
        raise


def _replace_argument(args, kwargs, position, name, replace):
    if len(args) > position:
        args[position] = replace(args[position])
    elif name in kwargs:
        kwargs[name] = replace(kwargs[name])


def _with_callbacks(callbacks, extra):
    if not extra or isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return extra + list(callbacks or [])
