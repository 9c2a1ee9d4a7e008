"""`allreduce="auto"`: pick, per fused buffer size, the algorithm with the lowest modelled time.

Each candidate's time is measured on the running cluster at the sizes in
`PROBE_BYTES` (see `calibration.py`) and interpolated piecewise linearly in
bytes between them (`interpolate`). The middle probe is needed: one straight
line through the smallest and largest probe mispredicts the sizes between
them, where an algorithm can be among the fastest at one size and among the
slowest a few octaves higher. Sizes above the largest probe are extrapolated
rather than probed: a large probe costs seconds, and with the few calls
affordable there it is noisier than the extrapolation. Curves are kept per
algorithm, rather than one alpha-beta-gamma model for all schedules, because
the schedule model's "busiest link" is wrong when replicas share cores and
memory (logical replicas in one process); the alpha-beta-gamma constants
derived from the same probe still model any algorithm that was not probed
(`cost.predict` on its schedule) and are logged for comparison.

The model then only shortlists: at the sizes a model really reduces, the
candidates modelled within `REFINE_MARGIN` of the best are timed once more on a
buffer of that size (`refine.Refiner`). The model ranks algorithms that differ
by 2x well, but the best two or three are often within a few percent of each
other, and a probe at other sizes cannot rank those.

Every worker must decide identically, so decisions are a pure function of a
`Calibration` that the chief measured and broadcast (and, when refined, of the
chief's timings). Ties go to the alphabetically first name.

Tuning: restrict the candidates
(``allreduce={"name": "auto", "candidates": [...]}``) to skip algorithms known
to be slow on a cluster, so fewer are probed and timed. Raise `REFINE_MARGIN`
when timed picks often differ from the model's; keep `REFINE_LIMIT` small (see
`shortlist`).
"""

import dataclasses
import math
from typing import Iterable, List, Optional, Sequence, Tuple

from tfdist_ext.collectives.cost import CostModel, predict
from tfdist_ext.collectives.schedule import ALGORITHMS

