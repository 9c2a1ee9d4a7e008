"""Accuracy and bytes of sync policies on mnist1d, over several seeds, against synchronous SGD.

    python bench/sync_accuracy.py --workers 2 --seeds 0,1,2 --configs sync,async \
        --json docs/results/sync_accuracy_w2.json

Runs `examples/keras_fit.py` (mnist1d CNN, 20 epochs, global batch 128,
`--optimizer sgd`: momentum 0.9 at 0.03, or `adam`: 3e-3) once per
configuration and seed on `--workers` worker processes (`async` configs with
one parameter server, `tfdist-run --ps 1`), and records worker 0's test
accuracy, its bytes sent and the fit time. Prints mean / min / max accuracy,
the points against `sync` and MB per worker.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "keras_fit.py"
# The example's SGD learning rate is 10 x --lr (momentum 0.9); Adam's is --lr.
RECIPES = {"sgd": ["--optimizer", "sgd", "--lr", "0.003"],
           "adam": ["--optimizer", "adam", "--lr", "0.003"]}
POLICIES = {
    "sync": "sync",
    "async": "async",
    "async_dc": {"name": "async", "delay_compensation": 0.1},
    "local_sgd": {"name": "local_sgd", "period": 4},
    "ssp": {"name": "stale_synchronous", "staleness": 2},
    "dga": {"name": "delayed_averaging", "delay": 2},
    "model_averaging": {"name": "model_averaging", "learners_per_device": 2},
    "gossip": "gossip",
    "gossip_p2": {"name": "gossip", "peers": 2},
    "gossip_slots": {"name": "gossip", "mix_slots": True},
    # Exact averaging every step with per-replica optimizer state (and with averaged slots):
    "lsgd1": {"name": "local_sgd", "period": 1, "average_slots": False},
    "lsgd1_slots": {"name": "local_sgd", "period": 1},
    "diloco": {"name": "diloco", "period": 8},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--configs", default="sync,async")
    parser.add_argument("--optimizer", default="sgd", choices=sorted(RECIPES))
    parser.add_argument("--momentum", default=None, help="SGD momentum (example: 0.9)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def run(config, seed, args, out_dir):
    path = pathlib.Path(out_dir) / f"{config}_{seed}_{{worker}}.json"
    policy = POLICIES[config]
    servers = ["--ps", "1"] if "async" in json.dumps(policy) else []
    recipe = RECIPES[args.optimizer] + (["--momentum", args.momentum] if args.momentum else [])
    command = [sys.executable, "-m", "tfdist_ext.launch", "-np", str(args.workers), *servers,
               "--timeout", str(args.timeout), sys.executable, str(EXAMPLE), *recipe,
               "--sync", policy if isinstance(policy, str) else json.dumps(policy),
               "--epochs", str(args.epochs), "--seed", str(seed), "--verbose", "0",
               "--json", str(path)]
    subprocess.run(command, cwd=ROOT, check=True)
    result = json.loads(pathlib.Path(str(path).format(worker=0)).read_text())
    return {"config": config, "seed": seed, "accuracy": result["test_accuracy"],
            "mb_sent": result["communication"]["bytes_sent"] / 1e6,
            "fit_seconds": result["fit_seconds"],
            "staleness": {k: v for k, v in result["communication"].items()
                          if k.startswith("staleness") or k.startswith("async")}}


def main(argv=None):
    args = parse_args(argv)
    records = []
    with tempfile.TemporaryDirectory() as out_dir:
        for seed in map(int, args.seeds.split(",")):
            for config in args.configs.split(","):
                records.append(run(config, seed, args, out_dir))
                print(json.dumps(records[-1]), flush=True)
    summary = []
    base = np.mean([r["accuracy"] for r in records if r["config"] == "sync"] or [np.nan])
    for config in args.configs.split(","):
        rows = [r for r in records if r["config"] == config]
        accuracy = [r["accuracy"] for r in rows]
        summary.append({"config": config, "accuracy_mean": float(np.mean(accuracy)),
                        "accuracy_runs": accuracy,
                        "points_vs_sync": float(100 * (np.mean(accuracy) - base)),
                        "mb_sent_per_worker": float(np.mean([r["mb_sent"] for r in rows])),
                        "fit_seconds_median": float(np.median([r["fit_seconds"]
                                                               for r in rows]))})
        row = summary[-1]
        print(f"{config:<14} accuracy {row['accuracy_mean']:.3f} "
              f"({', '.join(f'{a:.3f}' for a in accuracy)}) {row['points_vs_sync']:+.1f} "
              f"points, {row['mb_sent_per_worker']:.1f} MB/worker, "
              f"fit {row['fit_seconds_median']:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"args": vars(args), "summary": summary, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
