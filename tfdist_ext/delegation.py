"""How `CrossDeviceOps` hands attributes to its parts: forwarding properties and
temporary settings (helpers without TensorFlow)."""

import contextlib


def forwarded(part, name, settable=True):
    """A property that reads (and, if `settable`, writes) ``self.<part>.<name>``.

    For a method of the part it gives the bound method: ``ops.new_engine(...)``
    calls ``ops.engines.new(...)`` with the same arguments.
    """
    def read(self):
        return getattr(getattr(self, part), name)

    def write(self, value):
        setattr(getattr(self, part), name, value)

    return property(read, write if settable else None, doc=f"``self.{part}.{name}``.")


@contextlib.contextmanager
def setting(obj, name, value, after):
    """Sets ``obj.<name>`` to `value` for the context, then to `after`."""
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, after)
