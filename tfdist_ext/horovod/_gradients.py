"""Horovod's `DistributedGradientTape` and Keras `DistributedOptimizer` on tfdist_ext."""

import tensorflow as tf

from tfdist_ext.horovod import _collectives, _runtime
from tfdist_ext.horovod._collectives import Average, Compression
from tfdist_ext.registry import positive_int


def _check_common(op, compression, gradient_predivide_factor):
    """Validates the shared options; returns (Horovod compression, tfdist_ext strategy)."""
    _collectives.reduce_op(op)
    if gradient_predivide_factor != 1.0 and op is not Average:
        raise ValueError("Argument `gradient_predivide_factor` needs op=hvd.Average "
                         f"(received op={op!r}).")
    if compression in (Compression.none, Compression.fp16):
        return compression, None
    try:
        return Compression.none, _runtime.strategy(compression)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"Argument `compression` must be hvd.Compression.none, hvd.Compression.fp16 or a "
            f"tfdist_ext compressor (a name, dict or tfdist_ext.compression.Compressor); "
            f"received {compression!r}: {err}") from err


def reduce_gradients(grads, op=Average, compression=Compression.none,
                     gradient_predivide_factor=1.0, dist=None):
    """All-reduces a list of gradients (None entries kept) on the gradient path of
    `dist` (default: the strategy `hvd.init()` made)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present or _runtime.size() == 1:
        return list(grads)
    factor = gradient_predivide_factor
    reduced = _collectives.grouped_allreduce(
        [grads[i] for i in present], op=op, compression=compression,
        prescale_factor=1.0 / factor, postscale_factor=factor, gradients=True, dist=dist)
    out = list(grads)
    for i, r in zip(present, reduced):
        out[i] = r
    return out


class DistributedGradientTape:
    """A `tf.GradientTape` whose `gradient` returns gradients all-reduced over processes.

    Args:
        gradtape: The tape to wrap.
        device_dense, device_sparse: Accepted for compatibility; unused.
        compression: `hvd.Compression.none`, `.fp16`, or a tfdist_ext
            compressor (e.g. `tfdist_ext.compression.TopK(0.01)`, with error
            feedback).
        sparse_as_dense: Accepted; `IndexedSlices` are always reduced dense.
        op: `hvd.Average` (default) or `hvd.Sum`.
        gradient_predivide_factor: Divide before the sum and multiply after
            (Average only).
        num_groups, groups: Accepted; the strategy's bucketing decides the
            fusion (`hvd.init(bucketing=...)`).
    """

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False, op=Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None):
        del device_dense, device_sparse, sparse_as_dense, num_groups, groups
        compression, dist = _check_common(op, compression, gradient_predivide_factor)
        self._tape = gradtape
        self._op, self._compression, self._dist = op, compression, dist
        self._predivide = gradient_predivide_factor

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = reduce_gradients(flat, self._op, self._compression, self._predivide,
                                   self._dist)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def distributed_keras_optimizer(optimizer, name=None, compression=Compression.none,
                                backward_passes_per_step=1,
                                average_aggregated_gradients=False, sparse_as_dense=False,
                                op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                groups=None, device_dense="", device_sparse=""):
    """A copy of the Keras `optimizer` that all-reduces gradients before applying them.

    Args:
        optimizer: A Keras 3 optimizer (not yet built).
        name: Optional name of the copy.
        compression: `hvd.Compression.none`, `.fp16`, or a tfdist_ext
            compressor.
        backward_passes_per_step: Apply every k-th step, on gradients
            accumulated locally over k steps (Keras'
            `gradient_accumulation_steps`).
        average_aggregated_gradients: With k > 1, apply the mean of the k
            gradients (True) or their sum (False, Horovod's default).
        op: `hvd.Average` (default) or `hvd.Sum`.
        gradient_predivide_factor: As in `DistributedGradientTape`.
        sparse_as_dense, num_groups, groups, device_dense, device_sparse:
            Accepted for compatibility.

    Returns:
        An optimizer of a subclass of `optimizer`'s class, with its config.
    """
    del sparse_as_dense, num_groups, groups, device_dense, device_sparse
    compression, dist = _check_common(op, compression, gradient_predivide_factor)
    positive_int("backward_passes_per_step", backward_passes_per_step)
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps"):
            raise ValueError("Argument `backward_passes_per_step`: the optimizer already "
                             "accumulates (gradient_accumulation_steps="
                             f"{config['gradient_accumulation_steps']}); set one of them.")
        config["gradient_accumulation_steps"] = backward_passes_per_step
    if name:
        config["name"] = name
    # Keras averages the k accumulated gradients; Horovod's default sums them.
    scale = 1.0 if average_aggregated_gradients else float(backward_passes_per_step)
    base = type(optimizer)

    def apply(self, grads, trainable_variables=None):
        grads = reduce_gradients(list(grads), op, compression, gradient_predivide_factor, dist)
        if scale != 1.0:
            grads = [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]
        return base.apply(self, grads, trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "__module__": base.__module__,
                                        "_tfdist_horovod": True})
    return cls.from_config(config)
