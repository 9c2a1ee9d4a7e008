"""Which algorithm all-reduces a fused buffer, and how "auto" is prepared to decide.

`CrossDeviceOps` asks `AlgorithmChoice.select(num_bytes)` for every buffer it
reduces and gets a name: the configured algorithm, the size range's entry that
covers the buffer, or for ``allreduce="auto"`` the calibrated model's choice
(`auto.choose`), refined by timing at that size where the model finds
candidates close (`refine.Refiner`). Every worker decides identically: the
inputs are the configuration and the chief's measurements.

The host layout (the host of every global rank) is part of the choice: with
several hosts of which some run several ranks, "hierarchical" joins "auto"'s
candidates, and its schedule depends on the layout (`spec`).

    configuration --+                    +--> name ("ring", "native", ...)
                    +--> select(bytes) --+
    calibration  ---+    (refiner)       +--> spec(name): what engines run

`prepare_auto` runs once, when the strategy is made: it measures (or loads)
the calibration and installs the refiner.
"""

import logging
from typing import Optional, Sequence, Tuple

from tfdist_ext import cluster
from tfdist_ext.collectives import auto, calibration as calibration_lib, engines
from tfdist_ext.collectives import hierarchical, refine as refine_lib

log = logging.getLogger("tfdist_ext")


def rank_hosts(given: Optional[Sequence], group_size: int, replicas_per_worker: int,
               addresses: Optional[Sequence[str]] = None) -> Tuple:
    """The host of every global rank.

    Args:
        given: `AllReduce.hosts`: one host per worker or per rank, or None.
        group_size: Replicas in sync across all workers.
        replicas_per_worker: Local replicas of each worker.
        addresses: The workers' "host:port" addresses (TF_CONFIG), used when
            `given` is None; None means one worker on "localhost".

    Raises:
        ValueError: `given` lists neither every worker's nor every rank's host.
    """
    if given is None:
        return hierarchical.hosts_from_addresses(
            ["localhost:0"] if addresses is None else addresses, replicas_per_worker)
    workers = group_size // replicas_per_worker
    if len(given) not in (workers, group_size):
        raise ValueError(
            f"Argument `hosts` lists {len(given)} hosts ({given}) but the job has "
            f"{workers} worker(s) of {replicas_per_worker} replica(s); give the host of "
            f"every worker (or of every replica without TF_CONFIG).")
    repeat = replicas_per_worker if len(given) == workers else 1
    return tuple(h for h in given for _ in range(repeat))


def auto_candidates(given: Optional[Sequence[str]], hosts: Tuple) -> Tuple[str, ...]:
    """What "auto" chooses from: `given`, else every algorithm, with "hierarchical"
    when the job spans several hosts and some host runs several ranks."""
    if given:
        return tuple(sorted(given))
    groups = hierarchical.host_groups(hosts)
    layered = len(groups) > 1 and any(len(g) > 1 for g in groups)
    return auto.candidates_or_all(None) + ((hierarchical.NAME,) if layered else ())


def link_constants(calibration: auto.Calibration, algorithm: str) -> Tuple[float, float]:
    """(alpha seconds per message, beta seconds per byte) of `algorithm` in `calibration`."""
    for name, latency, per_byte in calibration.lines:
        if name == algorithm:
            return latency, per_byte
    return calibration.alpha, calibration.beta


