"""Adaptive compression: per bucket, the fastest candidate whose error is small enough."""

import dataclasses
import math
import numbers
import statistics

import numpy as np
import tensorflow as tf

from tfdist_ext.compression import transport
from tfdist_ext.compression.base import COMPRESSORS, Compressor, check_int
from tfdist_ext.compression.payload import NoCompression, PayloadCompressor

# Steps of a few ms jitter by more than 30% on a busy host; such changes are not
# worth a probe.
MIN_DRIFT_SECONDS = 0.002
DEFAULT_CANDIDATES = ("none", "bf16", {"name": "powersgd", "rank": 4},
                      {"name": "powersgd", "rank": 2}, {"name": "topk", "ratio": 0.01})


@COMPRESSORS.register("adaptive")
@dataclasses.dataclass(frozen=True)
class Adaptive(Compressor):
    """Chooses each bucket's compressor from measured step times and errors.

    The idea is from Determined AI's "Distributed Deep Learning That Actually
    Works": compression should be on only when communication, not compute,
    bounds the step, and only as strong as the gradients tolerate. Every
    bucket's hook is a `tf.switch_case` over the `candidates` (all traced
    once; a per-bucket choice variable selects one per step), and the
    controller `tfdist_ext.keras.AdaptiveCompression`, which `fit` adds by
    itself, sets the choices:

    1. Probe: after `warmup_steps` dense steps, every candidate in turn
       reduces every bucket for `probe_steps` steps (plus one unmeasured).
       The chief records each bucket's reduction time (compression
       included), relative error ||r'|| / ||g + r|| (r: the residual
       before, r': after; 0 for "none") and lag ||r'|| / ||g||: the
       gradient the residual holds back, in steps of gradient.
    2. Decide: per bucket, among candidates with median error <= `max_error`
       and largest lag <= `max_lag`, the fastest (by its fastest probe step:
       noise only adds time); a candidate listed earlier (less compression)
       wins if it is within `tolerance` of the fastest. The chief's
       decisions are broadcast, so every worker reduces alike, and logged
       (each candidate's ms, error and lag).
    3. Watch: the median step time of every `check_every` steps is compared
       with the one right after the decision; a change by more than `drift`
       (a slower or faster link, a straggler) in two checks in a row starts
       a new probe, as does every `reprobe_steps` steps when set.

    All candidates share one error-feedback residual per bucket, so nothing
    dropped by one candidate is lost when another takes over (a dense
    candidate sends the residual and empties it). Candidates with an
    `error_feedback` option run with it on; their other state (PowerSGD's Q)
    is kept per candidate. Works with `sync="sync"` only: the other policies'
    steps do not time a gradient all-reduce.

    The error measures speed's price per step; the lag measures harm: what
    error feedback holds back is applied late, like a stale gradient, and
    with SGD momentum late gradients add to the momentum (Mitliagkas et al.,
    "Asynchrony begets momentum", 2016). A residual that keeps growing over
    the probe (sparse candidates such as top-k 1%; PowerSGD's settles)
    belongs to a compressor that falls ever further behind the gradient.

    Tuning: order `candidates` from least to most compression. Raise
    `max_error` or `max_lag` to let stronger compression through (error
    feedback makes PowerSGD and top-k converge with per-step errors near 1;
    measured errors and lags in docs/guide/sync.md#safe-defaults and
    docs/results.md#adaptive-compression), lower them to keep to
    near-lossless choices. Longer `probe_steps` give steadier timings on a
    noisy machine (and larger lags for growing residuals); each probe costs
    len(candidates) * (probe_steps + 1) steps, some with slow candidates.

    Args:
        candidates: Compressor names, dicts or instances; defaults to none,
            bf16, PowerSGD rank 4 and 2, top-k 1%. No DGC momentum correction,
            no nested "adaptive".
        max_error: Largest median relative error a candidate may have on a
            bucket, a number > 0. Defaults to 0.95.
        max_lag: Largest lag (residual / gradient norm) a candidate may
            reach on a bucket during its probe, a number > 0. Defaults to 2:
            the staleness that stale-synchronous training's defaults apply.
        probe_steps: Measured steps per candidate and probe, >= 1. Defaults to 5.
        check_every: Steps between drift checks, >= 1. Defaults to 50. A
            lasting change is acted on 2 * check_every steps after it began.
        drift: Relative change of the median step time that starts a new
            probe (if also above `MIN_DRIFT_SECONDS` in two checks in a
            row), > 0. Defaults to 0.3.
        reprobe_steps: Probe again after this many steps (0: only on drift).
        tolerance: Relative slack in favour of less compression, >= 0.
            Defaults to 0.05.
        warmup_steps: Dense steps before the first probe. Defaults to 0.
    """

    candidates: tuple = DEFAULT_CANDIDATES
    max_error: float = 0.95
    max_lag: float = 2.0
    probe_steps: int = 5
    check_every: int = 50
    drift: float = 0.3
    reprobe_steps: int = 0
    tolerance: float = 0.05
    warmup_steps: int = 0

    error_feedback = True

    def __post_init__(self):
        super().__post_init__()
        owner = type(self).__name__
        object.__setattr__(self, "candidates", _candidates(self.candidates))
        _check_positive(owner, "max_error", self.max_error)
        _check_positive(owner, "max_lag", self.max_lag)
        _check_positive(owner, "drift", self.drift)
        _check_positive(owner, "tolerance", self.tolerance, allow_zero=True)
        check_int(owner, "probe_steps", self.probe_steps, minimum=1)
        check_int(owner, "check_every", self.check_every, minimum=1)
        check_int(owner, "reprobe_steps", self.reprobe_steps, minimum=0)

    def candidate_names(self):
        """A short label per candidate ("none", "powersgd(rank=2)", ...)."""
        return [_label(c) for c in self.candidates]

    def reduce(self, bucket, comm, state):
        """The chosen candidate's reduction of this bucket, timed, with its error."""
        flat, replica, key = bucket.flat, bucket.replica, bucket.key
        n, dtype = flat.shape.num_elements(), flat.dtype
        # [candidate index, 1 while the controller measures errors, else 0]
        setting = state.buffer(f"{key}_adaptive_choice", replica, 2, tf.int32).read_value()
        measured = state.buffer(f"{key}_adaptive_stats", replica, 3, tf.float64)
        residual = state.residual(key, replica, n, dtype)
        measuring = setting[1] > 0
        zero = tf.constant(0.0, tf.float64)
        before = tf.cond(measuring, lambda: _norm(flat + residual.read_value()), lambda: zero)
        fresh = tf.cond(measuring, lambda: _norm(flat), lambda: zero)
        comms = [comm.fork() for _ in self.candidates]
        branches = [_timed(_branch(c, i, bucket, comms[i], state, residual), flat)
                    for i, c in enumerate(self.candidates)]
        index = tf.clip_by_value(setting[0], 0, len(branches) - 1)
        result, seconds = tf.switch_case(index, branches)
        comm.count(tf.gather(tf.constant([c.bytes_sent for c in comms], tf.int64), index))
        with tf.control_dependencies([result]):
            after = tf.cond(measuring, lambda: _norm(residual.read_value()), lambda: zero)
            update = measured.assign(tf.stack([seconds, after / (before + 1e-30),
                                               after / (fresh + 1e-30)]))
        with tf.control_dependencies([update]):
            return tf.identity(result)


