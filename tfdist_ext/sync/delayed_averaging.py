"""Delayed gradient averaging (DGA): apply the global average D steps late.

    Strategy(sync=DelayedAveraging(delay=2))

Reference: Zhu, Lin, Lu, Han, "Delayed Gradient Averaging: Tolerate the
Communication Latency for Federated Learning", NeurIPS 2021 (also "Distributed
Training Across the World").

Update of replica i at step t, with g_i its own gradient and g the average
over replicas:

    w_i <- w_i - lr * (g_i(t) - g_i(t - D) + g(t - D))       for t >= D
    w_i <- w_i - lr * g_i(t)                                  for t <  D

so each replica takes full local steps, and D steps later swaps its own
gradient for the average. The all-reduce of step t runs while steps t+1, ...,
t+D compute (`tfdist_ext.sync.inflight`). Replicas differ only by their last
D local gradients; a drain (epoch end) replaces those by the averages.

Each replica's optimizer steps on g_i(t) - g_i(t - D) + g(t - D), whose noise
variance is 2N - 1 times that of the synchronous gradient g(t) (three
independent batches: two of 1 / N of the global batch, the rest of the third);
the replicas' mean is g(t). With an optimizer that normalizes the gradient
(Adam, RMSprop, ...) the learning rate is multiplied by sqrt(2N - 1)
(`sqrt_lr_scaling`, `tfdist_ext.sync.lr_scaling`) so the mean moves as
synchronous training's; SGD needs no change.

Tuning: D such that D steps of compute cover one all-reduce (1-4); the paper
reports no accuracy loss up to D = 4 with SGD momentum on ImageNet.
"""

import dataclasses

from tfdist_ext.registry import boolean, positive_int
from tfdist_ext.sync import inflight_payloads
from tfdist_ext.sync.base import SYNC_POLICIES, SyncPolicy
from tfdist_ext.sync.pipelined import PipelinedRunner


@SYNC_POLICIES.register("delayed_averaging")
@dataclasses.dataclass(frozen=True)
class DelayedAveraging(SyncPolicy):
    """Local steps corrected to the global average gradient `delay` steps later.

    Args:
        delay: D >= 1.
        sqrt_lr_scaling: Multiply a normalizing optimizer's learning rate by
            sqrt(2N - 1) (module doc); False keeps it as given.
    """

    delay: int = 2
    sqrt_lr_scaling: bool = True
    communicates = "gradients through a pipeline of in-flight reductions"
    divergence_advice = "lower `delay` (1 is the safest relaxed setting)"

    def __post_init__(self):
        positive_int("delay", self.delay)
        boolean("sqrt_lr_scaling", self.sqrt_lr_scaling)

    def check_compression(self, compressor) -> None:
        """One-round reducible compressors only (`inflight_payloads.check`)."""
        inflight_payloads.check(self.name, compressor)

    def runner(self, strategy):
        n = strategy.num_replicas_in_sync
        return PipelinedRunner(strategy, self.delay, local_scale=float(n),
                               noise_ratio=2 * n - 1 if self.sqrt_lr_scaling else 1.0)
