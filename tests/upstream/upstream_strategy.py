"""pytest plugin: runs other people's strategy tests with `tfdist_ext.Strategy`.

    UPSTREAM_STRATEGY=tfdist python -m pytest -p upstream_strategy <test files>

Keras' and TensorFlow's tests make their strategy as
`tf.distribute.MirroredStrategy(devices)`. With UPSTREAM_STRATEGY=tfdist (the
default) that name makes `tfdist_ext.Strategy(num_replicas=len(devices))`
instead, so the tests run unchanged against ours; with
UPSTREAM_STRATEGY=mirrored the name is left alone (the control run).
`isinstance(x, tf.distribute.MirroredStrategy)` stays true for TF's own class
and, in the tfdist run, for ours. tests/upstream/run.py runs both and
compares them.

With UPSTREAM_LOG=FILE each test appends a JSON line when it starts
(`{"start": nodeid}`) and when it ends (`{"nodeid": ..., "outcome": ...,
"seconds": ...}`), so a watcher can tell which test hangs; tests named in
UPSTREAM_DESELECT=FILE (one node id per line) are not run.
"""

import json
import os
import time
import sys
import types

import pytest


def _keras_conftest():
    """What Keras' test files import from Keras' repository conftest (not in the wheel)."""
    module = types.ModuleType("conftest")

    def skip_if_backend(given_backend, reason):
        import keras  # pylint: disable=import-outside-toplevel
        return pytest.mark.skipif(keras.backend.backend() == given_backend, reason=reason)

    module.skip_if_backend = skip_if_backend
    return module


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_trainable_backend: Keras' own marker")
    sys.modules.setdefault("conftest", _keras_conftest())
    os.environ.pop("TF_CONFIG", None)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel

    # Both strategies get the inter-op pool tfdist_ext.Strategy sizes for its local
    # replicas (cluster.local_devices): with TF's default (the core count, 2 here) TF's
    # MultiDeviceIterator teardown deadlocks MirroredStrategy too (every run on TF 2.19,
    # sometimes on 2.21), and the control would hang instead of judging.
    if not tf.config.threading.get_inter_op_parallelism_threads():
        tf.config.threading.set_inter_op_parallelism_threads(max(os.cpu_count() or 1, 5))
    if os.environ.get("UPSTREAM_SCOPE") == "1":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        _run_tests_in_a_strategy_scope(tf)
    if os.environ.get("UPSTREAM_STRATEGY", "tfdist") != "tfdist":
        return
    original = tf.distribute.MirroredStrategy

    class _Either(type):
        def __instancecheck__(cls, instance):
            return isinstance(instance, (original, tfdist_ext.Strategy))

        def __subclasscheck__(cls, subclass):
            return issubclass(subclass, (original, tfdist_ext.Strategy))

    class MirroredStrategy(metaclass=_Either):  # pylint: disable=too-few-public-methods
        """`tfdist_ext.Strategy` with one replica per device named."""

        def __new__(cls, devices=None, cross_device_ops=None):
            del cross_device_ops  # ours are the strategy's own
            return tfdist_ext.Strategy(num_replicas=len(devices) if devices else None)

    tf.distribute.MirroredStrategy = MirroredStrategy


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("UPSTREAM_DESELECT")
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as lines:
        skip = {line.strip() for line in lines if line.strip()}
    deselected = [item for item in items if item.nodeid in skip]
    if deselected:
        items[:] = [item for item in items if item.nodeid not in skip]
        config.hook.pytest_deselected(items=deselected)


_RUNNING = {}


def _log(entry):
    path = os.environ.get("UPSTREAM_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")


def pytest_runtest_logstart(nodeid, location):
    del location
    _RUNNING[nodeid] = {"outcome": "passed", "start": time.monotonic()}
    _log({"start": nodeid})


def pytest_runtest_logreport(report):
    state = _RUNNING.get(report.nodeid)
    if state is None:
        return
    if report.failed:
        state["outcome"] = "failed"
    elif report.skipped and state["outcome"] == "passed":
        state["outcome"] = "skipped"


def pytest_runtest_logfinish(nodeid, location):
    del location
    state = _RUNNING.pop(nodeid, {"outcome": "failed", "start": time.monotonic()})
    _log({"nodeid": nodeid, "outcome": state["outcome"],
          "seconds": round(time.monotonic() - state["start"], 3)})


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def _run_tests_in_a_strategy_scope(tf):
    """UPSTREAM_SCOPE=1: each Keras TestCase runs inside a 2-replica strategy's scope.

    For Keras' backend-independent tests (metrics, callbacks, optimizers,
    saving), which make their models, fit and evaluate without naming a
    strategy. The scope is entered after Keras' `setUp` (its `clear_session`
    resets the scope stack) and left before `tearDown`; one strategy serves
    the session.
    """
    from keras.src.testing import test_case  # pylint: disable=import-outside-toplevel
    strategies = []
    set_up, tear_down = test_case.TestCase.setUp, test_case.TestCase.tearDown

    def scoped_set_up(self):
        set_up(self)
        if not strategies:
            strategies.append(tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]))
        self._upstream_scope = strategies[0].scope()  # pylint: disable=protected-access
        self._upstream_scope.__enter__()  # pylint: disable=protected-access

    def scoped_tear_down(self):
        scope = self.__dict__.pop("_upstream_scope", None)
        if scope is not None:
            scope.__exit__(None, None, None)
        tear_down(self)

    test_case.TestCase.setUp = scoped_set_up
    test_case.TestCase.tearDown = scoped_tear_down
