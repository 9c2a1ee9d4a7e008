"""Where sync policies enter Keras' `fit`: three wrapped methods, installed once.

Keras 3 all-reduces every gradient and applies it in one private method, and
its `fit` offers no seam for "do not all-reduce this step". The first
`tfdist_ext.Strategy` installs these wrappers (`tfdist_ext.keras.patches`
installs every patch and lists them; the private classes come from
`tfdist_ext._compat`); they change nothing for any other strategy:

* `TFOptimizer._backend_update_step`: the runner's `update_step` replaces
  "all-reduce gradients, then apply" (TF_NOTES.md section 1).
* `TensorFlowTrainer.make_train_function`: lets the runner wrap the model's
  train step (model averaging), and, for relaxed policies, runs the train
  function with `Strategy.reduce` kept on this worker (`sync.runner`); with
  `jit_compile` it (and `make_test_function`) has XLA compile the step around
  its collectives (`tfdist_ext.keras.xla`).
* `TensorFlowTrainer.fit`: adds the strategy's `fit_callbacks()` (`SyncCallback`,
  `BackwardProfile`, `MomentumCheck`) first in the callback list, and has
  the file-writing Keras callbacks write once per job
  (`tfdist_ext.keras.worker_callbacks`); `.fit`, `.evaluate` and `.predict`
  pad the workers' datasets to a common number of batches
  (`tfdist_ext.keras.uneven.common_length`); `.fit` in synchronous training
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
import time

import keras
import numpy as np
import tensorflow as tf

from tfdist_ext import bucketing
from tfdist_ext.collectives import calibration
from tfdist_ext.keras import data_order, preemption, saving, uneven, worker_callbacks, xla

log = logging.getLogger("tfdist_ext")

_fits = itertools.count()  # the same sequence on every worker (SPMD)


def runner_of(strategy):
    """The sync-policy runner of `strategy` (None for other strategies and "sync")."""
    return getattr(strategy, "sync_runner", None)


def wrap_update_step(original):
    """`TFOptimizer._backend_update_step` replaced by the runner's `update_step`."""

    @functools.wraps(original)
    def update_step(self, grads, trainable_variables, learning_rate):
        runner = runner_of(self._distribution_strategy)  # pylint: disable=protected-access
        if runner is None:
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
        return self.train_function

    return make_train_function


def wrap_make_test_function(original):
    """`TensorFlowTrainer.make_test_function`, XLA-compiled around its collectives."""

    @functools.wraps(original)
    def make_test_function(self, force=False):
        if self.test_function is not None and not force:
            return original(self, force=force)
        _build_with_step(self, self.distribute_strategy, "test_step", self.test_step,
                         lambda: original(self, force=force))
        return self.test_function

    return make_test_function


def _build_with_step(model, strategy, name, step, build):
    """Runs Keras' `build()` with `step` as the model's `name` method.

    Keras' `_make_function` reads the step from the model, so `step` is set as
    an instance attribute for the duration of `build()` (one the user set is
    put back).
    """
    if uneven.is_tfdist_strategy(strategy) and xla.applies(model, strategy):
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
        if not uneven.is_tfdist_strategy(strategy):
            return original(self, *args, **kwargs)
        extra = strategy.fit_callbacks()
        args = list(args)
        _check_data_order(strategy, args, kwargs)
        for position, name in ((0, "x"), (7, "validation_data")):
            _replace_argument(args, kwargs, position, name,
                              lambda data: uneven.common_length(data, strategy))
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
                stop = preemption.StopOnPreemption(strategy, backups)
                if len(args) > 5:
                    args[5] = list(args[5] or []) + [stop]
                else:
                    kwargs["callbacks"] = list(kwargs["callbacks"] or []) + [stop]
            try:
                with saving.inside_fit():
                    return original(self, *args, **kwargs)
            finally:
                strategy.keep_logs_local(False)  # also when fit raised (sync="async")

    return fit


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
        if uneven.is_tfdist_strategy(strategy):
            args = list(args)
            _replace_argument(args, kwargs, 0, "x",
                              lambda data: uneven.common_length(data, strategy))
        return original(self, *args, **kwargs)

    return run


def _replace_argument(args, kwargs, position, name, replace):
    if len(args) > position:
        args[position] = replace(args[position])
    elif name in kwargs:
        kwargs[name] = replace(kwargs[name])


def _with_callbacks(callbacks, extra):
    if not extra or isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return extra + list(callbacks or [])


class DrainPoints(keras.callbacks.Callback):
    """Calls `drain(model)` before evaluation, at epoch ends and at the end of `fit`.

    Only when a train step ran since the last call. Under sync="sync", `fit`
    adds one with a `BufferAverager` (Keras 3 keeps BatchNorm statistics per
    replica, `aggregation="none"`), so every worker evaluates and saves one model.
    """

    def __init__(self, drain):
        super().__init__()
        self._drain_fn = drain
        self._dirty = False

    def on_train_batch_end(self, batch, logs=None):
        self._dirty = True

    def _drain(self):
        if self._dirty:
            self._drain_fn(self.model)
            self._dirty = False

    def on_test_begin(self, logs=None):
        self._drain()

    def on_epoch_end(self, epoch, logs=None):
        self._drain()

    def on_train_end(self, logs=None):
        self._drain()


