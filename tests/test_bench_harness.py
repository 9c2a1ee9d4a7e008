"""bench/harness.py: result JSON with its commit and machine, and every bench script on it.

Quick: no multi-worker launch, no TensorFlow in the scripts' subprocess.
"""

import ast
import datetime
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  pylint: disable=wrong-import-position

BENCH = ROOT / "bench"
HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                      check=False).stdout.strip()


def _check_facts(data, command):
    assert data["commit"] == (HEAD or os.environ.get("TFDIST_BENCH_COMMIT", ""))
    machine = data["machine"]
    assert machine["cores"] == len(os.sched_getaffinity(0))
    assert machine["cpu_count"] == os.cpu_count()
    assert machine["memory_gb"] > 0 and machine["cpu_model"] and machine["hostname"]
    assert machine["python"] == ".".join(map(str, sys.version_info[:3]))
    assert machine["kernel"] == os.uname().release
    assert set(machine["packages"]) == {"numpy", "tensorflow", "keras", "torch", "jax"}
    assert machine["packages"]["numpy"]
    assert data["command"] == command
    date = datetime.datetime.fromisoformat(data["date"])
    assert abs(datetime.datetime.now(datetime.timezone.utc) - date).total_seconds() < 600


def test_write_adds_commit_machine_command_and_date_and_plots(tmp_path):
    result = {"rows": [{"config": "sync", "ms": 1.5}], "cpu_cores": 2}
    drawn = []

    def plot(path):
        drawn.append(path)
        (tmp_path / "sub" / "r.png").write_bytes(b"png")

    out, png = tmp_path / "sub" / "r.json", tmp_path / "sub" / "r.png"
    written = harness.write(result, str(out), str(png), plot=plot)
    data = json.loads(out.read_text())
    assert data == written
    assert data["rows"] == result["rows"] and data["cpu_cores"] == 2  # the script's keys kept
    assert set(data) == {"rows", "cpu_cores", *harness.FACT_KEYS}
    assert "commit" not in result  # the caller's dict is left as it was
    _check_facts(data, sys.argv)
    assert drawn == [str(png)] and png.read_bytes() == b"png"


def test_write_stamps_every_record_of_a_list_and_skips_what_is_not_asked(tmp_path):
    records = [{"bytes": 1024, "time_ms_median": 0.1}, {"bytes": 2048, "time_ms_median": 0.2}]
    out = tmp_path / "records.json"
    harness.write(records, out, png_path=None, plot=lambda path: pytest.fail("no --png"))
    data = json.loads(out.read_text())
    assert [r["bytes"] for r in data] == [1024, 2048]  # still a list, in order
    for record in data:
        _check_facts(record, sys.argv)
    assert "commit" not in records[0]
    harness.write({"a": 1}, None, None)  # neither --json nor --png: nothing written
    with pytest.raises(TypeError):
        harness.write("text", out)


def test_commit_outside_git_is_tfdist_bench_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "ROOT", tmp_path)  # an export without .git
    monkeypatch.setenv("TFDIST_BENCH_COMMIT", "0123abc")
    assert harness.commit() == "0123abc"
    monkeypatch.delenv("TFDIST_BENCH_COMMIT")
    assert harness.commit() == ""


def test_add_arguments_keeps_the_usual_flags_and_defaults():
    import argparse  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser, repeats=3)
    assert vars(parser.parse_args([])) == {"json": None, "png": None, "repeats": 3}
    assert vars(parser.parse_args(["--json", "a", "--png", "b", "--repeats", "2"])) == {
        "json": "a", "png": "b", "repeats": 2}
    bare = argparse.ArgumentParser()
    harness.add_arguments(bare, png=False)
    assert vars(bare.parse_args([])) == {"json": None}


def test_a_real_script_writes_its_commit_and_machine(tmp_path):
    """bench/sync_accuracy.py summarizing an earlier file (no training, no TensorFlow)."""
    earlier, out = tmp_path / "earlier.json", tmp_path / "out.json"
    earlier.write_text(json.dumps({"records": [
        {"config": c, "seed": s, "accuracy": a, "mb_sent": 1.0, "optimizer": "sgd"}
        for c, s, a in (("sync", 0, 0.80), ("sync", 1, 0.90), ("async", 0, 0.70))]}))
    command = [str(BENCH / "sync_accuracy.py"), "--records", str(earlier), "--json", str(out)]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert {"args", "summary", "records"} <= set(data)  # the script's own keys
    _check_facts(data, command)


# -- every script that writes a result JSON writes it through the harness ---------------

WRITES = ("write_text", "write_bytes", "dump")  # Path.write_*, json.dump


def _is_json_option(node):
    """`<something>.json` that is not the json module's attribute: the --json value."""
    return (isinstance(node, ast.Attribute) and node.attr == "json"
            and not (isinstance(node.value, ast.Name) and node.value.id == "json"))


def _writes_a_file(node):
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in WRITES:
        return True
    if isinstance(func, ast.Name) and func.id == "open":
        modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
        return any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax")
                   for m in modes)
    return False


def _declares_json(tree):
    """Whether the script takes `--json` (its own add_argument or harness.add_arguments)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "add_argument" and any(
                isinstance(a, ast.Constant) and a.value == "--json" for a in node.args):
            return True
        if node.func.attr == "add_arguments" and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "harness":
            return True
    return False


def _calls_harness_write(tree):
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "write" and isinstance(node.func.value, ast.Name)
               and node.func.value.id == "harness" for node in ast.walk(tree))


def _functions_writing_the_json_option(tree):
    """Functions that read `args.json` and write a file themselves (not through the harness).

    Workers' own files (OUT/w0.json and such, named by other arguments) are not results.
    """
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nodes = list(ast.walk(fn))
            if any(map(_is_json_option, nodes)) and any(map(_writes_a_file, nodes)):
                found.append(fn.name)
    return found


def _bench_scripts():
    return sorted(p for p in BENCH.glob("*.py") if p.name != "harness.py")


def bench_offenders(scripts):
    """{script name: why} for every script that writes its result JSON itself."""
    offenders = {}
    for path in scripts:
        tree = ast.parse(path.read_text(), filename=str(path))
        if _declares_json(tree) and not _calls_harness_write(tree):
            offenders[path.name] = "takes --json but never calls harness.write"
        writers = _functions_writing_the_json_option(tree)
        if writers:
            offenders[path.name] = f"writes the --json file itself in {', '.join(writers)}()"
    return offenders


def test_every_bench_script_writes_its_result_json_through_the_harness():
    scripts = _bench_scripts()
    assert len(scripts) > 15, scripts
    offenders = bench_offenders(scripts)
    assert not offenders, "bench scripts that write result JSON without bench/harness.py " \
                          "(so without the commit and machine): " + json.dumps(offenders, indent=1)


def test_the_check_finds_a_script_that_writes_json_itself(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text(
        "import argparse, json, pathlib\n"
        "def main():\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--json', default=None)\n"
        "    args = parser.parse_args()\n"
        "    pathlib.Path(args.json).write_text(json.dumps({'rows': []}))\n")
    assert set(bench_offenders([script])) == {"mine.py"}
    worker = tmp_path / "worker.py"  # a worker's own file is no result
    worker.write_text(
        "import json\n"
        "def work(args):\n"
        "    with open(args.out + '/w0.json', 'w') as f:\n"
        "        json.dump({}, f)\n")
    assert not bench_offenders([worker])
