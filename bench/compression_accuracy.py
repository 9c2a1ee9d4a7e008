"""Accuracy and bytes of compressed training against dense, over several seeds.

    python bench/compression_accuracy.py --workers 2 --seeds 0,1,2,3,4 \
        --json docs/results/compression_accuracy.json

Runs `examples/keras_fit.py` (mnist1d, 20 epochs, global batch 128; `--model cnn`
or `mlp`) once per configuration and seed on `--workers` worker processes and
records worker 0's test accuracy and the strategy's byte counters. Every configuration trains the
same model on the same data and seeds with SGD and a cosine learning-rate
decay; they differ only in how gradients travel and in where the momentum
lives:

* `dense`: momentum SGD (0.9) at lr 0.1, uncompressed.
* `qsgd`: the same optimizer, QSGD 4-bit (levels 7, buckets of 512, max norm).
* `topk`: the same optimizer, top-k 1% with error feedback.
* `topk_dgc`: top-k 1% with DGC momentum correction (momentum 0.9 and factor
  masking in the compressor) and plain SGD at lr 0.3: masking makes values
  sent every step move as in plain SGD, which needs the larger rate.
* `powersgd`: the same optimizer as dense, PowerSGD rank 2 with error feedback
  (reduce-compatible: two all-reduces per bucket); `powersgd_warmup` the same
  after 155 dense steps (5 epochs of the CNN); `powersgd_r4` rank 4.

Prints a table (mean, min, max accuracy; points against dense; compression
ratio) and writes every run to JSON.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  pylint: disable=wrong-import-position  (bench/, above)

EXAMPLE = ROOT / "examples" / "keras_fit.py"

# name -> example arguments (the example's SGD learning rate is 10 x --lr).
CONFIGS = {
    "dense": ["--lr", "0.01", "--compression", "none"],
    "qsgd": ["--lr", "0.01", "--compression", "qsgd"],
    "topk": ["--lr", "0.01", "--compression", "topk"],
    "topk_dgc": ["--lr", "0.03", "--momentum", "0",
                 "--compression", '{"name": "topk", "momentum": 0.9}'],
    "powersgd": ["--lr", "0.01", "--compression", "powersgd"],
    "powersgd_warmup": ["--lr", "0.01", "--compression",
                        '{"name": "powersgd", "warmup_steps": 155}'],
    "powersgd_r4": ["--lr", "0.01", "--compression", '{"name": "powersgd", "rank": 4}'],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"],
                        help="the example's model: cnn (~26k parameters) or mlp (~1.1M)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run")
    harness.add_arguments(parser, png=False)
    args = parser.parse_args(argv)
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        parser.error(f"argument --configs: unknown {sorted(unknown)}; valid: {list(CONFIGS)}")
    return args


def run_one(config, seed, args, out_dir):
    """Trains once; returns worker 0's JSON record."""
    path = pathlib.Path(out_dir) / f"{config}_s{seed}_w{{worker}}.json"
    command = [sys.executable, "-m", "tfdist_ext.launch", "-np", str(args.workers),
               "--timeout", str(args.timeout), "--", sys.executable, str(EXAMPLE),
               "--verbose", "0", "--optimizer", "sgd", "--schedule", "cosine",
               "--epochs", str(args.epochs), "--model", args.model, "--seed", str(seed),
               "--json", str(path),
               *CONFIGS[config]]
    subprocess.run(command, cwd=ROOT, check=True)
    return json.loads(pathlib.Path(str(path).format(worker=0)).read_text())


def summarize(runs):
    """Per configuration: accuracy mean/min/max, points against dense, compression ratio."""
    rows = {}
    for config in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == config]
        accuracy = [r["test_accuracy"] for r in mine]
        rows[config] = {"runs": len(mine), "accuracy_mean": float(np.mean(accuracy)),
                        "accuracy_min": min(accuracy), "accuracy_max": max(accuracy),
                        "compression_ratio": mine[0]["compression_ratio"]}
    if "dense" in rows:
        for row in rows.values():
            row["points_vs_dense"] = 100 * (row["accuracy_mean"] - rows["dense"]["accuracy_mean"])
    return rows


def main(argv=None):
    args = parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as out_dir:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for config in args.configs.split(","):  # interleaved: drift hits all alike
                record = run_one(config, seed, args, out_dir)
                runs.append({"config": config, "seed": seed, "workers": args.workers,
                             "epochs": args.epochs,
                             "test_accuracy": record["test_accuracy"],
                             "compression_ratio": record["communication"]["compression_ratio"],
                             "bytes_sent": record["communication"]["bytes_sent"],
                             "dense_bytes": record["communication"]["dense_bytes"],
                             "fit_seconds": record["fit_seconds"]})
                print(f"{config:<10} seed {seed}: accuracy {record['test_accuracy']:.4f}, "
                      f"{runs[-1]['compression_ratio']:.1f}x fewer bytes", flush=True)
    rows = summarize(runs)
    print(f"\n{'config':<10} {'runs':>4} {'mean':>7} {'min':>7} {'max':>7} {'vs dense':>9} "
          f"{'bytes':>7}")
    for config, row in rows.items():
        print(f"{config:<10} {row['runs']:>4} {row['accuracy_mean']:7.4f} "
              f"{row['accuracy_min']:7.4f} {row['accuracy_max']:7.4f} "
              f"{row.get('points_vs_dense', float('nan')):+8.2f}p {row['compression_ratio']:6.1f}x")
    harness.write({"summary": rows, "runs": runs}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
