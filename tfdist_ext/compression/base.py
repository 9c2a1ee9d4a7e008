"""The compressor interface and the identity compressor.

A compressor turns a dense gradient into a payload and back. `reducible`
payloads (e.g. fp16, random-k with a shared seed) can be summed by an
all-reduce; the others (top-k, QSGD, sign) are all-gathered and summed locally.
"""

import dataclasses

from tfdist_ext.registry import Registry

COMPRESSORS = Registry("compression")


class Compressor:
    """Base class of all compressors (frozen dataclasses registered by name).

    Attributes:
        reducible: Whether payloads of different replicas can be summed
            element-wise by an all-reduce.
    """

    reducible = True


@COMPRESSORS.register("none")
@dataclasses.dataclass(frozen=True)
class NoCompression(Compressor):
    """Sends dense gradients unchanged (the default)."""


def get(identifier):
    """A compressor from a name, dict or instance (None means "none")."""
    return COMPRESSORS.get(identifier, default="none")
