"""tfdist-run --link-bandwidth / --link-latency: namespaces, tc shaping, the NFQUEUE
delay line, and that nothing is left behind.

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

from conftest import ROOT, read_worker_json

# Every test here may create network namespaces, veth pairs and netfilter queues on
# this machine (named per job, cleaned by the launcher): they run in the suite's last,
# one-at-a-time phase (`quiet`, see tests/run), not beside each other.
pytestmark = [pytest.mark.multiworker, pytest.mark.alone, pytest.mark.quiet]
from tfdist_ext.launch import cli, delayer, netbed, netjobs

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


def _state():
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


def _delay_lines():
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


def _wait_for_pid_files(launcher, directory, num_workers=2):
    """The pid files WORKER writes, once every worker has written its own."""
    deadline = time.monotonic() + 30
    files = [directory / f"pids{i}" for i in range(num_workers)]
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline and launcher.poll() is None, launcher.stdout.read()
        time.sleep(0.05)
    return files


def _launch(*args):
    return subprocess.Popen([sys.executable, "-m", "tfdist_ext.launch", "--output", "all",
                             *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _best_mbit(out):
    """The link check's best half second: the mean also counts slow start and loss
    recovery, which a 100 ms round trip on a busy machine stretches."""
    mean, best = re.search(r"measured [\d.]+ MB/s = ([\d.]+) Mbit/s over [\d.]+ MB, "
                           r"best 0.5 s ([\d.]+) Mbit/s", out).groups()
    assert float(mean) <= float(best) * 1.01, out
    return float(best)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@needs_netbed
def test_shaped_link_rate_and_keras_fit(tmp_path):
    before = _state()
    launcher = _launch("-np", 2, "--timeout", 240, "--link-bandwidth", "50mbit", "--check",
                       "--", sys.executable, ROOT / "tests/workers/multiworker_checks.py",
                       tmp_path, "tfdist")
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, out
    mbit = _best_mbit(out)
    assert abs(mbit - 50) / 50 < 0.25, out
    results = read_worker_json(tmp_path, 2)
    assert all(r["fit"]["ok"] and r["workers"] == 2 for r in results), results
    assert results[0]["fit"]["value"]["sha"] == results[1]["fit"]["value"]["sha"]
    assert _state() <= before, out  # (b) every namespace, link, qdisc and marker gone


@needs_latency
def test_latency_round_trip_rate_and_collectives(tmp_path):
    before, lines_before = _state(), _delay_lines()
    launcher = _launch("-np", 2, "--timeout", 120, "--link-bandwidth", "50mbit",
                       "--link-latency", "50ms", "--check", "--", sys.executable,
                       ROOT / "tests/workers/latency_checks.py", tmp_path)
    out, _ = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, out
    assert "50 ms one way between workers (round trip 100 ms; NFQUEUE delay line)" in out
    mbit = _best_mbit(out)
    rtt = float(re.search(r"round trip ([\d.]+) ms \(requested 100 ms", out).group(1))
    assert abs(mbit - 50) / 50 < 0.25, out
    assert abs(rtt - 100) / 100 < 0.2, out
    for result in read_worker_json(tmp_path, 2):
        for engine in result.values():  # one message each way: at least one round trip
            assert engine["sum"] == 2.0 and 0.1 <= engine["seconds"] < 1.0, result
    assert _state() <= before, out
    assert set(_delay_lines()) <= set(lines_before), out


@needs_latency
def test_emulated_hosts_share_an_address_and_hierarchical_discovers_them(tmp_path):
    before = _state()
    launcher = _launch("-H", "2x2", "--timeout", 120, "--link-bandwidth", "100mbit",
                       "--link-latency", "5ms", "--check", "--", sys.executable,
                       ROOT / "tests/workers/hosts_checks.py", tmp_path)
    out, _ = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, out
    assert "2 hosts (namespaces) of 2 workers" in out
    assert "link check, worker 0 -> worker 2: " in out  # across the hosts' link
    rtt = float(re.search(r"round trip ([\d.]+) ms \(requested 10 ms", out).group(1))
    assert 8 < rtt < 14, out
    results = read_worker_json(tmp_path, 4)
    for result in results:
        assert result["rank_hosts"] == [0, 0, 1, 1], result
        for name in ("hierarchical", "ring"):  # workers add 1 + 2 + 3 + 4
            assert result[name]["sum_min"] == result[name]["sum_max"] == 10.0, result
    # 4 MB: a ring of 4 sends 2 * 3/4 * 4 MB out of each host, two leaders 2 * 1/2 * 4 MB
    for result in results:
        ring, hierarchical = (result[name]["host_sent_bytes"] for name in ("ring", "hierarchical"))
        assert 4e6 < hierarchical < 4.6e6 and 6e6 < ring < 6.9e6, result
    assert _state() <= before, out


@needs_latency
def test_parameter_servers_get_a_shaped_host_of_their_own(tmp_path):
    before = _state()
    launcher = _launch("-np", 2, "--ps", 1, "--timeout", 120, "--link-bandwidth", "50mbit",
                       "--link-latency", "10ms", "--", sys.executable,
                       ROOT / "tests/workers/async_checks.py", tmp_path, "shaped")
    out, _ = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, out
    assert "2 namespaces and 1 for parameter servers" in out, out
    results = read_worker_json(tmp_path, 2)
    workers = {r["address"] for r in results}
    for r in results:
        server = r["ps"][0].split(":")[0]
        assert server.startswith(netbed.SUBNET_PREFIX) and server not in workers, r
        # Each async step pushes a gradient to the server and pulls the parameters back:
        # at least one 20 ms round trip through the server's delay line.
        assert r["step_seconds"] >= 0.02 and r["stats"]["async_steps"] == 8, r
    assert _state() <= before, out


@needs_netbed
@pytest.mark.parametrize("how, code, latency", [
    ("sigint", 130, []), ("timeout", 124, []),
    pytest.param("sigint", 130, ["--link-latency", "5ms"], marks=needs_latency)])
def test_stopped_shaped_job_leaves_nothing(tmp_path, how, code, latency):
    before, lines_before = _state(), _delay_lines()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    extra = ["--timeout", 4] if how == "timeout" else []
    launcher = _launch("-np", 2, "--grace", 1, "--link-bandwidth", "10mbit", *latency,
                       *extra, sys.executable, script, tmp_path)
    files = _wait_for_pid_files(launcher, tmp_path)
    records = [f.read_text().split() for f in files]
    assert [r[2].split(":")[0].rsplit(".", 1)[1] for r in records] == ["1", "2"]
    assert all(r[2].startswith(netbed.SUBNET_PREFIX + ".") for r in records)
    if how == "sigint":
        launcher.send_signal(signal.SIGINT)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == code, out
    time.sleep(0.2)
    assert [p for r in records for p in r[:2] if _alive(int(p))] == [], out
    assert _state() <= before, out
    assert set(_delay_lines()) <= set(lines_before), out


@needs_latency
def test_killed_launcher_with_delay_lines_is_cleaned(tmp_path):
    before, lines_before = _state(), _delay_lines()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launcher = _launch("-np", 2, "--link-latency", "5ms", sys.executable, script, tmp_path)
    files = _wait_for_pid_files(launcher, tmp_path)
    lines = set(_delay_lines()) - set(lines_before)
    assert len(lines) == 2
    launcher.kill()
    launcher.wait()
    assert all(_alive(p) for p in lines)  # orphaned until the next start cleans them
    assert netjobs.clean_leftovers()
    time.sleep(0.2)
    workers = [int(p) for f in files for p in f.read_text().split()[:2]]
    assert [p for p in [*lines, *workers] if _alive(p)] == []
    assert _state() <= before


@needs_latency
def test_dead_delay_line_stops_the_job_naming_it(tmp_path):
    before, lines_before = _state(), _delay_lines()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launcher = _launch("-np", 2, "--grace", 1, "--link-latency", "5ms", sys.executable,
                       script, tmp_path)
    files = _wait_for_pid_files(launcher, tmp_path)
    lines = sorted(set(_delay_lines()) - set(lines_before))
    os.kill(lines[1], signal.SIGKILL)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 1, out
    assert re.search(r"network test bed: the delay line of worker \d \(pid \d+\) exited "
                     r"with code -9: packets to worker \d are dropped; stopping all workers",
                     out), out
    assert _state() <= before, out


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
        launcher = _launch("-np", 1, "--link-bandwidth", "1mbit", sys.executable, "-c", "")
        out, _ = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, out
        assert "cleaned network test bed(s) left by killed runs: 0dead " in out
        left = _state()
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


@needs_netbed
def test_ucx_engine_crosses_the_shaped_link(tmp_path):
    from tfdist_ext.ops import ucx as ucx_ops  # pylint: disable=import-outside-toplevel

    if ucx_ops.problem() is not None:
        pytest.skip(f"the UCX engine is not built here: {ucx_ops.problem()}")
    launcher = _launch("-np", 2, "--timeout", 120, "--link-bandwidth", "50mbit", "--",
                       sys.executable, ROOT / "tests/workers/shaped_ucx.py", tmp_path)
    out, _ = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, out
    results = read_worker_json(tmp_path, 2)
    # A ring all-reduce of 4 MB on 2 workers sends 4 MB each way: >= 0.67 s at 50 Mbit
    # (shared memory would take milliseconds).
    assert all(r["ucx_tls"] == "tcp" and r["sum"] == 2.0 for r in results), results
    assert all(r["seconds"] > 0.5 for r in results), results


@needs_latency
def test_delays_per_host_pair():
    from tfdist_ext.launch import netcheck  # pylint: disable=import-outside-toplevel

    before, lines_before = _state(), _delay_lines()
    with netbed.NetBed(3, None, latency={(0, 1): 0.02, (1, 2): 0.005}) as bed:
        assert "one way between workers 0:1 20 ms, 1:2 5 ms" in bed.describe()
        assert len(set(_delay_lines()) - set(lines_before)) == 4  # 1: two delays; 0, 2: one
        checks = {(a, b): netcheck.measure(bed, a, b, nbytes=100_000)
                  for a, b in ((0, 1), (2, 1), (0, 2))}
    for (a, b), check in checks.items():
        expected = 2 * {(0, 1): 0.02, (2, 1): 0.005, (0, 2): 0.0}[(a, b)]
        assert check.requested_rtt == pytest.approx(expected)
        assert abs(check.rtt - expected) < 0.2 * expected + 0.002, (a, b, check)
    assert _state() <= before
    assert set(_delay_lines()) <= set(lines_before)


def test_best_rate_is_the_fastest_window_against_a_brute_force_reference():
    from tfdist_ext.launch import netcheck  # pylint: disable=import-outside-toplevel

    rng = __import__("random").Random(7)
    for trial in range(50):
        times = sorted(rng.uniform(0, 3) for _ in range(rng.randint(1, 60)))
        marks, total = [], 0
        for t in times:
            total += rng.randint(1, 10_000)
            marks.append((t, total))
        window = rng.choice([0.1, 0.5, 1.0, 5.0])
        spans = []
        for t2, b2 in marks:  # per end: the shortest span of at least `window` ending there
            starts = [(t1, b1) for t1, b1 in marks if t2 - t1 >= window]
            if starts:
                t1, b1 = starts[-1]
                spans.append((b2 - b1) * 8 / (t2 - t1) / 1e6)
        reference = max(spans) if spans else None
        assert netcheck.best_rate(marks, window) == pytest.approx(reference), trial
    steady = [(0.1 * i, 1000 * i if i < 10 else 1000 * 10 + 5000 * (i - 10)) for i in range(40)]
    assert netcheck.best_rate(steady, 0.5) == pytest.approx(5000 * 8 / 0.1 / 1e6)
    assert netcheck.best_rate(steady[:3], 0.5) is None
