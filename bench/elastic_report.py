"""The report of bench/elastic.py: per-failure costs, goodput, step rates, the plot.

Pure functions of the jobs' records (the workers' w{i}.json, OUT/events.jsonl
and OUT/steps-PID.txt that bench/elastic.py writes), so that a report can be
made again from a kept `--root` without training.
"""

import bisect
import json
import os
import statistics


def thin(curve, points=2000):
    """Every k-th (step, time, loss) of `curve`, at most about `points` of them."""
    return curve[::max(1, len(curve) // points)]


def summarize(args, whole, broken, killed, codes):
    lowest = min(broken)
    failures = []
    for failure in broken[lowest]["failures"]:
        (dead,) = failure["dead"] if len(failure["dead"]) == 1 else (failure["dead"][0],)
        lost = {w: 1 + next((f["skipped"] for f in r["failures"]
                             if f["generation"] == failure["generation"]), 0)
                for w, r in broken.items()}
        failures.append({
            "dead": failure["dead"], "step": failure["step"] - 1, "members": failure["members"],
            "seconds_to_go_on": failure["time"] - killed[dead] if dead in killed else None,
            "steps_lost": lost})
    reference = whole[min(whole)]
    return {
        "workers": args.workers, "kills": args.kills, "epochs": args.epochs,
        "hidden": args.hidden, "batch": args.batch,
        "exit_codes": codes, "cores": os.cpu_count(),
        "uninterrupted": {"accuracy": reference["accuracy"], "seconds": reference["seconds"],
                          "final_loss": reference["curve"][-1][2]},
        "with_failures": {"accuracy": broken[lowest]["accuracy"],
                          "seconds": broken[lowest]["seconds"],
                          "final_loss": broken[lowest]["curve"][-1][2],
                          "survivors": sorted(broken)},
        "accuracy_points_vs_uninterrupted": 100 * (broken[lowest]["accuracy"]
                                                   - reference["accuracy"]),
        "failures": failures,
        "curves": {"uninterrupted": thin(reference["curve"]),
                   "with_failures": thin(broken[lowest]["curve"])},
    }


def summarize_random(args, whole, broken, kills, codes, out):
    """The random killer's job: per kill, seconds to go on and to full size, steps lost;
    the job's goodput.

    Membership changes and the fit's start and end come from OUT/events.jsonl, which
    every process of the job appended to (killed ones included); the curve and
    accuracy from the worker that ran longest, the step rate from every process's
    OUT/steps-PID.txt (per window, the process that completed the most steps).
    """
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    chief = min(broken.values(), key=lambda r: (r["replacement"], r["start"]))
    reference = whole[min(whole)]
    changes = {}
    for e in events:
        if e["event"] in ("failure", "join"):
            changes.setdefault((e["event"], e["change"]["generation"]), e["change"])
    all_failures = sorted((f for (kind, _), f in changes.items() if kind == "failure"),
                          key=lambda f: f["generation"])
    joins = sorted((j for (kind, _), j in changes.items() if kind == "join"),
                   key=lambda j: j["generation"])
    # Per kill: the first failure after it that names its victim. One failure can name
    # several (kills moments apart); its lost steps count once, with the first kill.
    failures, used, unmatched = [], set(), []
    for victim, when in kills:
        failure = next((f for f in all_failures if victim in f["dead"]
                        and (f["generation"], victim) not in used
                        and f["time"] >= when - 1), None)
        if failure is None:  # e.g. killed before the fit began: nothing to recover
            unmatched.append({"worker": victim, "time": when})
            continue
        shared = any(generation == failure["generation"] for generation, _ in used)
        used.add((failure["generation"], victim))
        join = next((j for j in joins if victim in j["joined"] and j["time"] > when), None)
        failures.append({
            "dead": failure["dead"], "step": failure["step"] - 1,
            "members": failure["members"], "seconds_to_go_on": failure["time"] - when,
            "seconds_to_full_size": None if join is None else join["time"] - when,
            "steps_lost": {"0": 0 if shared else 1 + failure["skipped"]}})
    full = [f["seconds_to_full_size"] for f in failures if f["seconds_to_full_size"]]
    began = min(e["time"] for e in events if e["event"] == "fit_start" and not e["replacement"])
    ended = max(e["time"] for e in events if e["event"] == "fit_end")
    total = len(reference["curve"])  # the fit's steps (one loss per step)
    lost = sum(1 + f["skipped"] for f in all_failures)
    goodput = (total - lost) / total * reference["seconds"] / (ended - began)
    times = [[float(t) - began for t in path.read_text().split()]
             for path in sorted(out.glob("steps-*.txt"))]
    pauses = admission_pauses([j["time"] - began for j in joins], times)
    sizes = sorted((c["time"] - began, len(c["members"])) for c in changes.values())
    pace = own_pace(times, sizes, args.workers)
    parts = {}
    for e in events:  # the members' own account of each admission's pause
        if e["event"] in ("join", "join_pause") and "step" in e["change"].get("pause", {}):
            parts.setdefault(e["change"]["generation"], e["change"]["pause"])
    return {
        "goodput": goodput, "steps_total": total, "steps_lost_total": lost,
        # Against the job's own pace at full size (a twin run at another time can meet
        # another machine): kept steps over what that pace runs in the job's time.
        "goodput_own_pace": None if pace is None else (total - lost) * pace / (ended - began),
        "own_pace_step_seconds": pace,
        "failures_recorded": len(all_failures), "seconds": ended - began,
        "identical_weights": len({r.get("sha") for r in broken.values()}) == 1,
        "kill_times": [when - began for _, when in kills],
        "workers": args.workers, "mtbf": args.mtbf, "kills": len(kills), "hidden": args.hidden,
        "batch": args.batch,
        "cpus_per_worker": args.cpus_per_worker or None,
        "epochs": args.epochs, "exit_codes": codes, "cores": os.cpu_count(),
        "uninterrupted": {"accuracy": reference["accuracy"], "seconds": reference["seconds"],
                          "final_loss": reference["curve"][-1][2]},
        "with_failures": {"accuracy": chief["accuracy"], "seconds": ended - began,
                          "final_loss": chief["curve"][-1][2], "survivors": sorted(broken),
                          "members": chief["members"], "worker": chief["worker"],
                          "accuracy_by_worker": {str(w): r["accuracy"]
                                                 for w, r in sorted(broken.items())}},
        "accuracy_points_vs_uninterrupted": 100 * (chief["accuracy"] - reference["accuracy"]),
        "failures": failures,
        "kills_without_failure": unmatched,
        "mean_seconds_to_go_on": sum(f["seconds_to_go_on"] for f in failures)
        / max(len(failures), 1),
        "mean_seconds_to_full_size": sum(full) / len(full) if full else None,
        "mean_steps_lost": sum(f["steps_lost"]["0"] for f in failures) / max(len(failures), 1),
        "admission_pauses": pauses,
        "admission_pause_parts": {key: statistics.median(p[key] for p in parts.values())
                                  for key in ("admit", "state", "step") if parts},
        "median_step_seconds": median_step(times),
        "curves": {"uninterrupted": thin(reference["curve"]),
                   "with_failures": thin(chief["curve"])},
        "step_rates": {"uninterrupted": step_rate([c[1] - reference["curve"][0][1]
                                                   for c in reference["curve"]]),
                       "with_failures": step_rate(*times)},
    }


def own_pace(processes, sizes, workers, margin=4.0):
    """The mean seconds per step while the job ran at full size: over every process's
    consecutive steps (seconds from the fit's start) taken with `workers` members and
    at least `margin` seconds from any membership change (`sizes`: (time, members)
    in time order); None if there are none."""
    times = [t for t, _ in sizes]
    gaps = []
    for steps in processes:
        for a, b in zip(steps, steps[1:]):
            i = bisect.bisect_right(times, a) - 1
            size = workers if i < 0 else sizes[i][1]
            near = bisect.bisect_left(times, a - margin) < bisect.bisect_right(times, b + margin)
            if size == workers and not near:
                gaps.append(b - a)
    return sum(gaps) / len(gaps) if gaps else None


def median_step(processes):
    """The median seconds between consecutive steps of one process, over all processes."""
    gaps = sorted(b - a for times in processes for a, b in zip(times, times[1:]))
    return gaps[len(gaps) // 2] if gaps else None


def admission_pauses(joins, processes):
    """Per join (seconds from the fit's start), the seconds the members did not step:
    over a process that stepped before and after the join's time, the interval between
    its step before the admission and its second step after it (the admission and the
    state broadcast end the step in which the join's time falls; the first step of the
    new membership traces Keras' function again), less two median steps."""
    typical = median_step(processes) or 0.0
    pauses = []
    for when in joins:
        spans = [times[i + 2] - times[i] for times in processes
                 for i in range(len(times) - 2) if times[i] <= when <= times[i + 1]]
        if spans:
            pauses.append(max(spans) - 2 * typical)
    return pauses


def step_rate(*processes, window=5.0):
    """(window middle, steps per second) over windows of `window` seconds, from each
    process's step times (seconds from the fit's start): per window, the process that
    completed the most steps (every member completes every step)."""
    if not any(processes):
        return []
    counts = {}
    for times in processes:
        per = {}
        for t in times:
            per[int(t // window)] = per.get(int(t // window), 0) + 1
        for w, n in per.items():
            counts[w] = max(counts.get(w, 0), n)
    return [((w + 0.5) * window, counts.get(w, 0) / window)
            for w in range(min(counts), max(counts) + 1)]


def plot(result, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    rates = result.get("step_rates")
    fig, axes = plt.subplots(2 if rates else 1, 1, figsize=(7, 6 if rates else 3.5))
    ax = axes[0] if rates else axes
    if rates:
        for name, points in rates.items():
            axes[1].plot([p[0] for p in points], [p[1] for p in points], label=name, lw=1)
        for when in result["kill_times"]:
            axes[1].axvline(when, color="red", ls="--", lw=0.6)
        axes[1].set(xlabel="seconds from the fit's start (red: a kill)",
                    ylabel="training steps / s (5 s windows)",
                    title=f"goodput {result['goodput']:.3f} ({len(result['failures'])} "
                          f"failures, mean interval {result['mtbf']:g} s)")
        axes[1].legend(fontsize=7)
    for name, curve in result["curves"].items():
        ax.plot([c[0] for c in curve], [c[2] for c in curve], label=name, lw=1)
    ax.set_yscale("log")
    labelled = len(result["failures"]) <= 12  # more would cover each other
    for i, f in enumerate(result["failures"]):
        ax.axvline(f["step"], color="red", ls="--", lw=0.8 if labelled else 0.4)
        if labelled:
            ax.text(f["step"], ax.get_ylim()[1] * 0.6 ** (i % 4),
                    f" worker {f['dead']} killed", color="red", fontsize=7, va="top")
    ax.set(xlabel="training step" + ("" if labelled else " (red: a failure)"),
           ylabel="loss (running mean of the epoch, log)",
           title=f"{result['workers']} workers, elastic: accuracy "
                 f"{result['with_failures']['accuracy']:.3f} with failures, "
                 f"{result['uninterrupted']['accuracy']:.3f} without")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