class SyncCallback(DrainPoints):
    """Drains the sync policy before evaluation, at epoch ends and at the end of `fit`.

    Added by `fit` itself for strategies with a relaxed sync policy; listed
    first, so later callbacks (ModelCheckpoint, EarlyStopping) see one model.
    It also forwards the runner's other hooks.
    """

    def __init__(self, runner):
        super().__init__(runner.drain)
        self.runner = runner

    def on_train_begin(self, logs=None):
        self.runner.on_train_begin(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self.runner.on_epoch_begin(self.model)

    def on_test_begin(self, logs=None):
        super().on_test_begin(logs)
        self.runner.on_test_begin(self.model)

    def on_test_end(self, logs=None):
        self.runner.on_test_end(self.model)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        self.runner.on_train_end(self.model)


class MomentumCheck(keras.callbacks.Callback):
    """Refuses to train with momentum twice: in the compressor (DGC) and the optimizer."""

    def __init__(self, compressor):
        super().__init__()
        self.compressor = compressor

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        momentum = float(getattr(optimizer, "momentum", 0.0) or 0.0)
        if momentum:
            raise ValueError(
                f"Compression {self.compressor!r} applies momentum correction (DGC) itself, "
                f"and the optimizer {type(optimizer).__name__} also has momentum={momentum}: "
                f"momentum would be applied twice. Compile with "
                f"keras.optimizers.SGD(learning_rate, momentum=0.0), or give the compressor "
                f"momentum=0.")


class BackwardProfile(keras.callbacks.Callback):
    """Profiles when each gradient exists, then plans (and tunes) the buckets (MG-WFBP).

    1. While no backward times are known, the strategy's gradient reduction
       stamps (`tf.timestamp`) the moment each gradient is computed on the
       chief's first replica. After `profile_steps` batches the mean stamps
       become per-gradient backward times (backward order), the chief's
       (`calibration.broadcast_from_chief`) so every worker plans alike.
    2. With `tune`, each distinct plan among MG-WFBP's for alpha x
       `ALPHA_SCALES` and equal-size splits into `EQUAL_PARTS` buckets is
       traced and timed for `profile_steps` batches (after one batch that pays
       the re-trace); the chief's fastest wins.
    3. The train function is re-traced with the chosen plan.

    The strategy keeps one instance, so a tuning cut short by the end of a
    `fit` continues in the next.
    """

    ALPHA_SCALES = (1 / 16, 1 / 4, 1.0, 4.0, 1e6)  # 1e6: one bucket
    EQUAL_PARTS = (4, 8)

    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.cross_ops = strategy.extended.cross_device_ops
        self.planner = strategy.config.bucketing
        self.phase = "profile"
        self.steps = 0
        self.candidates = []  # ((kind, value), plan)
        self.medians = []
        self.durations = []
        self._began = None

    @property
    def done(self):
        return self.phase == "done"

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self.phase == "profile":
            self.steps += 1
            if self.steps >= self.planner.profile_steps:
                self._profiled()
        elif self.phase == "trial":
            self.durations.append(time.perf_counter() - self._began)
            if len(self.durations) > self.planner.profile_steps:
                self.medians.append(float(np.median(self.durations[1:])))
                self._next_trial()

    def _profiled(self):
        state = self.strategy.state
        ready = state.ready_sum.numpy() / max(1, int(state.ready_count.numpy()))
        times = self._chief(backward_times(ready[::-1]))
        self.cross_ops.backward_times = tuple(times)
        log.info("tfdist_ext: profiled backward times (ms, backward order): %s",
                 ", ".join(f"{t * 1e3:.2f}" for t in times))
        if not self.planner.tune or self.cross_ops.plan_inputs is None:
            self._finish(None)
            return
        sizes, alpha, beta = self.cross_ops.plan_inputs
        plans = [(("alpha", scale), self.planner.plan(list(sizes), times, alpha * scale, beta))
                 for scale in self.ALPHA_SCALES]
        # Equal-size buckets: TF runs independent collectives concurrently, which
        # MG-WFBP's one-channel model does not capture (docs/results.md#gradient-bucketing).
        plans += [(("parts", parts), bucketing.FixedSize(
            max(1, -(-sum(sizes) // parts))).plan(list(sizes))) for parts in self.EQUAL_PARTS]
        seen = set()
        for choice, plan in plans:
            if plan not in seen:
                seen.add(plan)
                self.candidates.append((choice, plan))
        self.phase = "trial"
        self._start_trial()

    def _chief(self, values):
        """The chief's `values` (floats), so that every worker plans alike."""
        return calibration.broadcast_from_chief(self.cross_ops, values,
                                                self.cross_ops.first_rank)

    def _start_trial(self):
        self.durations = []
        self.cross_ops.plan_override = self.candidates[len(self.medians)][1]
        self.model.make_train_function(force=True)

    def _next_trial(self):
        if len(self.medians) < len(self.candidates):
            self._start_trial()
            return
        best = int(self._chief([int(np.argmin(self.medians))])[0])
        self.trials = [{"candidate": f"{kind} {value:g}", "buckets": len(plan),
                        "step_seconds": median, "chosen": i == best}
                       for i, (((kind, value), plan), median) in enumerate(
                           zip(self.candidates, self.medians))]
        for trial in self.trials:
            log.info("tfdist_ext: bucket plan %s: %d bucket(s), %.2f ms/step%s",
                     trial["candidate"], trial["buckets"], trial["step_seconds"] * 1e3,
                     "  <- chosen" if trial["chosen"] else "")
        self._finish(self.candidates[best][1])

    def _finish(self, plan):
        self.cross_ops.plan_override = plan
        self.model.make_train_function(force=True)
        self.phase = "done"


def backward_times(ready):
    """Per-gradient backward seconds from ready stamps in backward order.

    Gradient i's time is how much later than every earlier gradient it was
    ready (never negative), so the prefix sums are the running maximum.
    """
    times, latest = [], None
    for stamp in ready:
        times.append(0.0 if latest is None else max(0.0, float(stamp) - latest))
        latest = float(stamp) if latest is None else max(latest, float(stamp))
    return times
