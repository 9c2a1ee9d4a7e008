"""Square-root learning-rate scaling for optimizers that normalize the gradient.

In the modes where every replica's optimizer steps on a gradient of its own
(local SGD, gossip, delayed averaging, model averaging), that gradient comes
from a smaller batch than synchronous training's global one, so its noise
variance is r times larger (r, the noise ratio, depends on the mode: N for
N replicas each stepping on its own batch). Averaging the replicas'
parameters averages their updates, which undoes the extra noise for plain
or momentum SGD (the update is linear in the gradient). An optimizer that
divides by a running estimate of the gradient's magnitude (Adam, RMSprop,
Adagrad, Lion, ...) divides by a sqrt(r) times larger value while the noise
dominates the gradient, so its averaged steps are sqrt(r) times shorter
than synchronous training's: the model learns more slowly at the same
learning rate. Multiplying the learning rate by sqrt(r) restores both the
drift and the diffusion of synchronous training, the square-root scaling
rule of Malladi, Lyu, Panigrahi, Arora, "On the SDEs and Scaling Rules for
Adaptive Gradient Algorithms", NeurIPS 2022 (there for batch-size changes;
here the batch each optimizer sees shrinks by r).

Tuning: the policies apply it by default (`sqrt_lr_scaling=True`) and log
the factor once; pass `sqrt_lr_scaling=False` to keep the learning rate as
given (e.g. one already tuned for the per-replica batch). Plain and momentum
SGD are never rescaled.
"""

import logging
import math

import keras
import tensorflow as tf

log = logging.getLogger("tfdist_ext")

_NORMALIZING = ("Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta",
                "Adafactor", "Lamb", "Lion")


def normalizes_gradient(optimizer) -> bool:
    """Whether `optimizer` (or the one inside a LossScaleOptimizer) is one of Keras'
    optimizers whose step does not grow with the gradient's scale."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    classes = tuple(getattr(keras.optimizers, name) for name in _NORMALIZING
                    if hasattr(keras.optimizers, name))
    return isinstance(inner, classes)


def scale(optimizer, noise_ratio: float) -> float:
    """The learning-rate factor: sqrt(noise_ratio) for a normalizing optimizer, else 1."""
    if noise_ratio <= 1 or not normalizes_gradient(optimizer):
        return 1.0
    return math.sqrt(noise_ratio)


def resolve(policy, optimizer, noise_ratio: float, enabled: bool) -> float:
    """`scale` if `enabled`, logged once per call site (call at trace time).

    Args:
        policy: The sync policy (its `name` goes in the log line).
        optimizer: The model's optimizer.
        noise_ratio: Variance of the gradient each replica's optimizer steps
            on over the variance of synchronous training's gradient.
        enabled: The policy's `sqrt_lr_scaling`.
    """
    factor = scale(optimizer, noise_ratio) if enabled else 1.0
    if factor != 1.0:
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        log.info("tfdist_ext: sync=%r: %s steps on each replica's own gradient (%.3g times "
                 "the variance of the synchronous one), so its learning rate is multiplied "
                 "by sqrt(%.3g) = %.3g (square-root scaling rule; pass sqrt_lr_scaling=False "
                 "to keep it).", policy.name, type(inner).__name__, noise_ratio, noise_ratio,
                 factor)
    return factor


def scaled(learning_rate, factor: float):
    """`learning_rate` (a number, tensor or variable) times `factor`, as a tensor."""
    if factor == 1.0:
        return learning_rate
    learning_rate = tf.convert_to_tensor(learning_rate)
    return learning_rate * tf.cast(factor, learning_rate.dtype)
