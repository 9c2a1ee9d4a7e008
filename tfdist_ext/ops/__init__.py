"""The C++ custom ops of tfdist_ext, as Python functions.

The op library is built by setup.py from `custom_ops/` and loaded on first use;
when it is missing or was built for another TensorFlow, calling an op raises
`OpsUnavailableError` with the command that rebuilds it.
"""

from tfdist_ext.ops._loader import OpsUnavailableError, build_problem, load


def build_info():
    """The TensorFlow version the loaded op library was compiled against."""
    return load().tfdist_build_info().numpy().decode()


__all__ = ["OpsUnavailableError", "build_info", "build_problem", "load"]
