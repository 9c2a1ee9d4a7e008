"""tfdist-run --link-bandwidth / --link-latency / -H: what crosses the emulated links (the
shaped rate, the delay, emulated hosts, parameter servers, the UCX engine) and the link
check's rate. What is left behind, and the arguments, are in test_netbed_cleanup.py.

Needs root and iproute2 (`ip`, `tc`); the delay tests also need iptables and the
fnfqueue package. Those tests skip otherwise, with the reason.
"""

import re
import sys

import pytest

from conftest import ROOT, read_worker_json
from netbed_jobs import delay_line_pids, launch_job, needs_latency, needs_netbed, bed_objects
from tfdist_ext.launch import netbed

# Every test here may create network namespaces, veth pairs and netfilter queues on
# this machine (named per job, cleaned by the launcher): they run in the suite's last,
# one-at-a-time phase (`quiet`, see tests/run), not beside each other.
pytestmark = [pytest.mark.multiworker, pytest.mark.alone, pytest.mark.quiet]


def _best_mbit(out):
    """The link check's best half second: the mean also counts slow start and loss
    recovery, which a 100 ms round trip on a busy machine stretches."""
    mean, best = re.search(r"measured [\d.]+ MB/s = ([\d.]+) Mbit/s over [\d.]+ MB, "
                           r"best 0.5 s ([\d.]+) Mbit/s", out).groups()
    assert float(mean) <= float(best) * 1.01, out
    return float(best)


@needs_netbed
def test_shaped_link_rate_and_keras_fit(tmp_path):
    before = bed_objects()
    launcher = launch_job("-np", 2, "--timeout", 240, "--link-bandwidth", "50mbit", "--check",
                          "--", sys.executable, ROOT / "tests/workers/multiworker_checks.py",
                          tmp_path, "tfdist")
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, out
    mbit = _best_mbit(out)
    assert abs(mbit - 50) / 50 < 0.25, out
    results = read_worker_json(tmp_path, 2)
    assert all(r["fit"]["ok"] and r["workers"] == 2 for r in results), results
    assert results[0]["fit"]["value"]["sha"] == results[1]["fit"]["value"]["sha"]
    assert bed_objects() <= before, out  # (b) every namespace, link, qdisc and marker gone


@needs_latency
def test_latency_round_trip_rate_and_collectives(tmp_path):
    before, lines_before = bed_objects(), delay_line_pids()
    launcher = launch_job("-np", 2, "--timeout", 120, "--link-bandwidth", "50mbit",
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
    assert bed_objects() <= before, out
    assert set(delay_line_pids()) <= set(lines_before), out


@needs_latency
def test_emulated_hosts_share_an_address_and_hierarchical_discovers_them(tmp_path):
    before = bed_objects()
    launcher = launch_job("-H", "2x2", "--timeout", 120, "--link-bandwidth", "100mbit",
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
    assert bed_objects() <= before, out


@needs_latency
def test_parameter_servers_get_a_shaped_host_of_their_own(tmp_path):
    before = bed_objects()
    launcher = launch_job("-np", 2, "--ps", 1, "--timeout", 120, "--link-bandwidth", "50mbit",
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
    assert bed_objects() <= before, out


@needs_netbed
def test_ucx_engine_crosses_the_shaped_link(tmp_path):
    from tfdist_ext.ops import ucx as ucx_ops  # pylint: disable=import-outside-toplevel

    if ucx_ops.problem() is not None:
        pytest.skip(f"the UCX engine is not built here: {ucx_ops.problem()}")
    launcher = launch_job("-np", 2, "--timeout", 120, "--link-bandwidth", "50mbit", "--",
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

    before, lines_before = bed_objects(), delay_line_pids()
    with netbed.NetBed(3, None, latency={(0, 1): 0.02, (1, 2): 0.005}) as bed:
        assert "one way between workers 0:1 20 ms, 1:2 5 ms" in bed.describe()
        assert len(set(delay_line_pids()) - set(lines_before)) == 4  # 1: two delays; 0, 2: one
        checks = {(a, b): netcheck.measure(bed, a, b, nbytes=100_000)
                  for a, b in ((0, 1), (2, 1), (0, 2))}
    for (a, b), check in checks.items():
        expected = 2 * {(0, 1): 0.02, (2, 1): 0.005, (0, 2): 0.0}[(a, b)]
        assert check.requested_rtt == pytest.approx(expected)
        assert abs(check.rtt - expected) < 0.2 * expected + 0.002, (a, b, check)
    assert bed_objects() <= before
    assert set(delay_line_pids()) <= set(lines_before)


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
