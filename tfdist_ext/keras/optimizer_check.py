"""Warns when `fit` starts if the model's optimizer is one a mode was measured to hurt.

Relaxed synchronization and compression were tuned with the optimizers of their
papers. Some of them cost accuracy with SGD + momentum, the optimizer most
scripts bring: stale gradients and late error-feedback residuals add to the
momentum (Mitliagkas, Zhang, Hadjis, Ré, "Asynchrony begets momentum, with an
application to deep learning", 2016). Each `SyncPolicy` and `Compressor` states
in words what it risks with momentum SGD, and the safer choices, in
`momentum_caution` ("" when measured safe), with Adam-like optimizers in
`adam_caution`, and with any optimizer in `caution` (said in place of the other
two); every warning links to the figures, `RESULTS` in docs/results.md. The
optimizer is known only once the model is compiled, so `OptimizerCheck` (added
first to `fit`'s callbacks by `Strategy.fit_callbacks`) warns at
`on_train_begin`, before the first step, once per strategy.
"""

import logging
import warnings
from typing import List

import keras

from tfdist_ext import zero
from tfdist_ext.sync import local_sgd, lr_scaling

log = logging.getLogger("tfdist_ext")

#: Where the measured costs behind the warnings are, with the settings they were measured in.
RESULTS = "docs/results.md#costs-behind-the-optimizer-warnings"


class ModeOptimizerWarning(UserWarning):
    """A sync policy or compressor runs with an optimizer it was measured to hurt."""


def cautions(sync, compressor, optimizer) -> List[str]:
    """What the strategy's modes risk with `optimizer`, one sentence per mode ([] if nothing).

    Args:
        sync: The `SyncPolicy`.
        compressor: The `Compressor`.
        optimizer: The model's Keras optimizer (None: nothing to say).
    """
    if optimizer is None:
        return []
    momentum = local_sgd.sgd_momentum(optimizer)
    described = type(getattr(optimizer, "inner_optimizer", optimizer)).__name__
    if momentum > 0:
        attribute, described = "momentum_caution", f"SGD(momentum={momentum:g})"
    elif lr_scaling.normalizes_gradient(optimizer):
        attribute = "adam_caution"
    else:
        attribute = None
    found = []
    for option, mode in (("sync", sync), ("compression", compressor)):
        text = getattr(mode, "caution", "") or getattr(mode, attribute or "caution", "")
        if text:
            name = getattr(mode, "name", type(mode).__name__)
            found.append(f"tfdist_ext: {option}={name!r} with {described}: {text} "
                         f"(measured costs: {RESULTS}).")
    return found


class OptimizerCheck(keras.callbacks.Callback):
    """Warns (`ModeOptimizerWarning` and the "tfdist_ext" logger) once, at the first `fit`."""

    def __init__(self, sync, compressor, zero_stage=0):
        super().__init__()
        self.sync, self.compressor, self.zero_stage = sync, compressor, zero_stage
        self.done = False

    def on_train_begin(self, logs=None):
        if self.zero_stage and getattr(self.model, "optimizer", None) is not None:
            zero.check_optimizer(self.model.optimizer)
        if self.done:
            return
        self.done = True
        for text in cautions(self.sync, self.compressor, getattr(self.model, "optimizer", None)):
            log.warning("%s", text)
            warnings.warn(text, ModeOptimizerWarning, stacklevel=2)
