"""A refinement the model cannot decide, shared by the in-process and worker tests.

`tie_refiner` gives "auto" a calibration that models three candidates as
equally fast, so every buffer size must be timed; `reduce_sizes` then sums
float32 buffers of `SIZES` (two of them in one size class) in replica context.
"""

import numpy as np
import tensorflow as tf

from tfdist_ext.collectives import auto, refine

NAMES = ("butterfly", "native", "ring")
SIZES = (1000, 1001, 300_000)  # elements: 4000 B and 4004 B share a half-octave
ONE_BUFFER_PER_TENSOR = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1)


def tie_refiner(strategy, cache_path=None, **kwargs):
    """Installs (and returns) a `Refiner` whose model ties NAMES at every size."""
    cross_ops = strategy.extended.cross_device_ops
    tie = (1e-3, 2e-3, 4e-3)
    calibration = auto.Calibration(
        strategy.calibration.cluster_key, strategy.num_replicas_in_sync, 1e-4, 1e-9, 1e-10,
        lines=tuple((name, 1e-3, 1e-9) for name in NAMES),
        points=tuple((name, tie) for name in NAMES))
    cross_ops.choice.calibration = calibration
    cross_ops.choice.refiner = refine.Refiner(cross_ops, calibration, NAMES,
                                              cache_path=cache_path, **kwargs)
    return cross_ops.choice.refiner


def reduce_sizes(strategy):
    """Each replica r sends r + 1 everywhere; returns (sums of replica 0, graph op names)."""
    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        value = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        return ctx.all_reduce("SUM", [tf.fill([n], value) for n in SIZES],
                              options=ONE_BUFFER_PER_TENSOR)

    fn = tf.function(lambda: strategy.run(replica_fn))
    sums = [t.numpy() for t in strategy.experimental_local_results(fn())[0]]
    ops = [op.name for op in fn.get_concrete_function().graph.get_operations()]
    return sums, ops


def problems(strategy, sums, ops):
    """What is wrong with a `reduce_sizes` result and the strategy's refinements."""
    world = strategy.num_replicas_in_sync
    found = []
    for n, s in zip(SIZES, sums):
        if s.shape != (n,) or not np.all(s == world * (world + 1) / 2):
            found.append(f"size {n}: wrong sum {s[:3]}")
    decisions = strategy.allreduce_refinements
    classes = sorted({auto.size_class(4 * n) for n in SIZES})
    if [auto.size_class(d["bytes"]) for d in decisions] != classes:
        found.append(f"refined sizes {[d['bytes'] for d in decisions]}, not one per class")
    for d in decisions:
        if tuple(d["candidates"]) != NAMES:
            found.append(f"candidates {d['candidates']}")
        if d["source"] == "timed" and d["choice"] != min(d["ms"], key=d["ms"].get):
            found.append(f"{d['bytes']} B: chose {d['choice']}, not the fastest of {d['ms']}")
        if not any(f"tfdist/{d['choice']}/" in op for op in ops):
            found.append(f"{d['bytes']} B: no op runs {d['choice']}")
    return found