class AlgorithmChoice:
    """The algorithm for each buffer size, the same on every worker.

    Args:
        allreduce: The strategy's `collectives.AllReduce` option.
        group_size: Replicas in sync across all workers.
        replicas_per_worker: Local replicas of each worker.
        calibration: The `auto.Calibration` to decide with, when another
            choice of this strategy has it already (its background reductions).

    Attributes:
        calibration: The `auto.Calibration` "auto" and the bucketing planners
            decide with; set by `prepare_auto` unless given (None until then).
        refiner: The `refine.Refiner` "auto" times close candidates with
            (None without "auto" or with one replica).
    """

    def __init__(self, allreduce, group_size: int, replicas_per_worker: int, calibration=None):
        self.allreduce = allreduce
        self.group_size = group_size
        self.replicas_per_worker = replicas_per_worker
        self.calibration = calibration
        self.refiner = None
        self._rank_hosts = None

    def select(self, num_bytes: int, itemsize: int = 4, refine: bool = True) -> str:
        """The algorithm for a buffer of `num_bytes`, the same on every worker.

        Args:
            num_bytes: Size of the buffer.
            itemsize: Bytes per element.
            refine: Whether "auto" may time its close candidates at this size
                (`collectives.refine`). False where no buffer of this size is
                reduced (a bucket plan's total) or where it is off the
                training path (metrics, `strategy.reduce`): the model decides.

        Raises:
            RuntimeError: "auto" without a calibration (`prepare_auto`).
        """
        name = self.allreduce.algorithm_for(num_bytes)
        if name == "auto":
            if self.calibration is None:
                raise RuntimeError("allreduce='auto' needs the strategy's calibration; "
                                   "create the strategy with tfdist_ext.Strategy(...).")
            if self.refiner is not None and refine:
                return self.refiner.choose(num_bytes, itemsize)
            return auto.choose(self.calibration, num_bytes, itemsize, self.candidates)
        return name

    @property
    def rank_hosts(self) -> Tuple:
        """Host id of every global rank (`AllReduce.hosts`, else TF_CONFIG's addresses)."""
        if self._rank_hosts is None:
            addresses = None
            if self.allreduce.hosts is None:
                spec = cluster.cluster_from_env()
                addresses = spec.worker_addresses if spec else None
            self._rank_hosts = rank_hosts(self.allreduce.hosts, self.group_size,
                                          self.replicas_per_worker, addresses)
        return self._rank_hosts

    @property
    def candidates(self) -> Tuple[str, ...]:
        """What "auto" chooses from (`auto_candidates` for this job's hosts)."""
        if self.allreduce.candidates:
            return auto_candidates(self.allreduce.candidates, ())
        return auto_candidates(None, self.rank_hosts)

    def spec(self, name: str):
        """What the engines and the cost model run for the algorithm `name`: the name
        itself, or for "hierarchical" its schedule for this job's hosts."""
        if name != hierarchical.NAME:
            return name
        return hierarchical.Hierarchical(self.rank_hosts, self.allreduce.inter_host)

    def link_constants(self, algorithm: str) -> Tuple[float, float]:
        """`link_constants` of the calibration, or of the defaults before one exists."""
        calibration = self.calibration or auto.Calibration.defaults("defaults", self.group_size)
        return link_constants(calibration, algorithm)


def prepare_auto(cross_ops, cluster_spec) -> Optional[list]:
    """Measures (or loads) the cost model "auto" decides with, and installs the refiner.

    Called once when a strategy whose configuration uses "auto" (or a
    bucketing planner that needs link constants) is made: a collective, so
    every worker calls it at the same point.

    Args:
        cross_ops: The strategy's `CrossDeviceOps`; its choice's `calibration`
            and `refiner` are set.
        cluster_spec: The job's `cluster.ClusterSpec` (None without TF_CONFIG).

    Returns:
        "auto"'s decision table (`auto.decision_table`), logged once by the
        chief; None when "auto" is not used or there is one replica.
    """
    options, engine = cross_ops.config.allreduce, cross_ops.config.engine
    key = calibration_lib.cluster_key(cluster_spec, cross_ops.group_size, cross_ops.devices,
                                      engine)
    if cross_ops.group_size == 1:
        cross_ops.choice.calibration = auto.Calibration.defaults(key, 1)
        return None
    candidates = cross_ops.choice.candidates
    if "auto" not in options.algorithms:  # only the bucketing planner needs figures
        candidates = tuple(sorted(set(options.algorithms)))
    cross_ops.choice.calibration = calibration_lib.calibrate(
        cross_ops, key, cross_ops.first_rank, candidates,
        cache_path=options.calibration_cache, probe=options.calibrate)
    if "auto" not in options.algorithms:
        return None
    cross_ops.choice.refiner = refine_lib.Refiner(
        cross_ops, cross_ops.choice.calibration, cross_ops.choice.candidates,
        default=engines.default_algorithm(engine),
        cache_path=options.calibration_cache, timing=options.calibrate and options.refine)
    decisions = auto.decision_table(cross_ops.choice.calibration,
                                    candidates=cross_ops.choice.candidates)
    if cross_ops.first_rank == 0:
        log.warning("tfdist_ext: %s", auto.format_table(cross_ops.choice.calibration, decisions))
    return decisions
