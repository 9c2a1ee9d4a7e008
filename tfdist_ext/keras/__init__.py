"""Keras integration: callbacks that report what a `tfdist_ext.Strategy` communicates."""

from tfdist_ext.keras.callbacks import CommunicationStats

__all__ = ["CommunicationStats"]
