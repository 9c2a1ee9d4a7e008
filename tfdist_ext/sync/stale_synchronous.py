"""Stale-synchronous parallel (SSP) training with a staleness bound s.

    Strategy(sync=StaleSynchronous(staleness=2))

Reference: Ho, Cipar, Cui, Lee, Kim, Gibbons, Gibson, Ganger, Xing, "More
Effective Distributed ML via a Stale Synchronous Parallel Parameter Server",
NIPS 2013.

Every replica applies its own gradient at once (read-my-writes: its 1/N share
of the global step) and the other replicas' gradients of step t at step t + s.
The all-reduce of step t is started at step t and awaited at step t + s
(`tfdist_ext.sync.inflight`), so a replica is never more than s steps ahead of
the slowest: a transient straggler costs the others nothing as long as it
catches up within s steps; a permanently slower worker still paces everyone.
With plain SGD the model of replica i at step t is the synchronous model with
the other replicas' last s gradients missing.

Counters (`Strategy.communication_stats()`, `CommunicationStats`):
``sync_rounds``, ``staleness`` (the lead observed at the last step: steps
since the newest round every worker had contributed to), ``staleness_max``.

Tuning: s = 1-3. Larger s absorbs longer stalls but applies staler gradients;
keep the learning rate of synchronous training.
"""

import dataclasses

from tfdist_ext.registry import positive_int
from tfdist_ext.sync import inflight_payloads
from tfdist_ext.sync.base import SYNC_POLICIES, SyncPolicy
from tfdist_ext.sync.pipelined import PipelinedRunner


@SYNC_POLICIES.register("stale_synchronous")
@dataclasses.dataclass(frozen=True)
class StaleSynchronous(SyncPolicy):
    """Apply others' gradients at most `staleness` steps late.

    Args:
        staleness: s >= 1.
    """

    staleness: int = 2
    communicates = "gradients through a pipeline of in-flight reductions"
    divergence_advice = "lower `staleness` (1 is the safest relaxed setting)"
    momentum_caution = (
        "gradients applied `staleness` steps late add to the optimizer's momentum (asynchrony "
        "acts as extra momentum: Mitliagkas et al., 2016); on a 2-worker MLP (8x8 digits, "
        "15 epochs) it ended 4.7 points below synchronous SGD (0.929 against 0.976). With "
        "this optimizer sync='delayed_averaging' (0.971) or sync='local_sgd' (0.976) are "
        "safer")

    def __post_init__(self):
        positive_int("staleness", self.staleness)

    def check_compression(self, compressor) -> None:
        """One-round reducible compressors only (`inflight_payloads.check`)."""
        inflight_payloads.check(self.name, compressor)

    def runner(self, strategy):
        return PipelinedRunner(strategy, self.staleness, local_scale=1.0)