def choose(seconds, errors, max_error, tolerance, lags=None, max_lag=math.inf):
    """Per bucket, the index of the candidate to use (a pure function).

    Args:
        seconds: seconds[c][b], candidate c's reduction time of bucket b (the
            controller passes the fastest of its probe steps).
        errors: errors[c][b], its median relative error there.
        max_error: Candidates above it on a bucket are not considered there
            (if every candidate is, the least erroneous one is used).
        tolerance: The first-listed candidate within (1 + tolerance) x the
            fastest allowed one wins.
        lags: lags[c][b], the largest residual it left, in steps of gradient
            (||residual|| / ||gradient||); None: not considered.
        max_lag: Candidates above it on a bucket are not considered there.

    Returns:
        A list of candidate indices, one per bucket.
    """
    choices = []
    for b in range(len(seconds[0]) if seconds else 0):
        allowed = [c for c in range(len(seconds)) if errors[c][b] <= max_error
                   and (lags is None or lags[c][b] <= max_lag)]
        if not allowed:
            allowed = [min(range(len(seconds)), key=lambda c: errors[c][b])]
        fastest = min(seconds[c][b] for c in allowed)
        choices.append(next(c for c in allowed if seconds[c][b] <= fastest * (1 + tolerance)))
    return choices


def drifted(recent, baseline, drift):
    """Whether the median of `recent` step times differs from `baseline` by more
    than the fraction `drift` and by more than `MIN_DRIFT_SECONDS`."""
    if not recent or baseline <= 0:
        return False
    change = abs(statistics.median(recent) - baseline)
    return change > drift * baseline and change > MIN_DRIFT_SECONDS


