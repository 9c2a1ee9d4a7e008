"""What each Keras / TF member tfdist_ext patches is expected to be, checked before patching.

`tfdist_ext.keras.patches` and `tfdist_ext.distribution` replace 29 members of
Keras and TensorFlow, most of them private. This module lists, for each, the signature it had on every
version tfdist_ext was tested on and the feature that needs it. `check` (run
once a process: when Keras and tfdist_ext have both been imported, as
`tfdist_ext.distribution` installs, or else at the first `Strategy`) compares the
installed Keras and TensorFlow with that list:

* a version outside the tested range gives one warning naming the version
  and the members that differ from what tfdist_ext expects (or none);
* a member that is missing or whose signature changed is not patched, and the
  feature that needs it raises `UnsupportedVersionError` when used (`require`,
  `require_for`) instead of misbehaving; the rest keeps working.

A signature that still matches does not prove the behaviour did not change:
the tested range is what `tests/compat/run` passed on. To widen it, run that
script on the new version, re-read each member below in its source, then
raise `TESTED_KERAS` / `TESTED_TF` and the bounds in requirements.txt and
setup.py.
"""

import dataclasses
import inspect
import warnings

import keras
import tensorflow as tf

from tfdist_ext import _compat

TESTED_KERAS = ("3.10.0", "3.15.1")
TESTED_TF = ("2.19.1", "2.21.0")
INSTALL_HINT = 'python -m pip install "keras>=3.10.0,<3.16" "tensorflow-cpu>=2.19.1,<2.22"'

FIT = "fit, evaluate and predict under tfdist_ext.Strategy"
RELAXED = "relaxed synchronization policies (sync=...)"
GLOBAL_APPLY = "clipnorm, global_clipnorm, clipvalue and gradient_accumulation_steps"
LOSS_SCALE = "mixed precision's LossScaleOptimizer"
ZERO = "zero_stage=1 (the optimizer's state sharded)"
EMPTY_BATCH_NORM = "BatchNormalization with an empty local batch"
EMPTY_CONV = "convolution and pooling layers with an empty local batch"
INPUT_SPECS = "distributed datasets' cached type specs"
SAVE = "model.save, save_weights and CheckpointManager.save on several workers"
KERAS_DISTRIBUTION = "keras.distribution (DataParallel) on TensorFlow"

_TRAINER_FIT = ("(self, x=None, y=None, batch_size=None, epochs=1, verbose='auto', "
                "callbacks=None, validation_split=0.0, validation_data=None, shuffle=True, "
                "class_weight=None, sample_weight=None, initial_epoch=0, steps_per_epoch=None, "
                "validation_steps=None, validation_batch_size=None, validation_freq=1)")
_CONV = "(inputs, kernel, strides=1, padding='valid', data_format=None, dilation_rate=1)"


@dataclasses.dataclass(frozen=True)
class Member:
    """A patched member: where it lives, its expected signature and who needs it.

    Attributes:
        owner: The class or module that holds it.
        name: Its attribute name.
        signature: `str(inspect.signature(...))` on the tested versions, or
            "property".
        feature: The feature that cannot work without its patch.
    """
    owner: object
    name: str
    signature: str
    feature: str

    @property
    def label(self) -> str:
        return label(self.owner, self.name)


def label(owner, name) -> str:
    """`Owner.name` as the warning and the errors write it."""
    return f"{getattr(owner, '__qualname__', None) or owner.__name__}.{name}"


