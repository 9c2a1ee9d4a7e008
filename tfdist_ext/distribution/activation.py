"""A Keras distribution made current on TensorFlow runs under a tfdist_ext.Strategy.

`keras.distribution.set_distribution(d)` and `with d.scope():` both store `d`
in Keras' global state; the wrapper here (`wrap_set_global_attribute`) then
makes a `tfdist_ext.Strategy` over the distribution's devices the default
strategy (`tf.distribute.experimental_set_strategy`), so models built while
it is current have mirrored variables and `fit` / `evaluate` / `predict`
run data-parallel; setting None (or leaving the scope) restores TF's default.

Batch sizes follow Keras' documented semantics: the dataset given to `fit`
carries the global batch and each worker trains on its contiguous part of
it; with `auto_shard_dataset=False` each worker's dataset is its own and
its batches are local (the global batch is the workers' together; see
`tfdist_ext.keras.local_input`). Keras' own `distribute_dataset` would split
the dataset per process before the strategy splits it again, so under a
tfdist_ext strategy it returns the dataset unchanged
(`wrap_distribute_dataset`).
"""

import functools

import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.distribution import backend

ATTRIBUTE = "distribution"
# Strategies made for distributions, by replica count (one per process in a job of
# several workers, where a strategy cannot be made twice).
_strategies = {}


def _devices_text(devices):
    listed = list(devices)
    return repr(listed if len(listed) <= 6 else listed[:3] + ["..."] + listed[-2:])


def check(distribution):
    """Raises ValueError if tfdist_ext cannot run `distribution` as data parallelism.

    Its mesh must hold exactly the job's devices (`list_devices()`); a
    ModelParallel layout may not shard a variable or output, and its batch
    axis must span every device.
    """
    dlib = _compat.keras_distribution_lib
    mesh = distribution.device_mesh
    devices = [str(d) for d in mesh.devices.flatten()]
    kind = devices[0].split(":")[0] if devices and ":" in devices[0] else None
    job = backend.list_devices(kind)
    name = type(distribution).__name__
    if sorted(devices) != sorted(job):
        raise ValueError(
            f"keras.distribution.{name}: its device mesh has {len(devices)} device(s) "
            f"{_devices_text(devices)}, but this job runs {len(job)} {_devices_text(job)} "
            f"({backend.num_processes()} worker(s)); tfdist_ext trains on every device of the "
            f"job. Use {name}(devices=keras.distribution.list_devices()), or start as many "
            "workers as the mesh has devices.")
    if isinstance(distribution, dlib.ModelParallel):
        for path, layout in distribution._layout_map.items():  # pylint: disable=protected-access
            if not isinstance(layout, dlib.TensorLayout) or backend.shards(layout):
                raise ValueError(
                    f"keras.distribution.ModelParallel: the layout map shards {path!r} with "
                    f"{layout!r}; {backend.SUPPORTED}. Set every axis of its layout to None "
                    "(replicated), or use DataParallel.")
        if distribution.num_model_replicas != len(devices):
            raise ValueError(
                f"keras.distribution.ModelParallel: its batch axis "
                f"{distribution.batch_dim_name!r} spans {distribution.num_model_replicas} of the "
                f"mesh's {len(devices)} devices; on TensorFlow tfdist_ext needs it to span every "
                "device (a mesh whose other axes have size 1), or use DataParallel.")


def strategy_for(distribution):
    """The `tfdist_ext.Strategy` over `distribution`'s devices, made on first use."""
    replicas = distribution.device_mesh.devices.size
    if replicas not in _strategies:
        from tfdist_ext.strategy import Strategy  # pylint: disable=import-outside-toplevel
        _strategies[replicas] = (Strategy() if backend.num_processes() > 1
                                 else Strategy(num_replicas=replicas))
    return _strategies[replicas]


def _ours(strategy) -> bool:
    return any(strategy is made for made in _strategies.values())


def activate(value):
    """Makes the strategy for `value` (a Keras Distribution, or None) TF's default."""
    dlib = _compat.keras_distribution_lib
    if value is not None and not isinstance(value, (dlib.DataParallel, dlib.ModelParallel)):
        return  # another Distribution subclass: Keras' own behaviour
    current = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    if value is None:
        if current is not None and _ours(current):
            tf.distribute.experimental_set_strategy(None)
        return
    check(value)
    strategy = strategy_for(value)
    if current is not strategy:
        tf.distribute.experimental_set_strategy(strategy)


def wrap_set_global_attribute(original):
    """`global_state.set_global_attribute`: a distribution made current activates it."""

    @functools.wraps(original)
    def set_global_attribute(name, value):
        if name == ATTRIBUTE:
            activate(value)
        return original(name, value)

    return set_global_attribute


def wrap_distribute_dataset(original):
    """`Distribution.distribute_dataset`: unchanged under a tfdist_ext strategy."""

    @functools.wraps(original)
    def distribute_dataset(self, dataset):
        if not (tf.distribute.has_strategy() and _ours(tf.distribute.get_strategy())):
            return original(self, dataset)
        return dataset

    return distribute_dataset
