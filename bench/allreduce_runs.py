"""Checks "auto" across several `bench/allreduce.py` runs: one line per cell and run.

    python bench/allreduce_runs.py docs/results/allreduce_w2*.json --limit 1.10

For every (placement, world, size) of every run it prints the model's and the
refined choice, the chosen algorithm's own median against the best fixed
algorithm's (`choice_vs_best`), the re-timed auto row's ratio (`vs_best_fixed`),
the auto row against the chosen algorithm's row (the same graph timed twice:
the run's noise), the bootstrap 95% lower bound of the choice's ratio
(`choice_vs_best_low`, both timings of the choice against the best; runs
written before it was recorded use `choice_vs_best`) and the best algorithm.
The exit status is 1 if any choice is slower than `--limit` times the best by
that bound, so a set of runs either meets the target or says where it did not.
"""

import argparse
import json
import sys


def cells(paths):
    """Yields (path, auto, chosen, best fixed record) for every size of every run."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
        for engine, size in sorted({(r.get("engine", "tf"), r["bytes"]) for r in records}):
            rows = {r["algorithm"]: r for r in records
                    if r["bytes"] == size and r.get("engine", "tf") == engine}
            if "auto" not in rows:
                continue
            fixed = [r for name, r in rows.items() if name != "auto"]
            yield (path, rows["auto"], rows.get(rows["auto"]["choice"]),
                   min(fixed, key=lambda r: r["time_ms_median"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="JSON files written by bench/allreduce.py")
    parser.add_argument("--limit", type=float, default=1.10,
                        help="largest allowed choice / best ratio (default 1.10)")
    args = parser.parse_args(argv)
    worst, misses, count = 0.0, 0, 0
    print(f"{'run':<48} {'where':<11} {'bytes':>9} {'model':<17} {'choice':<17} "
          f"{'choice/best':>11} {'auto/best':>9} {'auto/choice':>11} {'low (95%)':>9}  best")
    for path, auto, chosen, best in cells(args.runs):
        ratio = auto["choice_vs_best"]
        low = auto.get("choice_vs_best_low", ratio)
        count += 1
        worst = max(worst, low)
        misses += low > args.limit
        print(f"{path[-48:]:<48} {auto['world']} {auto['placement']:<9} {auto['bytes']:>9} "
              f"{auto.get('model_choice', '?'):<17} {auto['choice']:<17} {ratio:>11.2f} "
              f"{auto['vs_best_fixed']:>9.2f} "
              f"{auto['time_ms_median'] / chosen['time_ms_median']:>11.2f} {low:>9.2f}  "
              f"{best['algorithm']}"
              f"{'  <-- over ' + format(args.limit, '.2f') if low > args.limit else ''}")
    print(f"{count} cells, {misses} over {args.limit:.2f}x, worst {worst:.2f}x")
    return 1 if misses or not count else 0


if __name__ == "__main__":
    sys.exit(main())
