"""Worker program for tests/test_netbed.py: emulated hosts (tfdist-run -H HxW).

    python hosts_checks.py OUT_DIR

Records the host layout the strategy discovers from TF_CONFIG's addresses, and the
result and time of a 4 MB all-reduce with "hierarchical" and with "ring" on the UCX
engine (TF's collectives when it is not built), after one untimed call each.
Writes OUT_DIR/w<index>.json.
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
            "SUM", tf.ones([1 << 20]) * tf.cast(strategy.worker_index + 1, tf.float32)))

    reduce()
    start = time.monotonic()
    result = strategy.experimental_local_results(reduce())[0]
    return {"seconds": time.monotonic() - start,
            "sum_min": float(tf.reduce_min(result)), "sum_max": float(tf.reduce_max(result))}


def main(out_dir):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    engine = "ucx" if ucx_ops.problem() is None else "tf"
    results = {"engine": engine}
    for name in ("hierarchical", "ring"):
        strategy = tfdist_ext.Strategy(allreduce=name, engine=engine)
        results[name] = _time_allreduce(strategy)
        results["rank_hosts"] = list(strategy.extended.cross_device_ops.rank_hosts)
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
