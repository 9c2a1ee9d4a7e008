"""Finds, version-checks and loads the C++ op library built by setup.py.

`import tfdist_ext` calls `check_build()`, which only reads the build stamp (it
must not touch the TF runtime: logical devices may still be configured after
import). The library itself is loaded on first use by `load()`.
"""

import functools
import json
import pathlib
import warnings

import tensorflow as tf

_HERE = pathlib.Path(__file__).resolve().parent
BUILD_INFO = _HERE / "_build_info.json"
REBUILD_HINT = ("Rebuild it for the TensorFlow you run: `python setup.py build_ext "
                "--inplace` in a source checkout, or reinstall with `python -m pip "
                "install --no-build-isolation --force-reinstall --no-deps .`")


class OpsUnavailableError(RuntimeError):
    """The tfdist_ext C++ op library is missing, failed to build, or is stale."""


def _library_path():
    candidates = sorted(_HERE.glob("_tfdist_ops*.so"))
    return candidates[0] if candidates else None


def build_problem():
    """Why the op library cannot be used, or None when it can.

    Reads only the build stamp and the file system; never loads the library.
    """
    if _library_path() is None:
        reason = "it was never built"
        if BUILD_INFO.exists():
            info = json.loads(BUILD_INFO.read_text())
            reason = info.get("error", reason)
        return f"the tfdist_ext op library is not available ({reason}). {REBUILD_HINT}."
    try:
        info = json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return (f"the tfdist_ext op library has no readable build stamp "
                f"({BUILD_INFO}). {REBUILD_HINT}.")
    built_for = info.get("tf_version")
    if built_for != tf.__version__:
        return (f"the tfdist_ext op library was built for TensorFlow {built_for} but "
                f"TensorFlow {tf.__version__} is running; its kernels use internal "
                f"APIs that change between releases. {REBUILD_HINT}.")
    return None


def check_build():
    """Warns once at import when the op library cannot be used."""
    problem = build_problem()
    if problem is not None:
        warnings.warn(problem + " Features that need the ops will raise.", stacklevel=3)


@functools.lru_cache(maxsize=None)
def load():
    """Loads the op library once and returns its module of op wrappers.

    Raises:
        OpsUnavailableError: the library is missing, stale or fails to load.
    """
    problem = build_problem()
    if problem is not None:
        raise OpsUnavailableError(problem[0].upper() + problem[1:])
    path = _library_path()
    try:
        library = tf.load_op_library(str(path))
    except tf.errors.NotFoundError as err:
        raise OpsUnavailableError(
            f"Loading {path} failed: {err.message}. {REBUILD_HINT}.") from err
    with tf.init_scope():  # also when first used while tracing a tf.function
        stamped = library.tfdist_build_info().numpy().decode()
    if stamped != tf.__version__:
        raise OpsUnavailableError(
            f"{path} was compiled against TensorFlow {stamped} but TensorFlow "
            f"{tf.__version__} is running. {REBUILD_HINT}.")
    return library
