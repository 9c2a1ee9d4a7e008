"""`import tfdist_ext.horovod.keras as hvd`: the same API as `tfdist_ext.horovod.tensorflow.keras`."""

from tfdist_ext.horovod.tensorflow.keras import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import
from tfdist_ext.horovod.tensorflow.keras import DistributedOptimizer, callbacks  # noqa: F401