class _CandidateState:
    """The strategy state as candidate `tag` sees it: the bucket's residual is
    shared, every other buffer of the bucket is the candidate's own."""

    def __init__(self, state, key, tag):
        self._state, self._key, self._tag = state, key, tag

    def residual(self, key, replica, num_elements, dtype):
        return self.buffer(key, replica, num_elements, dtype)

    def buffer(self, key, replica, num_elements, dtype, initial=None):
        if key != self._key:
            key = f"{self._key}_{self._tag}{key[len(self._key):]}"
        return self._state.buffer(key, replica, num_elements, dtype, initial)


def _timed(reduce, flat):
    """`reduce` as a branch that also returns its wall-clock seconds.

    The timestamps live inside the branch: in the step's own graph, TF chains
    every stateful op that has no resource input (a timestamp) in program
    order, which would make replica 1's reduction wait for replica 0's.
    """

    def run():
        with tf.control_dependencies([flat]):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            result = reduce()
        with tf.control_dependencies([result]):
            return result, tf.timestamp() - start

    return run


def _norm(tensor):
    return tf.norm(tf.cast(tensor, tf.float64))


def _branch(candidate, index, bucket, comm, state, residual):
    """The switch_case branch that reduces `bucket` with `candidate`."""
    view = _CandidateState(state, bucket.key, f"c{index}")
    if candidate.error_feedback:  # reads and writes the shared residual itself
        return lambda: candidate.reduce(bucket, comm, view)

    def run():
        # No error feedback of its own: send the corrected gradient, keep what it lost.
        corrected = bucket.flat + residual.read_value()
        given = dataclasses.replace(bucket, flat=corrected)
        result = candidate.reduce(given, comm, view)
        if isinstance(candidate, NoCompression):
            lost = tf.zeros_like(corrected)
        else:
            seed = transport.buffer_seed(candidate, bucket.key, bucket.step, comm.rank)
            n = corrected.shape.num_elements()
            sent = candidate.decompress(candidate.compress(corrected, seed), n, corrected.dtype,
                                        seed=seed)
            lost = corrected - sent
        with tf.control_dependencies([residual.assign(lost)]):
            return tf.identity(result)

    return run


def _candidates(values):
    if isinstance(values, (str, dict, Compressor)) or not isinstance(values, (tuple, list)):
        values = (values,)
    if not values:
        raise ValueError("Argument `candidates` of Adaptive must list at least one compressor; "
                         "received an empty list. E.g. candidates=('none', 'bf16', 'powersgd').")
    out = []
    for value in values:
        candidate = COMPRESSORS.get(value)
        if isinstance(candidate, Adaptive):
            raise ValueError("Argument `candidates` of Adaptive cannot contain 'adaptive'; "
                             f"received {value!r}. List the compressors to choose among.")
        if candidate.momentum:
            raise ValueError(
                f"Argument `candidates` of Adaptive cannot contain DGC momentum correction "
                f"(received {value!r} with momentum={candidate.momentum}): the candidates "
                "share one residual and no velocity. Use momentum=0 and the optimizer's "
                "momentum.")
        if candidate.warmup_steps:
            candidate = dataclasses.replace(candidate, warmup_steps=0)
        if "error_feedback" in {f.name for f in dataclasses.fields(candidate)}:
            candidate = dataclasses.replace(candidate, error_feedback=True)
        elif not isinstance(candidate, PayloadCompressor):
            raise ValueError(
                f"Argument `candidates` of Adaptive takes payload compressors or compressors "
                f"with an `error_feedback` option; received {value!r} "
                f"({type(candidate).__name__}).")
        out.append(candidate)
    return tuple(out)


def _label(candidate):
    name = getattr(candidate, "name", type(candidate).__name__)
    options = [f"{f.name}={getattr(candidate, f.name)!r}" for f in dataclasses.fields(candidate)
               if f.name not in ("error_feedback", "warmup_steps")
               and getattr(candidate, f.name) != f.default]
    return f"{name}({', '.join(options)})" if options else name


def _check_positive(owner, arg, value, allow_zero=False):
    ok = (not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Real)
          and math.isfinite(value) and (value >= 0 if allow_zero else value > 0))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"Argument `{arg}` of {owner} must be a finite number {bound}; "
                         f"received {value!r}.")
