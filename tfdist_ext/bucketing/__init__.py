"""How gradients are grouped and when each group is sent (`Strategy(bucketing=...)`)."""

from tfdist_ext.bucketing.base import PLANNERS, FixedSize, Planner, get

__all__ = ["PLANNERS", "FixedSize", "Planner", "get"]
