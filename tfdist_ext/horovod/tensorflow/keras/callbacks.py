"""`hvd.callbacks`: Horovod's Keras callbacks on tfdist_ext."""

from tfdist_ext.horovod._callbacks import (BroadcastGlobalVariablesCallback,
                                           LearningRateScheduleCallback,
                                           LearningRateWarmupCallback, MetricAverageCallback)
