"""Elastic training in a script of several fits: a replacement runs the script from the
start, so it joins in the fit the members run, or is refused and not started again (also
when the script evaluates before its first fit).
The refusal's parts (the request's fit, the leader's answer) are in test_membership.py.
"""

import json

import pytest

from conftest import ROOT, launch
from elastic_jobs import NO_UCX

WORKER = ROOT / "tests" / "workers" / "elastic_two_fits.py"


@NO_UCX
@pytest.mark.multiworker
# A replacement that joins is `alone` as the other rejoin tests: among tests/run's second
# phase's jobs a member once found it dead after its admission (its store silent for 12 s)
# and the launcher started a second one.
@pytest.mark.parametrize("kill_fit, first", [pytest.param(1, "fit", marks=pytest.mark.alone),
                                             (2, "fit"), (1, "evaluate-first")])
def test_a_replacement_joins_in_the_members_fit_or_is_refused_naming_why(tmp_path, kill_fit,
                                                                         first):
    # "evaluate-first": the script evaluates the untrained model before its first fit (a
    # baseline), which a replacement cannot run without members.
    code, out, _ = launch(3, [WORKER, tmp_path, kill_fit, 5]
                          + ([first] if first != "fit" else []),
                          options=["--elastic"], timeout=240)
    assert code == 0, out[-4000:]
    assert out.count("worker 1 starts again in 2 s and rejoins") == 1, out[-4000:]
    results = {i: json.loads((tmp_path / f"w{i}.json").read_text())
               for i in range(3) if (tmp_path / f"w{i}.json").exists()}
    if (kill_fit, first) == (1, "fit"):  # it joins the first fit, runs the second with them
        assert sorted(results) == [0, 1, 2], out[-4000:]
        assert [j["joined"] for j in results[0]["joins"]] == [[1]]
        assert all(r["members"] == [0, 1, 2] for r in results.values())
    else:
        why = (" and asked to join in fit 1 of its script (a replacement runs the script "
               "from the start), but the running job is in fit 2: a replacement joins only in "
               "the fit the members run." if kill_fit == 2 else
               ", but its script runs evaluate or predict before a fit (a replacement runs "
               "the script from the start and joins at a training step of the members' fit): "
               "it cannot join.")
        assert f"worker 1 replaces a dead worker{why}" in out, out[-4000:]
        assert "exited with code 76 (too late to rejoin: not started again)" in out
        assert "the job finished without worker(s) [1], which died (--elastic)." in out
        assert sorted(results) == [0, 2], out[-4000:]
        assert all(r["members"] == [0, 2] and r["joins"] == [] for r in results.values())
    assert len({r["sha"] for r in results.values()}) == 1
    # The second fit's Adam counts its 2 epochs of 24 batches, but for the step the
    # death failed (discarded) when it came in that fit.
    assert all(r["iterations"] == 48 - (kill_fit == 2) and len(r["loss"]) == 2
               for r in results.values())
