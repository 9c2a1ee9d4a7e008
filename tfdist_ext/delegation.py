"""Temporary settings on an object (a helper without TensorFlow)."""

import contextlib


@contextlib.contextmanager
def setting(obj, name, value, after):
    """Sets ``obj.<name>`` to `value` for the context, then to `after`."""
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, after)
