"""ZeRO stage 1 across worker processes equals one process (issue 49)."""

import pytest

from conftest import ROOT, launch, read_worker_json

pytestmark = pytest.mark.multiworker


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_shard_the_state_and_train_100_steps_like_one_process(tmp_path, workers):
    code, out, _ = launch(workers, [ROOT / "tests" / "workers" / "zero_fit.py", tmp_path],
                          timeout=300)
    assert code == 0, out[-3000:]
    records = read_worker_json(tmp_path, workers)
    shard = -(-829 // workers)
    for name in ("sgd_momentum", "adam", "adamw"):
        assert len({r[name]["sha"] for r in records}) == 1, f"{name}: workers differ"
        for worker, r in enumerate(records):
            one = r[name]["one_process"]
            assert r[name]["losses"] == pytest.approx(one, rel=1e-5), (name, worker)
            assert r[name]["weights_off"] < 1e-4, (name, worker, r[name]["weights_off"])
            # 829 weights (odd: uneven shards at 2 and 3 workers): each worker holds the
            # state of its shard only.
            slots = r[name]["unsharded_state_bytes"] // (829 * 4)
            assert r[name]["state_bytes"] == {str(worker): slots * shard * 4}, (name, worker)
