"""Start-up calibration of the "auto" cost model on the running cluster.

A short probe (seconds, much of it tracing) measures, on every worker at
once, each candidate algorithm (and TF's native all-reduce) at 1 KB, 1 MB and
4 MB (`auto.PROBE_BYTES`). The candidates take turns and every timed call
starts right after a barrier, so a worker still finishing the previous call
does not bill its lag to the next. Below 1 MB the median of 15 calls is kept:
the minimum favours algorithms with many sequential messages, whose best call
is far below their typical one. From 1 MB, where calls are costly, the
minimum of 7 (load only adds time; a median of so few ranked candidates less
reproducibly). Alpha (per message) and beta (per byte on the busiest link)
are derived from the butterfly and ring lines, gamma from a local add.
The chief's numbers are then broadcast (a native all-reduce in which only rank
0 contributes), so every worker holds the same `Calibration` and makes the
same choices. The chief keeps them in a JSON cache, one entry per cluster key
(hosts, world size, devices, TF version, engine and its transports), so a
figure measured on one engine is never used for the other and alternating
engines re-uses both entries. Whether to probe is itself the chief's decision,
broadcast first: a worker that skipped the probe while others ran it would
leave them waiting.
"""

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import socket
import time
import warnings
import weakref

import numpy as np
import tensorflow as tf

from tfdist_ext.collectives import auto, cost

_BROADCASTS = weakref.WeakKeyDictionary()  # cross_ops -> its traced broadcast

log = logging.getLogger("tfdist_ext")

DEFAULT_CACHE = "~/.cache/tfdist_ext/calibration.json"
_SMALL, _LARGE = auto.PROBE_BYTES[0] // 4, auto.PROBE_BYTES[-1] // 4  # float32 elements


MAX_ENTRIES = 16  # cluster keys kept in one cache file (the oldest written goes first)


def transport_of(engine: str) -> str:
    """What carries an engine's bytes, as far as it changes the figures.

    The TF engine and "native" run over TF's gRPC; the UCX engine over the
    transports UCX_TLS / UCX_NET_DEVICES select (UCX's own choice when unset).
    """
    if engine != "ucx":
        return "grpc"
    return "tls={};dev={}".format(os.environ.get("UCX_TLS", "default"),
                                  os.environ.get("UCX_NET_DEVICES", "default"))


def cluster_key(cluster_spec, world_size: int, devices, engine: str) -> str:
    """A stable name for what the numbers describe: hardware, engine, transport.

    Ports are excluded; the engine ("ucx" or "tf") and its transports
    (`transport_of`) are included, since the same algorithm's figures differ
    by several times between them.
    """
    hosts = sorted(a.rsplit(":", 1)[0] for job in (cluster_spec.jobs.values()
                                                   if cluster_spec else [])
                   for a in job) or [socket.gethostname()]
    kind = sorted({d.split("device:")[-1].split(":")[0] for d in devices})
    text = json.dumps({"hosts": hosts, "world": world_size, "devices": kind,
                       "per_worker": len(devices), "tf": tf.__version__,
                       "engine": engine, "transport": transport_of(engine)})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _entries(path):
    """{cluster key: entry} of the cache at `path` ({} when absent).

    Raises:
        OSError, ValueError, KeyError, TypeError: an unreadable cache.
    """
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if "calibration" in data:  # the one-entry format of earlier versions
        return {data["calibration"]["cluster_key"]: data}
    return dict(data["clusters"])


def read_cache(path, key):
    """The cached `Calibration` for `key`, or None (warning if the file is unreadable)."""
    path = pathlib.Path(os.path.expanduser(path))
    try:
        entry = _entries(path).get(key)
        calibration = auto.Calibration(**entry["calibration"]) if entry else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        warnings.warn(f"Ignoring the unreadable calibration cache {path} ({err}); "
                      "re-calibrating and overwriting it.", stacklevel=2)
        return None
    if calibration is None:
        log.info("tfdist_ext: the calibration cache %s has no entry for this cluster, "
                 "engine and transport (key %s); calibrating.", path, key)
    return calibration


