"""Finds and loads the optional UCX op library (`_tfdist_ucx*.so`).

setup.py builds it from `custom_ops/ucx/` when the `libucx-cu12` wheel is
installed (``pip install libucx-cu12`` before building). Without it,
`import tfdist_ext` still works: `problem()` says why the UCX engine is not
available and `load()` raises `UcxUnavailableError` with the fix.
"""

import functools
import os
import pathlib

import tensorflow as tf

from tfdist_ext.ops._loader import REBUILD_HINT, find_library, stamp_problem

_HERE = pathlib.Path(__file__).resolve().parent
BUILD_INFO = _HERE / "_ucx_build_info.json"
INSTALL_HINT = ("Install UCX and rebuild: `python -m pip install 'libucx-cu12>=1.22,<1.23'` "
                "then `python setup.py build_ext --inplace` (or reinstall tfdist_ext with "
                "`python -m pip install --no-build-isolation -e .`)")
SPIN_VARIABLE = "TFDIST_UCX_SPIN_US"


class UcxUnavailableError(RuntimeError):
    """The UCX engine cannot be used here (library missing, stale or failing)."""


def _library_path():
    return find_library("_tfdist_ucx*.so")


def problem():
    """Why the UCX op library cannot be used, or None when it can (never loads it)."""
    try:
        import libucx  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return f"the UCX wheel is not installed. {INSTALL_HINT}."
    return stamp_problem(_library_path(), BUILD_INFO, "the tfdist_ext UCX op library",
                         INSTALL_HINT)


@functools.lru_cache(maxsize=None)
def load():
    """Loads the UCX op library once (after the wheel's shared libraries).

    Raises:
        UcxUnavailableError: naming the cause and the fix.
    """
    reason = problem()
    if reason is not None:
        raise UcxUnavailableError("The UCX engine is unavailable: " + reason)
    import libucx  # pylint: disable=import-outside-toplevel

    libucx.load_library()  # the wheel's libucp/libucs, found by soname below
    path = _library_path()
    try:
        library = tf.load_op_library(str(path))
    except tf.errors.NotFoundError as err:
        raise UcxUnavailableError(
            f"Loading {path} failed: {err.message}. {INSTALL_HINT}.") from err
    with tf.init_scope():
        stamped = library.tfdist_ucx_build_info().numpy().decode()
    if stamped != tf.__version__:
        raise UcxUnavailableError(
            f"{path} was compiled against TensorFlow {stamped} but TensorFlow "
            f"{tf.__version__} is running. {REBUILD_HINT}.")
    return library


def spin_from_environment() -> int:
    """`TFDIST_UCX_SPIN_US` as microseconds; a clear error for anything else."""
    text = os.environ[SPIN_VARIABLE]
    if not text.strip().isdigit():
        raise ValueError(f"Environment variable {SPIN_VARIABLE} must be a whole number of "
                         f"microseconds >= 0 (how long a waiting rank polls); received "
                         f"{text!r}. Unset it for the default, 200.")
    return int(text)
