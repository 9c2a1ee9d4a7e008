"""Adaptive compression against dense and every fixed candidate, per step, per link.

    python bench/adaptive.py --links none,1gbit --repeats 2 --epochs 8 \
        --json docs/results/adaptive.json --png docs/results/adaptive.png

For each link (none: plain 127.0.0.1; a rate: the shaped test bed, root),
repeat and config, one `bench/time_to_accuracy.py` launch trains the MLP
(4.4 MB of float32 gradients, Adam) on 2 workers. A launch's steady per-step
time is the median over epochs 2..E of (epoch seconds / steps per epoch),
so an epoch that a stall of this host hits does not move it
("step_ms_mean" keeps the mean over those epochs). Adaptive probes its
candidates during the first epoch, so epoch 1 is reported apart (its cost).
Ratios: adaptive / dense ("sync") and adaptive / the best fixed config, min
and median over repeats; configs are interleaved within each repeat.
"""

import argparse
import json
import math
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # pylint: disable=wrong-import-position
from bench import time_to_accuracy as tta  # pylint: disable=wrong-import-position

CONFIGS = "sync,bf16,powersgd4,powersgd,topk,adaptive"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="none,1gbit", help="comma-separated links")
    parser.add_argument("--configs", default=CONFIGS, help=f"default {CONFIGS}")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8, help=">= 2")
    parser.add_argument("--timeout", type=float, default=900)
    harness.add_arguments(parser, repeats=2)
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be >= 2 (epoch 1 holds the probe)")
    args.link_list = args.links.split(",")
    args.config_list = args.configs.split(",")
    return args


def steps_per_epoch(workers):
    from examples.keras_fit import load_mnist1d  # pylint: disable=import-outside-toplevel
    del workers  # the global batch is fixed
    return math.ceil(len(load_mnist1d()[0]) / tta.GLOBAL_BATCH)


def launch_options(args, link):
    """`bench/time_to_accuracy.py`'s options for one link (its defaults for the rest)."""
    return tta.parse_args(["--workers", str(args.workers), "--link", link, "--models", "mlp",
                           "--epochs", str(args.epochs), "--configs", args.configs,
                           "--timeout", str(args.timeout)])


def run(args):
    rows, steps = [], steps_per_epoch(args.workers)
    with tempfile.TemporaryDirectory(prefix="tfdist_adaptive_") as directory:
        for link in args.link_list:
            launch_args = launch_options(args, link)
            for repeat in range(args.repeats):
                for i, config in enumerate(args.config_list):
                    records = tta.launch(launch_args, "mlp", config, f"{link}-{repeat}-{i}",
                                         directory, check=link != "none" and not rows)
                    first, last = records[0], records[-1]
                    epoch_ms = [1e3 * (b["seconds"] - a["seconds"]) / steps
                                for a, b in zip(records, records[1:])]
                    rows.append({
                        "link": link, "repeat": repeat, "config": config,
                        "step_ms": statistics.median(epoch_ms),
                        "step_ms_mean": 1e3 * (last["seconds"] - first["seconds"])
                        / ((len(records) - 1) * steps),
                        "step_ms_epochs": epoch_ms,
                        "first_epoch_s": first["seconds"],
                        "mb_per_epoch": (last["bytes_sent"] - first["bytes_sent"])
                        / (len(records) - 1) / 1e6,
                        "test_accuracy": last["test_accuracy"],
                        "choices": last.get("choices", [])})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def summarize(rows, configs):
    summary = []
    for link in dict.fromkeys(r["link"] for r in rows):
        per = {c: [r for r in rows if r["link"] == link and r["config"] == c] for c in configs}
        med = {c: statistics.median(r["step_ms"] for r in rs) for c, rs in per.items() if rs}
        fixed = {c: v for c, v in med.items() if c != "adaptive"}
        best = min(fixed, key=fixed.get)
        for config, rs in per.items():
            times = [r["step_ms"] for r in rs]
            summary.append({
                "link": link, "config": config, "step_ms_min": min(times),
                "step_ms_median": med[config], "first_epoch_s": statistics.median(
                    r["first_epoch_s"] for r in rs),
                "mb_per_epoch": statistics.median(r["mb_per_epoch"] for r in rs),
                "test_accuracy": statistics.median(r["test_accuracy"] for r in rs),
                "vs_dense": med[config] / med["sync"] if "sync" in med else None,
                "vs_best_fixed": med[config] / fixed[best], "best_fixed": best,
                "choices": sorted({c for r in rs for c in r["choices"]})})
    return summary


def print_table(summary):
    print(f"{'link':>6} {'config':>10} {'ms/step min':>11} {'median':>7} {'epoch 1 s':>9} "
          f"{'MB/epoch':>9} {'acc':>6} {'/dense':>7} {'/best':>6}  chosen")
    for s in summary:
        print(f"{s['link']:>6} {s['config']:>10} {s['step_ms_min']:11.1f} "
              f"{s['step_ms_median']:7.1f} {s['first_epoch_s']:9.2f} {s['mb_per_epoch']:9.2f} "
              f"{s['test_accuracy']:6.3f} {s['vs_dense']:7.2f} {s['vs_best_fixed']:6.2f}  "
              f"{','.join(s['choices'])}")


def plot(summary, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    links = list(dict.fromkeys(s["link"] for s in summary))
    fig, axes = plt.subplots(1, len(links), figsize=(5 * len(links), 3.6), squeeze=False)
    for ax, link in zip(axes[0], links):
        rows = [s for s in summary if s["link"] == link]
        colors = ["tab:red" if s["config"] == "adaptive" else "tab:blue" for s in rows]
        ax.bar([s["config"] for s in rows], [s["step_ms_median"] for s in rows], color=colors)
        ax.set_title(f"MLP, 2 workers, link {link}")
        ax.set_ylabel("steady ms per step (median)")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    rows = run(args)
    summary = summarize(rows, args.config_list)
    print_table(summary)
    harness.write({"rows": rows, "summary": summary}, args.json, args.png,
                  plot=lambda path: plot(summary, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
