"""Both engines across worker processes (tfdist-run, TF_CONFIG; gRPC or UCX).

One launch per world size checks every algorithm x dtype x size x SUM/MEAN
against numpy (tests/workers/engine_checks.py); the 2-worker launch also runs
Keras `fit` with each algorithm and "auto" and compares the weights with
"native", and checks that "auto"'s refinement gives every worker the chief's
timings and choices. A last launch checks the shared-memory results' room
(tests/workers/shared_results.py).
"""

import numpy as np
import pytest

from conftest import ROOT, launch, read_worker_json
from tfdist_ext import collectives

pytestmark = pytest.mark.multiworker
CHECKS = ROOT / "tests" / "workers" / "engine_checks.py"


# The graph engine executes the same schedules as the UCX engine: it is checked at 3
# workers here. UCX worker processes of one machine sum buffers of 64 KB and more
# through shared memory whatever the algorithm: checked at 3 workers here. UCX's schedules run across
# processes in the fit test below (every algorithm against native, shared memory
# refused by one worker), and at 3 and 5 replicas over UCX in one process
# (tests/collectives/test_engine_replicas.py, "ucx-schedules"); CI time.
@pytest.mark.parametrize("engine,num_workers", [("tf", 3), ("ucx", 3)])
def test_every_algorithm_reduces_across_workers(tmp_path, engine, num_workers):
    code, out, _ = launch(num_workers, [CHECKS, tmp_path, "--engine", engine], timeout=240)
    assert code == 0, out[-3000:]
    results = read_worker_json(tmp_path, num_workers)
    for r in results:  # IndexedSlices: gathered on the engine, TF's all-gather with "tf"
        assert r["sparse"] == {"problems": [], "on_engine": engine == "ucx",
                               "tf_gather": engine == "tf"}, r["sparse"]
    for name in collectives.ALGORITHMS.names() + ["hierarchical"]:
        per_worker = [r["reduce"][name] for r in results]
        for result in per_worker:
            assert result["problems"] == [], (name, result)
            assert result["collectives"] > 0, name
            summed, total = result["host_sums"]
            # One machine: a registered algorithm's buffers of 64 KB and more sum
            # through shared memory, smaller ones run the schedule; "hierarchical"
            # with a given host layout always runs its schedule.
            if engine == "ucx" and name != "hierarchical":
                assert 0 < summed < total, (name, result["host_sums"])
            else:
                assert summed == 0, (name, result["host_sums"])
        assert len({r["sha"] for r in per_worker}) == 1, f"{name}: workers differ"
    if engine == "ucx":  # worker 0 sums 262144 float32 elements, the others 262145
        for r in results:
            assert r["disagree"]["on_host"], r["disagree"]
            assert "the ranks disagree on the all-reduce: rank " in r["disagree"]["error"], \
                r["disagree"]
        assert "rank 1 sums 262145 float32 elements, this rank 262144 float32" in \
            results[0]["disagree"]["error"], results[0]
        # The elastic state broadcast: complex parts, uint64 and top bits bit for bit.
        assert [r["state"] for r in results] == [[]] * num_workers, results


@pytest.mark.parametrize("engine", ["ucx"])
def test_fit_with_every_algorithm_ends_where_native_ends_and_auto_refines_alike(tmp_path, engine):
    code, out, _ = launch(2, [CHECKS, tmp_path, "--fit", "--engine", engine], timeout=240)
    assert code == 0, out[-3000:]
    results = read_worker_json(tmp_path, 2)
    native = results[0]["fit"]["native"]
    assert native["loss"][-1] < native["loss"][0]
    for name in collectives.ALGORITHMS.names() + ["auto"]:
        assert len({r["fit"][name]["sha"] for r in results}) == 1, name
        np.testing.assert_allclose(results[0]["fit"][name]["weights"], native["weights"],
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    # Every worker took the chief's timings, hence the same choices ("seconds"
    # is each worker's own time spent timing).
    def agreed(decisions):
        return [{k: v for k, v in d.items() if k != "seconds"} for d in decisions]

    assert agreed(results[0]["fit"]["auto"]["refinements"]) == agreed(
        results[1]["fit"]["auto"]["refinements"])
    for r in results:
        assert [r["fit"][name]["on_host"] for name in collectives.ALGORITHMS.names()] == \
            [False] * len(collectives.ALGORITHMS.names())
    for r in results:
        assert r["refine"]["problems"] == [], r["refine"]
        assert [d["source"] for d in r["refine"]["decisions"]] == ["timed", "timed"]
    assert agreed(results[0]["refine"]["decisions"]) == agreed(results[1]["refine"]["decisions"])


def test_shared_memory_results_fall_back_when_full_and_survive_an_in_place_consumer(tmp_path):
    code, out, _ = launch(2, [ROOT / "tests" / "workers" / "shared_results.py", tmp_path],
                          timeout=240)
    assert code == 0, out[-3000:]
    mb = 1 << 20
    for r in read_worker_json(tmp_path, 2):
        assert r["on_host"] and r["wrong"] == [], r
        # Room for two 2 MB results: the third goes to private tensors, a freed
        # block's room takes the fourth, and nothing stays held once all are freed.
        assert r["held"] == {"two_results": 4 * mb, "a_third_that_does_not_fit": 4 * mb,
                             "first_freed": 2 * mb, "a_fourth_in_its_room": 4 * mb,
                             "all_freed": 0}, r
