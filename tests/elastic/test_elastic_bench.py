"""bench/elastic.py in tiny runs, to keep it working (not timings)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from elastic_jobs import NO_UCX
from tfdist_ext.elastic.options import REPLACEMENT_DELAY_SECONDS


def _bench(tmp_path, *args, timeout=300):
    """bench/elastic.py's report (JSON, and a PNG checked to exist) of a run with `args`."""
    out = tmp_path / "elastic.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "elastic.py"), *args, "--json", str(out),
         "--png", str(tmp_path / "elastic.png")], capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "elastic.png").stat().st_size > 1000
    return json.loads(out.read_text())

@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_benchmark_reports_each_failure(tmp_path):
    report = _bench(tmp_path, "--workers", "2", "--kill", "1@5", "--epochs", "1")
    (failure,) = report["failures"]
    assert failure["dead"] == [1] and failure["step"] == 5 and failure["members"] == [0]
    assert 0 < failure["seconds_to_go_on"] < 10 and failure["steps_lost"] == {"0": 1}
    assert report["with_failures"]["survivors"] == [0]
    assert abs(report["accuracy_points_vs_uninterrupted"]) < 100
    assert len(report["curves"]["with_failures"]) == len(report["curves"]["uninterrupted"])


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_benchmark_random_killer_reports_the_time_to_full_size(tmp_path):
    # The kill comes about 2 s after both fits began; 60 epochs (about 40 s of fit on this
    # machine) leave the replacement, started 2 s later, time to start up and join. The
    # workers and the replacement are forked from a preload template (`--preload`).
    report = _bench(tmp_path, "--workers", "2", "--mtbf", "2", "--failures", "1", "--epochs",
                    "60", "--preload", "tensorflow,keras", timeout=600)
    (failure,) = report["failures"]
    assert report["kills_without_failure"] == []
    (victim,) = failure["dead"]
    assert failure["members"] == [1 - victim]
    assert 0 < failure["seconds_to_go_on"] < 10
    # The replacement starts 2 s after the kill and is taken in after a step.
    assert REPLACEMENT_DELAY_SECONDS < failure["seconds_to_full_size"] < 120, failure
    assert report["with_failures"]["members"] == [1 - victim, victim]
    assert report["mean_steps_lost"] >= 1
    # Goodput: the kept steps over what the uninterrupted job ran in the same time.
    assert report["identical_weights"] is True
    assert report["steps_lost_total"] == sum(f["steps_lost"]["0"] for f in report["failures"])
    kept = 1 - report["steps_lost_total"] / report["steps_total"]
    assert report["goodput"] == pytest.approx(kept * report["uninterrupted"]["seconds"]
                                              / report["with_failures"]["seconds"])
    assert 0 < report["goodput"] < 2 and report["step_rates"]["with_failures"]
    assert 0 < report["goodput_own_pace"] < 2 and 0 < report["own_pace_step_seconds"] < 1
    # The members' pause at the replacement's admission, beyond a typical step.
    (pause,) = report["admission_pauses"]
    assert 0 < pause < 30 and 0 < report["median_step_seconds"] < 1
    parts = report["admission_pause_parts"]  # the members' own account of it
    assert set(parts) == {"admit", "state", "step"} and all(v > 0 for v in parts.values())


def test_benchmark_refuses_a_kill_that_leaves_nobody():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "elastic.py"), "--workers",
                             "2", "--kill", "0@1,1@2"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 2 and "at least one worker must survive" in result.stderr
