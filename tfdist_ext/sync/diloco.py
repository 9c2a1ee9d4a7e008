"""DiLoCo: local SGD whose rounds take an outer Nesterov step.

    Strategy(sync="diloco")                       # period 16, outer lr 0.7, momentum 0.9
    Strategy(sync={"name": "diloco", "period": 100}, compression="powersgd")

Reference: Douillard et al., "DiLoCo: Distributed Low-Communication Training
of Language Models", 2023 (https://arxiv.org/abs/2311.08105). Every replica
takes `period` (H) steps with the user's optimizer (the inner optimizer; its
state stays local), then the round averages the parameter change since the
last round, D = mean_r(a - w_r) (the outer gradient), and applies it with
Nesterov momentum: v = 0.9 v + D; a -= 0.7 (D + 0.9 v); every replica
continues from a. The paper matches synchronous training of language models
while communicating H = 500 times less.

Tuning: keep the outer learning rate 0.7 and momentum 0.9 of the paper; raise
H as far as accuracy allows (tens for small models and datasets, hundreds for
long runs); with Adam as the inner optimizer keep `average_slots=False`.
Compressing the outer gradients is not supported yet (a compressor is
refused with a message).
"""

import dataclasses

from tfdist_ext.sync.base import SYNC_POLICIES
from tfdist_ext.sync.local_sgd import LocalSGD


@SYNC_POLICIES.register("diloco")
@dataclasses.dataclass(frozen=True)
class DiLoCo(LocalSGD):
    """`LocalSGD` with DiLoCo's outer Nesterov step and defaults.

    Args:
        period: H >= 1, inner steps between rounds. Defaults to 16.
        warmup_steps: Synchronous steps first (>= 0). Defaults to 0.
        average_slots: Average the inner optimizer's slots at rounds.
            Defaults to False (DiLoCo keeps them local).
        outer_optimizer: "nesterov" (default), "sgd" or "none".
        outer_learning_rate: Defaults to 0.7.
        outer_momentum: Defaults to 0.9.
    """

    period: int = 16
    warmup_steps: int = 0
    average_slots: bool = False
    outer_optimizer: str = "nesterov"
    outer_learning_rate: float = 0.7
    outer_momentum: float = 0.9
