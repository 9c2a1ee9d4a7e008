"""`import tfdist_ext.horovod.tensorflow as hvd`: Horovod's TensorFlow API on tfdist_ext.

See `tfdist_ext.horovod` for what is supported.
"""

from tfdist_ext.horovod._collectives import (Adasum, Average, Compression, Sum, allgather,
                                             allreduce, alltoall, broadcast,
                                             broadcast_variables, grouped_allreduce)
from tfdist_ext.horovod._gradients import DistributedGradientTape
from tfdist_ext.horovod._gradients import distributed_keras_optimizer as DistributedOptimizer
from tfdist_ext.horovod._runtime import (cross_rank, cross_size, gloo_enabled, init,
                                         is_initialized, local_rank, local_size, mpi_enabled,
                                         mpi_threads_supported, nccl_built, rank, shutdown,
                                         size, strategy)
