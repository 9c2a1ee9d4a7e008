"""Keras integration: callbacks that report what a `tfdist_ext.Strategy` communicates,
and learning-rate scaling with warm-up for large global batches."""

from tfdist_ext.keras.callbacks import CommunicationStats
from tfdist_ext.keras.warmup import LearningRateWarmup, linear_scaling

__all__ = ["CommunicationStats", "LearningRateWarmup", "linear_scaling"]