def members():
    """Every member tfdist_ext replaces (`tfdist_ext.keras.patches`,
    `tfdist_ext.distribution`), with what it expects of it."""
    trainer, optimizer = _compat.TensorFlowTrainer, _compat.TFOptimizer
    loss, nn = _compat.keras_loss, _compat.keras_tf_nn
    return (
        Member(optimizer, "_backend_update_step",
               "(self, grads, trainable_variables, learning_rate)", RELAXED),
        Member(trainer, "make_train_function", "(self, force=False)", FIT),
        Member(trainer, "make_test_function", "(self, force=False)", FIT),
        Member(trainer, "fit", _TRAINER_FIT, FIT),
        Member(trainer, "evaluate", "(self, x=None, y=None, batch_size=None, verbose='auto', "
               "sample_weight=None, steps=None, callbacks=None, return_dict=False, **kwargs)",
               FIT),
        Member(trainer, "predict",
               "(self, x, batch_size=None, verbose='auto', steps=None, callbacks=None)", FIT),
        Member(loss, "scale_loss_for_distribution", "(value)", FIT),
        Member(loss, "unscale_loss_for_distribution", "(value)", FIT),
        Member(trainer, "_maybe_symbolic_build", "(self, iterator=None, data_batch=None)", FIT),
        Member(keras.metrics.Mean, "update_state", "(self, values, sample_weight=None)", FIT),
        Member(keras.layers.BatchNormalization, "_moments", "(self, inputs, mask)",
               EMPTY_BATCH_NORM),
        Member(nn, "conv", _CONV, EMPTY_CONV),
        Member(nn, "depthwise_conv", _CONV, EMPTY_CONV),
        Member(nn, "separable_conv", "(inputs, depthwise_kernel, pointwise_kernel, strides=1, "
               "padding='valid', data_format=None, dilation_rate=1)", EMPTY_CONV),
        Member(nn, "max_pool",
               "(inputs, pool_size, strides=None, padding='valid', data_format=None)",
               EMPTY_CONV),
        Member(optimizer, "_backend_apply_gradients", "(self, grads, trainable_variables)",
               GLOBAL_APPLY),
        Member(_compat.LossScaleOptimizer, "_tf_apply",
               "(self, grads, trainable_variables=None)", LOSS_SCALE),
        Member(optimizer, "add_variable_from_reference",
               "(self, reference_variable, name=None, initializer='zeros')", ZERO),
        Member(_compat.BaseOptimizer, "save_own_variables", "(self, store)", ZERO),
        Member(_compat.BaseOptimizer, "load_own_variables", "(self, store)", ZERO),
        Member(_compat.TFEpochIterator, "_get_iterator", "(self)", FIT),
        Member(_compat.DistributedIterator, "_type_spec", "property", INPUT_SPECS),
        Member(_compat.SingleWorkerOwnedDatasetIterator, "_type_spec", "property",
               INPUT_SPECS),
        Member(_compat.OwnedMultiDeviceIterator, "_type_spec", "property", INPUT_SPECS),
        Member(_compat.DistributedIteratorSpec, "_component_specs", "property", INPUT_SPECS),
        Member(_compat.SingleWorkerDatasetIteratorSpec, "_component_specs", "property",
               INPUT_SPECS),
        Member(_compat.MultiDeviceIteratorSpec, "_component_specs", "property", INPUT_SPECS),
        Member(keras.Model, "save", "(self, filepath, overwrite=True, zipped=None, **kwargs)",
               SAVE),
        Member(keras.Model, "save_weights",
               "(self, filepath, overwrite=True, max_shard_size=None)", SAVE),
        Member(tf.train.CheckpointManager, "save",
               "(self, checkpoint_number=None, check_interval=True, options=None)", SAVE),
        Member(_compat.keras_global_state, "set_global_attribute", "(name, value)",
               KERAS_DISTRIBUTION),
        Member(_compat.keras_distribution_lib.Distribution, "distribute_dataset",
               "(self, dataset)", KERAS_DISTRIBUTION),
    )


def signature_of(owner, name):
    """The member's signature as `Member.signature` writes it; None when it is missing."""
    if isinstance(owner, type):
        raw = inspect.getattr_static(owner, name, None)
    else:
        raw = getattr(owner, name, None)
    if raw is None:
        return None
    if isinstance(raw, property):
        return "property"
    raw = inspect.unwrap(getattr(raw, "__func__", raw))
    try:
        return str(inspect.signature(raw))
    except (TypeError, ValueError):
        return "(signature not readable)"


def _version(text):
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def _in_range(version, tested):
    """low <= version, and version's major.minor <= high's (any patch release of it)."""
    low, high = tested
    return _version(low) <= _version(version) and _version(version)[:2] <= _version(high)[:2]


class UnsupportedVersionError(RuntimeError):
    """A feature was used whose Keras / TF patch could not be applied to this version."""


