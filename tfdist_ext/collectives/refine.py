"""`allreduce="auto"` at the sizes a model really reduces: time the close candidates there.

The start-up probe (`calibration.py`) measures every candidate at three sizes,
and the model interpolates between them. It ranks algorithms that differ by
2x well, but not the two or three that are within 5-20% of each other, which
is the usual case at the model's actual buffer sizes. So the first time a
buffer size is reduced, the candidates modelled within `auto.REFINE_MARGIN` of
the best (at most `auto.REFINE_LIMIT`, plus "native"; see `auto.shortlist`)
and the engine's default algorithm are timed on a buffer of exactly that
size, and the fastest by the chief's clock is kept for every buffer in the
same half-octave (`auto.size_class`).
The chief's clock is the median of interleaved calls at every size, unlike
the probe's minimum at 1 MB and above: two algorithms can share a minimum
while their typical times differ widely. This is what NCCL's tuner cannot do
for us (it has no CPU path) and what Horovod's autotuner does with whole
steps, at the cost of one timing per size class rather than a search.
Because the engine's default is always timed too, "auto" is never slower than
not choosing at all by more than the timing's noise; a model's pick that timed
more than `SLOWER_THAN_DEFAULT` times the default is logged as replaced.

When it runs: at trace time, the first time a size class is asked for (the
graph being traced is set aside with `init_scope`; the timing runs eagerly).
Every worker traces the same reductions in the same order (data-parallel
Keras: every worker builds the same steps), so every worker times the same
candidates at the same point, and the chief's times are broadcast so that all
keep the same choice. Only the training path refines (gradient and
parameter-averaging reductions); metrics and `strategy.reduce` take the
model's choice. At most `max_classes` classes are timed, beyond that the model
decides alone. The chief keeps the choices in the calibration cache, so a
second run on the same cluster times nothing.

Cost per size class: tracing 2-4 functions, then 2 * `repeats` + 1 timed
calls of each (15 by default; 8 all-reduces per call below 1 MB, 2 from 1 MB).
The cost grows with the buffer size and the number of workers and is paid
once per cluster, since the choices are cached. Cheaper timings (fewer calls,
or one all-reduce per call from 1 MB) are noisier and pick worse algorithms.

Tuning: keep `repeats` at its default rather than lowering it to save
start-up time. Lower `max_classes` to bound the first run's timing when a
model has many distinct buffer sizes, and use `refine=False` (the model's
choice, no timing) where the first run's start-up time matters more than the
best algorithm.

Buffers are timed as float32 of the same byte count whatever their dtype: the
algorithms move bytes, and only the local add differs.
"""

import logging
import threading
import time
from typing import Dict, Optional, Sequence

from tfdist_ext import _compat
from tfdist_ext.collectives import auto, calibration as calibration_lib, engine

log = logging.getLogger("tfdist_ext")

MAX_CLASSES = 16  # size classes timed per strategy; later ones use the model
SLOWER_THAN_DEFAULT = 1.10  # a model's pick timed above this x the default is reported


