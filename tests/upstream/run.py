"""Runs Keras' and TensorFlow's own strategy tests with tfdist_ext.Strategy and with
MirroredStrategy (the control), from the installed packages, and compares them.

    python tests/upstream/run.py [--all] [--json OUT.json]

Each strategy gets one pytest process for all files (`-p upstream_strategy`,
see upstream_strategy.py). The Keras tests are the files of the installed wheel
that make a `tf.distribute` strategy; `tf_strategy_lib_test.py` calls TF's
`strategy_test_lib` checks and `tf_mirrored_semantics_test.py` checks what
TF's MirroredStrategy tests (not in the wheel) check. Keras' backend-independent
tests (metrics, optimizers; with --all also callbacks and saving) run a second
time with every TestCase inside the strategy's scope. Exit status 0 when every test that passes with
MirroredStrategy passes with tfdist_ext.Strategy or is in `SKIPPED` with a
reason; prints (and writes with --json) pass/fail counts per file and strategy.
"""

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# (module, pytest -k expression or None): the Keras 3.15 test files that make a
# tf.distribute strategy; of nn_test and variables_test (900 cases, most of
# them needing jax or torch) only the classes with a strategy.
KERAS_TESTS = (
    ("keras.src.backend.tensorflow.optimizer_distribute_test", None),
    ("keras.src.backend.tensorflow.distribute_test", None),
    ("keras.src.callbacks.swap_ema_weights_test", None),
    ("keras.src.backend.common.variables_test", "VariableNumpyValueAndAssignmentTest"),
    ("keras.src.ops.nn_test", "distribution_strategy"),
)
# Not run: keras.src.trainers.data_adapters.tf_dataset_adapter_test imports jax,
# which the test environment does not install.

# Tests that pass with MirroredStrategy and check what tfdist_ext.Strategy does
# not provide by design: test id -> reason.
SKIPPED = {
    "variables_test.py::VariableNumpyValueAndAssignmentTest::test_variable_numpy_scalar": (
        "makes MirroredStrategy(['cpu:0', 'cpu:1']) after an earlier test initialised TF "
        "with one CPU device: TF's places both replicas on CPU:0 by soft placement, "
        "tfdist_ext.Strategy(num_replicas=2) raises naming tfdist_ext.cluster.local_devices "
        "(two replicas on one device cannot meet in a collective). It passes alone."),
}


# Keras' backend-independent test folders, run with every TestCase inside a
# 2-replica strategy's scope (UPSTREAM_SCOPE=1): what a user's model, metric,
# optimizer, callback or save does under a strategy. CI runs the first two;
# `--all` adds the slower ones (about 5 more minutes on the 2-core machine).
SCOPED_CI = ("keras.src.metrics", "keras.src.optimizers")
SCOPED_ALL = SCOPED_CI + ("keras.src.callbacks", "keras.src.saving")


def test_files():
    """(path, -k expression) of every upstream test file, found in the installed packages."""
    import importlib.util  # pylint: disable=import-outside-toplevel
    files = []
    for module, select in KERAS_TESTS:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"{module} is not in the installed keras package")
        files.append((spec.origin, select))
    files.append((str(HERE / "tf_strategy_lib_test.py"), None))
    files.append((str(HERE / "tf_mirrored_semantics_test.py"), None))
    return files


def scoped_files(packages):
    """Every `*_test.py` file of the installed Keras `packages` (folders)."""
    import importlib.util  # pylint: disable=import-outside-toplevel
    files = []
    for package in packages:
        folder = pathlib.Path(importlib.util.find_spec(package).origin).parent
        files.extend((str(path), None) for path in sorted(folder.glob("*_test.py")))
    return files


def run(strategy, files, timeout=1200, scoped=False):
    """{test id: outcome} of one pytest process with `strategy` ("tfdist" or "mirrored"),
    every Keras TestCase inside its scope when `scoped`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "report.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "upstream_strategy",
                   "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={report}",
                   "--rootdir", "/", "--confcutdir", str(HERE), *(path for path, _ in files)]
        selections = [f"({select} or not {pathlib.Path(path).stem})"
                      for path, select in files if select]
        if selections:
            command += ["-k", " and ".join(selections)]
        env = dict(os.environ, UPSTREAM_STRATEGY=strategy, KERAS_BACKEND="tensorflow",
                   UPSTREAM_SCOPE="1" if scoped else "0",
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
        env.pop("TF_CONFIG", None)
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if not report.exists():
            raise RuntimeError(f"pytest wrote no report with {strategy}:\n"
                               f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return _outcomes(report, [pathlib.Path(path).stem for path, _ in files])


def _outcomes(report, stems):
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        stem = next((p for p in reversed(parts) if p in stems), parts[-1])
        owner = parts[-1] if parts[-1] != stem else ""
        test_id = f"{stem}.py::{owner}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = ("failed" if kinds & {"failure", "error"} else
                   "skipped" if "skipped" in kinds else "passed")
        outcomes[test_id] = outcome
    return outcomes


def compare(ours, control):
    """Counts per file and strategy, and the tests the control passes that ours does not."""
    counts = collections.defaultdict(lambda: collections.Counter())
    for name, results in (("tfdist", ours), ("mirrored", control)):
        for test_id, outcome in results.items():
            counts[test_id.split("::")[0]][f"{name}_{outcome}"] += 1
    regressions = sorted(t for t, o in control.items()
                         if o == "passed" and ours.get(t) != "passed" and t not in SKIPPED)
    return {file: dict(c) for file, c in sorted(counts.items())}, regressions


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the counts and regressions here")
    parser.add_argument("--all", action="store_true",
                        help=f"run every scoped folder ({', '.join(SCOPED_ALL)}), "
                             f"not only {', '.join(SCOPED_CI)}")
    args = parser.parse_args(argv)
    files = test_files()
    scoped = scoped_files(SCOPED_ALL if args.all else SCOPED_CI)
    ours, control = run("tfdist", files), run("mirrored", files)
    for results, strategy in ((ours, "tfdist"), (control, "mirrored")):
        results.update({f"in scope: {test_id}": outcome for test_id, outcome
                        in run(strategy, scoped, scoped=True).items()})
    counts, regressions = compare(ours, control)
    for file, c in counts.items():
        print(f"{file}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    for test_id in regressions:
        print(f"passes with MirroredStrategy, not with tfdist_ext.Strategy: {test_id} "
              f"({ours.get(test_id, 'not run')})")
    summary = {"counts": counts, "regressions": regressions,
               "skipped": SKIPPED, "tfdist": ours, "mirrored": control}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
