"""Worker program for tests/compression/test_powersgd.py (under tfdist-run).

    python powersgd_checks.py OUT_DIR

Reduces three steps of fixed gradients (they depend on the worker's rank)
through PowerSGD with several algorithms and engines and writes each step's
fused result to OUT_DIR/w<index>.json.
"""

import json
import os
import sys

import numpy as np

import tfdist_ext
from tests.compression.test_powersgd import SHAPES, fused, reduce_steps

CASES = {"native": {"allreduce": "native"}, "ring": {"allreduce": "ring"},
         "butterfly": {"allreduce": "butterfly"},
         "ring_ucx": {"allreduce": "ring", "engine": "ucx"}}


def main(out_dir):
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    results = {}
    for name, options in CASES.items():
        strategy = tfdist_ext.Strategy(compression="powersgd", **options)
        steps = reduce_steps(strategy, 3)
        results[name] = {
            "steps": [fused([step[i][0] for i in range(len(SHAPES))]).tolist()
                      for step in steps],
            "stats": strategy.communication_stats()}
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
