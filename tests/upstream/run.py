"""Runs Keras' and TensorFlow's own strategy tests with tfdist_ext.Strategy and with
MirroredStrategy (the control), from the installed packages, and compares them.

    python tests/upstream/run.py [--all] [--json OUT.json]

Each strategy gets one pytest process for all files (`-p upstream_strategy`,
see upstream_strategy.py). The Keras tests are the files of the installed wheel
that make a `tf.distribute` strategy; `tf_strategy_lib_test.py` calls TF's
`strategy_test_lib` checks and `tf_mirrored_semantics_test.py` checks what
TF's MirroredStrategy tests (not in the wheel) check. Keras' backend-independent
tests (metrics, optimizers; with --all also callbacks and saving) run a second
time with every TestCase inside the strategy's scope. Exit status 0 when every
test that passes with MirroredStrategy passes with tfdist_ext.Strategy or is in
`SKIPPED` with a reason; the control runs only the tests ours did not pass (no
other test can be a regression) and the SKIPPED ones. Prints (and writes with
--json) pass/fail counts per file and strategy, the control's of the tests it ran.
A test that deadlocks (no progress for 4 minutes) or crashes the process counts as
"hung" or "crashed" and the rest run on in a new process: a hang in the control
cannot stop the comparison, and one in ours is a regression.
"""

import argparse
import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Seconds pytest may take to import TensorFlow and collect before the stall bound
# applies (minutes on a loaded 2-core machine).
STARTUP_SECONDS = 120

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


def run(strategy, files, timeout=1200, scoped=False, stall=240):
    """{test id: outcome} of `run_nodes`."""
    return {_test_id(nodeid): outcome
            for nodeid, outcome in run_nodes(strategy, files, timeout, scoped, stall).items()}


def run_nodes(strategy, files, timeout=1200, scoped=False, stall=240, skip=()):
    """{pytest node id: outcome} of pytest with `strategy` ("tfdist" or
    "mirrored"), every Keras TestCase inside its scope when `scoped`; the node
    ids in `skip` are not run.

    A test that makes no progress for `stall` seconds (a deadlock in TF's
    runtime) or kills the process is recorded as "hung" or "crashed", and
    pytest starts again without it and the tests already done, until all have
    run or `timeout` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    outcomes = {}
    skip = set(skip)
    with tempfile.TemporaryDirectory() as tmp:
        log, deselect = pathlib.Path(tmp) / "log.jsonl", pathlib.Path(tmp) / "deselect"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "upstream_strategy",
                   "-p", "no:cacheprovider", "-o", "addopts=",
                   "--rootdir", "/", "--confcutdir", str(HERE), *(path for path, _ in files)]
        selections = [f"({select} or not {pathlib.Path(path).stem})"
                      for path, select in files if select]
        if selections:
            command += ["-k", " and ".join(selections)]
        env = dict(os.environ, UPSTREAM_STRATEGY=strategy, KERAS_BACKEND="tensorflow",
                   UPSTREAM_SCOPE="1" if scoped else "0", UPSTREAM_LOG=str(log),
                   UPSTREAM_DESELECT=str(deselect),
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
        env.pop("TF_CONFIG", None)
        deselect.write_text("".join(f"{nodeid}\n" for nodeid in skip))
        while True:
            log.write_text("")
            finished, output = _pytest(command, env, log, stall, deadline)
            started = None
            for entry in map(json.loads, log.read_text().splitlines()):
                if "start" in entry:
                    started = entry["start"]
                else:
                    outcomes[entry["nodeid"]] = entry["outcome"]
                    started = None
            if finished == "exited" and started is None:
                if not outcomes and not skip:
                    raise RuntimeError(f"pytest ran no test with {strategy}:\n{output}")
                break
            if started is None:
                raise RuntimeError(f"pytest with {strategy} {finished} outside a test:\n"
                                   f"{output}")
            outcomes[started] = "hung" if finished == "stalled" else "crashed"
            print(f"{strategy}: {started} {outcomes[started]}; running the rest again",
                  file=sys.stderr, flush=True)
            deselect.write_text("".join(f"{nodeid}\n" for nodeid in skip | set(outcomes)))
    return outcomes


def _pytest(command, env, log, stall, deadline):
    """Runs pytest until it exits ("exited"; a crash inside a test shows in the log)
    or writes nothing to `log` for `stall` seconds while a test runs ("stalled";
    outside a test, while pytest imports TensorFlow, collects or exits, at least
    STARTUP_SECONDS); raises TimeoutError when `deadline` passes."""
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        size, last, in_test = -1, time.monotonic(), False
        while process.poll() is None:
            now = time.monotonic()
            if log.stat().st_size != size:
                size, last = log.stat().st_size, now
                in_test = _in_test(log)
            allowed = stall if in_test else max(stall, STARTUP_SECONDS)
            if now > deadline or now - last > allowed:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                output.seek(0)
                if now > deadline:
                    raise TimeoutError("the upstream tests did not finish in time:\n"
                                       f"{output.read()[-3000:]}")
                return "stalled", output.read()[-3000:]
            time.sleep(1)
        output.seek(0)
        return "exited", output.read()[-3000:]


def _in_test(log):
    """Whether the last complete entry of `log` is a test's start."""
    lines = log.read_text().splitlines()
    while lines:
        try:
            return "start" in json.loads(lines.pop())
        except json.JSONDecodeError:
            continue
    return False


def _test_id(nodeid):
    """`file.py::Class::test` (Class empty for a function) of a pytest node id."""
    path, *names = nodeid.split("::")
    return f"{pathlib.Path(path).name}::{'::'.join(names[:-1])}::{names[-1]}"


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
    ours, control = {}, {}
    for tests, in_scope in ((files, False), (scoped, True)):
        # The control runs only where ours did not pass (no other test can be a
        # regression) and the SKIPPED tests (whose reason needs it to pass).
        mine = run_nodes("tfdist", tests, scoped=in_scope)
        theirs = run_nodes("mirrored", tests, scoped=in_scope,
                           skip=[n for n, outcome in mine.items()
                                 if outcome == "passed" and _test_id(n) not in SKIPPED])
        prefix = "in scope: " if in_scope else ""
        ours.update({prefix + _test_id(n): outcome for n, outcome in mine.items()})
        control.update({prefix + _test_id(n): outcome for n, outcome in theirs.items()})
    counts, regressions = compare(ours, control)
    for file, c in counts.items():
        print(f"{file}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    for test_id in sorted(t for t, o in control.items() if o in ("hung", "crashed")):
        print(f"MirroredStrategy {control[test_id]} in {test_id}")
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
