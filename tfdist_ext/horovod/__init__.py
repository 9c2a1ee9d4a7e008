"""Horovod's TensorFlow and Keras API on tfdist_ext: move a script by changing its import.

    import tfdist_ext.horovod.tensorflow.keras as hvd   # was: horovod.tensorflow.keras
    tfdist-run -np 4 python train.py                     # was: horovodrun -np 4 ...

Supported: `init` (also takes `tfdist_ext.Strategy` options: `allreduce`,
`compression`, `bucketing`, `engine`), `shutdown`, `is_initialized`, `size`,
`rank`, `local_size`, `local_rank`, `cross_size`, `cross_rank`; `allreduce`
and `grouped_allreduce` (`hvd.Average`, `hvd.Sum`, prescale/postscale,
`hvd.Compression.none/fp16`), `allgather` (first dimensions may differ),
`broadcast`, `broadcast_variables`, `alltoall`; `DistributedGradientTape`;
`DistributedOptimizer` for Keras 3 optimizers (`backward_passes_per_step`,
`average_aggregated_gradients`, `gradient_predivide_factor`; `compression`
also takes tfdist_ext compressors such as `tfdist_ext.compression.TopK(0.01)`,
with error feedback); `hvd.callbacks`
with `BroadcastGlobalVariablesCallback`, `MetricAverageCallback`,
`LearningRateWarmupCallback` and `LearningRateScheduleCallback`.

Not supported: `Adasum`, `hvd.elastic`, process sets, `join`, TF1 graph APIs
(`broadcast_global_variables`, `BroadcastGlobalVariablesHook`), momentum
correction in the learning-rate callbacks, saving a model with its
`DistributedOptimizer` (save the weights, or the model without optimizer).
`broadcast` costs an all-reduce and `alltoall` two all-gathers.
"""
