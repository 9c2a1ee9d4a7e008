"""Fixed-seed gradient reductions through every compressor (a regression record).

    python tests/compression/golden.py tests/compression/golden.json

`scenarios()` lists strategy configurations; `run(kwargs)` reduces four steps
of fixed gradients (two dtypes, so two fused buffers) over 3 logical replicas
and returns every replica's result per step, the byte counters after each step
and the residuals; `digest` reduces each array to its dtype, shape and the
first 20 hex digits of the SHA-256 of its bytes. golden.json was written by the code before compression
moved to reduction hooks; test_golden.py checks that the current code
reproduces it bit for bit.
"""

import hashlib
import json
import sys

import numpy as np
import tensorflow as tf

import tfdist_ext
from tfdist_ext import compression

WORLD = 3
STEPS = 4
SHAPES = [((40, 25), "float32"), ((300,), "float32"), ((3, 3, 4, 5), "float32"),
          ((64,), "float64")]


def scenarios():
    """name -> Strategy keyword arguments."""
    out = {}
    for name in compression.COMPRESSORS.names():
        if name in ("powersgd", "adaptive"):  # newer than the record
            continue
        out[name] = {"compression": name, "allreduce": "ring"}
    out["topk_momentum_warmup"] = {
        "compression": {"name": "topk", "ratio": 0.05, "momentum": 0.9, "warmup_steps": 2},
        "allreduce": "butterfly"}
    out["qsgd_warmup_native"] = {"compression": {"name": "qsgd", "warmup_steps": 1},
                                 "allreduce": "native"}
    out["randomk_tree"] = {"compression": {"name": "randomk", "ratio": 0.1},
                           "allreduce": "tree"}
    out["fp16_buckets"] = {"compression": "fp16", "allreduce": "ring",
                           "bucketing": "wfbp"}
    return out


def gradients(step, replica):
    rng = np.random.default_rng(1000 * step + replica)
    return [(rng.normal(size=shape) * (replica + 1)).astype(dtype) for shape, dtype in SHAPES]


def run(kwargs):
    # The record was written when logical replicas ran the schedules over UCX;
    # the graph engine runs the same schedules (same summation order), while
    # the UCX engine now sums logical replicas in process (another order).
    strategy = tfdist_ext.Strategy(num_replicas=WORLD, **{"engine": "tf", **kwargs})

    @tf.function
    def reduce(per_replica):
        return strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce("SUM", v),
            args=(per_replica,))

    record = {}
    for step in range(STEPS):
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx, s=step: [tf.constant(g) for g in gradients(s, ctx.replica_id_in_sync_group)])
        out = reduce(values)
        for i, o in enumerate(out):
            for r, t in enumerate(strategy.experimental_local_results(o)):
                record[f"step{step}_t{i}_r{r}"] = t.numpy()
        stats = strategy.state.stats()
        record[f"step{step}_bytes"] = np.array([stats["bytes_sent"], stats["dense_bytes"]])
    for key, variables in sorted(strategy.state.residuals.items()):
        for r, v in enumerate(variables):
            record[f"residual_{key}_r{r}"] = v.numpy()
    return record


def digest(array):
    """'dtype shape sha256' of an array (byte counters: their values instead)."""
    array = np.ascontiguousarray(array)
    if array.dtype.kind == "i":
        return f"{array.dtype} {list(array.shape)} {array.tolist()}"
    return f"{array.dtype} {list(array.shape)} {hashlib.sha256(array.tobytes()).hexdigest()[:20]}"


def main(path):
    record = {name: {key: digest(value) for key, value in sorted(run(kwargs).items())}
              for name, kwargs in scenarios().items()}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=0, sort_keys=True)
    print(f"wrote {sum(map(len, record.values()))} digests to {path}")


if __name__ == "__main__":
    main(sys.argv[1])
