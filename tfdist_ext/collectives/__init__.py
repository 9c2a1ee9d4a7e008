"""All-reduce algorithms as data, a numpy simulator and an alpha-beta-gamma cost model.

Every algorithm is a pure function ``schedule(world_size, rank, num_elements)``
returning a `Schedule` (rounds of `Send` / `Recv` steps), registered by name in
`ALGORITHMS`. The simulator, the cost model and the TensorFlow engines all run
the same schedules. Importing this package registers every algorithm.

Example:
    >>> from tfdist_ext import collectives
    >>> collectives.ALGORITHMS.names()
    ['all_to_all', 'butterfly', 'halving_doubling', 'master_worker', 'ring', 'round_robin', 'tree']
"""

from tfdist_ext.collectives import (  # noqa: F401  (imported to register)
    all_to_all,
    butterfly,
    halving_doubling,
    master_worker,
    ring,
    round_robin,
    tree,
)
from tfdist_ext.collectives.options import AllReduce, available_algorithms
from tfdist_ext.collectives.cost import (
    CostModel,
    best_algorithm,
    predict,
    schedule_cost,
)
from tfdist_ext.collectives.schedule import (
    ALGORITHMS,
    Recv,
    Round,
    Schedule,
    ScheduleError,
    Send,
    all_schedules,
    schedule_fn,
    split,
)
from tfdist_ext.collectives.simulator import check_allreduce, simulate, validate
from tfdist_ext.collectives.hierarchical import Hierarchical

__all__ = [
    "ALGORITHMS",
    "AllReduce",
    "available_algorithms",
    "CostModel",
    "Hierarchical",
    "Recv",
    "Round",
    "Schedule",
    "ScheduleError",
    "Send",
    "all_schedules",
    "best_algorithm",
    "check_allreduce",
    "predict",
    "schedule_cost",
    "schedule_fn",
    "simulate",
    "split",
    "validate",
]
