"""The `allreduce=` option of `tfdist_ext.Strategy`: which algorithm reduces what.

Accepted forms:
    * a name: ``"native"`` (TF's own CollectiveReduceV2 ring) or a name listed
      by `available_algorithms()`;
    * a dict ``{"name": "ring", "bytes_per_pack": 4 << 20}``;
    * a size-range dict ``{"<64KB": "butterfly", ">=64KB": "ring"}`` that picks
      the algorithm per fused buffer by its size in bytes; the ranges must
      cover every size exactly once;
    * an `AllReduce` instance.
"""

import dataclasses
import math
import re
import types
from typing import Optional, Tuple

from tfdist_ext.collectives.schedule import ALGORITHMS
from tfdist_ext.registry import boolean, positive_int, seconds

_UNITS = types.MappingProxyType({"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30})
_BOUND = re.compile(r"^\s*(<=|>=|<|>)\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*$", re.IGNORECASE)

def available_algorithms() -> Tuple[str, ...]:
    """Names accepted for `allreduce=`: TF's "native", every schedule registered in
    `schedule.ALGORITHMS` at the time of the call (both engines run any schedule, so
    one registered in user code is selectable too), "auto" and "hierarchical"."""
    return ("native", *ALGORITHMS.names(), "auto", "hierarchical")


def parse_size(text: str) -> int:
    """"64KB" -> 65536 (binary units B, KB, MB, GB)."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*$", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"Cannot read the size {text!r}; use e.g. '512B', '64KB', '4MB'.")
    unit = match.group(2).upper()
    if unit and not unit.endswith("B"):
        unit += "B"  # "64K" means 64KB
    return int(float(match.group(1)) * _UNITS[unit])


def _check_algorithm(name, where="allreduce"):
    if name not in available_algorithms():
        raise ValueError(
            f"Unknown {where} algorithm {name!r}. Valid names: "
            f"{', '.join(repr(n) for n in available_algorithms())}.")
    return name


def _parse_bound(key: str):
    """'<64KB' -> (lo, hi) with lo inclusive and hi exclusive, in bytes."""
    match = _BOUND.match(key)
    if not match:
        raise ValueError(
            f"Argument `allreduce`: cannot read the size range {key!r}. Use keys like "
            "'<64KB', '>=64KB', '<=1MB' or '>1MB' (units B, KB, MB, GB).")
    op, number, unit = match.groups()
    size = parse_size(number + unit)
    return {"<": (0, size), "<=": (0, size + 1), ">": (size + 1, math.inf),
            ">=": (size, math.inf)}[op]


def _parse_ranges(spec: dict):
    ranges = sorted((_parse_bound(key) + (_check_algorithm(name, f"allreduce[{key!r}]"),)
                     for key, name in spec.items()), key=lambda r: (r[0], r[1]))
    position = 0
    for lo, hi, _ in ranges:
        if lo != position:
            problem = "overlap" if lo < position else f"leave sizes {position}..{lo - 1} uncovered"
            raise ValueError(
                f"Argument `allreduce`: the size ranges {list(spec)} {problem}. Give "
                "ranges that cover every size exactly once, e.g. "
                "{'<64KB': 'butterfly', '>=64KB': 'ring'}.")
        position = hi
    if position != math.inf:
        raise ValueError(
            f"Argument `allreduce`: the size ranges {list(spec)} leave sizes >= "
            f"{position} bytes uncovered. Add a range like '>={position}B'.")
    return tuple(ranges)


@dataclasses.dataclass(frozen=True)
class AllReduce:
    """How fused gradient buffers are all-reduced.

    Args:
        algorithm: Algorithm for every buffer size (ignored when `by_size` is
            given). Defaults to "native".
        by_size: Tuple of (lo_bytes, hi_bytes, algorithm) covering [0, inf),
            normally built from a size-range dict.
        bytes_per_pack: Gradients are fused into flat buffers of at least this
            many bytes, in order (TF's rule; 0: one buffer per dtype). Defaults to 0.
        candidates: Algorithms "auto" may choose from; empty means all of them
            and "native".
        calibrate: Whether "auto" (and the "mgwfbp" bucketing planner) runs the
            start-up probe (seconds, once per cluster) when no valid cache
            exists; False uses built-in defaults instead and times nothing.
        refine: Whether "auto" times its close candidates again at each
            buffer size the model reduces, the first time it is reduced
            (`collectives.refine`; seconds per size class, cached). False keeps
            the model's choice.
        calibration_cache: JSON file where the chief keeps the calibration,
            keyed by the cluster; None disables caching.
        hosts: For "hierarchical" (and "auto", which then considers it): the
            host of every worker in TF_CONFIG order (of every replica without
            TF_CONFIG), any hashable ids, e.g. ``(0, 0, 1, 1)``. None groups the
            workers by the host part of their TF_CONFIG addresses.
        inter_host: The flat algorithm "hierarchical" runs among the host
            leaders, or "auto" (the default: chosen per chunk by the cost model,
            `collectives.hierarchical.INTER_MODEL`).
        timeout_seconds: With the UCX engine, a collective that hears nothing
            from a peer for this long fails with an error naming the peer
            (0: wait forever). Raise it when workers may legitimately stall
            longer between steps (slow input pipelines, long evaluations).
            Defaults to 30.
    """

    algorithm: str = "native"
    by_size: Tuple[Tuple[float, float, str], ...] = ()
    bytes_per_pack: int = 0
    candidates: Tuple[str, ...] = ()
    calibrate: bool = True
    refine: bool = True
    calibration_cache: Optional[str] = "~/.cache/tfdist_ext/calibration.json"
    hosts: Optional[Tuple] = None
    inter_host: str = "auto"
    timeout_seconds: float = 30.0

    def __post_init__(self):
        if not self.by_size:
            _check_algorithm(self.algorithm)
        positive_int("bytes_per_pack", self.bytes_per_pack, minimum=0)
        object.__setattr__(self, "candidates", tuple(self.candidates))
        for name in self.candidates:
            if name == "auto":
                raise ValueError("Argument `candidates` lists the algorithms 'auto' chooses "
                                 "from; it cannot contain 'auto' itself.")
            _check_algorithm(name, "candidates")
        seconds("timeout_seconds", self.timeout_seconds)
        if self.hosts is not None:
            if isinstance(self.hosts, (str, bytes)) or not hasattr(self.hosts, "__len__") \
                    or not self.hosts:
                raise ValueError(
                    f"Argument `hosts` must list the host of every worker, e.g. (0, 0, 1, 1) "
                    f"for two hosts of two workers; received {self.hosts!r}.")
            object.__setattr__(self, "hosts", tuple(self.hosts))
        if self.inter_host in ("native", "hierarchical") or \
                self.inter_host not in available_algorithms():
            flat = [n for n in available_algorithms() if n not in ("native", "hierarchical")]
            raise ValueError(
                f"Argument `inter_host` must name a flat algorithm for the host leaders: "
                f"{', '.join(map(repr, flat))}; received {self.inter_host!r}.")
        for flag in ("calibrate", "refine"):
            boolean(flag, getattr(self, flag))

    def algorithm_for(self, num_bytes: int) -> str:
        """The algorithm that reduces a buffer of `num_bytes`."""
        for lo, hi, name in self.by_size:
            if lo <= num_bytes < hi:
                return name
        return self.algorithm

    @property
    def algorithms(self) -> Tuple[str, ...]:
        """Every algorithm this configuration may use."""
        return tuple(sorted({r[2] for r in self.by_size})) or (self.algorithm,)


def get(identifier) -> AllReduce:
    """An `AllReduce` from a name, dict, size-range dict, instance or None."""
    if identifier is None:
        return AllReduce()
    if isinstance(identifier, AllReduce):
        return identifier
    if isinstance(identifier, str):
        return AllReduce(algorithm=identifier)
    if isinstance(identifier, dict):
        if "name" in identifier:
            kwargs = dict(identifier)
            allowed = {f.name for f in dataclasses.fields(AllReduce)} - {"algorithm"}
            name = kwargs.pop("name")
            unknown = sorted(set(kwargs) - allowed)
            if unknown:
                raise ValueError(f"Argument `allreduce` got unknown option(s) {unknown}. "
                                 f"Allowed: ['name', {', '.join(map(repr, sorted(allowed)))}].")
            return AllReduce(algorithm=name, **kwargs)
        if not identifier:
            raise ValueError("Argument `allreduce` got an empty dict; give a name or "
                             "size ranges like {'<64KB': 'butterfly', '>=64KB': 'ring'}.")
        return AllReduce(by_size=_parse_ranges(identifier))
    raise TypeError(
        f"Argument `allreduce` must be a name, a dict or an AllReduce; received "
        f"{identifier!r} of type {type(identifier).__name__}. Valid names: "
        f"{', '.join(repr(n) for n in available_algorithms())}.")
