"""A custom training loop under `tfdist-run --elastic`: elastic recovery covers Keras'
`fit`, `evaluate` and `predict`, so a worker's death in the loop stops the survivors,
whose error says why and what to do instead (they used to agree on a new membership at
the loop's next dataset read, announce that they went on, and fail in the next step).
Run with tfdist-run's default replacements: those started before the last survivor
failed are stopped with the job (they used to find no job and start it afresh, and the
launcher could report success)."""

import pytest

from conftest import ROOT, launch
from elastic_jobs import NO_UCX

WORKER = ROOT / "tests" / "workers" / "elastic_custom_loop.py"
WARNING = "tfdist_ext: elastic training: strategy.run outside Keras' fit, evaluate and predict"


@NO_UCX
@pytest.mark.multiworker
def test_a_death_in_a_custom_loop_stops_the_survivors_saying_why():
    code, out, seconds = launch(3, [WORKER, 5], options=["--elastic"], timeout=200)
    assert code == 1, out[-4000:]
    assert ("have not rejoined, and there is no job left to rejoin (--elastic); the job "
            "failed") in out, out[-4000:]
    assert "custom loop done" not in out, out[-4000:]
    lines = out.splitlines()
    for worker in range(3):
        own = [line for line in lines if line.startswith(f"[{worker}] ")]
        warned = [i for i, line in enumerate(own) if WARNING in line]
        # Once, in the loop: the fit before it did not warn.
        assert len(warned) == 1 and warned[0] > own.index(f"[{worker}] fit done"), out[-4000:]
    for worker in (0, 1):
        own = "\n".join(line for line in lines if line.startswith(f"[{worker}] "))
        assert ("Aborting the collectives in flight (elastic training). This worker is "
                "outside Keras' fit, evaluate and predict. The survivors of a death go on "
                "inside Keras' fit, evaluate and predict only; a worker's death in a custom "
                "training loop stops the job. To survive deaths, train with model.fit "
                "(override Model.train_step for a custom step), or run without elastic and "
                "restart the whole job from a checkpoint") in own, out[-4000:]
        assert "discarded" not in own and "custom loop done" not in own, out[-4000:]
    assert seconds < 150, out[-4000:]
