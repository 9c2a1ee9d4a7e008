"""`hvd.callbacks` for `tfdist_ext.horovod.keras`."""

from tfdist_ext.horovod.tensorflow.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback, LearningRateScheduleCallback, LearningRateWarmupCallback,
    MetricAverageCallback)
