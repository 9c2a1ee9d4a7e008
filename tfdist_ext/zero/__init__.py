"""Optimizer state (and gradients) sharded across replicas: ZeRO stages 1 and 2.

Data parallelism keeps a full copy of the optimizer's state on every replica;
with Adam that is two slots per weight. ZeRO (Rajbhandari, Rasley, Ruwase, He,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC'20)
gives each of the N replicas the state of 1/N of the weights
(`Strategy(zero_stage=1)`), and at stage 2 only its shard of the summed
gradients: `partition` plans the split (a block of every weight per
replica), `step` runs the step, `summed` sums the gradients into each
replica's blocks, `blocks` cuts and gathers them, `shards` keeps track of
each replica's part and `checkpoint` saves and loads the whole state in
Keras' format.
"""

from tfdist_ext.zero.checkpoint import wrap_load_own_variables, wrap_save_own_variables
from tfdist_ext.zero.partition import Partition
from tfdist_ext.zero.step import (PER_WEIGHT_OPTIMIZERS, STAGES, apply_gradients,
                                    check_optimizer, check_stage, sharded, slot_bytes,
                                    state_bytes, update_step, wrap_add_variable_from_reference)

__all__ = ["PER_WEIGHT_OPTIMIZERS", "Partition", "STAGES", "apply_gradients",
           "check_optimizer", "check_stage", "sharded", "slot_bytes", "state_bytes",
           "update_step", "wrap_add_variable_from_reference", "wrap_load_own_variables",
           "wrap_save_own_variables"]