@dataclasses.dataclass
class Report:
    """What `check` found.

    Attributes:
        keras_version: The installed Keras.
        tf_version: The installed TensorFlow.
        differing: label -> what differs, for the members that cannot be patched.
        unavailable: feature -> labels of its members that cannot be patched.
    """
    keras_version: str
    tf_version: str
    differing: dict
    unavailable: dict

    @property
    def tested(self) -> bool:
        return (_in_range(self.keras_version, TESTED_KERAS)
                and _in_range(self.tf_version, TESTED_TF))

    def applies(self, owner, name) -> bool:
        """Whether the patch of `owner.name` may be installed."""
        return label(owner, name) not in self.differing

    def warning(self):
        """The warning `report` gives, or None when the versions are tested and nothing differs."""
        if self.tested and not self.differing:
            return None
        text = (f"tfdist_ext was tested with Keras {TESTED_KERAS[0]}-{TESTED_KERAS[1]} and "
                f"TensorFlow {TESTED_TF[0]}-{TESTED_TF[1]}; this is Keras {self.keras_version} "
                f"with TensorFlow {self.tf_version}. ")
        if self.differing:
            listed = "; ".join(f"{label} ({what})" for label, what in self.differing.items())
            text += (f"Of the {len(members())} Keras/TF members tfdist_ext patches, these differ "
                     f"from what it expects and are left alone: {listed}. These features raise "
                     f"when used: {', '.join(self.unavailable)}. ")
        else:
            text += (f"None of the {len(members())} Keras/TF members tfdist_ext patches differs "
                     "in name or signature, but their behaviour was not tested. ")
        return text + f"To use a tested combination: {INSTALL_HINT}."

    def require(self, feature):
        """Raises `UnsupportedVersionError` if `feature` lost a patch on this version."""
        if feature not in self.unavailable:
            return
        listed = ", ".join(f"{label} ({self.differing[label]})"
                           for label in self.unavailable[feature])
        raise UnsupportedVersionError(
            f"tfdist_ext cannot run {feature} on Keras {self.keras_version} with TensorFlow "
            f"{self.tf_version}: it patches {listed}, which differs from Keras "
            f"{TESTED_KERAS[0]}-{TESTED_KERAS[1]} / TensorFlow {TESTED_TF[0]}-{TESTED_TF[1]}, "
            f"what it was tested on. Install a tested combination: {INSTALL_HINT}.")


def check(expected=None) -> Report:
    """Compares the installed Keras and TF with `expected` (default `members()`)."""
    differing, unavailable = {}, {}
    for member in expected if expected is not None else members():
        found = signature_of(member.owner, member.name)
        if found == member.signature:
            continue
        differing[member.label] = ("missing" if found is None
                                   else f"signature {found}, expected {member.signature}")
        unavailable.setdefault(member.feature, []).append(member.label)
    return Report(keras.__version__, tf.__version__, differing, unavailable)


_reports = []


def report() -> Report:
    """The process's report, made (and warned about) on the first call."""
    if not _reports:
        _reports.append(check())
        text = _reports[0].warning()
        if text:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
    return _reports[0]


def require_for(model, strategy):
    """Raises if `fit`/`evaluate`/`predict` of `model` needs a patch this version lost.

    Args:
        model: The Keras model about to run.
        strategy: Its tfdist_ext strategy; with one replica the empty-batch
            patches are not needed.
    """
    state = report()
    if not state.unavailable:
        return
    state.require(FIT)
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        state.require(LOSS_SCALE)
        optimizer = optimizer.inner_optimizer
    if optimizer is not None and (optimizer.clipnorm or optimizer.global_clipnorm
                                  or optimizer.clipvalue or optimizer.gradient_accumulation_steps):
        state.require(GLOBAL_APPLY)
    if strategy.num_replicas_in_sync > 1:
        layers = model._flatten_layers()  # pylint: disable=protected-access
        kinds = {cls.__name__ for layer in layers for cls in type(layer).__mro__}
        if "BatchNormalization" in kinds:
            state.require(EMPTY_BATCH_NORM)
        if kinds & {"BaseConv", "BaseDepthwiseConv", "BaseSeparableConv", "BasePooling"}:
            state.require(EMPTY_CONV)
