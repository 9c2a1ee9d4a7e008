"""The import-time check of the Keras / TF members tfdist_ext patches (issue 51)."""

import pathlib
import subprocess
import sys
import textwrap

import keras
import pytest

import tfdist_ext
from tfdist_ext import _compat
from tfdist_ext.keras import patch_check, patches

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_patched_member_is_what_tfdist_ext_expects_on_the_installed_versions():
    report = patch_check.check()
    assert report.differing == {}
    assert report.tested, (report.keras_version, report.tf_version)
    assert report.warning() is None


def test_the_check_lists_exactly_the_members_patches_installs():
    # pylint: disable=protected-access
    listed = [*patches._process_patches(), *patches._save_patches(),
              *tfdist_ext.distribution.patched()]
    installed = {patch_check.label(owner, name) for owner, name, *_ in listed}
    assert installed == {member.label for member in patch_check.members()}


@pytest.mark.parametrize("version, tested", [
    ("3.10.0", True), ("3.15.1", True), ("3.15.9", True), ("3.9.2", False), ("3.16.0", False),
    ("3.16.0.dev2026112803", False), ("4.0.0", False)])
def test_the_tested_range_is_inclusive_of_its_patch_releases(monkeypatch, version, tested):
    monkeypatch.setattr(keras, "__version__", version)
    assert patch_check.check().tested is tested


def test_an_untested_keras_without_a_patched_member_is_named_in_the_warning_and_the_error(
        monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    monkeypatch.delattr(_compat.LossScaleOptimizer, "_tf_apply")
    report = patch_check.check()
    text = report.warning()
    assert "Keras 3.16.0" in text and "tested with Keras 3.10.0-3.15.1" in text
    assert "LossScaleOptimizer._tf_apply (missing)" in text
    assert "These features raise when used: mixed precision's LossScaleOptimizer" in text
    assert 'pip install "keras>=3.10.0,<3.16"' in text
    assert not report.applies(_compat.LossScaleOptimizer, "_tf_apply")
    assert report.applies(_compat.TensorFlowTrainer, "fit")
    report.require(patch_check.FIT)  # the rest keeps working
    with pytest.raises(patch_check.UnsupportedVersionError,
                       match=r"cannot run mixed precision's LossScaleOptimizer on Keras 3\.16\.0"
                             r".*LossScaleOptimizer\._tf_apply \(missing\)"):
        report.require(patch_check.LOSS_SCALE)


def test_a_changed_signature_is_named_with_both_signatures(monkeypatch):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None, steps=None):
        del self, iterator, data_batch, steps

    monkeypatch.setattr(_compat.TensorFlowTrainer, "_maybe_symbolic_build", _maybe_symbolic_build)
    report = patch_check.check()
    assert report.tested  # the installed versions: the changed member alone warns
    assert ("TensorFlowTrainer._maybe_symbolic_build (signature (self, iterator=None, "
            "data_batch=None, steps=None), expected (self, iterator=None, data_batch=None))"
            in report.warning())
    with pytest.raises(patch_check.UnsupportedVersionError, match="cannot run fit, evaluate"):
        report.require(patch_check.FIT)


def test_an_untested_version_with_every_member_alike_warns_that_behaviour_is_untested(
        monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    text = patch_check.check().warning()
    assert "None of the 32 Keras/TF members tfdist_ext patches differs" in text


_SCRIPT = textwrap.dedent("""
    import warnings
    import keras
    from keras.src.optimizers import loss_scale_optimizer
    import numpy as np

    keras.__version__ = "3.16.0"
    del loss_scale_optimizer.LossScaleOptimizer._tf_apply
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tfdist_ext
        strategy = tfdist_ext.Strategy(num_replicas=2)
    print("WARNING:", [str(w.message) for w in caught if "tfdist_ext was tested" in str(w.message)])
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    print("PLAIN FIT:", len(history.history["loss"]))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                      loss="mse")
    try:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        print("LOSS SCALE FIT: ran")
    except tfdist_ext.keras.patch_check.UnsupportedVersionError as err:
        print("LOSS SCALE FIT:", err)
""")


def test_a_script_on_an_untested_keras_warns_and_only_the_feature_that_lost_its_patch_raises():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, check=False)
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Keras 3.16.0" in out and "LossScaleOptimizer._tf_apply (missing)" in out
    assert "PLAIN FIT: 2" in out
    assert ("LOSS SCALE FIT: tfdist_ext cannot run mixed precision's LossScaleOptimizer on "
            "Keras 3.16.0") in out, out


def test_a_private_module_this_keras_lacks_is_named_with_the_tested_versions():
    script = textwrap.dedent("""
        import sys
        import keras
        import keras.src.losses
        del keras.src.losses.loss  # as if this Keras had moved the module
        sys.modules["keras.src.losses.loss"] = None
        try:
            import tfdist_ext._compat
        except ImportError as err:
            print("IMPORT ERROR:", err)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert ("IMPORT ERROR: tfdist_ext needs keras.src.losses.loss, which TensorFlow "
            in done.stdout), done.stdout + done.stderr[-2000:]
    assert 'tested with TensorFlow 2.19-2.21 and Keras 3.10-3.15' in done.stdout
