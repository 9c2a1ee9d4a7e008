"""`import tfdist_ext.horovod.tensorflow.keras as hvd`: Horovod's Keras API on tfdist_ext."""

from tfdist_ext.horovod._collectives import (Average, Compression, Sum, allgather, allreduce,
                                             broadcast, broadcast_variables, grouped_allreduce)
from tfdist_ext.horovod._gradients import distributed_keras_optimizer as DistributedOptimizer
from tfdist_ext.horovod._runtime import (cross_rank, cross_size, init, is_initialized,
                                         local_rank, local_size, rank, shutdown, size, strategy)
from tfdist_ext.horovod.tensorflow.keras import callbacks
