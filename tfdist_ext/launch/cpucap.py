"""A fixed CPU share per worker process, for measurements on a shared machine.

When several workers share a few cores, one that dies leaves its CPU to the
others, which then step faster than before: a benchmark of failures would
credit the failure with a speed-up no real cluster has. `CpuCaps` puts each
worker into its own control group with a CFS bandwidth quota of `cpus` cores
(cgroup v1 `cpu.cfs_quota_us`, or v2 `cpu.max`), and a high weight so that other
work on the machine takes only what the workers leave. A replacement started in
a worker's place joins the same group.

Tuning: keep `cpus` x workers below the machine's cores (say 0.5 each for 3
workers on 2 cores), or the quota never binds. `period_us` trades smoothness
against overhead: a step shorter than the period runs at full speed and then
waits out the rest of the period, so keep the period under the step time.

Needs root and a mounted cpu controller; `CpuCapError` says what is missing.
"""

import os
import pathlib
V1_ROOT = pathlib.Path("/sys/fs/cgroup/cpu")
V2_ROOT = pathlib.Path("/sys/fs/cgroup")
WEIGHT_V1 = 10240  # cpu.shares, 10x the default
WEIGHT_V2 = 1000  # cpu.weight, 10x the default


class CpuCapError(RuntimeError):
    """The machine cannot cap a process's CPU (not root, no cpu controller)."""


def _hierarchy() -> tuple:
    """('v1' or 'v2', root folder) of the writable cpu controller."""
    if (V1_ROOT / "cpu.cfs_quota_us").exists() or (V1_ROOT / "tasks").exists():
        return "v1", V1_ROOT
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2", V2_ROOT
    raise CpuCapError("cpus_per_worker needs the cgroup cpu controller (v1 at "
                      f"{V1_ROOT} or v2 with 'cpu' in {controllers}); neither is mounted. "
                      "Leave out --cpus-per-worker to run without caps.")


class CpuCaps:
    """One control group per worker, each capped at `cpus` cores.

    Args:
        name: A name for this job's groups (letters, digits, '-', '_').
        cpus: Cores each worker may use, > 0 (e.g. 0.5).
        period_us: The CFS period in microseconds (1,000-1,000,000).

    Use as a context manager: the groups are removed on exit (a process still in
    one is moved back to the root group first).
    """

    def __init__(self, name: str, cpus: float, period_us: int = 10_000):
        if not isinstance(cpus, (int, float)) or not cpus > 0:
            raise ValueError(f"cpus_per_worker={cpus!r}: must be a number of cores > 0, "
                             "e.g. 0.5")
        if not 1_000 <= period_us <= 1_000_000:
            raise ValueError(f"period_us={period_us!r}: must be in [1000, 1000000]")
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"name={name!r}: letters, digits, '-' and '_' only")
        if os.geteuid() != 0:
            raise CpuCapError(f"cpus_per_worker={cpus} needs root (cgroups); running as uid "
                              f"{os.geteuid()}. Run as root or leave out --cpus-per-worker.")
        self.version, root = _hierarchy()
        self.cpus, self.period_us = float(cpus), int(period_us)
        self.folder = root / f"tfdist-{name}"
        self.folder.mkdir(exist_ok=True)
        if self.version == "v2":
            (root / "cgroup.subtree_control").write_text("+cpu")
            (self.folder / "cgroup.subtree_control").write_text("+cpu")
        self._groups = {}

    def group(self, worker: int) -> pathlib.Path:
        """The capped group of `worker` (made on first use)."""
        if worker not in self._groups:
            group = self.folder / f"w{worker}"
            group.mkdir(exist_ok=True)
            quota = max(1_000, round(self.cpus * self.period_us))
            if self.version == "v1":
                (group / "cpu.cfs_period_us").write_text(str(self.period_us))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
                (group / "cpu.shares").write_text(str(WEIGHT_V1))
            else:
                (group / "cpu.max").write_text(f"{quota} {self.period_us}")
                (group / "cpu.weight").write_text(str(WEIGHT_V2))
            self._groups[worker] = group
        return self._groups[worker]

    def add(self, worker: int, pid: int):
        """Moves process `pid` (threads included) into `worker`'s group."""
        (self.group(worker) / "cgroup.procs").write_text(str(pid))

    def throttled(self, worker: int) -> int:
        """How many periods the quota held `worker`'s group back."""
        for line in (self.group(worker) / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "nr_throttled":
                return int(value)
        return 0

    def close(self):
        _remove(self.folder, list(self._groups.values()))
        self._groups = {}

    @staticmethod
    def remove_leftovers(prefix: str) -> list:
        """Removes the groups of jobs named `prefix`-PID-... whose process PID ended.

        A job killed by a signal cannot remove its groups; call this before
        making new ones under the same prefix. Returns the folders removed.
        """
        _, root = _hierarchy()
        removed = []
        for folder in sorted(root.glob(f"tfdist-{prefix}-*")):
            pid = folder.name[len(f"tfdist-{prefix}-"):].partition("-")[0]
            if pid.isdigit() and not pathlib.Path(f"/proc/{pid}").exists():
                _remove(folder, [g for g in folder.iterdir() if g.is_dir()])
                removed.append(folder)
        return removed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _remove(folder: pathlib.Path, groups: list):
    """Removes `groups` (folders in `folder`) and `folder`, moving their processes to the root."""
    root = folder.parent
    for group in groups:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (root / "cgroup.procs").write_text(pid)
            except OSError:  # the process ended meanwhile
                pass
        group.rmdir()
    folder.rmdir()
