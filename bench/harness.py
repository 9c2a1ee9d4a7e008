"""What the benchmarks in bench/ share: common arguments, machine facts, result files.

Every script that writes a result JSON writes it through `write`, which adds
where the numbers come from:

    {..., "commit": "<git sha>", "machine": {...}, "command": [sys.argv], "date": "..."}

so a result file names the code it measured and the machine it ran on. A
script's own keys are kept as they are (docs and tests read them); the four
keys above are added. A result that is a list of records (bench/allreduce.py,
bench/engines.py, bench/compression.py) stays a list, and every record gets
the four keys.

    import harness  # or `from bench import harness` with the repository root on sys.path

    parser = argparse.ArgumentParser()
    harness.add_arguments(parser, repeats=3)          # --json, --png, --repeats 3
    ...
    harness.write(result, args.json, args.png, plot=lambda path: plot(result, path))

The module imports no TensorFlow and no sibling module: both `import harness`
(bench/ on sys.path, as when a script runs) and `from bench import harness`
work.
"""

import datetime
import functools
import importlib.metadata
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Packages whose versions a result records: (module, distributions that install it).
_PACKAGES = (("numpy", ("numpy",)),
             ("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow_cpu", "tf-nightly")),
             ("keras", ("keras",)),
             ("torch", ("torch",)),
             ("jax", ("jax",)))

# The keys `write` adds to a result.
FACT_KEYS = ("commit", "machine", "command", "date")


def add_arguments(parser, png=True, repeats=None, repeats_help=None):
    """Adds the output arguments most benchmarks take.

    Only for a script whose parser had exactly these arguments (same names and
    defaults): a script's flags and defaults are part of its interface.

    Args:
        parser: An `argparse.ArgumentParser` (or argument group).
        png: Also add `--png FILE` (default None).
        repeats: When not None, also add `--repeats N` (type int) with this default.
        repeats_help: The help text of `--repeats`, or None.
    """
    parser.add_argument("--json", default=None,
                        help="write the result here (with its commit and machine)")
    if png:
        parser.add_argument("--png", default=None, help="write the plot here")
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help)


def commit():
    """The measured code's git commit.

    Returns:
        `git rev-parse HEAD` of the repository, or TFDIST_BENCH_COMMIT where
        the tree is an export without .git (e.g. `git archive` for long
        runs), or "" when neither says.
    """
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False).stdout.strip()
    return head or os.environ.get("TFDIST_BENCH_COMMIT", "")


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "Processor", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gb():
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 2)  # kB -> GiB
    except OSError:
        pass
    return None


def _cgroup_cpus():
    """The cgroup v2 CPU quota in cores (cpu.max), or None without one."""
    try:
        quota, period = pathlib.Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else round(int(quota) / int(period), 3)


def _version(module, distributions):
    """A package's version: the imported module's, else its installed metadata's (no import)."""
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def machine():
    """Facts about the machine this process runs on.

    Returns:
        A dict: "hostname"; "cores" (the CPUs this process may run on,
        `os.sched_getaffinity`), "cpu_count" (the machine's), "cgroup_cpus"
        (a cgroup v2 CPU quota in cores, or None); "cpu_model" (from
        /proc/cpuinfo); "memory_gb" (MemTotal, GiB); "kernel", "os",
        "python"; "packages": the versions of numpy, tensorflow, keras, torch
        and jax (None where not installed).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count()
    return {
        "hostname": socket.gethostname(),
        "cores": cores,
        "cpu_count": os.cpu_count(),
        "cgroup_cpus": _cgroup_cpus(),
        "cpu_model": _cpu_model(),
        "memory_gb": _memory_gb(),
        "kernel": platform.release(),
        "os": platform.system(),
        "python": platform.python_version(),
        "packages": {module: _version(module, dists) for module, dists in _PACKAGES},
    }


def facts():
    """The keys `write` adds: {"commit", "machine", "command", "date"} of this run now.

    "command" is `sys.argv`; "date" the UTC time in ISO 8601, to the second.
    """
    return {"commit": commit(), "machine": machine(), "command": list(sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write(result, json_path, png_path=None, plot=None):
    """Writes a benchmark's result as JSON with its commit and machine, and its plot.

    Args:
        result: A dict, or a list of dicts (records). A dict gets the keys of
            `facts()` beside its own; in a list, every record gets them. The
            caller's object is not changed.
        json_path: Where the JSON goes (its folder is made), or None for none.
        png_path: Where the plot goes, or None for none.
        plot: A callable `plot(png_path)` that draws the figure and saves it
            at `png_path` (called when `png_path` and `plot` are both given).

    Returns:
        The object written (`result` with the facts added), or `result` itself
        when `json_path` is None.
    """
    if not isinstance(result, (dict, list)):
        raise TypeError(f"a benchmark result is a dict or a list of dicts, not {type(result)}")
    stamped = result
    if json_path:
        stamp = facts()
        stamped = ({**result, **stamp} if isinstance(result, dict)
                   else [{**record, **stamp} for record in result])
        path = pathlib.Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stamped, indent=1))
    if png_path and plot is not None:
        pathlib.Path(png_path).parent.mkdir(parents=True, exist_ok=True)
        plot(png_path)
    return stamped
