"""The callbacks `fit` adds first under a `tfdist_ext.Strategy` (`Strategy.fit_callbacks`).

`tfdist_ext.keras.fit_hooks` puts them at the head of every `fit`'s callback
list. Which ones depends on the strategy's configuration:

* always `optimizer_check.OptimizerCheck` (warns before the first step when
  the mode was measured to hurt the model's optimizer);
* `divergence.guard_for`'s guard, when the sync policy or compressor has one;
* `MomentumCheck` for compressors with momentum correction;
* `SyncCallback` for a sync policy's runner, else (several replicas)
  `DrainPoints` around a `sync.runner.BufferAverager`;
* `adaptive_controller.AdaptiveCompression` for ``compression="adaptive"``;
* `backward_profile.BackwardProfile` for bucketing planners that use backward
  times, while they are being profiled or tuned;
* `job_profile.JobProfile` when ``TFDIST_PROFILE_DIR`` asks for a profile of
  every worker (`tfdist-run --profile`), until one is written.

Stateful callbacks are made once per strategy and kept here (`kept`), so
every `fit` of the strategy shares them.
"""

import weakref

import keras

from tfdist_ext import compression
from tfdist_ext.keras import backward_profile, divergence, job_profile, optimizer_check
from tfdist_ext.sync.runner import BufferAverager

_kept = weakref.WeakKeyDictionary()  # strategy -> {name: callback or state}


def kept(strategy) -> dict:
    """The stateful callbacks made for `strategy` so far, by name ("optimizer_check",
    "buffer_averager", "adaptive", "bucket_tuner")."""
    return _kept.setdefault(strategy, {})


def fit_callbacks(strategy) -> list:
    """The callbacks `fit` adds first for `strategy` (a `tfdist_ext.Strategy`)."""
    config = strategy.config
    state = kept(strategy)
    if "optimizer_check" not in state:
        state["optimizer_check"] = optimizer_check.OptimizerCheck(
            config.sync, config.compression, config.zero_stage)
    callbacks = [state["optimizer_check"]]
    guard = divergence.guard_for(config.sync, config.compression, strategy.sync_runner)
    if guard is not None:
        callbacks.append(guard)
    if config.compression.momentum:
        callbacks.append(MomentumCheck(config.compression))
    if strategy.sync_runner is not None:
        callbacks.append(SyncCallback(strategy.sync_runner))
    elif strategy.num_replicas_in_sync > 1:
        if "buffer_averager" not in state:
            state["buffer_averager"] = BufferAverager(strategy)
        callbacks.append(DrainPoints(state["buffer_averager"]))
    if isinstance(config.compression, compression.Adaptive):
        if "adaptive" not in state:
            # pylint: disable-next=import-outside-toplevel
            from tfdist_ext.keras import adaptive_controller
            state["adaptive"] = adaptive_controller.AdaptiveCompression(strategy)
        callbacks.append(state["adaptive"])
    if getattr(config.bucketing, "uses_backward_times", False):
        if "bucket_tuner" not in state:
            state["bucket_tuner"] = backward_profile.BackwardProfile(strategy)
        tuner = state["bucket_tuner"]
        if (strategy.extended.cross_device_ops.buckets.needs_backward_profile()
                or tuner.phase == "trial"):
            callbacks.append(tuner)
    profile = job_profile.from_env(strategy)
    if profile is not None:
        callbacks.append(profile)
    return callbacks


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
