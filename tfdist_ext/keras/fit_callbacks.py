"""The callbacks `fit` adds first under a `tfdist_ext.Strategy` (`Strategy.fit_callbacks`).

`tfdist_ext.keras.hooks` puts them at the head of every `fit`'s callback
list. Which ones depends on the strategy's configuration:

* always `optimizer_check.OptimizerCheck` (warns before the first step when
  the mode was measured to hurt the model's optimizer);
* `divergence.guard_for`'s guard, when the sync policy or compressor has one;
* `hooks.MomentumCheck` for compressors with momentum correction;
* `hooks.SyncCallback` for a sync policy's runner, else (several replicas)
  `hooks.DrainPoints` around a `sync.runner.BufferAverager`;
* `adaptive.AdaptiveCompression` for ``compression="adaptive"``;
* `hooks.BackwardProfile` for bucketing planners that use backward times,
  while they are being profiled or tuned.

Stateful callbacks are made once per strategy and kept on it (its
`_optimizer_check`, `_buffer_averager`, `_adaptive` and `_bucket_tuner`), so
every `fit` of the strategy shares them.
"""

from tfdist_ext import compression
from tfdist_ext.keras import divergence, hooks, optimizer_check
from tfdist_ext.sync.runner import BufferAverager


def fit_callbacks(strategy) -> list:
    """The callbacks `fit` adds first for `strategy` (a `tfdist_ext.Strategy`)."""
    # pylint: disable=protected-access
    config = strategy.config
    if getattr(strategy, "_optimizer_check", None) is None:
        strategy._optimizer_check = optimizer_check.OptimizerCheck(config.sync,
                                                                   config.compression)
    callbacks = [strategy._optimizer_check]
    guard = divergence.guard_for(config.sync, config.compression, strategy.sync_runner)
    if guard is not None:
        callbacks.append(guard)
    if config.compression.momentum:
        callbacks.append(hooks.MomentumCheck(config.compression))
    if strategy.sync_runner is not None:
        callbacks.append(hooks.SyncCallback(strategy.sync_runner))
    elif strategy.num_replicas_in_sync > 1:
        if getattr(strategy, "_buffer_averager", None) is None:
            strategy._buffer_averager = BufferAverager(strategy)
        callbacks.append(hooks.DrainPoints(strategy._buffer_averager))
    if isinstance(config.compression, compression.Adaptive):
        if getattr(strategy, "_adaptive", None) is None:
            from tfdist_ext.keras import adaptive  # pylint: disable=import-outside-toplevel
            strategy._adaptive = adaptive.AdaptiveCompression(strategy)
        callbacks.append(strategy._adaptive)
    if getattr(config.bucketing, "uses_backward_times", False):
        if getattr(strategy, "_bucket_tuner", None) is None:
            strategy._bucket_tuner = hooks.BackwardProfile(strategy)
        if (strategy.extended.cross_device_ops.needs_backward_profile()
                or strategy._bucket_tuner.phase == "trial"):
            callbacks.append(strategy._bucket_tuner)
    return callbacks
