"""What the network test bed's tests share (tests/test_netbed.py, tests/test_netbed_cleanup.py):
skip marks naming what is missing, a hanging worker program, launching a job, and
finding the test bed's objects and delay lines left on this machine."""

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from tfdist_ext.launch import netbed, netjobs

_MISSING = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
needs_netbed = pytest.mark.skipif(
    os.geteuid() != 0 or bool(_MISSING),
    reason=("network namespaces and tc need root" if os.geteuid() != 0 else
            f"iproute2 not installed (missing {', '.join(_MISSING)})"))


def _latency_problem():
    try:
        netbed.check_available(latency=True)
    except netbed.NetBedError as err:
        return str(err)
    return None


needs_latency = pytest.mark.skipif(_latency_problem() is not None,
                                   reason=f"no delay line here: {_latency_problem()}")

# Records its pid, a child's pid and its TF_CONFIG address, then hangs.
WORKER = """
import json, os, subprocess, sys, time
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(sys.argv[1], f"pids{index}"), "w") as f:
    f.write(f"{os.getpid()} {child.pid} {config['cluster']['worker'][index]}")
time.sleep(120)
"""


def bed_objects():
    """Names of the test bed objects that exist now (namespaces, links, markers)."""
    names = {n for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                       text=True, check=True).stdout.split()
             if n.startswith("tfdist-")}
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=True).stdout
    names |= {n for n in re.findall(r"^\d+: ([^:@]+)", links, re.M) if n.startswith("tfd")}
    if os.path.isdir(netjobs.MARKER_DIR):
        names |= {f"marker:{n}" for n in os.listdir(netjobs.MARKER_DIR)}
    return names


def delay_line_pids():
    """Pids of the delay-line processes running now."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"tfdist_ext.launch.delayer" in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def wait_for_pid_files(launcher, directory, num_workers=2):
    """The pid files WORKER writes, once every worker has written its own."""
    deadline = time.monotonic() + 30
    files = [directory / f"pids{i}" for i in range(num_workers)]
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline and launcher.poll() is None, launcher.stdout.read()
        time.sleep(0.05)
    return files


def launch_job(*args):
    """tfdist-run with `args` (every worker's lines kept), as a running process."""
    return subprocess.Popen([sys.executable, "-m", "tfdist_ext.launch", "--output", "all",
                             *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def alive(pid):
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
