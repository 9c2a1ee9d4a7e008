"""Workers forked from a preload template behave as executed ones (`tfdist_ext.launch.preload`).

Plain Python workers (no TensorFlow): the template preloads `colorsys`, a module no
fresh Python imports, so each worker can say whether it was forked. The multi-worker
TensorFlow tests run forked in tests/run's launching and `alone` phases (TFDIST_PRELOAD),
and executed in its `quiet` phase, one elastic case and the tests/compat smoke set.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tfdist_ext.launch import preload

ROOT = pathlib.Path(__file__).resolve().parent.parent

PROBE = """
import atexit, json, os, sys
import numpy as np
seen = {"preloaded": "colorsys" in sys.modules, "argv": sys.argv, "path0": sys.path[0],
        "name": __name__, "main_file": sys.modules["__main__"].__file__,
        "stdin": sys.stdin.read(), "own_group": os.getpgid(0) == os.getpid(),
        "cwd": os.getcwd(), "task": json.loads(os.environ["TF_CONFIG"])["task"]["index"],
        "extra": os.environ.get("PROBE_EXTRA"), "restart": os.environ["TFDIST_RESTART"]}
draws = [int(x) for x in np.random.randint(0, 2**31, size=4)]
atexit.register(lambda: print("atexit ran", sys.argv[0], flush=True))
print("probe", json.dumps(seen, sort_keys=True), flush=True)
print("draws", draws, flush=True)
mode = sys.argv[1]
if mode == "message":
    sys.exit("a message for stderr")
if mode == "raise":
    raise RuntimeError("boom from the probe")
if mode == "code":
    sys.exit(7)
if mode == "hook":
    sys.excepthook = lambda kind, value, frames: print("the script's hook:", value)
    raise ValueError("for the hook")
if mode == "interrupt":
    raise KeyboardInterrupt
"""


def _launch(tmp_path, modules, command, env=None, workers=1):
    return subprocess.run(
        [sys.executable, "-m", "tfdist_ext.launch", "-np", str(workers), "--output", "all",
         *(("--preload", modules) if modules is not None else ()), *command],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        env=dict(os.environ, PYTHONPATH=str(ROOT), PROBE_EXTRA="x", **(env or {})))


def _seen(out):
    return [json.loads(line.split("probe ", 1)[1]) for line in out.splitlines()
            if " probe {" in line]


@pytest.mark.parametrize("form", ["script", "module"])
@pytest.mark.parametrize("mode, code, says", [
    ("ok", 0, None), ("message", 1, "a message for stderr"),
    ("raise", 1, "RuntimeError: boom from the probe"), ("code", 7, None),
    ("hook", 1, "the script's hook: for the hook"), ("interrupt", 130, "KeyboardInterrupt")])
def test_a_forked_worker_sees_and_exits_as_an_executed_one(tmp_path, form, mode, code, says):
    (tmp_path / "probe.py").write_text(PROBE)
    command = ([sys.executable, "probe.py", mode] if form == "script"
               else [sys.executable, "-m", "probe", mode])
    workers = 2 if code == 0 else 1  # a failure stops the other worker wherever it is
    results, shutdowns = {}, {}
    for modules in ("", "colorsys"):
        result = _launch(tmp_path, modules, command, workers=workers)
        out = result.stdout + result.stderr
        assert result.returncode == code, out
        assert out.count("atexit ran") == workers, out
        if says:
            assert says in out
        if mode == "raise" and form == "script":  # the traceback starts at the script
            assert ('[0] Traceback (most recent call last):\n[0]   File "'
                    + str(tmp_path)) in out, out
        seen = _seen(out)
        assert sorted(s["task"] for s in seen) == list(range(workers)), out
        results[modules] = seen
        shutdowns[modules] = sorted(line for line in out.splitlines() if "atexit ran" in line)
    assert shutdowns[""] == shutdowns["colorsys"]  # argv[0] kept to the end
    executed, forked = results[""], results["colorsys"]
    assert {s["preloaded"] for s in executed} == {False}
    assert {s["preloaded"] for s in forked} == {True}
    for a, b in zip(sorted(executed, key=lambda s: s["task"]),
                    sorted(forked, key=lambda s: s["task"])):
        assert {**a, "preloaded": None} == {**b, "preloaded": None}
    assert forked[0]["own_group"] and forked[0]["stdin"] == "" and forked[0]["extra"] == "x"


def test_forked_workers_draw_their_own_unseeded_random_numbers(tmp_path):
    """NumPy's global generator, imported by the template, is seeded anew in each worker."""
    (tmp_path / "probe.py").write_text(PROBE)
    result = _launch(tmp_path, "colorsys,numpy.random", [sys.executable, "probe.py", "ok"],
                     workers=3)
    assert [s["preloaded"] for s in _seen(result.stdout)] == [True] * 3, result.stdout
    draws = [line.split("draws ", 1)[1] for line in result.stdout.splitlines()
             if " draws [" in line]
    assert len(draws) == 3 and len(set(draws)) == 3, result.stdout


def test_the_environment_variable_turns_it_on_and_other_commands_are_executed(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    result = _launch(tmp_path, None, [sys.executable, "probe.py", "ok"],
                     env={preload.VARIABLE: "colorsys"})
    assert [s["preloaded"] for s in _seen(result.stdout)] == [True], result.stdout
    show = "import sys; print('preloaded', 'colorsys' in sys.modules)"
    result = _launch(tmp_path, "colorsys", [sys.executable, "-c", show])
    assert "[0] preloaded False" in result.stdout, result.stdout


def test_a_module_that_fails_to_import_is_reported_and_workers_are_executed(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    result = _launch(tmp_path, "colorsys,no_such_module_here", [sys.executable, "probe.py",
                                                                "ok"], workers=2)
    assert result.returncode == 0, result.stdout
    assert "preloading colorsys,no_such_module_here failed" in result.stdout
    assert "No module named 'no_such_module_here'" in result.stdout
    assert "starting workers without --preload." in result.stdout
    assert [s["preloaded"] for s in _seen(result.stdout)] == [False, False]


def test_a_virtual_environment_of_the_same_python_is_another_interpreter(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").write_text(f"home = {pathlib.Path(sys.executable).parent}\n")
    (tmp_path / "train.py").write_text("")
    assert preload.python_arguments([str(venv / "bin" / "python"),
                                     str(tmp_path / "train.py")]) is None
    with pytest.raises(ValueError, match="pid must be positive, not 0"):
        preload.ForkedProcess(0, None)


@pytest.mark.parametrize("command, expected", [
    ([sys.executable, "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    ([sys.executable, "-u", "-m", "pkg.train"], ["-m", "pkg.train"]),
    ([sys.executable, "-c", "pass"], None),
    ([sys.executable, "-X", "dev", "train.py"], None),
    ([sys.executable, "missing.py"], None),
    (["bash", "train.py"], None),
])
def test_only_this_interpreter_running_a_script_or_module_is_forked(tmp_path, monkeypatch,
                                                                      command, expected):
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert preload.python_arguments(command) == expected
