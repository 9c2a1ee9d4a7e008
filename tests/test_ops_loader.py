"""The op library's build stamp, version check and graceful absence."""

import json
import subprocess
import sys

import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.ops import _loader


def test_built_library_reports_the_running_tensorflow():
    assert _loader.build_problem() is None
    assert tfdist_ext.ops.build_info() == tf.__version__


@pytest.fixture
def stamp(tmp_path, monkeypatch):
    path = tmp_path / "_build_info.json"
    monkeypatch.setattr(_loader, "BUILD_INFO", path)
    return path


def test_missing_library_explains_and_names_the_rebuild(stamp, monkeypatch):
    monkeypatch.setattr(_loader, "_library_path", lambda: None)
    stamp.write_text(json.dumps({"error": "compiling 1 source(s) failed"}))
    with pytest.raises(_loader.OpsUnavailableError,
                       match=r"not available \(compiling 1 source\(s\) failed\). Rebuild it .* "
                             r"`python setup.py build_ext --inplace`"):
        _loader.load.__wrapped__()
    with pytest.warns(UserWarning, match="Features that need the ops will raise"):
        _loader.check_build()


def test_library_built_for_another_tensorflow_is_refused(stamp):
    stamp.write_text(json.dumps({"tf_version": "1.15.0"}))  # not any TF tfdist_ext runs on
    with pytest.raises(_loader.OpsUnavailableError,
                       match=rf"built for TensorFlow 1.15.0 but TensorFlow {tf.__version__} is running"):
        _loader.load.__wrapped__()


def test_import_works_without_the_library(tmp_path):
    # A copy of the package without the compiled library still imports and
    # builds a strategy; only the ops raise.
    import shutil  # pylint: disable=import-outside-toplevel
    import pathlib  # pylint: disable=import-outside-toplevel

    package = pathlib.Path(tfdist_ext.__file__).parent
    shutil.copytree(package, tmp_path / "tfdist_ext",
                    ignore=shutil.ignore_patterns("*.so", "_build_info.json", "__pycache__"))
    code = ("import warnings, tfdist_ext\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    s = tfdist_ext.Strategy()\n"
            "print('WARNED', any('never built' in str(x.message) for x in w))\n"
            "try:\n    tfdist_ext.ops.load()\n"
            "except tfdist_ext.ops.OpsUnavailableError as e:\n    print('RAISED', e)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "WARNED True" in result.stdout
    assert "RAISED The tfdist_ext op library is not available (it was never built)" in result.stdout
