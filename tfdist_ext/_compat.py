"""Every private TensorFlow / Keras import tfdist_ext relies on, in one place.

These are internal APIs of TensorFlow 2.19-2.21 and Keras 3.10-3.15 (see
docs/tf_internals.md); when upgrading TensorFlow, this module and the C++
kernels are what to re-check. Nothing else in the package may import
`tensorflow.python.*` or `keras.src.*`.

The Keras methods tfdist_ext replaces (most of them on the private classes and
modules below) are listed, with the reason for each and the Keras versions
checked, in `tfdist_ext.keras.patches`, the one module that installs them.
"""

# pylint: disable=unused-import,g-direct-tensorflow-import

import inspect

import tensorflow as tf

try:
    from tensorflow.python.distribute import collective_all_reduce_strategy
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
    from tensorflow.python.distribute import cross_device_utils
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.distribute import distribute_utils
    from tensorflow.python.distribute import input_lib
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.distribute import reduce_util
    from tensorflow.python.distribute import values as distribute_values
    from tensorflow.python.distribute.cluster_resolver import tfconfig_cluster_resolver
    from tensorflow.python.distribute.cluster_resolver import cluster_resolver as cluster_resolver_lib
    from tensorflow.python.data.ops import multi_device_iterator_ops
    from tensorflow.python.eager import context
    from tensorflow.python.framework import errors_impl
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import collective_ops
    from tensorflow.python.ops import resource_variable_ops
    from tensorflow.python.trackable import base as trackable_base
    from tensorflow.python.util import nest
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from keras.src.backend.tensorflow import nn as keras_tf_nn
    from keras.src.backend.tensorflow import optimizer as keras_tf_optimizer
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer
    from keras.src.losses import loss as keras_loss
    from keras.src.trainers.data_adapters import tf_dataset_adapter as keras_tf_dataset_adapter
    from keras.src.optimizers import loss_scale_optimizer as keras_loss_scale_optimizer
    from keras.src.optimizers import base_optimizer as keras_base_optimizer
    from keras.src.backend.common import global_state as keras_global_state
    from keras.src.backend.tensorflow import distribution_lib as keras_tf_distribution_lib
    from keras.src.distribution import distribution_lib as keras_distribution_lib
except ImportError as _err:
    import keras as _keras  # pylint: disable=ungrouped-imports
    import tensorflow as _tf
    raise ImportError(
        f"tfdist_ext needs {_err.name}, which TensorFlow {_tf.__version__} with Keras "
        f"{_keras.__version__} does not have ({_err}); tfdist_ext was tested with TensorFlow "
        '2.19-2.21 and Keras 3.10-3.15: python -m pip install "keras>=3.10.0,<3.16" '
        '"tensorflow-cpu>=2.19.1,<2.22"') from _err

