"""Momentum compensation: SGD momentum for gradients that arrive late.

Asynchrony acts as momentum (Mitliagkas, Zhang, Hadjis, Ré, "Asynchrony begets
momentum, with an application to deep learning", Allerton 2016): when gradients
are applied with a mean staleness of E[tau] steps, the expected update behaves
like SGD with an implicit momentum of about 1 - 1 / (1 + E[tau]), which adds to
the optimizer's own. The paper's remedy is to lower the explicit momentum.

Here the explicit momentum m' keeps the steady-state step gain of synchronous
training: SGD with momentum m moves lr / (1 - m) per unit of gradient in steady
state, the implicit momentum multiplies that by (1 + E[tau]), so

    (1 + E[tau]) / (1 - m') = 1 / (1 - m)   =>   m' = 1 - (1 - m) (1 + E[tau])

clipped at 0 (then the learning rate is not lowered: the relaxed mode keeps
the user's). Only Keras' `SGD` (also inside a `LossScaleOptimizer`) is
changed: Adam's and RMSprop's first moments are averages with a gain of 1, not
sums, and were measured safe under the same staleness.
"""

import contextlib
import copy

from tfdist_ext.sync import local_sgd


def compensated(momentum: float, mean_staleness: float) -> float:
    """The explicit momentum m' for a user's momentum m at mean staleness E[tau] (>= 0)."""
    if momentum <= 0:
        return float(momentum)
    return max(0.0, 1.0 - (1.0 - momentum) * (1.0 + mean_staleness))


def sgd_optimizer(optimizer):
    """Keras' SGD inside `optimizer` (itself, or a LossScaleOptimizer's inner one), else None."""
    if local_sgd.sgd_momentum(optimizer) <= 0:
        return None
    return getattr(optimizer, "inner_optimizer", optimizer)


def compensated_config(config: dict, mean_staleness: float) -> dict:
    """A copy of a serialized Keras optimizer (`keras.optimizers.serialize`)
    whose SGD momentum (also a LossScaleOptimizer's inner one) is compensated."""
    config = copy.deepcopy(config)
    inner = config.get("config", {})
    if isinstance(inner.get("inner_optimizer"), dict):
        inner["inner_optimizer"] = compensated_config(inner["inner_optimizer"], mean_staleness)
    elif config.get("class_name") == "SGD" and (inner.get("momentum") or 0) > 0:
        inner["momentum"] = compensated(float(inner["momentum"]), mean_staleness)
    return config


_active = {}  # id(SGD) -> [the user's momentum, open blocks]


@contextlib.contextmanager
def momentum_while_tracing(optimizer, mean_staleness: float, value=None):
    """Within the block, `optimizer`'s SGD momentum is the compensated one
    (or `value`, when given: 0.0 where the momentum moved into a compressor).

    Keras' SGD reads `momentum` when its update step is traced, so a train
    step traced inside the block keeps m' while the optimizer object (its
    config, what `model.save` writes, later `fit` calls without the mode) keeps
    the user's m. Blocks nest (each replica of a step opens one before their
    shared merge call applies the update): the momentum is set once.
    """
    sgd = sgd_optimizer(optimizer)
    if sgd is None:
        yield
        return
    entry = _active.setdefault(id(sgd), [sgd.momentum, 0])
    if entry[1] == 0:
        sgd.momentum = (compensated(float(entry[0]), mean_staleness) if value is None
                        else float(value))
    entry[1] += 1
    try:
        yield
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            sgd.momentum = entry[0]
            del _active[id(sgd)]
