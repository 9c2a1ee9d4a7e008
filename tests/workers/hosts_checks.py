"""Worker program for tests/test_netbed.py: emulated hosts (tfdist-run -H HxW).

    python hosts_checks.py OUT_DIR

Records the host layout the strategy discovers from TF_CONFIG's addresses, and for a
4 MB all-reduce with "hierarchical" and with "ring" on the UCX engine (TF's
collectives when it is not built): its result, its time and the bytes this worker's
host (network namespace) sent over its link during it. A tiny all-reduce before and
after the call fences it, so the count holds every byte of the call and nothing of
the untimed first call. Writes OUT_DIR/w<index>.json.
"""

import json
import os
import sys
import time

import tensorflow as tf

import tfdist_ext
from tfdist_ext.ops import ucx as ucx_ops


def _sent_bytes():
    """Bytes sent by this network namespace's interfaces other than loopback."""
    with open("/proc/net/dev", encoding="utf-8") as f:
        rows = [line.split(":", 1) for line in f.readlines()[2:]]
    return sum(int(fields.split()[8]) for name, fields in rows if name.strip() != "lo")


def _measure(strategy):
    def run(size):
        @tf.function
        def reduce():
            return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
                "SUM", tf.ones([size]) * tf.cast(strategy.worker_index + 1, tf.float32)))
        return lambda: strategy.experimental_local_results(reduce())[0]

    fence, reduce = run(1), run(1 << 20)
    reduce()
    fence()
    sent = _sent_bytes()
    fence()
    start = time.monotonic()
    result = reduce()
    seconds = time.monotonic() - start
    fence()
    return {"seconds": seconds, "host_sent_bytes": _sent_bytes() - sent,
            "sum_min": float(tf.reduce_min(result)), "sum_max": float(tf.reduce_max(result))}


def main(out_dir):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    engine = "ucx" if ucx_ops.problem() is None else "tf"
    results = {"engine": engine}
    for name in ("hierarchical", "ring"):
        strategy = tfdist_ext.Strategy(allreduce=name, engine=engine)
        results[name] = _measure(strategy)
        results["rank_hosts"] = list(strategy.extended.cross_device_ops.choice.rank_hosts)
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
