"""The ZeRO step: each replica's optimizer updates and keeps its shard of the weights.

Per step, in each replica (`update_step`, in place of Keras' all-reduce-then-
apply): the gradients are all-reduced as in plain data parallelism (stage 1)
or reduce-scattered (stage 2, `stage2`: the replica gets its shard's sum); the
replica's optimizer updates its shard of the flattened weights
(`partition.Partition`; only the shard's pieces are sliced, no flat copy of
the model) and keeps state for that shard alone; then each weight in turn is
gathered from the replicas' shards and assigned (`_gather`), so the gather
holds one weight's buffers at a time. The gather is an all-reduce of the
pieces placed in zeros: bytes per step are twice plain data parallelism's
(an all-gather would send half of that). Keras applies weight decay
(AdamW, `weight_decay=`) to the full weights before, as without sharding.
Clipping applies to the summed gradients (`apply_gradients`), as in one
process. Embedding gradients (IndexedSlices) are reduced dense, as with
`Strategy(sparse_as_dense=True)`: the same for SGD and momentum; Adam squares
each row's sum, not each lookup's.

The model's optimizer object keeps its `iterations`, learning rate and
config; its per-weight slots are empty, and each replica's state lives in a
second optimizer of the same class and config over a plain (unmirrored)
variable holding that replica's shard (`shard_state`). Options that need the
whole state in one place are refused with an error (`check_optimizer`), and
`checkpoint` saves and loads the whole state in Keras' format.

Tuning: per replica, the state shrinks to 1/N, and the shard's weights are
kept once more (the replica optimizer's variable): with Adam (state twice the
weights) the saving is (2N - 3)/N of the weights' bytes. At stage 1 the
gather doubles the bytes per step; stage 2 sends 1.5x plain data
parallelism's. Keep `zero_stage=0` while the state fits.
"""

import functools
import threading

import keras
import numpy as np
import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.zero import accumulation, shards, stage2
from tfdist_ext.zero.partition import Partition

STAGES = (0, 1, 2)
# Their update of a weight reads the whole weight, not element by element.
PER_WEIGHT_OPTIMIZERS = ("Adafactor", "Lamb", "Muon")
ACCUMULATOR = "gradient_accumulator"  # Keras' name for `gradient_accumulation_steps`' slots
_lock = threading.Lock()


def check_stage(value) -> int:
    """`zero_stage`, validated."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in STAGES:
        raise ValueError(f"Argument `zero_stage` must be one of {list(STAGES)}; received "
                         f"{value!r}. 0 keeps the optimizer's state on every replica, 1 "
                         "shards it across replicas, 2 shards the summed gradients too.")
    return value


def check_optimizer(optimizer) -> None:
    """Raises ValueError for optimizer options ZeRO does not support."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:  # LossScaleOptimizer: its inner optimizer holds the state
        check_optimizer(inner)
        return
    stage = _stage(optimizer) or 1
    for name in PER_WEIGHT_OPTIMIZERS:
        if isinstance(optimizer, getattr(keras.optimizers, name, ())):
            raise ValueError(f"zero_stage={stage} does not support keras.optimizers.{name}: "
                             "its update reads whole weights (norms or factored rows and "
                             "columns), and a replica holds a flat shard of them. Use an "
                             "element-wise optimizer (SGD, Adam, AdamW, RMSprop, Adagrad, "
                             "Lion, ...) or zero_stage=0.")
    if stage == 2:
        stage2.check_clipping(optimizer)
    if optimizer.use_ema:
        raise ValueError(f"zero_stage={stage} does not support the optimizer's `use_ema` "
                         "(use_ema=True) yet; leave it out or use zero_stage=0.")


def _stage(optimizer) -> int:
    strategy = getattr(optimizer, "_distribution_strategy", None)
    return getattr(getattr(strategy, "config", None), "zero_stage", 0)


