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


def find_library(pattern):
    """The first library in this folder matching `pattern`, or None."""
    candidates = sorted(_HERE.glob(pattern))
    return candidates[0] if candidates else None


def _library_path():
    return find_library("_tfdist_ops*.so")


def stamp_problem(library, stamp, what, hint):
    """Why `library` (a path, or None when missing) cannot be used, or None when it can.

    Reads only its build stamp `stamp` (written by setup.py) and compares the
    TensorFlow version it records with the running one; `what` names the
    library and `hint` says how to fix it.
    """
    if library is None:
        reason = "it was never built"
        try:
            reason = json.loads(stamp.read_text()).get("error", reason)
        except (OSError, ValueError):
            pass
        return f"{what} is not available ({reason}). {hint}."
    try:
        info = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return f"{what} has no readable build stamp ({stamp}). {hint}."
    built_for = info.get("tf_version")
    if built_for != tf.__version__:
        return (f"{what} was built for TensorFlow {built_for} but TensorFlow "
                f"{tf.__version__} is running; its kernels use internal APIs that change "
                f"between releases. {hint}.")
    return None


def build_problem():
    """Why the op library cannot be used, or None when it can.

    Reads only the build stamp and the file system; never loads the library.
    """
    return stamp_problem(_library_path(), BUILD_INFO, "the tfdist_ext op library",
                         REBUILD_HINT)


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
