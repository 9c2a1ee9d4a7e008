"""DGC's momentum correction chosen from the optimizer: SGD's momentum moves into top-k.

With momentum SGD, error feedback returns each unsent value late, and the late
gradient adds to the optimizer's momentum. Deep Gradient Compression (Lin,
Han, Mao, Wang, Dally, ICLR 2018, section 3.2) accumulates the velocity
before compression instead (`compress_with_momentum_correction`) and applies
what arrives as plain SGD. A compressor with `correct_momentum` (top-k's
default) and no momentum of its own takes the optimizer's: while `fit` runs
under sync="sync", the strategy traces its gradient reductions with the
compressor at `momentum=m` (`Extended.compressing_gradients_with`) and the
optimizer's update step without momentum (`momentum_while_tracing`). The
optimizer object, its config and what `model.save` writes keep m; DGC's
velocity lives in the strategy's state with the error-feedback residuals.

Tuning: `correct_momentum=False` keeps the momentum in the optimizer (`fit`
warns with the measured cost); an explicit `momentum=` on the compressor needs
an optimizer without momentum, as before.
"""

import contextlib
import dataclasses
import logging
import threading
import weakref

from tfdist_ext.sync import local_sgd, momentum

log = logging.getLogger("tfdist_ext")

_lock = threading.Lock()
_moved = set()  # id() of the optimizers whose momentum a running `fit` moved
_logged = weakref.WeakSet()  # the strategies that logged the move


def moved(compressor, optimizer):
    """`compressor` with `optimizer`'s SGD momentum, or None when nothing moves."""
    m = local_sgd.sgd_momentum(optimizer)
    if (m <= 0 or not getattr(compressor, "correct_momentum", False) or compressor.momentum
            or not compressor.error_feedback):
        return None
    return dataclasses.replace(compressor, momentum=m)


@contextlib.contextmanager
def during_fit(strategy, optimizer):
    """Around one `fit`: the strategy's gradient reductions take the moved momentum."""
    compressor = None
    if strategy.sync_runner is None:
        compressor = moved(strategy.config.compression, optimizer)
    if compressor is None:
        yield
        return
    if strategy not in _logged:
        _logged.add(strategy)
        log.info("tfdist_ext: compression=%r with SGD(momentum=%g): the momentum moves into "
                 "the compressor (DGC's momentum correction, masking=%s) and the optimizer "
                 "steps without it while fit runs (pass correct_momentum=False to keep it "
                 "in the optimizer).", compressor.name, compressor.momentum,
                 compressor.momentum_masking)
    inner = id(getattr(optimizer, "inner_optimizer", optimizer))  # LossScaleOptimizer's
    with _lock:
        _moved.add(inner)
    try:
        with strategy.extended.compressing_gradients_with(compressor):
            yield
    finally:
        with _lock:
            _moved.discard(inner)


@contextlib.contextmanager
def while_tracing(optimizer):
    """Around the optimizer's update step: no momentum while `during_fit` moved it."""
    if id(getattr(optimizer, "inner_optimizer", optimizer)) not in _moved:
        yield
        return
    with momentum.momentum_while_tracing(optimizer, 0.0, value=0.0):
        yield