def sharded(optimizer) -> bool:
    """Whether `optimizer` is a model's optimizer under a `zero_stage >= 1` strategy of
    several replicas (one replica keeps the whole state: nothing to shard)."""
    if shards.is_replica_optimizer(optimizer):
        return False
    strategy = optimizer._distribution_strategy  # pylint: disable=protected-access
    return _stage(optimizer) >= 1 and strategy.num_replicas_in_sync > 1


def _plain_variables():
    """Variables made in this scope are the replica's own, not the strategy's mirrored ones."""

    def creator(next_creator, **kwargs):
        del next_creator
        keep = ("initial_value", "trainable", "name", "dtype", "shape")
        return _compat.ResourceVariable(**{k: kwargs[k] for k in keep if k in kwargs})

    return tf.variable_creator_scope(creator)


def shard_state(optimizer, replica: int, plan: Partition, paths, dtype):
    """(shard variable, optimizer over it) of `replica`, made on first use.

    A state loaded before (`shards.keep_pending`) is written into a new one.
    """
    with _lock:
        made = shards.replicas(optimizer).get(replica)
        if made is not None:
            return made
        with tf.init_scope(), _plain_variables():
            shard = tf.Variable(tf.zeros([plan.shard], dtype), trainable=False,
                                name=f"zero_shard_{replica}")
            # The replica's optimizer steps only: accumulation stays with the model's.
            own = type(optimizer).from_config({**optimizer.get_config(),
                                               "gradient_accumulation_steps": None})
            _compat.set_optimizer_strategy(own, _compat.default_strategy())
            shards.mark_replica_optimizer(own)
            own.build([shard])
            pending = shards.take_pending(optimizer)
            if pending is not None:
                shards.restore(own, replica, plan, paths, pending)
        shards.add_replica(optimizer, replica, shard, own)
        return shard, own


def apply_gradients(optimizer, grads, variables):
    """Keras' `_backend_apply_gradients` (replica context) with the state sharded: weight
    decay, then the optimizer's `_backend_update_step`, which reaches `update_step`
    (it clips the summed gradients, as one process would)."""
    check_optimizer(optimizer)
    if optimizer.gradient_accumulation_steps:
        accumulation.apply_every(optimizer, grads, variables, _apply)
    else:
        _apply(optimizer, grads, variables)


def _apply(optimizer, grads, variables):
    optimizer._apply_weight_decay(variables)  # pylint: disable=protected-access
    # The class's own step first (Nadam updates its u_product), which calls
    # `update_step` through `tfdist_ext.keras.fit_hooks`.
    optimizer._backend_update_step(  # pylint: disable=protected-access
        grads, variables, optimizer.learning_rate)


def update_step(optimizer, grads, variables, learning_rate):
    """Keras' `_backend_update_step` (replica context) with the state sharded.

    The summed gradients are clipped as the optimizer's `clipnorm`,
    `global_clipnorm` or `clipvalue` asks: every replica has them whole, so the
    global norm needs no more communication.
    """
    check_optimizer(optimizer)
    context = tf.distribute.get_replica_context()
    replica = int(tf.get_static_value(context.replica_id_in_sync_group))
    shards.set_layout(optimizer, variables)
    paths = [shards.path_of(v) for v in variables]
    variables = [getattr(v, "value", v) for v in variables]
    dtypes = sorted({v.dtype.name for v in variables})
    if len(dtypes) > 1:
        raise ValueError(f"zero_stage={_stage(optimizer)} keeps the weights as one flat buffer "
                         f"of one dtype; this model's trainable weights have dtypes {dtypes}. "
                         "Give them one dtype (keras.mixed_precision policies keep float32 "
                         "weights) or use zero_stage=0.")
    plan = Partition.of([v.shape.num_elements() for v in variables],
                        context.num_replicas_in_sync)
    dtype = variables[0].dtype
    pieces = plan.pieces(replica)  # no full flat copy: only the shard's pieces are sliced

    def shard_of(tensors):
        parts = [tf.reshape(tf.cast(tensors[i], dtype), [-1])[lo:hi] for i, lo, hi in pieces]
        padding = plan.shard - plan.owned(replica)
        return tf.concat(parts + ([tf.zeros([padding], dtype)] if padding else []), 0)

    if _stage(optimizer) == 2:
        shard_grads = stage2.summed_shard(context, optimizer, grads, plan, dtype)
    else:
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                   [tf.convert_to_tensor(g) for g in grads])
        shard_grads = shard_of(optimizer._clip_gradients(grads))  # pylint: disable=protected-access
    shard, own = shard_state(optimizer, replica, plan, paths, dtype)
    shard.assign(shard_of(variables))
    own.iterations.assign(optimizer.iterations)
    for mine, theirs in shards.shared_variables(optimizer, own):
        theirs.assign(mine)
    own.update_step(shard_grads, shard, learning_rate)
    context.merge_call(functools.partial(_gather, variables=variables, plan=plan),
                       args=(tf.convert_to_tensor(shard), tf.constant(replica)))


