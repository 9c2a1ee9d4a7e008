"""Keras 3's distribution API (`keras.distribution`) on TensorFlow, through tfdist_ext.

With `KERAS_BACKEND=tensorflow` (Keras' default) and `import tfdist_ext`,
a script written for Keras' backend-independent API runs data-parallel on
TensorFlow workers:

    import keras
    import tfdist_ext  # before or after keras

    keras.distribution.initialize()   # reads TF_CONFIG under tfdist-run / Slurm / Ray
    distribution = keras.distribution.DataParallel(
        devices=keras.distribution.list_devices())
    keras.distribution.set_distribution(distribution)   # or `with distribution.scope():`
    model = build_model(); model.compile(...)
    model.fit(global_batch_dataset)

`install` replaces the functions of Keras' TensorFlow backend module for the
distribution API (`backend`) and makes a current DataParallel run under a
`tfdist_ext.Strategy` (`activation`). ModelParallel is accepted when its
layouts replicate every variable and its batch axis spans every device;
layouts that shard raise an error naming the path and the layout. See
docs/guide/keras-distribution.md.

`import tfdist_ext` installs it once Keras is imported (at once if it already
is), without importing Keras or TensorFlow itself.
"""

import importlib.abc
import importlib.machinery
import sys
import warnings

_installed = []


def install():
    """Installs the TensorFlow backend of `keras.distribution` (once; TF backend only)."""
    import keras  # pylint: disable=import-outside-toplevel
    if _installed or keras.backend.backend() != "tensorflow":
        return
    # pylint: disable=import-outside-toplevel
    from tfdist_ext import _compat
    from tfdist_ext.distribution import activation, backend
    from tfdist_ext.keras import patch_check
    module = _compat.keras_tf_distribution_lib
    report = patch_check.report()
    if not all(report.applies(owner, name) for owner, name in patched()):
        def unavailable(*args, **kwargs):
            del args, kwargs
            report.require(patch_check.KERAS_DISTRIBUTION)

        for name in ("list_devices", "get_device_count", "initialize"):
            setattr(module, name, unavailable)
        _installed.append(False)
        return
    for name, function in (("list_devices", backend.list_devices),
                           ("get_device_count", backend.get_device_count),
                           ("initialize", backend.initialize),
                           ("num_processes", backend.num_processes),
                           ("process_id", backend.process_id),
                           ("distribute_tensor", backend.distribute_tensor),
                           ("_to_backend_mesh", backend.to_backend_mesh),
                           ("_to_backend_layout", backend.to_backend_layout)):
        setattr(module, name, function)
    state = _compat.keras_global_state
    state.set_global_attribute = activation.wrap_set_global_attribute(state.set_global_attribute)
    base = _compat.keras_distribution_lib.Distribution
    base.distribute_dataset = activation.wrap_distribute_dataset(base.distribute_dataset)
    _installed.append(True)


def patched():
    """(owner, name) of the Keras members `install` wraps (checked by `patch_check`)."""
    from tfdist_ext import _compat  # pylint: disable=import-outside-toplevel
    return ((_compat.keras_global_state, "set_global_attribute"),
            (_compat.keras_distribution_lib.Distribution, "distribute_dataset"))


def _install_quietly(wait_for_compat=True):
    compat = sys.modules.get("tfdist_ext._compat")
    if wait_for_compat and compat is not None and getattr(compat.__spec__, "_initializing",
                                                          False):
        # `tfdist_ext._compat` is what imported Keras (e.g. `early.prepare` under a
        # launcher): `install` needs it whole, so it runs at the end of that module.
        compat.__dict__.setdefault("when_imported", []).append(
            lambda: _install_quietly(wait_for_compat=False))
        return
    try:
        install()
    except Exception as err:  # pylint: disable=broad-except
        warnings.warn(f"tfdist_ext could not install keras.distribution for TensorFlow: "
                      f"{type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)


class _AfterKeras(importlib.abc.MetaPathFinder):
    """Runs `install` right after `import keras` finishes (a lookup alone does not)."""

    def find_spec(self, name, path, target=None):  # pylint: disable=unused-argument
        if name != "keras":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _install_quietly()

        spec.loader.exec_module = exec_module
        return spec


def install_after_keras():
    """`install` now if Keras is imported, else right after it is (called by `import tfdist_ext`)."""
    if "keras" in sys.modules:
        _install_quietly()
    elif not any(isinstance(finder, _AfterKeras) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKeras())
