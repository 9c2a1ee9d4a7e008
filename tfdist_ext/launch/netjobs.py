"""Test-bed jobs on this host: the commands, the job markers, what killed runs left behind.

Every `NetBed` job creates namespaces tfdist-<job>-<i>, a bridge and veths
named tfd<job>*, and a marker file MARKER_DIR/<job> holding the launcher's pid
and its start time. `clean_leftovers` removes the jobs whose launcher is gone
(pids get reused, so the start time must match too).
"""

import ipaddress
import os
import re
import signal
import subprocess
from typing import List, Optional

MARKER_DIR = "/run/tfdist_netbed"


class NetBedError(RuntimeError):
    """The test bed cannot be built here (privilege, tools) or a command failed."""


def run(*argv, check=True) -> str:
    """Runs a command; its stdout, or NetBedError with its stderr when it fails."""
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetBedError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
    return result.stdout


def start_time(pid: int) -> Optional[str]:
    """The kernel's start time of `pid` (None when gone or a zombie): pids get reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def create_marker(job: str) -> bool:
    """Claims the id `job` for this process; False when another job holds it."""
    os.makedirs(MARKER_DIR, exist_ok=True)
    try:
        fd = os.open(os.path.join(MARKER_DIR, job), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid())}\n")
    return True


def remove_job(job: str):
    """Deletes every namespace (killing what still runs there), veth and bridge of `job`,
    and its marker. Idempotent."""
    for name in run("ip", "netns", "list", check=False).split():
        if re.fullmatch(rf"tfdist-{job}-\d+", name):
            for pid in run("ip", "netns", "pids", name, check=False).split():
                try:  # Workers of a killed launcher would keep the namespace alive.
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            run("ip", "netns", "delete", name, check=False)
    links = re.findall(r"^\d+: ([^:@]+)", run("ip", "-o", "link", "show", check=False), re.M)
    for link in sorted(links, reverse=True):  # veths (tfd<job>r<i>) before the bridge
        if link.startswith(f"tfd{job}"):
            run("ip", "link", "delete", link, check=False)
    try:
        os.remove(os.path.join(MARKER_DIR, job))
    except FileNotFoundError:
        pass


def clean_leftovers(log=None) -> List[str]:
    """Removes what runs whose launcher is no longer alive left behind; returns their ids."""
    cleaned = []
    names = sorted(os.listdir(MARKER_DIR)) if os.path.isdir(MARKER_DIR) else []
    for job in names:
        try:
            with open(os.path.join(MARKER_DIR, job), encoding="utf-8") as f:
                fields = f.read().split()
        except OSError:
            continue
        pid = int(fields[0]) if fields and fields[0].isdigit() else 0
        started = fields[1] if len(fields) > 1 else None
        now = start_time(pid) if pid > 0 else None
        if now is not None and (started is None or started == now):
            continue  # Its launcher is still running.
        remove_job(job)
        cleaned.append(job)
    if cleaned and log is not None:
        log(f"cleaned network test bed(s) left by killed runs: {', '.join(cleaned)} "
            f"(namespaces tfdist-<id>-* and what ran in them, bridge/veths tfd<id>*, "
            f"{MARKER_DIR}/<id>).")
    return cleaned


def subnets_in_use() -> List[ipaddress.IPv4Network]:
    """The IPv4 networks of this namespace's addresses and routes."""
    nets = [ipaddress.ip_interface(a).network for a in re.findall(
        r"inet (\S+)", run("ip", "-4", "-o", "addr", "show", check=False))]
    for line in run("ip", "-4", "route", "show", "table", "all", check=False).splitlines():
        word = line.split()[0] if line.split() else ""
        if word not in ("default", "broadcast", "local") and re.match(r"[\d./]+$", word):
            nets.append(ipaddress.ip_network(word, strict=False))
    return nets