def _gather(distribution, updated, replicas, variables, plan):
    """Every replica's updated shard into the weights, one weight at a time.

    Each weight, with each replica's piece in place in zeros, is summed over the
    replicas (an all-gather whose sums add zeros only: exact, on the strategy's
    engine) and assigned before the next weight's is made, so a step holds one
    weight's gather buffers at a time, not the whole model's.
    """
    devices = distribution.extended.worker_devices
    updated = distribution.experimental_local_results(updated)
    replicas = [int(tf.get_static_value(r))
                for r in distribution.experimental_local_results(replicas)]
    pieces = [{i: (lo, hi) for i, lo, hi in plan.pieces(r)} for r in replicas]
    offsets = [0] * len(devices)
    previous = []
    for i, variable in enumerate(variables):
        size = plan.sizes[i]
        with tf.control_dependencies(previous):
            parts = []
            for j, device in enumerate(devices):
                lo, hi = pieces[j].get(i, (0, 0))
                with tf.device(device):
                    mine = updated[j][offsets[j]:offsets[j] + hi - lo]
                    parts.append(tf.reshape(tf.pad(mine, [[lo, size - hi]]), variable.shape))
                offsets[j] += hi - lo
            summed = distribution.extended.reduce_to(
                tf.distribute.ReduceOp.SUM, _compat.PerReplica(parts), destinations=variable)
            previous = [distribution.extended.update(variable, lambda v, x: v.assign(x),
                                                     args=(summed,), group=True)]


def slot_bytes(optimizer) -> int:
    """Bytes of a Keras optimizer's state: its variables but the step counter and learning rate."""
    return sum(np.asarray(v).nbytes for v in optimizer.variables
               if v.name not in ("iteration", "learning_rate"))


def state_bytes(optimizer) -> dict:
    """{replica id: bytes of its shard's optimizer state} (`slot_bytes` of its optimizer)."""
    return {replica: slot_bytes(own) for replica, (_, own) in shards.replicas(optimizer).items()}


def wrap_add_variable_from_reference(original):
    """`TFOptimizer.add_variable_from_reference`: an empty slot for a sharded optimizer
    (but whole gradient accumulators); a replica's optimizer makes its slots as a plain
    optimizer does."""

    @functools.wraps(original)
    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        if shards.is_replica_optimizer(self):
            slot = _compat.BaseOptimizer.add_variable_from_reference(
                self, reference_variable, name=name, initializer=initializer)
            shards.add_kind(self, name or "var", slot)
            return slot
        if sharded(self) and name == ACCUMULATOR:
            accumulator = original(self, reference_variable, name=name, initializer=initializer)
            shards.add_unshared(self, accumulator)
            return accumulator
        if sharded(self):
            slot = self.add_variable(shape=(0,), dtype=reference_variable.dtype, name=name)
            shards.add_slot(self, slot, reference_variable, name or "var")
            return slot
        return original(self, reference_variable, name=name, initializer=initializer)

    return add_variable_from_reference
