"""ZeRO stage 1: each replica's optimizer updates and keeps its shard of the weights.

Per step, in each replica (`update_step`, in place of Keras' all-reduce-then-
apply): the gradients are all-reduced as in plain data parallelism; the
weights and the summed gradients are flattened (`partition.Partition`) and
the replica's optimizer updates its shard only, with state (Adam's moments,
momentum) for that shard alone; the updated shards are all-gathered and
every replica assigns the full weights. The gather is an all-reduce of the
shards placed in zeros: bytes per step are twice plain data parallelism's
(the engine's all-gather would send half of that). Keras applies weight decay
(AdamW, `weight_decay=`) to the full weights before, as without sharding.
Embedding gradients (IndexedSlices) are reduced dense, as with
`Strategy(sparse_as_dense=True)`: the same for SGD and momentum; Adam squares
each row's sum, not each lookup's.

The model's optimizer object keeps its `iterations`, learning rate and
config; its per-weight slots are empty, and each replica's state lives in a
second optimizer of the same class and config over a plain (unmirrored)
variable holding that replica's shard (`shard_state`). Options that need the
whole state in one place are refused with an error (`check_optimizer`), and
so is saving it (`wrap_save_own_variables`): the shards are not gathered.

Tuning: the memory saved per replica is (N-1)/N of the optimizer's state; the
gather doubles the bytes per step, so keep `zero_stage=0` when the state fits.
"""

import threading
import weakref

import numpy as np
import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.zero.partition import Partition

STAGES = (0, 1)
_lock = threading.Lock()
# optimizer -> {replica id: (shard variable, the replica's optimizer)}
_shards = weakref.WeakKeyDictionary()
_replica_optimizers = weakref.WeakSet()


def check_stage(value) -> int:
    """`zero_stage`, validated."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in STAGES + (2,):
        raise ValueError(f"Argument `zero_stage` must be one of {list(STAGES)}; received "
                         f"{value!r}. 0 keeps the optimizer's state on every replica, 1 "
                         "shards it across replicas.")
    if value == 2:
        raise ValueError("zero_stage=2 (gradients sharded too) is not available yet; "
                         "use zero_stage=1, which shards the optimizer's state.")
    return value


def check_optimizer(optimizer) -> None:
    """Raises ValueError for optimizer options ZeRO stage 1 does not support."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if isinstance(optimizer, _compat.LossScaleOptimizer) or inner is not None:
        raise ValueError("zero_stage=1 does not support LossScaleOptimizer (mixed precision) "
                         "yet; train in float32 or use zero_stage=0.")
    for option in ("gradient_accumulation_steps", "use_ema", "clipnorm", "global_clipnorm",
                   "clipvalue"):
        value = getattr(optimizer, option, None)
        if value:
            raise ValueError(f"zero_stage=1 does not support the optimizer's `{option}` "
                             f"({option}={value!r}) yet; leave it out or use zero_stage=0.")


def sharded(optimizer) -> bool:
    """Whether `optimizer` is a model's optimizer under a `zero_stage >= 1` strategy."""
    if optimizer in _replica_optimizers:
        return False
    strategy = getattr(optimizer, "_distribution_strategy", None)
    return getattr(getattr(strategy, "config", None), "zero_stage", 0) >= 1


def _plain_variables():
    """Variables made in this scope are the replica's own, not the strategy's mirrored ones."""

    def creator(next_creator, **kwargs):
        del next_creator
        keep = ("initial_value", "trainable", "name", "dtype", "shape")
        return _compat.ResourceVariable(**{k: kwargs[k] for k in keep if k in kwargs})

    return tf.variable_creator_scope(creator)


def shard_state(optimizer, replica: int, size: int, dtype):
    """(shard variable, optimizer over it) of `replica`, made on first use."""
    with _lock:
        per_replica = _shards.setdefault(optimizer, {})
        if replica not in per_replica:
            with tf.init_scope(), _plain_variables():
                shard = tf.Variable(tf.zeros([size], dtype), trainable=False,
                                    name=f"zero_shard_{replica}")
                own = type(optimizer).from_config(optimizer.get_config())
                _compat.set_optimizer_strategy(own, _compat.default_strategy())
                _replica_optimizers.add(own)
                own.build([shard])
            per_replica[replica] = (shard, own)
        return per_replica[replica]


def update_step(optimizer, grads, variables, learning_rate):
    """Keras' `_backend_update_step` (replica context) with the state sharded."""
    check_optimizer(optimizer)
    context = tf.distribute.get_replica_context()
    replica = int(tf.get_static_value(context.replica_id_in_sync_group))
    variables = [getattr(v, "value", v) for v in variables]
    grads = context.all_reduce(tf.distribute.ReduceOp.SUM,
                               [tf.convert_to_tensor(g) for g in grads])
    plan = Partition.of([v.shape.num_elements() for v in variables],
                        context.num_replicas_in_sync)
    dtype = variables[0].dtype

    def flat(tensors):
        whole = tf.concat([tf.reshape(tf.cast(t, dtype), [-1]) for t in tensors], 0)
        return tf.pad(whole, [[0, plan.padded - plan.total]])

    start, stop = plan.bounds(replica)
    shard, own = shard_state(optimizer, replica, plan.shard, dtype)
    shard.assign(flat(variables)[start:stop])
    own.iterations.assign(optimizer.iterations)
    own.update_step(flat(grads)[start:stop], shard, learning_rate)
    # Each replica's shard in place in zeros, summed: an all-gather whose sums add zeros
    # only (exact), through the strategy's engine.
    placed = tf.pad(tf.convert_to_tensor(shard), [[start, plan.padded - stop]])
    gathered = context.all_reduce(tf.distribute.ReduceOp.SUM, placed)[:plan.total]
    values = [tf.reshape(part, v.shape) for part, v in
              zip(tf.split(gathered, list(plan.sizes)), variables)]

    def assign(distribution, values):
        for variable, value in zip(variables, values):
            distribution.extended.update(variable, lambda v, x: v.assign(x), args=(value,),
                                         group=False)

    context.merge_call(assign, args=(values,))


def state_bytes(optimizer) -> dict:
    """{replica id: bytes of its shard's optimizer state} (slots, not the step counter)."""
    return {replica: sum(np.asarray(v).nbytes for v in own.variables
                         if v.name not in ("iteration", "learning_rate"))
            for replica, (_, own) in _shards.get(optimizer, {}).items()}


def wrap_add_variable_from_reference(original):
    """`TFOptimizer.add_variable_from_reference`: no per-weight slot for a sharded optimizer;
    a replica's optimizer makes its slots as a plain optimizer does."""

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        if self in _replica_optimizers:
            return _compat.BaseOptimizer.add_variable_from_reference(
                self, reference_variable, name=name, initializer=initializer)
        if sharded(self):
            return self.add_variable(shape=(0,), dtype=reference_variable.dtype, name=name)
        return original(self, reference_variable, name=name, initializer=initializer)

    return add_variable_from_reference


def wrap_save_own_variables(original):
    """`BaseOptimizer.save_own_variables`: refused for a sharded optimizer."""

    def save_own_variables(self, store):
        if sharded(self):
            raise ValueError(
                "Saving the optimizer of a model trained with zero_stage=1 is not available "
                "yet: each replica holds a shard of its state, and a file would silently lack "
                "the rest (model.save, save_weights, ModelCheckpoint and BackupAndRestore "
                "save it). Use zero_stage=0 for runs you checkpoint, or save the weights "
                "alone: np.save(path, model.get_weights()).")
        return original(self, store)

    return save_own_variables
