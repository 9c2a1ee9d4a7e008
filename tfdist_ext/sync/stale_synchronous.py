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

The applied gradient is s(N - 1)/N steps old on average, which acts as extra
momentum (Mitliagkas, Zhang, Hadjis, Ré, "Asynchrony begets momentum, with an
application to deep learning", Allerton 2016). With Keras' `SGD` and momentum
m, `momentum_compensation` (on by default) steps with the momentum
1 - (1 - m)(1 + s(N - 1)/N) instead (`tfdist_ext.sync.momentum`; 0.8 for
m = 0.9, s = 2, N = 2), which keeps synchronous training's step gain; the
optimizer object keeps m.

Tuning: s = 1-3. Larger s absorbs longer stalls but applies staler gradients;
keep the learning rate of synchronous training.
"""

import dataclasses

from tfdist_ext.registry import boolean, positive_int
from tfdist_ext.sync import inflight_payloads
from tfdist_ext.sync.base import SYNC_POLICIES, SyncPolicy
from tfdist_ext.sync.pipelined import PipelinedRunner


@SYNC_POLICIES.register("stale_synchronous")
@dataclasses.dataclass(frozen=True)
class StaleSynchronous(SyncPolicy):
    """Apply others' gradients at most `staleness` steps late.

    Args:
        staleness: s >= 1.
        momentum_compensation: Lower an SGD optimizer's momentum for the
            staleness (see the module doc); False keeps the optimizer's own.
    """

    staleness: int = 2
    momentum_compensation: bool = True
    communicates = "gradients through a pipeline of in-flight reductions"
    divergence_advice = "lower `staleness` (1 is the safest relaxed setting)"

    @property
    def momentum_caution(self):
        """The cost of switching `momentum_compensation` off with momentum SGD ("" when on)."""
        if self.momentum_compensation:
            return ""
        return ("with momentum_compensation=False the gradients applied `staleness` steps late "
                "add to the optimizer's momentum (asynchrony acts as extra momentum: "
                "Mitliagkas et al., 2016), and it may end a point or two below synchronous "
                "momentum SGD. momentum_compensation=True (the default) is safer")

    adam_caution = (
        "Adam's per-coordinate step does not shrink for gradients `staleness` steps old "
        "the way compensated momentum does: at 4 or more replicas it may end a few points "
        "below synchronous Adam; safer: sync='local_sgd' or 'gossip', or sync='sync'")

    def __post_init__(self):
        positive_int("staleness", self.staleness)
        boolean("momentum_compensation", self.momentum_compensation)

    def check_compression(self, compressor) -> None:
        """One-round reducible compressors only (`inflight_payloads.check`)."""
        inflight_payloads.check(self.name, compressor)

    def runner(self, strategy):
        n = strategy.num_replicas_in_sync
        staleness = self.staleness * (n - 1) / n if self.momentum_compensation else 0.0
        return PipelinedRunner(strategy, self.staleness, local_scale=1.0,
                               mean_staleness=staleness)
