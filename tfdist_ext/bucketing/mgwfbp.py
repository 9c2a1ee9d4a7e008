"""MG-WFBP: merge consecutive layers' gradients when that lowers the modelled time.

S. Shi, X. Chu, B. Li, "MG-WFBP: Efficient Data Communication for Distributed
Synchronous SGD Algorithms", IEEE INFOCOM 2019 (arXiv:1811.11141).

WFBP pays one start-up latency alpha per layer; one bucket pays it once but
cannot overlap communication with backprop. MG-WFBP merges a layer's gradient
into its neighbour's message when waiting for the neighbour costs less than
another alpha. Two methods, same timing model (`bucketing.model`):

* ``"optimal"`` (default): dynamic programming over all partitions into
  consecutive buckets. The finish time of a bucket only grows with the finish
  time of the bucket before it, so the best plan for gradients 0..j-1 extends
  a best plan for some prefix 0..i-1:

      finish[j] = min over i < j of  max(ready[j-1], finish[i]) + alpha + beta * bytes(i..j-1)

  O(L^2) for L layers (a few ms for 1,000 layers). Its modelled time is never
  worse than WFBP's, the single bucket's or any fixed-size plan's. Ties go to
  the larger last bucket (fewer messages).
* ``"greedy"``: the paper's merge rule as its authors implement it
  (HKBU-HPML/MG-WFBP): walk layers in backward order and merge layer l into
  the open bucket when l's gradient is ready less than alpha after the open
  bucket could start sending (the saved start-up outweighs the wait). O(L),
  but not always optimal under this model (property tests use "optimal").

Tuning: the plan is only as good as (alpha, beta) and the per-layer backward
times; feed it `Calibration.alpha` / `.beta` measured by "auto" and backward
times profiled on rank 0, broadcast so every rank plans the same buckets.
"""

import dataclasses
from typing import Optional, Tuple

import numpy as np

from tfdist_ext.bucketing.base import PLANNERS, Planner
from tfdist_ext.bucketing.model import Plan, check_inputs, ready_times
from tfdist_ext.registry import positive_int

METHODS = ("greedy", "optimal")


@PLANNERS.register("mgwfbp")
@dataclasses.dataclass(frozen=True)
class MGWFBP(Planner):
    """Merged-gradient WFBP (Shi, Chu, Li, INFOCOM 2019).

    In `Strategy(bucketing="mgwfbp")`, alpha and beta come from the
    strategy's calibration (probed at start-up) and the backward times from
    `backward_times` or, when None, from a profile of the first
    `profile_steps` training steps on the chief (the strategy stamps when
    each gradient exists, then re-plans and re-traces the train step).

    Args:
        method: "optimal" (exact minimum of the modelled iteration time over
            consecutive partitions) or "greedy" (the paper's O(L) merge rule).
            Defaults to "optimal".
        backward_times: Seconds of each gradient's backward, backward order
            (one per gradient tensor), or None to profile.
        profile_steps: Training steps profiled before planning (>= 1), and
            timed per candidate plan when tuning.
        tune: After profiling, time the distinct plans MG-WFBP makes with
            alpha x {1/16, 1/4, 1, 4}, one bucket, and equal splits into 4
            and 8 buckets, each for `profile_steps` steps of real training,
            and keep the fastest (the chief decides). The calibrated alpha is
            the cost of a lone collective; inside a train step collectives
            pipeline, run concurrently and share the CPU with backprop, which
            the one-channel timing model does not capture (see
            docs/results.md#gradient-bucketing). False trusts the model.
    """

    method: str = "optimal"
    backward_times: Optional[Tuple[float, ...]] = None
    profile_steps: int = 5
    tune: bool = True
    uses_backward_times = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(
                f"Argument `method` of MGWFBP must be one of {list(METHODS)}; received "
                f"{self.method!r}.")
        positive_int("profile_steps", self.profile_steps)
        if self.backward_times is not None:
            object.__setattr__(self, "backward_times", tuple(self.backward_times))
            check_inputs([0] * len(self.backward_times), self.backward_times, 0.0, 0.0)

    def plan(self, sizes, backward_times, alpha, beta) -> Plan:
        sizes, backward_times, alpha, beta = check_inputs(sizes, backward_times, alpha,
                                                          beta)
        if not sizes:
            return ()
        ready = ready_times(backward_times)
        if self.method == "greedy":
            return _greedy(sizes, ready, alpha, beta)
        return _optimal(sizes, ready, alpha, beta)


def _greedy(sizes, ready, alpha, beta) -> Plan:
    buckets, current, channel_free = [], [0], 0.0
    for layer in range(1, len(sizes)):
        start = max(ready[current[-1]], channel_free)
        if ready[layer] - start < alpha:
            current.append(layer)
            continue
        channel_free = start + alpha + beta * sum(sizes[i] for i in current)
        buckets.append(tuple(current))
        current = [layer]
    buckets.append(tuple(current))
    return tuple(buckets)


def _optimal(sizes, ready, alpha, beta) -> Plan:
    n = len(sizes)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(sizes, dtype=np.float64))])
    finish = np.zeros(n + 1)  # finish[j]: best end of the last message for gradients < j
    first = np.zeros(n + 1, dtype=np.int64)  # first gradient of that plan's last bucket
    for j in range(1, n + 1):
        candidates = (np.maximum(ready[j - 1], finish[:j]) + alpha
                      + beta * (prefix[j] - prefix[:j]))
        best = int(np.argmin(candidates))  # first minimum: the largest last bucket
        finish[j], first[j] = candidates[best], best
    buckets, j = [], n
    while j > 0:
        buckets.append(tuple(range(int(first[j]), j)))
        j = int(first[j])
    return tuple(reversed(buckets))
