"""Optimizer state sharded across replicas: ZeRO stage 1 (`Strategy(zero_stage=1)`).

Data parallelism keeps a full copy of the optimizer's state on every replica;
with Adam that is two slots per weight. ZeRO (Rajbhandari, Rasley, Ruwase, He,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC'20)
gives each of the N replicas the state of 1/N of the weights: `partition`
plans the split, `stage1` runs the step and keeps each replica's part.
"""

from tfdist_ext.zero.partition import Partition
from tfdist_ext.zero.stage1 import (STAGES, check_callbacks, check_optimizer, check_stage,
                                    sharded, slot_bytes, state_bytes, update_step,
                                    wrap_add_variable_from_reference, wrap_save_own_variables)

__all__ = ["Partition", "STAGES", "check_callbacks", "check_optimizer", "check_stage",
           "sharded", "slot_bytes", "state_bytes", "update_step",
           "wrap_add_variable_from_reference", "wrap_save_own_variables"]
