"""Elastic workers that leave without dying: stopped (SIGSTOP), cut off from the
network, or removed as stragglers (`tfdist_ext.elastic.stragglers`).

The SIGTERM departures are in test_elastic.py, beside the uninterrupted job they
are compared with.
"""

import json
import os
import re
import shutil
import signal
import time

import pytest

from conftest import launch
from elastic_jobs import NO_UCX, WORKER, removed_in_time, run_job, started, wait_for, weights_sha


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_stopped_chief_is_removed_and_when_continued_exits_without_writing(tmp_path):
    """SIGSTOP to worker 0 (the chief): the others remove it within 10 s and go on;
    SIGCONT once they have: it finds from its own clock that it stood still, asks the
    members, exits non-zero naming what happened, and the checkpoints stay theirs."""
    out = tmp_path / "stop"
    # The survivors wait 1 s per step while short (at most 8 s): the job still runs
    # when the stopped worker continues.
    env = {"WAIT_REJOIN": "1", "WAIT_REJOIN_SECONDS": "8"}
    with started(out, 0, 10, 2, "mlp", "sigstop", env=env) as job:
        procs, logs = job.procs, job.logs
        wait_for(lambda: "go on (generation" in logs[1].read_text(errors="replace"),
                 procs[1:], logs)
        assert procs[0].poll() is None
        time.sleep(1)
        procs[0].send_signal(signal.SIGCONT)
        continued = time.monotonic()
        code = procs[0].wait(timeout=60)
        took = time.monotonic() - continued
        codes = [code] + [p.wait(timeout=240) for p in procs[1:]]
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes[1:] == [0, 0] and codes[0] not in (0, None), [t[-3000:] for t in texts]
    assert took < 10, (took, texts[0][-3000:])
    assert ("worker 0 did not run for" in texts[0] and "the others removed it and went on "
            "without it as 2 worker(s) [1, 2]" in texts[0]), texts[0][-3000:]
    results = removed_in_time(out, 0, [1, 2])
    assert "worker 1 is now the chief" in texts[1]
    assert weights_sha(out / "ckpt-2.weights.h5") == results[1]["sha"]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_job_frozen_as_a_whole_goes_on_with_every_worker(tmp_path):
    """SIGSTOP to all three workers for 6 s (a paused VM, a host that stalls under load),
    then SIGCONT: nobody was removed, so all go on and end alike. TF's coordination
    service must not take the stall for deaths: once it marked every task in error after
    a 4 s heartbeat timeout, and Keras' next TF collective failed on every worker."""
    out = tmp_path / "freeze"
    with started(out, 0, -1, 3, "mlp", "train", env={"TFDIST_ELASTIC": "1"}) as job:
        procs, logs = job.procs, job.logs
        wait_for((out / "ckpt-1.weights.h5").exists, procs, logs)
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        time.sleep(6)
        for p in procs:
            p.send_signal(signal.SIGCONT)
        codes = [p.wait(timeout=180) for p in procs]
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0, 0], [t[-3000:] for t in texts]
    # The job trains on the UCX engine; TF's collective executor (Keras' model build at a
    # fit's start, a broadcast) would fail from then on had the service aborted it.
    assert not any("heartbeat timeout" in t or "StartAbort" in t for t in texts), \
        [t[-3000:] for t in texts]
    results = [json.loads((out / f"w{i}.json").read_text()) for i in range(3)]
    assert [r["failures"] for r in results] == [[], [], []]
    assert [r["members"] for r in results] == [[0, 1, 2]] * 3
    assert len({r["sha"] for r in results}) == 1
    assert weights_sha(out / "ckpt-3.weights.h5") == results[0]["sha"]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                    reason="network namespaces need root and iproute2")
def test_a_worker_cut_off_from_the_network_is_removed_and_stops_alone(tmp_path):
    """Worker 2 takes its emulated host's link down (tfdist-run --link-bandwidth):
    the two that still reach each other remove it within 10 s and finish; it sees
    the other two silent, is no majority, and exits naming the quorum rule."""
    code, out, _ = launch(3, [WORKER, tmp_path, 2, 10, 2, "mlp", "netcut"], timeout=200,
                          options=["--elastic", "--link-bandwidth", "10gbit"])
    assert code == 0, out[-4000:]
    assert "the job finished without worker(s) [2]" in out, out[-4000:]
    assert ("worker 2 cannot reach worker(s) [0, 1], which did not answer" in out
            and "not a majority" in out), out[-4000:]
    removed_in_time(tmp_path, 2, [0, 1])


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_straggler_is_removed_with_its_times_logged_and_no_step_is_discarded(tmp_path):
    """Elastic(straggler_factor=3, straggler_steps=10); worker 2 sleeps 50 ms before each
    step from batch 5 of every epoch on (the others' busy time is a few ms): after 10
    steps at >= 3x the others' median every member names it with the measured times, it
    leaves after the next step with exit code 0, and the others train every batch and
    end alike. On a busy machine a step before batch 5 can be 3x slow too (its CPU
    taken), so the 10 may begin a few steps before the sleeps do."""
    codes, texts, results = run_job(tmp_path, "straggler", kill_worker=2, kill_step=5,
                                     extra=(3, "mlp", "straggler"))
    assert codes == [0, 0, 0], [t[-3000:] for t in texts]
    for text in texts:
        found = re.search(r"worker 2 is a straggler: busy \[([^]]*)\] s in its last 10 "
                          r"steps against the other members' median \[([^]]*)\] s", text)
        assert found and "it leaves the job after the next step" in text, text[-3000:]
        busy, others = ([float(v) for v in group.split(",")] for group in found.groups())
        assert len(busy) == len(others) == 10
        assert all(b >= 3 * o for b, o in zip(busy, others)), (busy, others)
        assert sorted(busy)[4] >= 0.05, busy  # most of the 10 are the 50 ms sleeps
    assert "worker 2 leaves the job after step" in texts[2] and "(a straggler)" in texts[2]
    assert sorted(results) == [0, 1]
    for r in results.values():
        assert r["failures"] == [] and r["joins"] == [], r
        (left,) = r["leaves"]
        assert left["left"] == [2] and left["members"] == [0, 1]
        assert left["reason"] == "a straggler"
        # Slow from step 6 on: 10 slow steps, measured a step late, then the step that
        # carries its request: step 17 (later on a busy machine, where a slow step of
        # the others can start the count again; as early as 12 when the count began
        # with steps made slow by the machine).
        assert 12 <= left["step"] < 3 * 27, left
        assert r["iterations"] == 3 * 27  # every step ran: none discarded
    assert results[0]["sha"] == results[1]["sha"]
    # Before worker 2 slowed down, nobody was taken for a straggler.
    assert texts[0].count("is a straggler") == 1
