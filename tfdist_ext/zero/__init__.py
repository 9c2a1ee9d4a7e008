"""Optimizer state sharded across replicas: ZeRO stage 1 (`Strategy(zero_stage=1)`).

Data parallelism keeps a full copy of the optimizer's state on every replica;
with Adam that is two slots per weight. ZeRO (Rajbhandari, Rasley, Ruwase, He,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC'20)
gives each of the N replicas the state of 1/N of the weights: `partition`
plans the split, `stage1` runs the step, `shards` keeps track of each
replica's part and `checkpoint` saves and loads the whole state in Keras'
format.
"""

from tfdist_ext.zero.checkpoint import wrap_load_own_variables, wrap_save_own_variables
from tfdist_ext.zero.partition import Partition
from tfdist_ext.zero.stage1 import (PER_WEIGHT_OPTIMIZERS, STAGES, apply_gradients,
                                    check_optimizer, check_stage, sharded, slot_bytes,
                                    state_bytes, update_step, wrap_add_variable_from_reference)

__all__ = ["PER_WEIGHT_OPTIMIZERS", "Partition", "STAGES", "apply_gradients",
           "check_optimizer", "check_stage", "sharded", "slot_bytes", "state_bytes",
           "update_step", "wrap_add_variable_from_reference", "wrap_load_own_variables",
           "wrap_save_own_variables"]
