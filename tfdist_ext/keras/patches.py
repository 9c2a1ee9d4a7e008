"""Every Keras and TF method tfdist_ext replaces, listed and installed here only.

Keras 3 offers no seam for what a distribution strategy has to change in
`fit` (docs/tf_internals.md), so tfdist_ext wraps a few Keras methods, most
of them private. The wrappers live beside the feature they serve; this module
is the one place that assigns them, when the first `tfdist_ext.Strategy` is
made (`install`). Each wrapper calls the original and changes nothing for
other strategies (the iterator specs are cached for every strategy's
iterators: the same values, computed once). The private classes and modules
come from `tfdist_ext._compat`.

Tested on Keras 3.10.0-3.15.1 with TensorFlow 2.19-2.21 (`tests/compat/run`).
`tfdist_ext.keras.patch_check` holds each member's expected signature and the
feature that needs it: a member that is missing or changed on the installed
version is not patched (`install` asks it), and its feature raises when used.
When upgrading Keras, re-read every method in the table in the new version:
its name, its signature and what the wrapper assumes it does.

patched (Keras 3.15.1) -> wrapper             why
--------------------------------------------  ------------------------------------------------------
TFOptimizer._backend_update_step              a relaxed sync policy's runner replaces
  -> fit_hooks.wrap_update_step               all-reduce-then-apply
TensorFlowTrainer.make_train_function         the runner's train step, or the one weighting uneven
  -> fit_hooks.wrap_make_train_function       batches; worker-local logs; XLA around the collectives
TensorFlowTrainer.make_test_function          XLA around the collectives (`jit_compile`)
  -> fit_hooks.wrap_make_test_function
TensorFlowTrainer.fit                         Strategy.fit_callbacks() first, write-once file
  -> fit_hooks.wrap_fit                       callbacks, padded inputs, data order, a common stop on
                                              SIGTERM
TensorFlowTrainer.evaluate, .predict          inputs padded to the workers' common number of batches
  -> fit_hooks.wrap_inference
keras_loss.scale_loss_for_distribution        each replica weighted by its share of the global batch
  -> uneven.wrap_scale                        (a module function)
keras_loss.unscale_loss_for_distribution      its inverse, likewise
  -> uneven.wrap_unscale
TensorFlowTrainer._maybe_symbolic_build       builds from the first local batch: no collective
  -> uneven.wrap_symbolic_build               over local batches of unequal lengths
keras.metrics.Mean.update_state (public)      an unweighted per-batch scalar weighted by the
  -> uneven.wrap_mean_update                  replica's share of the batch (trackers equal
                                              one process's with unequal local batches)
BatchNormalization._moments                   an empty local batch keeps the moving statistics
  -> uneven.wrap_moments                      instead of NaN
keras_tf_nn.conv, depthwise_conv,             TF 2.21's oneDNN CPU kernels mishandle empty batches
separable_conv, max_pool                      (module functions)
  -> uneven.one_sample_when_empty
TFOptimizer._backend_apply_gradients          clipping and gradient accumulation on the all-reduced
  -> optimizer_fixes.wrap_apply               gradient (keras-team/keras#20582)
LossScaleOptimizer._tf_apply                  every replica skips an overflowed step alike
  -> optimizer_fixes.wrap_loss_scale_apply
TFOptimizer.add_variable_from_reference       zero_stage=1: no per-weight slots in the model's
  -> zero.wrap_add_variable_from_reference    optimizer; each replica's shard has its own
BaseOptimizer.save_own_variables,             zero_stage=1: the state is written whole (gathered
    .load_own_variables                       from the shards) and each replica loads its part
  -> zero.wrap_save_own_variables, wrap_load_own_variables
keras.Model.save, .save_weights               a worker's save returns once the chief's has (jobs of
  -> saving.published                         several workers; public methods)
tf.train.CheckpointManager.save (TF)          likewise
  -> saving.published
TFEpochIterator._get_iterator                 one replica per worker: this worker's dataset through
  -> local_input.wrap_get_iterator            a plain tf.data iterator (no per-step agreement)
DistributedIterator._type_spec,               computed once per iterator instead of at every step
_SingleWorkerOwnedDatasetIterator._type_spec, (TF properties)
OwnedMultiDeviceIterator._type_spec,
DistributedIteratorSpec._component_specs,
_SingleWorkerDatasetIteratorSpec._component_specs,
MultiDeviceIteratorSpec._component_specs
  -> iterator_specs.cached

Names as in `tfdist_ext._compat` (`keras_loss` is `keras.src.losses.loss`,
`keras_tf_nn` is `keras.src.backend.tensorflow.nn`).

Installed by `tfdist_ext.distribution` once Keras is imported, not here (Keras'
distribution API on TensorFlow): `keras_global_state.set_global_attribute` (a current
DataParallel makes a tfdist_ext.Strategy TF's default), `Distribution.distribute_dataset`
(no per-process split under that strategy) and the functions of Keras' TensorFlow
`distribution_lib` module (`list_devices`, `initialize`, ...).

Installed at `import tfdist_ext` in a job of several workers, not here (datasets
are built before the strategy): `keras.utils.text_dataset_from_directory`,
`image_dataset_from_directory`, `audio_dataset_from_directory` and
`timeseries_dataset_from_array` (public functions) get a job-wide `seed` when
the call passes none (`loader_seeds`).

Not installed here, because they are not replaced methods: the attributes of
the file-writing callbacks of one `fit`, set and restored by
`worker_callbacks.for_this_worker`; TF's SIGTERM handler, replaced by
`preemption.Preemption.install_handler` (from `Strategy.__init__`); and
`CollectiveAllReduceExtended._reduce_to` (TF), overridden by subclassing in
`tfdist_ext.strategy_extended.Extended` (keras-team/keras#20585).
"""

