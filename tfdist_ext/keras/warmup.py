"""Learning-rate scaling for large global batches, with a gradual warm-up.

Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1
Hour": when the global batch grows k-fold, multiply the learning rate by k
(`linear_scaling`), and reach that rate gradually: start at 1/k of it and raise
it by the same amount every step for the first few epochs (5 in the paper),
which avoids the early divergence a k-fold rate causes. The same rule as
Horovod's `LearningRateWarmupCallback`.

Typical use, for a recipe tuned at batch 256 and learning rate 0.1::

    lr = tfdist_ext.keras.linear_scaling(0.1, global_batch_size, 256)
    model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9), ...)
    model.fit(..., callbacks=[tfdist_ext.keras.LearningRateWarmup(warmup_epochs=5)])

Tuning: 5 epochs suit k up to about 32 on ImageNet-sized epochs; a shorter
epoch (few steps) needs more warm-up epochs. With `k = 1` the callback does
nothing.
"""

import math

import keras


def _positive(name, value, allow_zero=False):
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"Argument `{name}` must be a finite number {bound}; received {value!r}.")
    return value


def linear_scaling(base_learning_rate: float, global_batch_size: int,
                   base_batch_size: int) -> float:
    """Goyal's linear scaling rule: the learning rate for `global_batch_size`.

    Args:
        base_learning_rate: The rate tuned at `base_batch_size`.
        global_batch_size: The batch summed over all replicas (the batch size
            `fit` sees).
        base_batch_size: The batch the base rate was tuned at.

    Returns:
        `base_learning_rate * global_batch_size / base_batch_size`.
    """
    _positive("base_learning_rate", base_learning_rate)
    _positive("global_batch_size", global_batch_size)
    _positive("base_batch_size", base_batch_size)
    return base_learning_rate * global_batch_size / base_batch_size


def warmup_learning_rate(target: float, factor: float, progress: float) -> float:
    """The warm-up rate after `progress` warm-up periods (0 to 1; clipped).

    `target / factor` at the start, `target` at the end, linear in between.
    """
    progress = min(max(progress, 0.0), 1.0)
    return target / factor * (1.0 + (factor - 1.0) * progress)


class LearningRateWarmup(keras.callbacks.Callback):
    """Raises the optimizer's learning rate linearly to its compiled value.

    At every training batch of the first `warmup_epochs` epochs the learning
    rate is set to `warmup_learning_rate(target, factor, (epoch + batch /
    steps_per_epoch) / warmup_epochs)`, where `target` is the optimizer's
    learning rate when `fit` starts; afterwards it stays at `target`.

    Args:
        warmup_epochs: Length of the warm-up in epochs (fractions allowed).
        factor: How many times lower the first rate is than `target`.
            Defaults to the strategy's `num_replicas_in_sync` (the k of the
            linear scaling rule when the per-replica batch is fixed).
        steps_per_epoch: Batches per epoch; defaults to what `fit` reports
            (needed for datasets of unknown length).
        target_learning_rate: The rate the warm-up ends at. Defaults to the
            optimizer's rate when `fit` starts; pass it when the job may resume
            mid-warm-up from a `BackupAndRestore` backup (which restores the
            partly warmed rate).
        verbose: 1 prints the rate at the start and the end of the warm-up.

    Raises:
        ValueError: On a bad argument, or when the optimizer's learning rate
            is a schedule (combine the schedule with the warm-up yourself, or
            use a constant rate).
    """

    def __init__(self, warmup_epochs: float = 5, factor=None, steps_per_epoch=None,
                 target_learning_rate=None, verbose=0):
        super().__init__()
        self.warmup_epochs = _positive("warmup_epochs", warmup_epochs)
        if factor is not None and (_positive("factor", factor) < 1):
            raise ValueError(f"Argument `factor` must be >= 1 (the first rate is the target "
                             f"divided by it); received {factor!r}.")
        self.factor = factor
        if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool)
                                            or not isinstance(steps_per_epoch, int)
                                            or steps_per_epoch < 1):
            raise ValueError(f"Argument `steps_per_epoch` must be an integer >= 1 or None; "
                             f"received {steps_per_epoch!r}.")
        self.steps_per_epoch = steps_per_epoch
        self.target = (None if target_learning_rate is None
                       else _positive("target_learning_rate", target_learning_rate))
        self.verbose = verbose
        self._epoch, self._steps, self._factor, self._done = 0, None, None, False

    def on_train_begin(self, logs=None):
        rate = self.model.optimizer.learning_rate
        if not isinstance(rate, keras.Variable):
            raise ValueError(
                "LearningRateWarmup needs a constant learning rate, but the optimizer's "
                "`learning_rate` is a schedule. Use a float learning rate, or build the "
                "warm-up into the schedule.")
        if self.target is None:
            self.target = float(keras.ops.convert_to_numpy(rate))
        self._factor = self.factor
        if self._factor is None:
            strategy = getattr(self.model, "distribute_strategy", None)
            self._factor = float(getattr(strategy, "num_replicas_in_sync", 1) or 1)
        self._steps = self.steps_per_epoch or self.params.get("steps")
        if not self._steps:
            raise ValueError("LearningRateWarmup cannot tell the number of batches per epoch "
                             "(a dataset of unknown length): pass `steps_per_epoch`.")
        self._done = False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self._done:
            return
        progress = (self._epoch + batch / self._steps) / self.warmup_epochs
        rate = warmup_learning_rate(self.target, self._factor, progress)
        self.model.optimizer.learning_rate.assign(rate)
        self._done = progress >= 1.0
        if self.verbose and (progress == 0.0 or self._done):
            print(f"LearningRateWarmup: learning rate {rate:.6g} at epoch {self._epoch} "
                  f"batch {batch}")