CollectiveAllReduceExtended = collective_all_reduce_strategy.CollectiveAllReduceExtended
CollectiveAllReduce = cross_device_ops_lib.CollectiveAllReduce
CollectiveKeys = cross_device_utils.CollectiveKeys
CommunicationOptions = collective_util.Options
CommunicationImplementation = collective_util.CommunicationImplementation
ReduceOp = reduce_util.ReduceOp
SimpleClusterResolver = cluster_resolver_lib.SimpleClusterResolver
TFConfigClusterResolver = tfconfig_cluster_resolver.TFConfigClusterResolver
# A variable constructed directly (not through tf.Variable) bypasses the
# strategy's variable creator, as TF's CollectiveReplicaLauncher relies on for
# its ordering tokens.
ResourceVariable = resource_variable_ops.ResourceVariable
CheckpointInitialValue = trackable_base.CheckpointInitialValue
init_scope = ops.init_scope
# TF's fusion rule for CommunicationOptions.bytes_per_pack: packs of at least
# bytes_per_pack bytes, in order (0: one pack).
group_by_size = cross_device_utils.group_by_size
# Keras' TF-backend optimizer and trainer: `tfdist_ext.keras.patches` wraps
# `TFOptimizer._backend_update_step` (where Keras all-reduces gradients and
# applies them), `TensorFlowTrainer.make_train_function` and `.fit` so that a
# sync policy can replace the per-step all-reduce (docs/tf_internals.md).
TFOptimizer = keras_tf_optimizer.TFOptimizer
TensorFlowTrainer = keras_tf_trainer.TensorFlowTrainer
PerReplica = distribute_values.PerReplica
Mirrored = distribute_values.Mirrored
regroup = distribute_utils.regroup
# `tfdist_ext.keras.patches` wraps `TFOptimizer._backend_apply_gradients` and
# `LossScaleOptimizer._tf_apply` (`keras.optimizer_fixes`) so that clipping,
# gradient accumulation and loss-scale skips decide on the all-reduced gradients.
LossScaleOptimizer = keras_loss_scale_optimizer.LossScaleOptimizer
# ZeRO (`tfdist_ext.zero`) wraps `TFOptimizer.add_variable_from_reference` (no
# per-weight slots for a sharded optimizer; a replica's own optimizer takes the
# backend-independent `BaseOptimizer` method, which does not colocate with a
# strategy's variables) and `BaseOptimizer.save_own_variables`.
BaseOptimizer = keras_base_optimizer.BaseOptimizer
# The strategy in effect outside any scope; a Keras optimizer updates through the
# strategy it was made under (`set_optimizer_strategy` points it at this one).
default_strategy = distribute_lib._get_default_strategy  # pylint: disable=protected-access
# `keras_loss.scale_loss_for_distribution` / `unscale_loss_for_distribution`
# (module functions, looked up at call time by Keras' losses and trainer) are
# wrapped (`tfdist_ext.keras.patches`, `keras.uneven`) to weight replicas by
# their samples.
# Likewise the TF backend's `keras_tf_nn.conv`, `depthwise_conv`, `separable_conv`
# and `max_pool` (looked up at call time by `keras.ops`), for empty batches.
# tf.distribute's iterators and their specs, whose `_type_spec` and
# `_component_specs` properties `tfdist_ext.keras.iterator_specs` caches.
DistributedIterator = input_lib.DistributedIterator
DistributedIteratorSpec = input_lib.DistributedIteratorSpec
SingleWorkerOwnedDatasetIterator = input_lib._SingleWorkerOwnedDatasetIterator  # pylint: disable=protected-access
SingleWorkerDatasetIteratorSpec = input_lib._SingleWorkerDatasetIteratorSpec  # pylint: disable=protected-access
OwnedMultiDeviceIterator = multi_device_iterator_ops.OwnedMultiDeviceIterator
MultiDeviceIteratorSpec = multi_device_iterator_ops.MultiDeviceIteratorSpec
# Keras' epoch iterator, whose `_get_iterator` `tfdist_ext.keras.local_input` wraps, and
# the one data adapter that can hold a user's `DistributedDataset` (its `get_tf_dataset`
# returns what it holds; the array adapter's builds a new pipeline at every call).
TFEpochIterator = keras_tf_trainer.TFEpochIterator
TFDatasetAdapter = keras_tf_dataset_adapter.TFDatasetAdapter


def undistributed_dataset(distributed):
    """The `tf.data.Dataset` a `DistributedDataset` was made from (else None)."""
    if type(distributed) is not input_lib.DistributedDataset:  # pylint: disable=unidiomatic-typecheck
        return None
    return getattr(distributed, "_original_dataset", None)


def building_tf1_graph() -> bool:
    """Whether ops go into a TF1 graph (not eager, not a `tf.function`'s graph)."""
    return not context.executing_eagerly() and not ops.inside_function()


def dataset_graph(dataset) -> bytes:
    """The serialized GraphDef of a `tf.data.Dataset` (op names can be searched)."""
    return dataset._as_serialized_graph().numpy()  # pylint: disable=protected-access


