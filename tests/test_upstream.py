"""Keras' and TensorFlow's own strategy tests pass with tfdist_ext.Strategy (issue 47).

tests/upstream/run.py runs them from the installed packages with our strategy
and with MirroredStrategy (the control) in separate pytest processes; every
test the control passes must pass with ours or be on run.py's SKIPPED list
with its reason.
"""

import json
import subprocess
import sys

from conftest import ROOT


def test_upstream_strategy_tests_pass_where_mirrored_strategy_passes(tmp_path):
    report = tmp_path / "upstream.json"
    done = subprocess.run([sys.executable, ROOT / "tests" / "upstream" / "run.py",
                           "--json", report], cwd=ROOT, capture_output=True, text=True,
                          timeout=1500, check=False)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(report.read_text())
    assert summary["regressions"] == [], done.stdout[-3000:]
    assert done.returncode == 0, done.stdout[-3000:]
    counts = summary["counts"]
    # The files ran, and the gradient-accumulation case (issue 47) among them.
    assert counts["optimizer_distribute_test.py"]["tfdist_passed"] >= 9
    assert counts["tf_strategy_lib_test.py"]["tfdist_passed"] >= 29
    assert counts["tf_mirrored_semantics_test.py"]["tfdist_passed"] >= 22
    assert summary["tfdist"][
        "optimizer_distribute_test.py::OptimizerDistributeTest::test_gradient_accumulation"
    ] == "passed"
    for skipped in summary["skipped"]:
        assert summary["mirrored"].get(skipped) == "passed", skipped  # still needed


def test_a_hung_or_crashed_upstream_test_is_recorded_and_the_rest_still_run(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "upstream"))
    try:
        import run as upstream  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    tests = tmp_path / "harness_test.py"
    tests.write_text(
        "import atexit, os, time\n"
        "atexit.register(time.sleep, 12)\n"  # a slow exit is not a hang: no test runs
        "def test_a():\n    pass\n"
        "def test_b_hangs():\n    time.sleep(600)\n"
        "def test_c():\n    assert False\n"
        "def test_d_crashes():\n    os.abort()\n"
        "def test_e():\n    pass\n")
    outcomes = upstream.run("mirrored", [(str(tests), None)], timeout=240, stall=8)
    assert outcomes == {
        "harness_test.py::::test_a": "passed", "harness_test.py::::test_b_hangs": "hung",
        "harness_test.py::::test_c": "failed", "harness_test.py::::test_d_crashes": "crashed",
        "harness_test.py::::test_e": "passed"}
