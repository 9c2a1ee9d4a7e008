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
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  pylint: disable=wrong-import-position  (bench/, above)

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
    "gossip_grads": {"name": "gossip", "mix_gradients": True},
    # Exact averaging every step with per-replica optimizer state (and with averaged slots):
    "lsgd1": {"name": "local_sgd", "period": 1, "average_slots": False},
    "lsgd1_slots": {"name": "local_sgd", "period": 1},
    "lsgd2": {"name": "local_sgd", "period": 2, "average_slots": False},
    "diloco": {"name": "diloco", "period": 8},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--configs", default=None,
                        help="comma-separated POLICIES keys (default sync,async; with "
                             "--records: all configs in the files)")
    parser.add_argument("--optimizer", default="sgd", choices=sorted(RECIPES))
    parser.add_argument("--momentum", default=None, help="SGD momentum (example: 0.9)")
    parser.add_argument("--lr", default=None,
                        help="the example's --lr instead of the recipe's 0.003")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--schedule", default="constant", choices=["constant", "cosine"],
                        help="learning-rate schedule (cosine: decays to 0 over the run)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    harness.add_arguments(parser, png=False)
    parser.add_argument("--records", default=None,
                        help="comma-separated --json files of earlier runs: summarize (and "
                             "plot) their records instead of running")
    parser.add_argument("--plot", default=None, help="PNG of every run's accuracy per config")
    return parser.parse_args(argv)


def recipe(args):
    """The optimizer and schedule of a run, e.g. 'sgd_momentum_0.9' or 'adam, cosine'."""
    args = dict(args)
    name = args["optimizer"] + (f"_momentum_{args['momentum']}" if args.get("momentum") else "")
    name += f"_lr_{args['lr']}" if args.get("lr") else ""
    schedule = args.get("schedule", "constant")
    return name if schedule == "constant" else f"{name}, {schedule}"


def load(paths, configs=None):
    """Records of earlier --json files, each tagged with its recipe; a (recipe, config, seed)
    seen in an earlier file is skipped (runs are deterministic per seed)."""
    records, seen = [], set()
    for path in paths:
        data = json.loads(pathlib.Path(path).read_text())
        for record in data["records"]:
            record = dict(record)
            record.setdefault("optimizer", recipe(data["args"]) if "args" in data else "?")
            key = (record["optimizer"], record["config"], record["seed"])
            if key not in seen and (configs is None or record["config"] in configs):
                seen.add(key)
                records.append(record)
    return records


def run(config, seed, args, out_dir):
    path = pathlib.Path(out_dir) / f"{config}_{seed}_{{worker}}.json"
    policy = POLICIES[config]
    servers = ["--ps", "1"] if "async" in json.dumps(policy) else []
    flags = RECIPES[args.optimizer] + (["--momentum", args.momentum] if args.momentum else [])
    flags += ["--lr", args.lr] if args.lr else []
    command = [sys.executable, "-m", "tfdist_ext.launch", "-np", str(args.workers), *servers,
               "--timeout", str(args.timeout), sys.executable, str(EXAMPLE), *flags,
               "--sync", policy if isinstance(policy, str) else json.dumps(policy),
               "--epochs", str(args.epochs), "--schedule", args.schedule, "--seed", str(seed),
               "--verbose", "0",
               "--json", str(path)]
    subprocess.run(command, cwd=ROOT, check=True)
    result = json.loads(pathlib.Path(str(path).format(worker=0)).read_text())
    return {"config": config, "seed": seed, "accuracy": result["test_accuracy"],
            "mb_sent": result["communication"]["bytes_sent"] / 1e6,
            "fit_seconds": result["fit_seconds"],
            "staleness": {k: v for k, v in result["communication"].items()
                          if k.startswith("staleness") or k.startswith("async")}}


def summarize(records):
    """Per recipe and config: mean accuracy, points against `sync` of the same recipe, and
    the standard error of that difference (runs of one config as independent samples)."""
    summary = []
    for name in dict.fromkeys(r["optimizer"] for r in records):
        group = [r for r in records if r["optimizer"] == name]
        base = [r["accuracy"] for r in group if r["config"] == "sync"]
        for config in dict.fromkeys(r["config"] for r in group):
            rows = [r for r in group if r["config"] == config]
            accuracy = [r["accuracy"] for r in rows]
            row = {"recipe": name, "config": config, "seeds": [r["seed"] for r in rows],
                   "accuracy_mean": float(np.mean(accuracy)), "accuracy_runs": accuracy,
                   "points_vs_sync": float(100 * (np.mean(accuracy) - np.mean(base)))
                   if base else None,
                   "mb_sent_per_worker": float(np.mean([r["mb_sent"] for r in rows]))}
            if len(base) > 1 and len(accuracy) > 1:
                row["points_standard_error"] = float(100 * np.sqrt(
                    np.var(accuracy, ddof=1) / len(accuracy) + np.var(base, ddof=1) / len(base)))
            if all("fit_seconds" in r for r in rows):
                row["fit_seconds_median"] = float(np.median([r["fit_seconds"] for r in rows]))
            summary.append(row)
            versus = ("" if row["points_vs_sync"] is None else
                      f" {row['points_vs_sync']:+.1f} points"
                      + (f" (+-{row['points_standard_error']:.1f})"
                         if "points_standard_error" in row else ""))
            print(f"{name:<22} {config:<13} accuracy {row['accuracy_mean']:.3f} over "
                  f"{len(rows)} seeds ({', '.join(f'{a:.3f}' for a in accuracy)}){versus}, "
                  f"{row['mb_sent_per_worker']:.1f} MB/worker")
    return summary


def plot(records, path, title):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    names = list(dict.fromkeys(r["optimizer"] for r in records))
    groups = [(n, c) for n in names for c in sorted(
        {r["config"] for r in records if r["optimizer"] == n}, key=lambda c: (c != "sync", c))]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(groups)), 4.5))
    labelled = set()
    for i, (name, config) in enumerate(groups):
        accuracy = [r["accuracy"] for r in records
                    if r["optimizer"] == name and r["config"] == config]
        ax.scatter([i] * len(accuracy), accuracy, s=14, alpha=0.7,
                   color=f"C{names.index(name)}", label=None if name in labelled else name)
        labelled.add(name)
        ax.hlines(np.mean(accuracy), i - 0.3, i + 0.3, color="black")
    ax.set_xticks(range(len(groups)), [c for _, c in groups], rotation=45, ha="right",
                  fontsize=8)
    ax.legend(fontsize=8)
    ax.set_ylabel("test accuracy (dots: seeds, bar: mean)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    configs = args.configs.split(",") if args.configs else None
    if args.records:
        records = load(args.records.split(","), configs)
    else:
        records = []
        with tempfile.TemporaryDirectory() as out_dir:
            for seed in map(int, args.seeds.split(",")):
                for config in configs or ["sync", "async"]:
                    records.append(dict(run(config, seed, args, out_dir),
                                        optimizer=recipe(vars(args))))
                    print(json.dumps(records[-1]), flush=True)
    summary = summarize(records)
    harness.write({"args": vars(args), "summary": summary, "records": records},
                  args.json, args.plot,
                  plot=lambda path: plot(records, path, f"mnist1d CNN, {args.workers} workers"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