def strategy_init(strategy, extended):
    """Runs `tf.distribute.Strategy.__init__` (skipping MWMS's own __init__)."""
    distribute_lib.Strategy.__init__(strategy, extended)


def is_distributed_value(value):
    return isinstance(value, distribute_values.DistributedValues)


def record_strategy_gauges(num_workers, replicas_per_worker):
    """Keeps TF's usage gauges as MultiWorkerMirroredStrategy would set them."""
    distribute_lib.distribution_strategy_gauge.get_cell("V2").set(
        "MultiWorkerMirroredStrategy")
    distribute_lib.distribution_strategy_replica_gauge.get_cell("num_workers").set(
        num_workers)
    distribute_lib.distribution_strategy_replica_gauge.get_cell(
        "num_replicas_per_worker").set(replicas_per_worker)


def collective_ops_enabled():
    """Whether this process already enabled multi-worker collective ops.

    Each MultiWorkerMirroredStrategy built with TF_CONFIG calls
    `context.enable_collective_ops` again, which resets the process's collective
    executor under a peer that is mid-collective (hangs when a second strategy
    initialises its variables). Strategies after the first must skip it.
    """
    return getattr(context.context(), "_collective_ops_server_def", None) is not None


def context_initialized():
    """Whether TF's eager context exists (any op, tensor or device query made it)."""
    return context.context()._context_handle is not None  # pylint: disable=protected-access


_recoverable_context = []  # [True] once the context lets a dead worker come back


def recoverable_context() -> bool:
    """Whether the context was configured with `recoverable=True` (the workers'
    jobs outlive a death and take a worker started again)."""
    return bool(_recoverable_context)


def prepare_multi_worker_context(cluster_spec, task_type, task_id, coordination=True,
                                 heartbeat_ms=0, recoverable=False):
    """Configures this process as a worker of `cluster_spec` before TF starts.

    What `MultiWorkerMirroredStrategy` does when it is created first thing in
    a program: collective ops (group leader, device filters), the coordination
    service, and the server definition. TF applies them lazily, when its eager
    context is created (the first op, tensor or device query), so from then on
    every device, tensor and resource has its worker name
    ("/job:worker/replica:0/task:1/..."): a strategy created later finds
    collective ops configured and tensors made before it still usable.

    Args:
        cluster_spec: `tf.train.ClusterSpec` of the chief and worker jobs.
        task_type: "worker" or "chief".
        task_id: This task's index in its job.
        coordination: False for a worker started again while its job runs:
            no coordination service (its leader may be dead), no registration.
        heartbeat_ms: The coordination service's heartbeat timeout (0: TF's
            default, 10 s), for recoverable jobs too: the service's own death
            detection only backs up the dead-peer watcher's, and a timeout
            puts the late task's TF collectives in error for good.
        recoverable: A worker's death does not fail the others' agents, and
            a worker started again may register as a new incarnation (what
            elastic training needs; `coordination=False` implies it).

    Returns:
        False (and changes nothing) when the context already exists.
    """
    ctx = context.context()
    if context_initialized() or collective_ops_enabled():
        return False
    ctx.configure_collective_ops(
        collective_leader=multi_worker_util.collective_leader(cluster_spec, task_type,
                                                              task_id),
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{task_type}/task:{task_id}",))
    # A recoverable job: a worker's death does not fail the others' agents. A worker
    # started again joins without the service; one that found no running job tries to
    # register as a new incarnation, which the service refuses while the dead task is
    # within its heartbeat timeout: it waits until the startup watch ends it, naming
    # the blocked UDP (`tfdist_ext.startup`).
    recoverable = recoverable or not coordination
    if coordination:
        ctx.configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(cluster_spec),
            coordinated_jobs=[coordination_config_pb2.CoordinatedJob(
                name=job, num_tasks=cluster_spec.num_tasks(job))
                for job in ("chief", "worker") if job in cluster_spec.jobs],
            heartbeat_timeout_in_ms=heartbeat_ms,
            allow_new_incarnation_to_reconnect=recoverable)
        if recoverable:
            ctx.coordination_service.recoverable_jobs.append("worker")
    if recoverable:
        _recoverable_context.append(True)
    ctx.enable_collective_ops(tensorflow_server_pb2.ServerDef(
        cluster=cluster_spec.as_cluster_def(), default_session_config=ctx.config,
        job_name=task_type, task_index=task_id, protocol="grpc", port=0))
    return True