class Refiner:
    """Chooses "auto"'s algorithm per buffer size, timing the model's close calls.

    Args:
        cross_ops: The strategy's `CrossDeviceOps` (its devices, rank and
            native all-reduce are used for timing and broadcasting).
        calibration: The cluster's `auto.Calibration` (identical on every worker).
        candidates: Algorithms to choose from; empty means all and "native".
        default: The engine's default algorithm (`engines.default_algorithm`),
            timed beside the shortlist whenever it is a candidate.
        cache_path: The calibration cache; the chief reads and writes the
            refined choices there. None disables it.
        timing: False never times: the model's choice stands (`calibrate=False`
            or `refine=False`).
        max_classes: Size classes timed at most; later ones use the model.
        repeats: Each candidate is timed in 2 * repeats + 1 calls (the
            median is kept).

    Attributes:
        decisions: Size class -> {"bytes", "candidates", "choice", "source",
            "ms" (the chief's times, when timed), "model" (the model's choice),
            "seconds" (this worker's time spent timing, when timed)}.
    """

    def __init__(self, cross_ops, calibration: auto.Calibration,
                 candidates: Sequence[str] = (), default: Optional[str] = None,
                 cache_path: Optional[str] = None,
                 timing: bool = True, max_classes: int = MAX_CLASSES, repeats: int = 7):
        self.cross_ops = cross_ops
        self.calibration = calibration
        self.candidates = tuple(candidates)
        self.default = default if default and (not candidates or default in candidates) else None
        self.cache_path = cache_path
        self.timing = timing
        self.max_classes = max_classes
        self.repeats = repeats
        self.decisions: Dict[int, dict] = {}
        self._is_chief = cross_ops.first_rank == 0
        self._cached = (calibration_lib.read_refined(cache_path, calibration.cluster_key)
                        if cache_path and self._is_chief and calibration.measured else {})
        self._barrier = None
        self._engine = None  # its own instance keys (engine.TIMING_INSTANCE_KEYS)
        self._lock = threading.Lock()  # replica threads may trace reductions

    def choose(self, num_bytes: int, itemsize: int = 4) -> str:
        """The algorithm for a buffer of `num_bytes` (timing its class the first time)."""
        names = auto.shortlist(self.calibration, num_bytes, itemsize, self.candidates)
        if self.default and self.default not in names and self.calibration.world_size > 1:
            names += (self.default,)
        if len(names) == 1 or not self.timing:
            return names[0]
        size_class = auto.size_class(num_bytes)
        with self._lock:
            if size_class not in self.decisions:
                self.decisions[size_class] = self._decide(size_class, num_bytes, names)
            return self.decisions[size_class]["choice"]

    def _decide(self, size_class, num_bytes, names):
        decision = {"bytes": num_bytes, "candidates": names, "model": names[0], "ms": {}}
        if sum(d["source"] == "timed" for d in self.decisions.values()) >= self.max_classes:
            return dict(decision, choice=names[0], source="model (max_classes reached)")
        with _compat.init_scope():
            cached = self._cached.get(size_class)
            index = names.index(cached) if cached in names else -1
            (agreed,) = calibration_lib.broadcast_from_chief(self.cross_ops, [float(index)],
                                                             self.cross_ops.first_rank)
            if agreed >= 0:
                return dict(decision, choice=names[int(agreed)], source="cache")
            start = time.perf_counter()
            if self._engine is None:
                self._barrier = calibration_lib.barrier_fn(self.cross_ops)  # None in one process
                self._engine = self.cross_ops.engines.new(engine.TIMING_INSTANCE_KEYS,
                                                          role="timing")
            steps = 8 if num_bytes < (1 << 20) else 2  # as the probe and the benchmark
            mine = calibration_lib.time_candidates(self.cross_ops, names, num_bytes,
                                                   2 * self.repeats + 1, steps, self._barrier,
                                                   engine=self._engine)
            chief = calibration_lib.broadcast_from_chief(
                self.cross_ops, [mine[name] for name in names], self.cross_ops.first_rank)
        choice = min(zip(chief, names))[1]
        decision.update(choice=choice, source="timed", seconds=time.perf_counter() - start,
                        ms={name: 1e3 * seconds for name, seconds in zip(names, chief)})
        ms = decision["ms"]
        if (self._is_chief and self.default in ms
                and ms[names[0]] > SLOWER_THAN_DEFAULT * ms[self.default]):
            log.warning("tfdist_ext: allreduce='auto' at %d B: the cost model's pick %s timed "
                        "%.3f ms, %.2fx the engine's default %s (%.3f ms); replaced by %s.",
                        num_bytes, names[0], ms[names[0]], ms[names[0]] / ms[self.default],
                        self.default, ms[self.default], choice)
        if self._is_chief:
            log.info("tfdist_ext: allreduce='auto' at %d B timed %s -> %s (model: %s) in %.1f s",
                     num_bytes, ", ".join(f"{n} {t:.3f} ms" for n, t in decision["ms"].items()),
                     choice, names[0], decision["seconds"])
            if self.cache_path and self.calibration.measured:
                self._cached[size_class] = choice
                calibration_lib.write_cache(self.cache_path, self.calibration, self._cached)
        return decision
