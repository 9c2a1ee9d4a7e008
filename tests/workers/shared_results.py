"""Worker program for tests/collectives/test_engine_workers.py: shared-memory results.

    tfdist-run -np 2 python shared_results.py OUT_DIR

A UCX engine with room for two 2 MB results in shared memory
(`shared_output_bytes`): results that fit are held there (the bytes some rank
holds are recorded after each step), a third falls back to each rank's own
tensor, freed room is used again, and an op that consumes a shared result
inside a tf.function on worker 1 does not change worker 0's. Every result is
checked against numpy, and so are reduce-scatters through shared memory (2 MB)
and the ring (4 KB). Writes OUT_DIR/w<index>.json.
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import tfdist_ext
from tfdist_ext.collectives import ucx_engine

N = 1 << 19  # float32 elements: 2 MB
RESULT = N * 4


def main(out_dir):
    strategy = tfdist_ext.Strategy(engine="ucx")
    rank, world = strategy.cluster.task_index, strategy.num_replicas_in_sync
    engine = ucx_engine.UcxEngine("shared-results", ["/cpu:0"], world, rank,
                                  shared_output_bytes=2 * N * 4)

    def inputs(seed):
        return np.random.default_rng(seed * world + rank).normal(size=N).astype("float32")

    def expected(seed):
        return sum(np.random.default_rng(seed * world + r).normal(size=N).astype("float32")
                   for r in range(world))

    def all_reduce(seed):
        return engine.all_reduce(tf.constant(inputs(seed)), 0, "ring")

    def barrier():
        engine.all_reduce(tf.ones([4]), 0, "ring").numpy()

    record = {"on_host": engine.on_host, "held": {}, "wrong": []}

    def check(name, result, seed, factor=1.0):
        if not np.allclose(result.numpy(), factor * expected(seed), rtol=1e-5, atol=1e-5):
            record["wrong"].append(name)

    def held(step, expected):
        # A rank's release can trail its `del` by a few ms on a loaded machine
        # (2 of 24 readings right after the barrier, with two busy loops
        # beside the workers); a room not given back within 3 s still fails.
        # The ranks decide together whether to read again.
        for _ in range(60):
            barrier()  # every rank has let go of what it freed
            record["held"][step] = engine.shared_result_bytes()
            off = float(record["held"][step] != expected)
            if engine.all_reduce(tf.constant([off] * 4), 0, "ring").numpy()[0] == 0:
                return
            time.sleep(0.05)

    first, second = all_reduce(1), all_reduce(2)
    held("two_results", 2 * RESULT)
    third = all_reduce(3)
    held("a_third_that_does_not_fit", 2 * RESULT)
    for name, result, seed in (("first", first, 1), ("second", second, 2), ("third", third, 3)):
        check(name, result, seed)
    del first
    held("first_freed", RESULT)
    fourth = all_reduce(4)
    held("a_fourth_in_its_room", 2 * RESULT)
    check("fourth", fourth, 4)
    check("second_again", second, 2)
    del second, third, fourth
    held("all_freed", 0)

    x = tf.constant(inputs(5))
    if rank == 1:
        doubled = tf.function(lambda v: engine.all_reduce(v, 0, "ring") * 2.0)(x)
        check("doubled", doubled, 5, factor=2.0)
    else:
        result = engine.all_reduce(x, 0, "ring")
    barrier()  # worker 1 has doubled its result by now
    if rank != 1:
        check("beside_a_consumer", result, 5)
    # Reduce-scatter: 2 MB sums through shared memory on one host, 4 KB through the ring.
    for seed, size in ((6, N), (7, 1024)):
        mine = engine.reduce_scatter(tf.constant(inputs(seed)[:size]), 0).numpy()
        block = size // world
        want = expected(seed)[:size][rank * block:(rank + 1) * block]
        if mine.shape != want.shape or not np.allclose(mine, want, rtol=1e-5, atol=1e-5):
            record["wrong"].append(f"reduce_scatter_{size}")
    with open(os.path.join(out_dir, f"w{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1])
