"""`import tfdist_ext.horovod.tensorflow.keras as hvd`: Horovod's Keras API on tfdist_ext."""

from tfdist_ext.horovod._gradients import distributed_keras_optimizer as DistributedOptimizer
from tfdist_ext.horovod._runtime import (Average, Compression, Sum, allgather, allreduce,
                                         broadcast, broadcast_variables, cross_rank,
                                         cross_size, grouped_allreduce, init, is_initialized,
                                         local_rank, local_size, rank, shutdown, size,
                                         strategy)
from tfdist_ext.horovod.tensorflow.keras import callbacks