def coordination_service_configured():
    return context.context().coordination_service is not None


def global_seed():
    """TF's global random seed (`tf.random.set_seed`), None when unset."""
    return context.global_seed()


def coordination_barrier(barrier_id, timeout_in_ms):
    """Blocks until every task of the coordination service reaches `barrier_id`."""
    context.context().wait_at_barrier(barrier_id, timeout_in_ms)


def coordination_service_kv():
    """(set, get) functions of the coordination service's key-value store."""
    ctx = context.context()
    return ctx.set_config_key_value, ctx.get_config_key_value


def coordination_key_value(key, timeout_in_ms):
    """The value of `key` in the coordination service's store; raises when absent
    after `timeout_in_ms` (or when the service is unreachable); 0 waits until it is
    set. A read that times out stays pending on the service until the key is set."""
    return context.context().get_config_key_value(key, timeout_in_ms=timeout_in_ms)


def check_peer_health(task, timeout_in_ms):
    """Raises (UnavailableError, DeadlineExceededError, ...) unless the TF server of
    `task` ("/job:worker/replica:0/task:1") answers within `timeout_in_ms`."""
    context.context().check_collective_ops_peer_health(task, timeout_in_ms=timeout_in_ms)


def abort_collective_ops(message):
    """Fails this process's TF collective ops, now and later, with UNAVAILABLE `message`."""
    context.context().abort_collective_ops(errors_impl.UNAVAILABLE, message)


def distributed_update_step(optimizer):
    """Keras' cross-replica apply step of a TF-backend optimizer.

    A function (strategy, grads_and_vars, learning_rate) run in cross-replica
    context: per-replica gradients update each replica's own variables.
    """
    return optimizer._distributed_tf_update_step  # pylint: disable=protected-access


def optimizer_slots(optimizer):
    """A Keras optimizer's per-parameter variables (momentum, Adam's moments).

    Not its step counter, nor the learning rate Keras keeps as a variable.
    """
    skip = {id(optimizer.iterations), id(getattr(optimizer, "_learning_rate", None))}
    return [v for v in optimizer.variables if id(v) not in skip]


def set_optimizer_strategy(optimizer, strategy):
    """Makes a Keras TF optimizer update through `strategy` (Keras reads it at construction)."""
    optimizer._distribution_strategy = strategy  # pylint: disable=protected-access


def keras_iterator_function(function):
    """The `tf.function` that Keras' train or test function calls with a
    distributed iterator (`multi_step_on_iterator` of
    `TensorFlowTrainer._make_function`), under wrappers made with
    `functools.wraps`; None where it has none (`run_eagerly`, another Keras)."""
    function = inspect.unwrap(function)
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if (isinstance(value, tf.types.experimental.PolymorphicFunction)
                and getattr(value, "__name__", "") == "multi_step_on_iterator"):
            return value
    return None


def set_initial_epoch(model, epoch):
    """Makes the running `fit` begin at `epoch` when set in `on_train_begin` (Keras
    reads `model._initial_epoch` after it, as `BackupAndRestore` uses); returns the
    value it had."""
    previous = getattr(model, "_initial_epoch", None)
    model._initial_epoch = epoch  # pylint: disable=protected-access
    return previous


# Callbacks that waited for this module to finish importing (it imports Keras, and
# `tfdist_ext.distribution` installs itself once Keras is imported).
for _callback in globals().pop("when_imported", []):
    _callback()

