"""Elastic training: deaths while a replacement joins (during its rehearsal, its
admission, the new communicators' wire-up or the state broadcast) and a stop carried by
the step that admits it. The launcher's 3-worker jobs of tests/workers/elastic_fit.py.
"""

import json
import re

import pytest

from conftest import launch
from elastic_jobs import NO_UCX, WORKER


def _death_during_admission(tmp_path, phase, dies, timeout, killed=2):
    """The launcher's 3-worker job in which worker `killed` dies at step 10 and, while its
    replacement is admitted, worker `dies` dies as PHASE says (tests/workers/elastic_fit.py):
    every worker's result, once the job ended well with each dead worker started again
    once, identical weights, and the replacement still its first process."""
    code, out, _ = launch(3, [WORKER, tmp_path, killed, 10, 4, "mlp", phase],
                          options=["--elastic"], timeout=timeout, extra_env={"WAIT_REJOIN": "1"})
    (tmp_path / "launcher.txt").write_text(out)  # the whole story; the messages keep its end
    assert code == 0, out[-4000:]
    assert out.count(f"worker {killed} starts again") == 1, out[-4000:]
    assert out.count(f"worker {dies} starts again") == 1, out[-4000:]
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(3)]
    assert len({r["sha"] for r in results}) == 1
    assert results[killed]["pid_start"] == results[killed]["pid_end"]
    return results


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_member_dying_while_a_replacement_joins_leaves_the_replacement_running(tmp_path):
    # Worker 2 dies at step 10 and is started again; worker 1 dies once it has admitted
    # it and wired up with it, before the state broadcast. Worker 0 and the replacement
    # agree without it (the replacement is a member by then) instead of the replacement
    # failing too (it used to exit with the broadcast's error and be started again).
    results = _death_during_admission(tmp_path, "admission", 1, timeout=240)
    assert [f["dead"] for f in results[2]["failures"]] == [[1]], results[2]["failures"]
    assert [f["dead"] for f in results[0]["failures"]] == [[2], [1]], results[0]["failures"]
    assert results[0]["members"] == [0, 1, 2]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_member_dying_while_a_replacement_rehearses_leaves_the_replacement_running(
        tmp_path):
    # Worker 2 dies at step 10 and is started again; worker 1 dies while that replacement
    # runs its rehearsed step, before it asks to join. Not yet a member, the replacement
    # must neither take part in the survivors' agreement nor fail its rehearsal (its
    # watcher aborted the rehearsal's communicators, Keras' metric reset then failed and it
    # agreed as a member: left out of the survivors' membership, it exited).
    results = _death_during_admission(tmp_path, "rehearsal", 1, timeout=240)
    assert results[2]["failures"] == [], results[2]["failures"]
    assert [f["dead"] for f in results[0]["failures"]] == [[2], [1]], results[0]["failures"]
    # Worker 2 traced for [0, 1, 2]; if it heard of worker 1's death before it asked, it
    # traced again for [0, 2] (`Recovery.look_again`). Worker 1's replacement, started 2 s
    # after its death, may ask first. Worker 2 traces at its admission only if it joins
    # other members than it traced for last. Either way both end at their index's rank.
    text = (tmp_path / "launcher.txt").read_text()
    assert results[2]["rehearsed"] in ([0, 1, 2], [0, 2]), results[2]
    assert (results[2]["rehearsed"] == [0, 2]) == ("worker 2 traced its step for members "
                                                   "[0, 1, 2], but the job now" in text)
    assert results[0]["members"] == [0, 1, 2], results[0]["members"]
    joined_with = [0, 2] if results[0]["joins"][0]["joined"] == [2] else [0, 1, 2]
    assert (results[2]["rehearsed"] != joined_with) == bool(re.search(
        r"worker 2 traced its step for members \[[0-9, ]*\] but joined", text)), text[-4000:]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_the_leader_dying_while_a_replacement_joins_costs_seconds_not_the_recover_timeout(
        tmp_path):
    # Worker 2 dies at step 10 and is started again; worker 0, whose store the admitted
    # replacement wires up in, dies before that wire-up. The replacement's wire-up is
    # refused: it agrees with worker 1 as a member (it used to crash, and worker 1, which
    # had found it alive, waited out Elastic.recover_seconds, 60 s, for its report).
    results = _death_during_admission(tmp_path, "admission-leader", 0, timeout=300)
    assert [f["dead"] for f in results[2]["failures"]] == [[0]], results[2]["failures"]
    assert [f["dead"] for f in results[1]["failures"]] == [[2], [0]], results[1]["failures"]
    killed = float((tmp_path / "leader_killed.txt").read_text())
    for worker in (1, 2):
        assert results[worker]["failures"][-1]["time"] - killed < 10, results[worker]
    assert results[1]["members"] == [1, 0, 2]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_replacement_ranked_first_after_the_chiefs_death_does_not_give_its_state(tmp_path):
    # Worker 1 dies at step 10; its replacement is admitted at rank 1 of [0, 1, 2], and the
    # chief dies before the state broadcast. Of the survivors [1, 2] the replacement is
    # rank 0, but it holds no trained state: the state must come from worker 2. (It came
    # from rank 0: every worker ended identical, with the replacement's fresh variables,
    # and the optimizer's step count set back to the replacement's.)
    results = _death_during_admission(tmp_path, "admission-leader", 0, timeout=300, killed=1)
    recovery = results[1]["failures"][-1]
    assert recovery["dead"] == [0] and recovery["members"][:2] == [1, 2], recovery
    assert recovery["source"] == 2, recovery
    assert results[2]["failures"][-1]["source"] == 2, results[2]["failures"]
    # Every global batch trained once (4 epochs of 27 steps); the replacement's own count,
    # had its state been taken, is short of it by the steps it never ran.
    assert [r["iterations"] for r in results] == [4 * 27] * 3, results


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_stop_carried_with_a_join_request_leaves_after_the_admission(tmp_path):
    # Worker 2 dies at step 10 and is started again; the chief sends itself SIGTERM
    # before the step that carries the replacement's join request, so one step carries
    # both. The members admit the replacement, then the chief leaves after the next step,
    # which the replacement runs too (the members used to ask the replacement whether it
    # left, wait 60 s for an answer it never gives, and fail their fit).
    code, out, _ = launch(3, [WORKER, tmp_path, 2, 10, 4, "mlp", "sigterm-join"],
                          options=["--elastic"], timeout=240,
                          extra_env={"WAIT_REJOIN": "1", "WAIT_REJOIN_SECONDS": "40"})
    (tmp_path / "launcher.txt").write_text(out)
    assert code == 0, out[-4000:]
    assert out.count("worker 2 starts again") == 1 and "worker 0 starts again" not in out, \
        out[-4000:]
    assert "received SIGTERM; this worker leaves the job" in out, out[-4000:]
    signalled = float((tmp_path / "sigterm.txt").read_text())
    assert not (tmp_path / "w0.json").exists()  # it left
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in (1, 2)]
    (admission,) = results[0]["joins"]
    (left,) = results[0]["leaves"]
    assert admission["joined"] == [2] and admission["members"] == [0, 1, 2], admission
    assert left["left"] == [0] and left["members"] == [1, 2], left
    assert left["step"] == admission["step"] + 1, (admission, left)
    assert left["time"] - signalled < 10, (left, signalled)
    assert results[1]["leaves"] == [dict(left, time=results[1]["leaves"][0]["time"])]
    assert len({r["sha"] for r in results}) == 1
    assert results[0]["iterations"] == results[1]["iterations"] == 4 * 27
