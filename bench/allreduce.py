"""All-reduce benchmark in the style of nccl-tests, for every tfdist_ext algorithm.

    python bench/allreduce.py --workers 4 --sizes 1KB,64KB,1MB,16MB --algorithms all --json out.json
    python bench/allreduce.py --replicas 4 --sizes 1KB,1MB --png out.png

`--workers N` re-launches this script on N worker processes through tfdist-run
(TF_CONFIG over 127.0.0.1); `--hosts HxW` on H emulated hosts of W workers
(`tfdist-run -H HxW`, root), with `--link-bandwidth` / `--link-latency` shaping the
links between hosts; "hierarchical" then joins the algorithms. `--replicas N` uses
N logical CPU replicas in one process. `--engine` picks what carries the bytes: "tf" (TF's collectives),
"ucx" (the UCX engine) or "all" (the default: every engine that loads, one after
the other in the same job; every record names its engine). Every algorithm, TF's "native" ring and "auto" (the calibrated
cost model's choice, refined by timing its close candidates at that size as in
training, then measured as its own row) run side by side in one job; "auto" chooses
among the algorithms listed with it. `bench/allreduce_runs.py` checks its picks
across several runs.
Times are per all-reduce of float32 (min and median over `--repeat` timed calls,
each chaining `--steps` all-reduces and starting right after a barrier);
algbw = bytes / time and busbw = algbw * 2(p-1)/p as in nccl-tests. The
chief's measurements are reported.

The run exits 1 when auto's choice is slower than `--max-auto-ratio` times the
best fixed algorithm beyond the run's noise: the chosen algorithm is timed twice
(its own row and the auto row), and the ratio of its median to the best fixed
algorithm's must exceed the limit at the lower end of a bootstrap 95% interval
(`choice_vs_best_low`). Below 64 KB every algorithm's median is mostly scheduling
jitter on a loaded host; the interval says when two rows cannot be told apart.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  pylint: disable=wrong-import-position  (bench/, above)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None, help="worker processes")
    where.add_argument("--replicas", type=int, default=None,
                       help="logical CPU replicas in one process")
    where.add_argument("--hosts", default=None, metavar="HxW",
                       help="H emulated hosts of W workers (needs root)")
    parser.add_argument("--link-bandwidth", default=None, metavar="RATE",
                        help="with --hosts: tc rate of the links between hosts")
    parser.add_argument("--link-latency", default=None, metavar="DELAY",
                        help="with --hosts: one-way delay between hosts")
    parser.add_argument("--sizes", default="1KB,64KB,1MB,16MB")
    parser.add_argument("--algorithms", default="all",
                        help="comma-separated names, or 'all' (every algorithm + native + auto); "
                             "auto chooses among the other names listed")
    parser.add_argument("--engine", choices=("all", "tf", "ucx"), default="all")
    parser.add_argument("--repeat", type=int, default=0,
                        help="timed calls per algorithm and size (0: 41 below 64 KB, else 11)")
    parser.add_argument("--steps", type=int, default=0,
                        help="all-reduces per timed call (0: 32 below 64 KB, 8 below 1 MB, "
                             "else 2)")
    harness.add_arguments(parser)
    parser.add_argument("--max-auto-ratio", type=float, default=1.10,
                        help="exit 1 when auto's choice is slower than this x the best fixed "
                             "algorithm at some size, beyond the noise (the bootstrap 95%% "
                             "lower bound; 0: never)")
    parser.add_argument("--no-cache", action="store_true",
                        help="re-calibrate instead of using the calibration cache")
    return parser.parse_args(argv)


def relaunch(args, argv):
    """Runs this script on `args.workers` workers and returns the exit code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    where = ["-np", str(args.workers)] if args.workers else ["-H", args.hosts]
    for option in ("link_bandwidth", "link_latency"):
        if getattr(args, option):
            where += ["--" + option.replace("_", "-"), getattr(args, option)]
    command = [sys.executable, "-m", "tfdist_ext.launch", *where, "--",
               sys.executable, __file__, *argv]
    return subprocess.run(command, env=env, check=False).returncode