NATIVE = "native"
TABLE_SIZES = tuple(1 << s for s in range(10, 27, 2))  # 1 KB .. 64 MB
PROBE_BYTES = (1 << 10, 1 << 20, 1 << 22)  # 1 KB, 1 MB, 4 MB
REFINE_MARGIN = 1.5  # time again every candidate modelled within 1.5x of the best ...
REFINE_LIMIT = 3     # ... but at most the 3 best


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured constants of one cluster (seconds, bytes).

    Attributes:
        cluster_key: Identifies the cluster the numbers were measured on.
        world_size: Replicas in sync when measured.
        alpha: Graph engine start-up per message (derived).
        beta: Graph engine seconds per byte on one rank's link (derived).
        gamma: Seconds per byte of local reduction (an add).
        lines: ``(name, latency_seconds, seconds_per_byte)`` per probed
            algorithm: the straight line through its smallest and largest
            probe (what the bucketing planner reads as alpha and beta).
        points: ``(name, seconds at each of PROBE_BYTES)`` per probed
            algorithm; `predict` interpolates them (the line when absent).
        measured: False when these are defaults, not measurements.
    """

    cluster_key: str
    world_size: int
    alpha: float
    beta: float
    gamma: float
    lines: Tuple[Tuple[str, float, float], ...] = ()
    points: Tuple[Tuple[str, Tuple[float, ...]], ...] = ()
    measured: bool = True

    def __post_init__(self):  # JSON gives lists
        object.__setattr__(self, "lines", tuple(tuple(line) for line in self.lines))
        object.__setattr__(self, "points", tuple((name, tuple(seconds))
                                                 for name, seconds in self.points))

    def cost_model(self) -> CostModel:
        return CostModel(self.alpha, self.beta, self.gamma)

    def predict(self, name: str, num_bytes: int, itemsize: int = 4) -> float:
        """Modelled seconds for algorithm `name` on a buffer of `num_bytes`."""
        for points_name, seconds in self.points:
            if points_name == name:
                return interpolate(PROBE_BYTES, seconds, num_bytes)
        for line_name, latency, per_byte in self.lines:
            if line_name == name:
                return latency + per_byte * num_bytes
        if name == NATIVE:
            raise ValueError("The calibration has no line for 'native'.")
        num_bytes -= num_bytes % itemsize
        return predict(name, self.world_size, num_bytes, itemsize, self.cost_model())

    @classmethod
    def defaults(cls, cluster_key: str, world_size: int) -> "Calibration":
        """Built-in constants for a loopback cluster (docs/tf_internals.md).

        Used only when calibration is skipped and no cache exists; they do not
        describe the running cluster, so run the probe for real decisions.
        """
        return cls(cluster_key, world_size, alpha=4e-4, beta=1 / 0.8e9, gamma=1 / 4e9,
                   lines=((NATIVE, 1.7e-3, 1 / 0.32e9),), measured=False)


def interpolate(sizes: Sequence[int], seconds: Sequence[float], num_bytes: int) -> float:
    """Piecewise-linear `seconds` over increasing `sizes`.

    Below the first size the first segment is extended (never below 1e-7 s).
    Above the last size the steepest segment is: the per-byte cost does not
    fall once a message is bandwidth-bound, and a flatter top segment comes
    from buffers that still fit in the CPU caches, so extending it would
    under-predict larger buffers.
    """
    slopes = [(t1 - t0) / (s1 - s0) for s0, s1, t0, t1 in
              zip(sizes, sizes[1:], seconds, seconds[1:])]
    if num_bytes > sizes[-1]:
        return max(seconds[-1] + max(slopes) * (num_bytes - sizes[-1]), 1e-7)
    i = 1
    while i < len(sizes) - 1 and num_bytes > sizes[i]:
        i += 1
    return max(seconds[i - 1] + slopes[i - 1] * (num_bytes - sizes[i - 1]), 1e-7)


def candidates_or_all(candidates: Optional[Iterable[str]]) -> Tuple[str, ...]:
    """The given candidates, or every registered algorithm plus "native"."""
    if candidates:
        return tuple(sorted(set(candidates)))
    return tuple(sorted(set(ALGORITHMS.names()) | {NATIVE}))


def choose(calibration: Calibration, num_bytes: int, itemsize: int = 4,
           candidates: Optional[Sequence[str]] = None) -> str:
    """The candidate with the lowest modelled time for `num_bytes`."""
    return shortlist(calibration, num_bytes, itemsize, candidates)[0]


def shortlist(calibration: Calibration, num_bytes: int, itemsize: int = 4,
              candidates: Optional[Sequence[str]] = None, margin: float = REFINE_MARGIN,
              limit: int = REFINE_LIMIT) -> Tuple[str, ...]:
    """The candidates worth timing at `num_bytes`, best modelled first.

    Those modelled within `margin` times the best, at most `limit` of them,
    plus "native" when it is a candidate; the first is `choose`'s answer.

    `margin` should cover the model's error at a single size; `limit` should
    stay small, because every extra candidate is one more chance for a noisy
    time to win. "native" is timed regardless of its modelled rank: the probe
    can place TF's fused op outside the shortlist at sizes where it is the
    best.

    Args:
        calibration: The cluster's `Calibration`.
        num_bytes: Buffer size in bytes.
        itemsize: Bytes per element of the buffer.
        candidates: Algorithms to choose from; None or empty means all and
            "native".
        margin: Candidates modelled above `margin` times the best are dropped.
            Raise it when the model's picks are often beaten by timing.
        limit: At most this many candidates (before "native" is added).

    Returns:
        Candidate names, best modelled first.
    """
    if calibration.world_size == 1:
        return (NATIVE,)
    names = candidates_or_all(candidates)
    ranked = sorted((calibration.predict(name, num_bytes, itemsize), name) for name in names)
    close = tuple(name for seconds, name in ranked[:limit] if seconds <= margin * ranked[0][0])
    return close + (NATIVE,) if NATIVE in names and NATIVE not in close else close


def size_class(num_bytes: int) -> int:
    """Buffers in the same half-octave share one refined decision: round(2 log2 bytes)."""
    return round(2 * math.log2(max(num_bytes, 1)))


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
