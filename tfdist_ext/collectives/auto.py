"""`allreduce="auto"`: pick, per fused buffer size, the algorithm with the lowest modelled time.

Each candidate's time is a straight line ``latency + seconds_per_byte * bytes``
measured for that algorithm on the running cluster at two sizes (see
`calibration.py`). Lines per algorithm, rather than one alpha-beta-gamma model
for all schedules, because the schedule model's "busiest link" is wrong when
replicas share cores and memory (logical replicas in one process: measured
1.9x off at 1 MB); the alpha-beta-gamma constants derived from the same probe
still model any algorithm that was not probed (`cost.predict` on its schedule)
and are logged for comparison.

Every worker must decide identically, so decisions are a pure function of a
`Calibration` that the chief measured and broadcast. Ties go to the
alphabetically first name.
"""

import dataclasses
from typing import Iterable, List, Optional, Sequence, Tuple

from tfdist_ext.collectives.cost import CostModel, predict
from tfdist_ext.collectives.schedule import ALGORITHMS

NATIVE = "native"
TABLE_SIZES = tuple(1 << s for s in range(10, 27, 2))  # 1 KB .. 64 MB


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured constants of one cluster (seconds, bytes).

    Attributes:
        cluster_key: Identifies the cluster the numbers were measured on.
        world_size: Replicas in sync when measured.
        alpha: Graph engine start-up per message (derived).
        beta: Graph engine seconds per byte on one rank's link (derived).
        gamma: Seconds per byte of local reduction (an add).
        lines: ``(name, latency_seconds, seconds_per_byte)`` per probed algorithm.
        measured: False when these are defaults, not measurements.
    """

    cluster_key: str
    world_size: int
    alpha: float
    beta: float
    gamma: float
    lines: Tuple[Tuple[str, float, float], ...] = ()
    measured: bool = True

    def __post_init__(self):  # JSON gives lists
        object.__setattr__(self, "lines", tuple(tuple(line) for line in self.lines))

    def cost_model(self) -> CostModel:
        return CostModel(self.alpha, self.beta, self.gamma)

    def predict(self, name: str, num_bytes: int, itemsize: int = 4) -> float:
        """Modelled seconds for algorithm `name` on a buffer of `num_bytes`."""
        for line_name, latency, per_byte in self.lines:
            if line_name == name:
                return latency + per_byte * num_bytes
        if name == NATIVE:
            raise ValueError("The calibration has no line for 'native'.")
        num_bytes -= num_bytes % itemsize
        return predict(name, self.world_size, num_bytes, itemsize, self.cost_model())

    @classmethod
    def defaults(cls, cluster_key: str, world_size: int) -> "Calibration":
        """Figures measured on 2 workers over 127.0.0.1 (TF_NOTES section 7);
        used only when calibration is skipped and no cache exists."""
        return cls(cluster_key, world_size, alpha=4e-4, beta=1 / 0.8e9, gamma=1 / 4e9,
                   lines=((NATIVE, 1.7e-3, 1 / 0.32e9),), measured=False)


def candidates_or_all(candidates: Optional[Iterable[str]]) -> Tuple[str, ...]:
    """The given candidates, or every registered algorithm plus "native"."""
    if candidates:
        return tuple(sorted(set(candidates)))
    return tuple(sorted(set(ALGORITHMS.names()) | {NATIVE}))


def choose(calibration: Calibration, num_bytes: int, itemsize: int = 4,
           candidates: Optional[Sequence[str]] = None) -> str:
    """The candidate with the lowest modelled time for `num_bytes`."""
    if calibration.world_size == 1:
        return NATIVE
    return min((calibration.predict(name, num_bytes, itemsize), name)
               for name in candidates_or_all(candidates))[1]


def decision_table(calibration: Calibration, sizes: Sequence[int] = TABLE_SIZES,
                   candidates: Optional[Sequence[str]] = None) -> List[dict]:
    """One row per size: the choice and every candidate's modelled milliseconds."""
    rows = []
    for size in sizes:
        times = {name: 1e3 * calibration.predict(name, size)
                 for name in candidates_or_all(candidates)}
        rows.append({"bytes": size, "choice": choose(calibration, size, 4, candidates),
                     "modelled_ms": times})
    return rows


def format_table(calibration: Calibration, rows: List[dict]) -> str:
    """The decision table as text, for the log."""
    names = list(rows[0]["modelled_ms"]) if rows else []
    source = "measured" if calibration.measured else "DEFAULTS (not measured)"
    lines = [(f"allreduce='auto' on {calibration.world_size} replicas, {source}: "
              f"alpha={calibration.alpha * 1e6:.1f} us/msg, "
              f"beta={1e-9 / max(calibration.beta, 1e-30):.2f} GB/s, "
              f"gamma={1e-9 / max(calibration.gamma, 1e-30):.2f} GB/s; modelled ms:"),
             "bytes".rjust(10) + "  choice".ljust(20) + "".join(n[:10].rjust(11) for n in names)]
    for row in rows:
        lines.append(f"{row['bytes']:>10}  {row['choice']:<18}" + "".join(
            f"{row['modelled_ms'][n]:>11.3f}" for n in names))
    return "\n".join(lines)
