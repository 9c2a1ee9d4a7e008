"""The independent choices of a `tfdist_ext.Strategy`, validated where they enter."""

import dataclasses
from typing import Any

from tfdist_ext import _compat, bucketing, compression, sync, zero
from tfdist_ext.collectives import engines
from tfdist_ext.collectives import options as allreduce_options


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    """The independent choices of a strategy, validated.

    Attributes:
        allreduce: A `tfdist_ext.collectives.AllReduce`.
        compression: A `tfdist_ext.compression.Compressor`.
        sync: A `tfdist_ext.sync.SyncPolicy`.
        bucketing: A `tfdist_ext.bucketing.Planner` or None (one bucket).
        engine: "ucx" or "tf" (`tfdist_ext.collectives.engines`).
        sparse_as_dense: Whether IndexedSlices are reduced dense.
        zero_stage: 0, 1 for the optimizer's state sharded, 2 for the gradients
            reduce-scattered too (`tfdist_ext.zero`).
    """

    allreduce: Any
    compression: Any
    sync: Any
    bucketing: Any
    engine: str = "tf"
    sparse_as_dense: bool = False
    zero_stage: int = 0

    @classmethod
    def from_args(cls, allreduce=None, compression_=None, sync_=None, bucketing_=None,
                  engine=None, sparse_as_dense=False, zero_stage=0):
        engine = engines.resolve(engine)
        if allreduce is None:
            allreduce = engines.default_algorithm(engine)
        if not isinstance(sparse_as_dense, bool):
            raise ValueError(f"Argument `sparse_as_dense` must be True or False; received "
                             f"{sparse_as_dense!r}.")
        config = cls(allreduce=allreduce_options.get(allreduce),
                     compression=compression.get(compression_),
                     sync=sync.get(sync_),
                     bucketing=bucketing.get(bucketing_), engine=engine,
                     sparse_as_dense=sparse_as_dense, zero_stage=zero.check_stage(zero_stage))
        config.sync.check_compression(config.compression)
        config.check_zero()
        return config

    def plain_reduction_problems(self) -> list:
        """The choices that keep gradients from one plain all-reduce per step (sync="sync",
        no compression, one bucket), one phrase each; options that need it name them."""
        problems = []
        if getattr(self.sync, "name", "sync") != "sync":
            problems.append(f"sync={self.sync.name!r} (needs 'sync')")
        if getattr(self.compression, "name", "none") != "none":
            problems.append(f"compression={self.compression.name!r} (needs 'none')")
        if self.bucketing is not None:
            problems.append(f"bucketing={self.bucketing} (needs None)")
        return problems

    def check_zero(self):
        """Raises ValueError unless the other choices work with `zero_stage`."""
        problems = self.plain_reduction_problems() if self.zero_stage else []
        if self.zero_stage == 2 and self.engine != "ucx":
            problems.append(f"engine={self.engine!r} (needs 'ucx', which reduce-scatters)")
        if problems:
            raise ValueError(f"Argument `zero_stage`={self.zero_stage} cannot be combined with "
                             + "; ".join(problems) + " yet. Drop those arguments, or pass "
                             "zero_stage=0.")

    def communication_options(self):
        """TF communication options implied by the configuration."""
        return _compat.CommunicationOptions(bytes_per_pack=self.allreduce.bytes_per_pack)

    def describe(self) -> str:
        return (f"engine={self.engine}, allreduce={self.allreduce}, "
                f"compression={self.compression}, sync={self.sync}, bucketing={self.bucketing}"
                + (f", zero_stage={self.zero_stage}" if self.zero_stage else ""))
