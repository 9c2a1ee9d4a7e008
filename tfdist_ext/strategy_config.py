"""The four independent choices of a `tfdist_ext.Strategy`, validated where they enter."""

import dataclasses
from typing import Any

from tfdist_ext import _compat, bucketing, compression, sync
from tfdist_ext.collectives import engines
from tfdist_ext.collectives import options as allreduce_options


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    """The four independent choices of a strategy, validated.

    Attributes:
        allreduce: A `tfdist_ext.collectives.AllReduce`.
        compression: A `tfdist_ext.compression.Compressor`.
        sync: A `tfdist_ext.sync.SyncPolicy`.
        bucketing: A `tfdist_ext.bucketing.Planner` or None (one bucket).
        engine: "ucx" or "tf" (`tfdist_ext.collectives.engines`).
    """

    allreduce: Any
    compression: Any
    sync: Any
    bucketing: Any
    engine: str = "tf"

    @classmethod
    def from_args(cls, allreduce=None, compression_=None, sync_=None, bucketing_=None,
                  engine=None):
        engine = engines.resolve(engine)
        if allreduce is None:
            allreduce = engines.default_algorithm(engine)
        config = cls(allreduce=allreduce_options.get(allreduce),
                     compression=compression.get(compression_),
                     sync=sync.get(sync_),
                     bucketing=bucketing.get(bucketing_), engine=engine)
        config.sync.check_compression(config.compression)
        return config

    def communication_options(self):
        """TF communication options implied by the configuration."""
        return _compat.CommunicationOptions(bytes_per_pack=self.allreduce.bytes_per_pack)

    def describe(self) -> str:
        return (f"engine={self.engine}, allreduce={self.allreduce}, "
                f"compression={self.compression}, sync={self.sync}, bucketing={self.bucketing}")