def read_refined(path, key):
    """The cached refined choices for cluster `key` ({size class: algorithm}), or {}."""
    path = pathlib.Path(os.path.expanduser(path))
    try:
        entry = _entries(path)[key]
        return {int(size_class): str(name)
                for size_class, name in entry.get("refined", {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}  # read_cache has warned about it


def write_cache(path, calibration, refined=None):
    """Stores `calibration` and its refined choices ({size class: algorithm}) under its
    key, keeping the other keys' entries (at most `MAX_ENTRIES`)."""
    path = pathlib.Path(os.path.expanduser(path))
    try:
        entries = _entries(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        entries = {}  # unreadable: read_cache has warned; overwritten
    entries[calibration.cluster_key] = {
        "calibration": calibration.__dict__,
        "refined": {str(k): v for k, v in (refined or {}).items()},
        "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    newest = sorted(entries, key=lambda k: entries[k].get("written", ""))[-MAX_ENTRIES:]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"clusters": {k: entries[k] for k in newest}}, indent=1))
        tmp.replace(path)
    except OSError as err:
        warnings.warn(f"Could not write the calibration cache {path}: {err}.", stacklevel=2)


@contextlib.contextmanager
def _quiet_retracing():
    """The probe builds one tf.function per measurement on purpose; TF warns about it."""
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _per_call_seconds(fn, repeats):
    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def barrier_fn(cross_ops):
    """A callable that returns once every worker has called it (None in one process).

    A one-element native all-reduce: timing a collective right after it
    measures the collective, not how late the other workers arrived.
    """
    if cross_ops.single_process:
        return None
    return all_reduce_fn(cross_ops, auto.NATIVE, 1, steps=1)


def _local_add_seconds(device, num_elements, steps, repeats):
    @tf.function(autograph=False)
    def run():
        with tf.device(device):
            x = tf.fill([num_elements], 1.0)
            y = tf.fill([num_elements], 2.0)
            for _ in range(steps):
                x = x + y
            return x[:1]

    return float(np.median(_per_call_seconds(run, repeats))) / steps


def all_reduce_fn(cross_ops, algorithm, num_elements, steps=4, dtype=tf.float32, engine=None):
    """A tf.function running `steps` chained all-reduces on every local replica.

    Args:
        cross_ops: The strategy's `CrossDeviceOps`.
        algorithm: "native" or a graph-engine algorithm name.
        engine: The `GraphEngine` to build with; defaults to the strategy's.
    """
    devices = cross_ops.devices
    if algorithm == auto.NATIVE:
        reduce_fn = cross_ops.native_sum
    else:
        engine = engine or cross_ops.engines.main()
        spec = cross_ops.choice.spec(algorithm)
        reduce_fn = lambda x, i: engine.all_reduce(x, i, spec)  # noqa: E731

    inputs = []
    for device in devices:  # made once: each call then times the reductions, not the fill
        with tf.device(device):
            inputs.append(tf.ones([num_elements], dtype))

    @tf.function(autograph=False)
    def run():
        xs = inputs
        for _ in range(steps):
            xs = [reduce_fn(x, i) for i, x in enumerate(xs)]
        return [x[:1] for x in xs]

    return run


def time_interleaved(fns, repeats, barrier=None, steps=1):
    """Seconds per step of each function, `repeats` calls each, taking turns.

    Each round starts one function later than the round before, so that no
    function always runs right after the same other one (a slow neighbour's
    after-effects, e.g. buffers still in flight or caches it evicted, then hit
    every function alike).

    Args:
        fns: name -> zero-argument callable (e.g. from `all_reduce_fn`); every
            worker must pass the same names in the same order.
        repeats: Timed calls per function (after one untimed warm-up call).
        barrier: From `barrier_fn`; called before every timed call.
        steps: Steps each call runs (the times are divided by it).

    Returns:
        name -> list of `repeats` seconds.
    """
    for fn in fns.values():  # trace and warm up, in the same order everywhere
        fn()
    times = {name: [] for name in fns}
    names = list(fns)
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            if barrier is not None:
                barrier()
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) / steps)
    return times


def time_candidates(cross_ops, names, num_bytes, calls, steps, barrier=None,
                    statistic=np.median, engine=None):
    """Seconds per all-reduce of each of `names` on a float32 buffer of `num_bytes`.

    Each candidate makes `calls` timed calls of `steps` chained all-reduces;
    the candidates take turns (interleaved, each timed call right after
    `barrier`), so that load on this machine hits them alike, and `statistic`
    (of the per-step seconds) is kept. Every worker must call it with the same
    arguments; each gets its own times. `engine` as in `all_reduce_fn`.
    """
    with _quiet_retracing():
        fns = {name: all_reduce_fn(cross_ops, name, max(num_bytes // 4, 1), steps,
                                   engine=engine)
               for name in names}
        times = time_interleaved(fns, calls, barrier, steps)
    return {name: float(statistic(times[name])) for name in names}


def measure(cross_ops, candidates, repeats=7):
    """Runs the probe on every local replica (`time_candidates` at each probe size).

    Below 1 MB, 8 all-reduces per call and the median of 2 * repeats + 1
    calls; from 1 MB, 2 per call and the minimum of `repeats`.

    Returns:
        (alpha, beta, gamma, lines, points), as in `auto.Calibration`.
    """
    devices, world = cross_ops.devices, cross_ops.group_size
    barrier = barrier_fn(cross_ops)
    seconds = {name: [] for name in candidates}
    for size in auto.PROBE_BYTES:
        if size < (1 << 20):  # latency-bound: more calls, and their median
            times = time_candidates(cross_ops, candidates, size, 2 * repeats + 1, 8, barrier)
        else:
            times = time_candidates(cross_ops, candidates, size, repeats, 2, barrier, min)
        for name, measured in times.items():
            seconds[name].append(measured)
    points = [(name, tuple(seconds[name])) for name in candidates]
    lines = []
    for name, (small, *_, large) in points:
        slope = max((large - small) / (4 * (_LARGE - _SMALL)), 1e-13)
        lines.append((name, max(small - slope * 4 * _SMALL, 1e-7), slope))
    gamma = _local_add_seconds(devices[0], _LARGE, 5, repeats) / (4 * _LARGE)
    alphas, betas = [], []
    for name, latency, per_byte in lines:
        if name not in ("butterfly", "ring"):
            continue
        small = cost.cached_round_stats(name, world, _SMALL)
        messages = sum(s[0] for s in small)
        link = 4 * sum(s[1] for s in cost.cached_round_stats(name, world, _LARGE))
        reduced = 4 * sum(s[2] for s in cost.cached_round_stats(name, world, _LARGE))
        alphas.append(latency / max(messages, 1))
        betas.append(max((per_byte * 4 * _LARGE - gamma * reduced) / max(link, 1), 1e-13))
    defaults = auto.Calibration.defaults("", world)
    return (float(np.mean(alphas)) if alphas else defaults.alpha,
            float(np.mean(betas)) if betas else defaults.beta, gamma, lines, points)


def broadcast_from_chief(cross_ops, values, first_rank):
    """Every worker gets rank 0's `values` (a list of floats).

    The traced function is kept per `cross_ops` (retraced per length only),
    so repeated calls (a controller checking every few steps) cost one
    collective, not a trace.
    """
    if cross_ops.single_process:
        return list(values)  # one process: nothing to agree on
    run = _BROADCASTS.get(cross_ops)
    if run is None:
        devices = cross_ops.devices
        native = cross_ops.native_sum

        @tf.function(autograph=False)
        def run(given):
            out = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    mine = given * float(first_rank + i == 0)
                out.append(native(mine, i))
            return out[0]

        _BROADCASTS[cross_ops] = run
    return [float(v) for v in run(tf.constant(values, tf.float64)).numpy()]


def calibrate(cross_ops, key, first_rank, candidates, cache_path=DEFAULT_CACHE, probe=True,
              repeats=7) -> auto.Calibration:
    """The cluster's `Calibration`, identical on every worker.

    Args:
        cross_ops: The strategy's `CrossDeviceOps`.
        key: `cluster_key(...)` of this cluster.
        first_rank: Global rank of this worker's first replica (0 is the chief).
        candidates: Algorithm names to probe (sorted; the same on every worker).
        cache_path: JSON cache read and written by the chief; None disables it.
        probe: False skips the probe (cache, else built-in defaults).
        repeats: Timed repetitions per measurement (the minimum is used).
    """
    world = cross_ops.group_size
    candidates = tuple(sorted(candidates))
    cached = read_cache(cache_path, key) if (cache_path and first_rank == 0) else None
    if cached is not None and ({line[0] for line in cached.lines} != set(candidates)
                               or {p[0] for p in cached.points} != set(candidates)):
        cached = None  # probed other candidates, or an older format
    width = 3 + (2 + len(auto.PROBE_BYTES)) * len(candidates)
    have = broadcast_from_chief(cross_ops, [1.0] + _flatten(cached, candidates)
                                if cached else [0.0] * (1 + width), first_rank)
    if have[0]:
        return _unflatten(key, world, have[1:], candidates)
    if not probe:
        return auto.Calibration.defaults(key, world)
    start = time.perf_counter()
    alpha, beta, gamma, lines, points = measure(cross_ops, candidates, repeats)
    mine = auto.Calibration(key, world, alpha, beta, gamma, tuple(lines), tuple(points))
    agreed = broadcast_from_chief(cross_ops, _flatten(mine, candidates), first_rank)
    calibration = _unflatten(key, world, agreed, candidates)
    log.info("tfdist_ext: calibrated all-reduce cost model in %.1f s",
             time.perf_counter() - start)
    if cache_path and first_rank == 0:
        write_cache(cache_path, calibration)
    return calibration


def _flatten(calibration, candidates):
    lines = {line[0]: line[1:] for line in calibration.lines}
    points = dict(calibration.points)
    return [calibration.alpha, calibration.beta, calibration.gamma] + [
        v for name in candidates for v in lines[name] + tuple(points[name])]


def _unflatten(key, world, values, candidates):
    alpha, beta, gamma, rest = values[0], values[1], values[2], values[3:]
    width = 2 + len(auto.PROBE_BYTES)
    rows = [rest[width * i:width * (i + 1)] for i in range(len(candidates))]
    lines = tuple((name, row[0], row[1]) for name, row in zip(candidates, rows))
    points = tuple((name, tuple(row[2:])) for name, row in zip(candidates, rows))
    return auto.Calibration(key, world, alpha, beta, gamma, lines, points)