def run(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tfdist_ext.ops import ucx as ucx_ops  # pylint: disable=import-outside-toplevel

    tf.get_logger().setLevel("ERROR")  # one tf.function per measurement is the point here
    names = (None if args.algorithms == "all"  # decided per strategy (its hosts)
             else tuple(args.algorithms.split(",")))
    allreduce = {"name": "auto"}
    if args.no_cache:
        allreduce["calibration_cache"] = None
    if args.algorithms != "all":  # auto chooses among the algorithms it is compared with
        allreduce["candidates"] = [n for n in names if n != "auto"]  # empty: all
    engines = (("tf", "ucx") if ucx_ops.problem() is None else ("tf",)) \
        if args.engine == "all" else (args.engine,)
    records = []
    for engine in engines:
        records += measure(args, names, allreduce, engine)
    if not records or records[0].get("is_chief"):
        return summarize(records, args)
    return 0


def measure(args, names, allreduce, engine):
    """Records of every algorithm x size on one engine (the chief's times)."""
    import tfdist_ext  # pylint: disable=import-outside-toplevel
    from tfdist_ext.collectives import auto, calibration, options  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(allreduce=allreduce, num_replicas=args.replicas,
                                   engine=engine)
    cross_ops = strategy.extended.cross_device_ops
    calibrated = cross_ops.choice.calibration
    names = names or cross_ops.choice.candidates + ("auto",)
    world = strategy.num_replicas_in_sync
    placement = "workers" if strategy.cluster else "replicas"
    is_chief = strategy.cluster is None or strategy.cluster.task_index == 0
    barrier = calibration.barrier_fn(cross_ops)
    records = []
    for size in [options.parse_size(s) for s in args.sizes.split(",")]:
        elements = max(size // 4, 1)
        # Sub-millisecond all-reduces are timed in longer chains, so that the
        # launch of the timed function and the host's jitter stay below 10%.
        steps = args.steps or (32 if size < (64 << 10) else 8 if size < (1 << 20) else 2)
        # "auto" decides as in training: the model, then timing its close candidates
        # at this size (collectives.refine) before the benchmark's own timing.
        chosen = {name: (cross_ops.choice.select(4 * elements) if name == "auto" else name)
                  for name in names}
        refined = {d["bytes"]: d for d in strategy.allreduce_refinements}.get(4 * elements)
        fns = {name: calibration.all_reduce_fn(cross_ops, chosen[name], elements, steps)
               for name in names}
        repeat = args.repeat or (41 if size < (64 << 10) else 11)
        seconds = calibration.time_interleaved(fns, repeat, barrier, steps)
        for name in names:
            t_min, t_med = min(seconds[name]), float(np.median(seconds[name]))
            algbw = 4 * elements / t_med / 1e9
            records.append({
                "engine": engine, "is_chief": is_chief,
                "world": world, "placement": placement, "algorithm": name,
                "hosts": args.hosts, "link_bandwidth": args.link_bandwidth,
                "link_latency": args.link_latency,
                "choice": chosen[name], "bytes": 4 * elements,
                "time_ms_min": 1e3 * t_min, "time_ms_median": 1e3 * t_med,
                "times_ms": [1e3 * t for t in seconds[name]],
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * (2 * (world - 1) / world if world > 1 else 1.0),
                "modelled_ms": 1e3 * calibrated.predict(chosen[name], 4 * elements)})
            if name == "auto":
                records[-1]["model_choice"] = auto.choose(calibrated, 4 * elements,
                                                          candidates=allreduce.get("candidates"))
                records[-1]["refined_ms"] = refined["ms"] if refined else {}
                records[-1]["refine_seconds"] = refined.get("seconds", 0.0) if refined else 0.0
            if is_chief:
                r = records[-1]
                print(f"{engine:<4} {r['bytes']:>10} {name:<17} {r['time_ms_min']:9.3f} "
                      f"{r['time_ms_median']:9.3f} {r['busbw_GBps']:8.3f}  "
                      f"{'-> ' + chosen[name] if name == 'auto' else ''}", flush=True)
    return records


def ratio_lower_bound(times, best_times, resamples=2000, seed=0):
    """The 5th percentile of median(times) / median(best_times) over bootstrap resamples.

    A one-sided 95% lower bound on how much slower `times` is than
    `best_times`: above the limit only when the gap is larger than the run's noise.
    """
    rng = np.random.default_rng(seed)
    times, best_times = np.asarray(times), np.asarray(best_times)
    ratios = (np.median(rng.choice(times, (resamples, times.size)), axis=1)
              / np.median(rng.choice(best_times, (resamples, best_times.size)), axis=1))
    return float(np.percentile(ratios, 5))


def summarize(records, args):
    """Adds ratios to native / best, prints them, writes JSON and PNG.

    Returns:
        The exit code: 1 when auto's choice is more than `--max-auto-ratio` times
        the best fixed algorithm at some size with 95% confidence (the chosen
        algorithm's own row and the auto row against the best row), else 0.
    """
    by_size, failures = {}, []
    for r in records:
        by_size.setdefault((r["engine"], r["bytes"]), {})[r["algorithm"]] = r
    for (engine, size), rows in by_size.items():
        fixed = {n: r for n, r in rows.items() if n != "auto"}
        best = min(fixed.values(), key=lambda r: r["time_ms_median"])
        for r in rows.values():
            r["vs_best_fixed"] = r["time_ms_median"] / best["time_ms_median"]
            if "native" in rows:
                r["vs_native"] = r["time_ms_median"] / rows["native"]["time_ms_median"]
        if "auto" in rows:
            # How good the choice is, from the chosen algorithm's own row (the auto row
            # re-times the same algorithm, so it differs from that row only by noise).
            chosen = rows.get(rows["auto"]["choice"])
            if chosen is not None:
                rows["auto"]["choice_vs_best"] = chosen["vs_best_fixed"]
                rows["auto"]["choice_vs_best_low"] = ratio_lower_bound(
                    chosen["times_ms"] + rows["auto"]["times_ms"], best["times_ms"])
            if "hierarchical" in rows:
                flat = min((r for n, r in fixed.items() if n != "hierarchical"),
                           key=lambda r: r["time_ms_median"])
                h = rows["hierarchical"]
                h["vs_best_flat"] = h["time_ms_median"] / flat["time_ms_median"]
                if "ring" in rows:
                    h["ring_vs_hierarchical"] = (rows["ring"]["time_ms_median"]
                                                 / h["time_ms_median"])
                print(f"{engine} {size:>10} B: hierarchical {h['vs_best_flat']:.2f}x the best "
                      f"flat ({flat['algorithm']}); ring takes "
                      f"{h.get('ring_vs_hierarchical', float('nan')):.2f}x hierarchical's time",
                      flush=True)
            ratio = rows["auto"].get("choice_vs_best", rows["auto"]["vs_best_fixed"])
            low = rows["auto"].get("choice_vs_best_low", ratio)
            if args.max_auto_ratio and low > args.max_auto_ratio:
                failures.append(f"{engine} {size} B: auto -> {rows['auto']['choice']}, "
                                f"{ratio:.2f}x the best fixed ({best['algorithm']}), "
                                f"at least {low:.2f}x with 95% confidence")
            print(f"{engine} {size:>10} B: auto -> {rows['auto']['choice']}, "
                  f"{rows['auto']['vs_best_fixed']:.2f}x the best fixed "
                  f"({best['algorithm']}) as re-timed, "
                  f"{rows['auto'].get('choice_vs_best', float('nan')):.2f}x by the "
                  "chosen algorithm's own row, at least "
                  f"{rows['auto'].get('choice_vs_best_low', float('nan')):.2f}x (95%)",
                  flush=True)
    harness.write(records, args.json, args.png, plot=lambda path: plot(records, path))
    for failure in failures:
        print(f"FAIL: {failure}, above --max-auto-ratio {args.max_auto_ratio}", flush=True)
    return 1 if failures else 0


def plot(records, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, ax = plt.subplots(figsize=(8, 5))
    for engine, name in sorted({(r["engine"], r["algorithm"]) for r in records}):
        rows = sorted((r for r in records if (r["engine"], r["algorithm"]) == (engine, name)),
                      key=lambda r: r["bytes"])
        ax.plot([r["bytes"] for r in rows], [r["time_ms_median"] for r in rows], marker="o",
                label=f"{engine}:{name}", linewidth=3 if name in ("auto", "native") else 1.2,
                linestyle="-" if engine == "ucx" else "--")
    first = records[0]
    where = f"{first['world']} {first['placement']}"
    if first.get("hosts"):
        where = (f"{first['hosts']} hosts, {first.get('link_bandwidth') or 'unshaped'}"
                 f"{', ' + first['link_latency'] if first.get('link_latency') else ''} "
                 f"between hosts")
    ax.set(xscale="log", yscale="log", xlabel="bytes (float32)", ylabel="ms per all-reduce",
           title=f"All-reduce on {where} (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if (args.workers or args.hosts) and "TF_CONFIG" not in os.environ:
        return relaunch(args, argv)
    if json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"] == 0:
        print(f"{'eng':<4} {'bytes':>10} {'algorithm':<17} {'min ms':>9} {'med ms':>9} "
              f"{'busbw':>8}",
              flush=True)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
