"""tfdist-run --link-bandwidth / --link-latency: nothing is left behind (namespaces, links,
delay lines) however a job ends, the delay line itself, and the network arguments'
checks. What crosses the links is in test_netbed.py.

Needs root and iproute2 (`ip`, `tc`); the delay tests also need iptables and the
fnfqueue package. Those tests skip otherwise, with the reason. The argument checks
and the delay line's own test run everywhere.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from netbed_jobs import (WORKER, alive, delay_line_pids, launch_job, needs_latency,
                         needs_netbed, bed_objects, wait_for_pid_files)
from tfdist_ext.launch import cli, delayer, netbed, netjobs

# Every test here may create network namespaces, veth pairs and netfilter queues on
# this machine (named per job, cleaned by the launcher): they run in the suite's last,
# one-at-a-time phase (`quiet`, see tests/run), not beside each other.
pytestmark = [pytest.mark.multiworker, pytest.mark.alone, pytest.mark.quiet]


@needs_netbed
@pytest.mark.parametrize("how, code, latency", [
    ("sigint", 130, []), ("timeout", 124, []),
    pytest.param("sigint", 130, ["--link-latency", "5ms"], marks=needs_latency)])
def test_stopped_shaped_job_leaves_nothing(tmp_path, how, code, latency):
    before, lines_before = bed_objects(), delay_line_pids()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    extra = ["--timeout", 4] if how == "timeout" else []
    launcher = launch_job("-np", 2, "--grace", 1, "--link-bandwidth", "10mbit", *latency,
                          *extra, sys.executable, script, tmp_path)
    files = wait_for_pid_files(launcher, tmp_path)
    records = [f.read_text().split() for f in files]
    assert [r[2].split(":")[0].rsplit(".", 1)[1] for r in records] == ["1", "2"]
    assert all(r[2].startswith(netbed.SUBNET_PREFIX + ".") for r in records)
    if how == "sigint":
        launcher.send_signal(signal.SIGINT)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == code, out
    time.sleep(0.2)
    assert [p for r in records for p in r[:2] if alive(int(p))] == [], out
    assert bed_objects() <= before, out
    assert set(delay_line_pids()) <= set(lines_before), out


@needs_latency
def test_killed_launcher_with_delay_lines_is_cleaned(tmp_path):
    before, lines_before = bed_objects(), delay_line_pids()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launcher = launch_job("-np", 2, "--link-latency", "5ms", sys.executable, script, tmp_path)
    files = wait_for_pid_files(launcher, tmp_path)
    lines = set(delay_line_pids()) - set(lines_before)
    assert len(lines) == 2
    launcher.kill()
    launcher.wait()
    assert all(alive(p) for p in lines)  # orphaned until the next start cleans them
    assert netjobs.clean_leftovers()
    time.sleep(0.2)
    workers = [int(p) for f in files for p in f.read_text().split()[:2]]
    assert [p for p in [*lines, *workers] if alive(p)] == []
    assert bed_objects() <= before


@needs_latency
def test_dead_delay_line_stops_the_job_naming_it(tmp_path):
    before, lines_before = bed_objects(), delay_line_pids()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launcher = launch_job("-np", 2, "--grace", 1, "--link-latency", "5ms", sys.executable,
                          script, tmp_path)
    files = wait_for_pid_files(launcher, tmp_path)
    lines = sorted(set(delay_line_pids()) - set(lines_before))
    os.kill(lines[1], signal.SIGKILL)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 1, out
    assert re.search(r"network test bed: the delay line of worker \d \(pid \d+\) exited "
                     r"with code -9: packets to worker \d are dropped; stopping all workers",
                     out), out
    assert bed_objects() <= before, out


def test_delay_line_holds_each_packet_for_the_delay_in_order():
    released = []
    line = delayer.DelayLine(0.05, lambda item: released.append((item, time.monotonic())))
    start = time.monotonic()
    for item in range(5):
        line.hold((item, time.monotonic()))
        time.sleep(0.01)
    time.sleep(0.15)
    assert [item[0] for item, _ in released] == list(range(5))
    assert all(0.05 <= at - held < 0.07 for (_, held), at in released), released
    line.hold(("late", time.monotonic()))
    line.close()  # releases what it holds at once
    assert released[-1][0][0] == "late" and time.monotonic() - start < 0.3
    with pytest.raises(ValueError, match="`delay` must be >= 0 seconds; received -1"):
        delayer.DelayLine(-1, print)


@needs_netbed
def test_leftover_of_a_killed_run_is_cleaned_at_next_start():
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.makedirs(netjobs.MARKER_DIR, exist_ok=True)
    alive_marker = os.path.join(netjobs.MARKER_DIR, "a11fe")
    try:
        with open(os.path.join(netjobs.MARKER_DIR, "0dead"), "w", encoding="utf-8") as f:
            f.write(f"{dead.pid}\n")
        with open(alive_marker, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")  # A run still going: must be left alone.
        subprocess.run(["ip", "netns", "add", "tfdist-0dead-0"], check=True)
        subprocess.run(["ip", "link", "add", "tfd0dead", "type", "bridge"], check=True)
        orphan = subprocess.Popen(["ip", "netns", "exec", "tfdist-0dead-0", "sleep", "60"])
        launcher = launch_job("-np", 1, "--link-bandwidth", "1mbit", sys.executable, "-c", "")
        out, _ = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, out
        assert "cleaned network test bed(s) left by killed runs: 0dead " in out
        left = bed_objects()
        assert not {"tfdist-0dead-0", "tfd0dead", "marker:0dead"} & left, left
        assert "marker:a11fe" in left
        assert orphan.wait(timeout=5) == -signal.SIGKILL  # a worker the dead run left
    finally:
        netjobs.remove_job("0dead")
        os.remove(alive_marker)


@pytest.mark.parametrize("argv, message", [
    (["--link-bandwidth", "fast"], "argument --link-bandwidth: must be a tc rate of at "
                                   "least 8kbit such as 100kbit, 50mbit, 1gbit or 10mbps"),
    (["--link-bandwidth", "50"], "received '50'"),
    (["--link-latency", "soon"], "argument --link-latency: must be a delay such as 50ms, "
                                 "500us or 1s; received 'soon'"),
    (["--link-latency", "50"], "received '50'"),
    (["--link-latency", "0:0=5ms"], "or delays per pair of hosts such as 0:1=100ms,0:2=30ms"),
    (["--link-latency", "0:2=5ms"], "argument --link-latency: the pair 0:2 names host 2, but "
                                    "there are 2 hosts (0..1; each worker is one without "
                                    "-H HxW, and each --ps server one after them)"),
    (["--ps", "1", "--link-latency", "0:3=5ms"], "the pair 0:3 names host 3, but there are 3 "
                                                 "hosts (0..2;"),
    (["--check"], "argument --check: needs --link-bandwidth, --link-latency or -H HxW, "
                  "and two workers on different hosts"),
    (["-H", "2x0"], "the layout HxW needs H >= 1 hosts and W >= 1 workers per host"),
    (["-H", "2x2", "-np", "3"], "argument -np: 3 workers do not match the layout -H 2x2 "
                                "(4 workers); drop -np or make it 4"),
])
def test_bad_network_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["-np", "2", *argv, "true"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_privilege_or_tools_say_what_and_how(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit):
        cli.main(["-np", "2", "--link-bandwidth", "50mbit", "true"])
    err = capsys.readouterr().err
    assert "needs root" in err and "uid 1000" in err
    assert "leave out --link-bandwidth: the plain launcher works without it" in err
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else "/bin/x")
    with pytest.raises(netbed.NetBedError,
                       match=r"needs `ip` and `tc` \(iproute2\); not found on PATH: tc\. "):
        netbed.check_available()
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "iptables" else "/x")
    with pytest.raises(netbed.NetBedError,
                       match=r"--link-latency needs `iptables` .*\(apt-get install -y "
                             r"iptables\), or leave out --link-latency"):
        netbed.check_available(latency=True)
    monkeypatch.setattr(shutil, "which", lambda tool: "/bin/x")
    monkeypatch.setitem(sys.modules, "fnfqueue", None)  # as if not installed
    with pytest.raises(netbed.NetBedError,
                       match=r"needs the Python package fnfqueue .*pip install "
                             r"'fnfqueue>=1.1.2,<1.2'"):
        netbed.check_available(latency=True)
