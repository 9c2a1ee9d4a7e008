"""Keras' file-writing callbacks across 2 workers, and exact resume after a kill."""

import json

import keras
import numpy as np
import pytest

from conftest import ROOT, launch, read_worker_json
from tfdist_ext.keras import preemption

pytestmark = [pytest.mark.multiworker, pytest.mark.alone]
CHECKS = ROOT / "tests" / "workers" / "callback_checks.py"


def test_checkpoint_tensorboard_csv_and_backup_write_once(tmp_path):
    code, out, _ = launch(2, [CHECKS, tmp_path, "files"], timeout=240)
    assert code == 0, out[-4000:]
    checkpoints = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert checkpoints == ["ckpt-1.keras", "ckpt-2.keras", "ckpt-3.keras"]
    final = read_worker_json(tmp_path, 2)[0]["weights"]
    model = keras.saving.load_model(tmp_path / "ckpt-3.keras")
    for got, want in zip(model.get_weights(), final):
        np.testing.assert_array_equal(got, np.asarray(want, dtype=got.dtype))
    assert len(list((tmp_path / "logs" / "train").glob("events.out.tfevents.*"))) == 1
    assert len(list((tmp_path / "logs" / "comm").glob("events.out.tfevents.*"))) == 1
    rows = (tmp_path / "log.csv").read_text().strip().splitlines()
    assert rows[0].startswith("epoch,loss") and len(rows) == 4, rows
    rows = (tmp_path / "alone" / "log.csv").read_text().strip().splitlines()
    assert rows[0].startswith("epoch,loss") and len(rows) == 2, rows
    assert not (tmp_path / "backup").exists()  # the chief deleted it at the end


def _weights(directory):
    return [np.asarray(w) for w in read_worker_json(directory, 2)[0]["weights"]]


def _compare(resumed, uninterrupted):
    results = read_worker_json(resumed, 2)
    assert len(results[0]["loss"]) == 2  # epochs 2 and 3 only: it resumed
    assert results[0]["optimizer_iterations"] == read_worker_json(
        uninterrupted, 2)[0]["optimizer_iterations"]
    for got, want in zip(_weights(resumed), _weights(uninterrupted)):
        np.testing.assert_array_equal(got, want)
    assert results[0]["weights"] == results[1]["weights"]


def _uninterrupted(tmp_path, text):
    directory = tmp_path / "uninterrupted"
    directory.mkdir()
    code, out, _ = launch(2, [CHECKS, directory, "resume", -1, text], timeout=240)
    assert code == 0, out[-4000:]
    return directory


def test_killed_top_k_job_restarted_by_hand_resumes_exactly(tmp_path):
    text = json.dumps({"compression": {"name": "topk", "ratio": 0.1}})
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    code, out, _ = launch(2, [CHECKS, resumed, "resume", 2, text], timeout=240)
    assert code != 0 and "SIGKILL" in out, out[-3000:]  # worker 1 killed itself in epoch 2
    backup = resumed / "backup"
    assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 2
    assert (backup / "tfdist-worker0").is_dir() and (backup / "tfdist-worker1").is_dir()
    code, out, _ = launch(2, [CHECKS, resumed, "resume", -1, text], timeout=240)
    assert code == 0, out[-4000:]
    _compare(resumed, _uninterrupted(tmp_path, text))


def test_max_restarts_completes_a_fit_whose_worker_dies_once(tmp_path):
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    code, out, _ = launch(2, [CHECKS, resumed, "resume", 2, "{}"], timeout=240,
                          options=["--max-restarts", "1"])
    assert code == 0, out[-4000:]
    assert "restart 1 of 1: worker 1 was killed by SIGKILL" in out
    _compare(resumed, _uninterrupted(tmp_path, "{}"))


def test_sigterm_stops_every_worker_at_one_step_with_a_backup_to_resume_from(tmp_path):
    code, out, seconds = launch(2, [CHECKS, tmp_path, "preempt", 1, "{}"], timeout=240)
    assert code == 143, out[-4000:]
    assert "[1] WARNING:tfdist_ext:tfdist_ext: received SIGTERM" in out
    # SIGTERM arrived after batch 5 of epoch 1 (13 batches an epoch): agreed after
    # batch 6, read at the next multiple of CHECK_EVERY (8) steps of the fit, step 24.
    assert preemption.CHECK_EVERY == 8
    for worker in (0, 1):
        assert (f"[{worker}] WARNING:tfdist_ext:tfdist_ext: stopped by a preemption request "
                f"in epoch 1 after batch 10, backup in {tmp_path / 'backup'}; exiting with "
                "code 143.") in out
    assert seconds < 90, seconds
    metadata = json.loads((tmp_path / "backup" / "training_metadata.json").read_text())
    assert metadata["epoch"] == 1
    code, out, _ = launch(2, [CHECKS, tmp_path, "resume", -1, "{}"], timeout=240)
    assert code == 0, out[-4000:]
    results = read_worker_json(tmp_path, 2)
    assert len(results[0]["loss"]) == 3  # epochs 1-3: resumed in the interrupted epoch
    assert results[0]["weights"] == results[1]["weights"]
