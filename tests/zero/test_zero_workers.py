"""ZeRO stages 1 and 2 across worker processes equal one process (issue 49)."""

import itertools
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, launch, read_worker_json
from tfdist_ext.zero import Partition

pytestmark = pytest.mark.multiworker


@pytest.mark.parametrize("workers,stage", [(2, 1), (3, 2)])
def test_workers_shard_the_state_and_train_100_steps_like_one_process(tmp_path, workers,
                                                                     stage):
    code, out, _ = launch(workers, [ROOT / "tests" / "workers" / "zero_fit.py", tmp_path,
                                    stage], timeout=300)
    assert code == 0, out[-3000:]
    records = read_worker_json(tmp_path, workers)
    shard = Partition.of([660, 33, 132, 4], workers).shard  # a block of each weight
    for name in ("sgd_momentum", "adam", "adamw", "sgd_global_clipnorm", "adam_accumulate"):
        # Identical weights everywhere, so worker 0's distance from one process is each's.
        assert len({r[name]["sha"] for r in records}) == 1, f"{name}: workers differ"
        one = records[0][name]["one_process"]
        assert records[0][name]["weights_off"] < 1e-4, (name, records[0][name]["weights_off"])
        # 829 weights (odd: uneven shards at 2 and 3 workers): each worker holds the
        # state of its shard only.
        slots = records[0][name]["unsharded_state_bytes"] // (829 * 4)
        assert slots >= 1, name
        for worker, r in enumerate(records):
            assert r[name]["losses"] == pytest.approx(one, rel=1e-5), (name, worker)
            assert r[name]["state_bytes"] == {str(worker): slots * shard * 4}, (name, worker)
    for r in records:  # embeddings (densified gradients) across workers, SGD
        assert r["embedding"] == pytest.approx(records[0]["embedding_one_process"], rel=1e-5)


def test_a_checkpoint_written_at_4_workers_resumes_at_2_and_in_plain_keras(tmp_path):
    """Issue 49: the next steps' losses after a ZeRO checkpoint (ModelCheckpoint and
    BackupAndRestore, written at 4 workers with zero_stage=2) are those of going on
    at 4, whether resumed at 4, at 2 workers (zero_stage=1) or in one plain Keras
    process."""
    script = ROOT / "tests" / "workers" / "zero_resume.py"
    for workers, mode in ((4, "save"), (2, "resume")):
        code, out, _ = launch(workers, [script, mode, tmp_path], timeout=300)
        assert code == 0, out[-3000:]
        if mode == "save":
            for name, copy in itertools.product(("adam", "sgd_momentum"), ("resume", "plain")):
                shutil.copytree(tmp_path / f"{name}-backup", tmp_path / f"{name}-backup-{copy}")
    plain = subprocess.run([sys.executable, str(script), "plain", str(tmp_path)],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert plain.returncode == 0, plain.stderr[-3000:]
    saved = read_worker_json(tmp_path, 4, "save-w{worker}.json")
    resumed = read_worker_json(tmp_path, 2, "resume-w{worker}.json")
    one = read_worker_json(tmp_path, 1, "plain-w{worker}.json")[0]
    for name in ("adam", "sgd_momentum"):
        going_on = saved[0][f"{name}/continued"]
        assert len(going_on["losses"]) == 10
        runs = ([r[f"{name}/resumed"] for r in saved + resumed] + [one[f"{name}/resumed"]]
                + [r[f"{name}/backup"] for r in resumed] + [one[f"{name}/backup"]])
        for run in runs:
            assert run["losses"] == pytest.approx(going_on["losses"], rel=1e-5), name
        for run in runs[:7]:
            assert run["weights"] == pytest.approx(going_on["weights"], rel=1e-5), name
