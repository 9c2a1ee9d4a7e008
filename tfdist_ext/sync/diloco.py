"""DiLoCo: local SGD whose rounds take an outer Nesterov step.

    Strategy(sync="diloco")                       # period 16, outer Nesterov
    Strategy(sync={"name": "diloco", "period": 100}, compression="powersgd")

Reference: Douillard et al., "DiLoCo: Distributed Low-Communication Training
of Language Models", 2023 (https://arxiv.org/abs/2311.08105). Every replica
takes `period` (H) steps with the user's optimizer (the inner optimizer; its
state stays local), then the round averages the parameter change since the
last round, D = mean_r(a - w_r) (the outer gradient), and applies it with
Nesterov momentum: v = m v + D; a -= lr (D + m v); every replica continues
from a. The paper matches synchronous training of language models while
communicating H = 500 times less, with AdamW inner steps and lr = 0.7,
m = 0.9. Those outer settings are kept for adaptive inner optimizers (Adam,
RMSprop, ...) and plain SGD; with inner SGD + momentum they diverge (the inner
momentum already carries progress across rounds), so there the outer step is
lr = 0.7, m = 0.3, which moves the averaged change 1x in steady state
(lr / (1 - m)) instead of 7x; a slow momentum in the sense of SlowMo (Wang
et al., "SlowMo: Improving Communication-Efficient Distributed SGD with Slow
Momentum", ICLR 2020). The choice is made at the first step and logged
(`local_sgd.outer_settings`).

Tuning: leave `outer_learning_rate` and `outer_momentum` unset (None) unless
measurements say otherwise; raise H as far as accuracy allows (tens for small
models and datasets, hundreds for long runs); keep `average_slots=False`.
Compressing the outer gradients is not supported yet (a compressor is
refused with a message).
"""

import dataclasses
from typing import Optional

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
        outer_learning_rate: Defaults to None: 0.7 (chosen at the first step).
        outer_momentum: Defaults to None: 0.9, or 0.3 with inner SGD + momentum.
    """

    period: int = 16
    warmup_steps: int = 0
    average_slots: bool = False
    outer_optimizer: str = "nesterov"
    outer_learning_rate: Optional[float] = None
    outer_momentum: Optional[float] = None
    divergence_advice = ("lower `outer_learning_rate` (e.g. 0.5) and `outer_momentum` "
                         "(e.g. 0.5), or `period`")
