"""What is sent: gradient compressors (`Strategy(compression=...)`)."""

from tfdist_ext.compression.base import COMPRESSORS, Compressor, NoCompression, get

__all__ = ["COMPRESSORS", "Compressor", "NoCompression", "get"]
