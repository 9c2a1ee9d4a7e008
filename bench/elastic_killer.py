"""bench/elastic.py's random killer (torchft's punisher): SIGKILLs a worker in the job
at random, after exponential intervals, and starts it again as a replacement.

It reads only the job's folder (events.jsonl, the replacements' logs) and the
processes it is given; the report is `elastic_report`'s.
"""

import json
import random
import time

from tfdist_ext.launch.elastic_env import REPLACEMENT_DELAY_SECONDS


def _workers_with(out, event):
    """The workers that wrote `event` ("fit_start", "fit_end") to `out`/events.jsonl."""
    path = out / "events.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    events = [json.loads(line) for line in lines if line.strip()]
    return {e["worker"] for e in events if e["event"] == event}


def fits_begun(out):
    """How many workers' fits have begun (their "fit_start" events in `out`)."""
    return len(_workers_with(out, "fit_start"))


def random_kills(args, procs, start, out, deadline):
    """The random killer: SIGKILLs a worker in the job after exponential intervals of
    mean `args.mtbf` and starts it again, until a worker's fit ends; returns
    [(worker, time)]."""
    rng = random.Random(args.seed)
    began, kills, restarts = time.monotonic(), [], 0
    joined = {i: True for i in range(len(procs))}  # in the job (a replacement: once joined)
    next_kill = None  # armed when every worker's fit has begun (start-up varies: 5-30 s)
    while len(kills) < args.failures and time.monotonic() < deadline:
        time.sleep(0.2)
        if any(p.poll() == 0 for p in procs) or _workers_with(out, "fit_end"):
            break  # the job ended: a kill now would only cost its replacement's start
        if next_kill is None:
            if fits_begun(out) >= len(procs):
                next_kill = time.monotonic() + rng.expovariate(1.0 / args.mtbf)
            continue
        for i, tag in list(joined.items()):
            if tag is not True and "joined at step" in tag.read_text(errors="replace"):
                joined[i] = True
        ready = [i for i in range(len(procs)) if joined[i] is True
                 and procs[i].poll() is None]
        if time.monotonic() < next_kill or len(ready) < 2:
            continue  # the last member is never killed: a job of none restarts from a checkpoint
        victim = rng.choice(ready)
        procs[victim].kill()
        procs[victim].wait()
        kills.append((victim, time.time()))
        print(f"random killer: killed worker {victim} at {time.monotonic() - began:.1f} s",
              flush=True)
        time.sleep(REPLACEMENT_DELAY_SECONDS)
        restarts += 1
        procs[victim] = start(victim, f"-r{restarts}")
        joined[victim] = out / f"w{victim}-r{restarts}.log"
        next_kill = time.monotonic() + rng.expovariate(1.0 / args.mtbf)
    return kills
