"""Worker program for tests/test_netbed.py: collectives across links with emulated delay.

    python latency_checks.py OUT_DIR

Times one small all-reduce (after an untimed one) on the UCX engine when it is
built and on TF's collectives, and writes the seconds and the sums to
OUT_DIR/w<index>.json. With a one-way delay D between workers, each takes at least
2 D: a ring all-reduce on 2 workers sends one message each way per phase.
"""

import json
import os
import sys
import time

import tensorflow as tf

import tfdist_ext
from tfdist_ext.ops import ucx as ucx_ops


def _time_allreduce(strategy):
    @tf.function
    def reduce():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            "SUM", tf.ones([1024])))

    reduce()
    start = time.monotonic()
    total = float(strategy.experimental_local_results(reduce())[0][0])
    return {"seconds": time.monotonic() - start, "sum": total}


def main(out_dir):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    results = {"tf": _time_allreduce(tfdist_ext.Strategy(allreduce="ring"))}
    if ucx_ops.problem() is None:
        results["ucx"] = _time_allreduce(tfdist_ext.Strategy(engine="ucx", allreduce="ring"))
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
