"""bench/time_to_accuracy.py end to end: 2 workers on 127.0.0.1, one epoch per config."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.multiworker
SCRIPT = ROOT / "bench" / "time_to_accuracy.py"


def test_time_to_accuracy_records_and_summary(tmp_path):
    out = tmp_path / "tta.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--link", "none", "--workers", "2", "--models", "cnn",
         "--configs", "sync,fp16", "--epochs", "1", "--timeout", "240", "--json", str(out),
         "--png", str(tmp_path / "tta.png")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    records = data["records"]
    assert [(r["model"], r["config"], r["epoch"]) for r in records] == [
        ("cnn", "sync", 1), ("cnn", "fp16", 1)]
    for r in records:
        assert r["workers"] == 2 and r["link"] == "none"
        assert r["seconds"] > 0 and 0.0 <= r["test_accuracy"] <= 1.0
    sync, fp16 = records
    assert sync["bytes_sent"] > 0
    assert fp16["bytes_sent"] == pytest.approx(sync["bytes_sent"] / 2, rel=0.05)
    summary = {s["config"]: s for s in data["summary"]}
    assert summary["sync"]["target_accuracy"] == pytest.approx(sync["test_accuracy"] - 0.01)
    assert summary["sync"]["time_to_target"] == sync["seconds"]
    assert summary["sync"]["x_sooner"] == 1.0
    assert (tmp_path / "tta.png").stat().st_size > 0
    assert "x sooner" in result.stdout


def test_unknown_config_is_refused():
    result = subprocess.run([sys.executable, str(SCRIPT), "--configs", "sync,bogus"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert result.returncode == 2
    assert "unknown config 'bogus'" in result.stderr
