"""How gradients are grouped and when each group is sent (`Strategy(bucketing=...)`).

Planners ("fixed", "wfbp", "mgwfbp") are pure functions of gradient sizes,
per-layer backward times and the link's alpha/beta; `model` holds the timing
model they share. `bucketing=None` means one bucket of everything
(`single_bucket`).
"""

from tfdist_ext.bucketing.base import PLANNERS, FixedSize, Planner, get
from tfdist_ext.bucketing.mgwfbp import MGWFBP
from tfdist_ext.bucketing.model import (check_inputs, modelled_time, plan_buckets,
                                        ready_times, schedule, single_bucket)
from tfdist_ext.bucketing.wfbp import WFBP

__all__ = ["MGWFBP", "PLANNERS", "WFBP", "FixedSize", "Planner", "check_inputs", "get",
           "modelled_time", "plan_buckets", "ready_times", "schedule", "single_bucket"]
