"""Worker program for tests/test_netbed.py: the UCX engine's bytes cross the shaped link.

    python shaped_ucx.py OUT_DIR

Times a 4 MB ring all-reduce on the UCX engine (after one untimed call) and
writes the seconds and the UCX_TLS the launcher gave to OUT_DIR/w<index>.json.
"""

import json
import os
import sys
import time

import tensorflow as tf

import tfdist_ext


def main(out_dir):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tfdist_ext.Strategy(engine="ucx", allreduce="ring")

    @tf.function
    def reduce():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            "SUM", tf.ones([1 << 20])))

    reduce()
    start = time.monotonic()
    total = float(strategy.experimental_local_results(reduce())[0][0])
    seconds = time.monotonic() - start
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump({"seconds": seconds, "sum": total, "ucx_tls": os.environ.get("UCX_TLS")}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