import threading

import keras
import tensorflow as tf

from tfdist_ext import _compat, zero
from tfdist_ext.keras import (fit_hooks, iterator_specs, local_input, optimizer_fixes,
                              patch_check, saving, uneven)

_lock = threading.Lock()
_installed = False


def _process_patches():
    """(owner, attribute, wrapper) of the patches every process gets, in install order."""
    trainer, optimizer = _compat.TensorFlowTrainer, _compat.TFOptimizer
    loss, nn = _compat.keras_loss, _compat.keras_tf_nn
    return (
        (optimizer, "_backend_update_step", fit_hooks.wrap_update_step),
        (trainer, "make_train_function", fit_hooks.wrap_make_train_function),
        (trainer, "make_test_function", fit_hooks.wrap_make_test_function),
        (trainer, "fit", fit_hooks.wrap_fit),
        (trainer, "evaluate", fit_hooks.wrap_inference),
        (trainer, "predict", fit_hooks.wrap_inference),
        (loss, "scale_loss_for_distribution", uneven.wrap_scale),
        (loss, "unscale_loss_for_distribution", uneven.wrap_unscale),
        (trainer, "_maybe_symbolic_build", uneven.wrap_symbolic_build),
        (keras.metrics.Mean, "update_state", uneven.wrap_mean_update),
        (keras.layers.BatchNormalization, "_moments", uneven.wrap_moments),
        (nn, "conv", uneven.one_sample_when_empty),
        (nn, "depthwise_conv", uneven.one_sample_when_empty),
        (nn, "separable_conv", uneven.one_sample_when_empty),
        (nn, "max_pool", uneven.one_sample_when_empty),
        (optimizer, "_backend_apply_gradients", optimizer_fixes.wrap_apply),
        (_compat.LossScaleOptimizer, "_tf_apply", optimizer_fixes.wrap_loss_scale_apply),
        (optimizer, "add_variable_from_reference", zero.wrap_add_variable_from_reference),
        (_compat.BaseOptimizer, "save_own_variables", zero.wrap_save_own_variables),
        (_compat.BaseOptimizer, "load_own_variables", zero.wrap_load_own_variables),
        (_compat.TFEpochIterator, "_get_iterator", local_input.wrap_get_iterator),
        (_compat.DistributedIterator, "_type_spec", iterator_specs.cached),
        (_compat.SingleWorkerOwnedDatasetIterator, "_type_spec", iterator_specs.cached),
        (_compat.OwnedMultiDeviceIterator, "_type_spec", iterator_specs.cached),
        (_compat.DistributedIteratorSpec, "_component_specs", iterator_specs.cached),
        (_compat.SingleWorkerDatasetIteratorSpec, "_component_specs", iterator_specs.cached),
        (_compat.MultiDeviceIteratorSpec, "_component_specs", iterator_specs.cached),
    )


def _save_patches():
    """(owner, attribute, kind) of the save methods wrapped in multi-worker jobs."""
    return ((keras.Model, "save", "model"), (keras.Model, "save_weights", "weights"),
            (tf.train.CheckpointManager, "save", "checkpoint"))


def _wrap(report, owner, name, wrapper, *args):
    if report.applies(owner, name):
        setattr(owner, name, wrapper(getattr(owner, name), *args))


def install(strategy):
    """Installs the patches (each once per process); called by `tfdist_ext.Strategy`.

    Patches whose member differs on the installed Keras / TF are skipped
    (`patch_check`); the strategy itself, a relaxed sync policy and saving
    on several workers raise `patch_check.UnsupportedVersionError` here if
    they lost one. The type-spec caches are an optimization: without them
    TF computes the specs at every step.

    Args:
        strategy: The new strategy. The save methods are wrapped for the
            first strategy of several workers (`saving.register`).
    """
    global _installed
    report = patch_check.report()
    report.require(patch_check.FIT)
    if strategy.sync_runner is not None:
        report.require(patch_check.RELAXED)
    with _lock:
        if not _installed:
            for owner, name, wrapper in _process_patches():
                _wrap(report, owner, name, wrapper)
            _installed = True
        if saving.register(strategy):
            report.require(patch_check.SAVE)
            for owner, name, kind in _save_patches():
                _wrap(report, owner, name, saving.published, kind)
