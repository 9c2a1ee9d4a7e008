"""WFBP: wait-free backpropagation, one bucket (one message) per layer."""

import dataclasses

from tfdist_ext.bucketing.base import PLANNERS, Planner
from tfdist_ext.bucketing.model import Plan, check_inputs


@PLANNERS.register("wfbp")
@dataclasses.dataclass(frozen=True)
class WFBP(Planner):
    """Sends each layer's gradient as soon as backprop has produced it.

    Maximal overlap of communication with backprop, at the price of one
    start-up latency (alpha) per layer: the best plan when alpha is ~0, poor
    for models with many small layers on high-latency links (use "mgwfbp").
    Poseidon (Zhang et al., USENIX ATC 2017) and Horovod without fusion do this.
    """

    def plan(self, sizes, backward_times=None, alpha=0.0, beta=0.0) -> Plan:
        sizes, _, _, _ = check_inputs(sizes, backward_times, alpha, beta)
        return tuple((i,) for i in range(len(sizes)))
