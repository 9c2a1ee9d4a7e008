"""The ZeRO step: each replica's optimizer updates and keeps its blocks of the weights.

Every weight is cut into N equal blocks and replica r owns block r of each
(`partition.Partition`). Per step, in each replica (`update_step`, in place
of Keras' all-reduce-then-apply): the replica gets its block of each summed
gradient (`summed.gradient_blocks`: all-reduced at stage 1,
reduce-scattered at stage 2, clipped as one process clips); its own
optimizer updates its blocks and keeps state for them alone; then the
updated blocks are all-gathered into the weights, bucket by bucket
(`blocks.gather`). Bytes per step: an all-reduce's at stage 1 plus an
all-gather's, at stage 2 a reduce-scatter's and an all-gather's (together
an all-reduce's). Keras applies weight decay (AdamW, `weight_decay=`) to the
full weights before, as without sharding. Embedding gradients
(IndexedSlices) are reduced dense, as with `Strategy(sparse_as_dense=True)`:
the same for SGD and momentum; Adam squares each row's sum, not each
lookup's.

The model's optimizer object keeps its `iterations`, learning rate and
config; its per-weight slots are empty, and each replica's state lives in a
second optimizer of the same class and config over plain (unmirrored)
variables holding that replica's blocks (`shard_state`). Options that need
the whole state in one place are refused with an error (`check_optimizer`),
and `checkpoint` saves and loads the whole state in Keras' format.

Tuning: per replica, the state shrinks to 1/N (plus less than one element
per weight of padding). The blocks' copies of the weights exist only during
the step (emptied after the gather), so between steps a replica holds the
weights, its 1/N of the state and nothing else of ZeRO's. Keep
`zero_stage=0` while the state fits; prefer stage 2, which sends and holds
less than stage 1 (stage 1 also runs with engine="tf").
"""

import functools
import threading

import keras
import numpy as np
import tensorflow as tf

from tfdist_ext import _compat, frontends
from tfdist_ext.zero import accumulation, blocks, shards, summed
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
                             "columns), and a replica holds a block of each. Use an "
                             "element-wise optimizer (SGD, Adam, AdamW, RMSprop, Adagrad, "
                             "Lion, ...) or zero_stage=0.")
    if optimizer.use_ema:
        raise ValueError(f"zero_stage={stage} does not support the optimizer's `use_ema` "
                         "(use_ema=True) yet; leave it out or use zero_stage=0.")


def _stage(optimizer) -> int:
    ours = frontends.our_strategy(getattr(optimizer, "_distribution_strategy", None))
    return 0 if ours is None else ours.config.zero_stage


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
    """(block variables, optimizer over them) of `replica`, made on first use.

    One variable per weight holds the replica's block of it during the step;
    its length is left open so that the step can empty it again. A state
    loaded before (`shards.keep_pending`) is written into the new optimizer.
    """
    with _lock:
        made = shards.replicas(optimizer).get(replica)
        if made is not None:
            return made
        with tf.init_scope(), _plain_variables():
            variables = [tf.Variable(tf.zeros([plan.block(i)], dtype), trainable=False,
                                     shape=tf.TensorShape([None]), name=f"zero_block_{replica}")
                         for i in range(len(plan.sizes))]
            # The replica's optimizer steps only: accumulation stays with the model's.
            own = type(optimizer).from_config({**optimizer.get_config(),
                                               "gradient_accumulation_steps": None})
            _compat.set_optimizer_strategy(own, _compat.default_strategy())
            shards.mark_replica_optimizer(own)
            own.build(variables)
            pending = shards.take_pending(optimizer)
            if pending is not None:
                shards.restore(own, replica, plan, paths, pending)
        shards.add_replica(optimizer, replica, variables, own)
        return variables, own


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
    `global_clipnorm` or `clipvalue` asks (`summed.gradient_blocks`).
    """
    check_optimizer(optimizer)
    context = tf.distribute.get_replica_context()
    replica = int(tf.get_static_value(context.replica_id_in_sync_group))
    shards.set_layout(optimizer, variables)
    paths = [shards.path_of(v) for v in variables]
    variables = [getattr(v, "value", v) for v in variables]
    dtypes = sorted({v.dtype.name for v in variables})
    if len(dtypes) > 1:
        raise ValueError(f"zero_stage={_stage(optimizer)} moves the weights in buckets of one "
                         f"dtype; this model's trainable weights have dtypes {dtypes}. "
                         "Give them one dtype (keras.mixed_precision policies keep float32 "
                         "weights) or use zero_stage=0.")
    plan = Partition.of([v.shape.num_elements() for v in variables],
                        context.num_replicas_in_sync)
    dtype = variables[0].dtype
    grads = summed.gradient_blocks(context, optimizer, grads, plan, dtype, _stage(optimizer))
    mine, own = shard_state(optimizer, replica, plan, paths, dtype)
    own.iterations.assign(optimizer.iterations)
    for theirs, copy in shards.shared_variables(optimizer, own):
        copy.assign(theirs)
    for i, (grad, variable, weight) in enumerate(zip(grads, mine, variables)):
        variable.assign(blocks.block(weight, plan, i, replica, dtype))
        own.update_step(grad, variable, learning_rate)
    context.merge_call(functools.partial(_gather, variables=variables, plan=plan, dtype=dtype),
                       args=([tf.convert_to_tensor(v) for v in mine], tf.constant(replica)))
    for variable in mine:  # their memory is free between steps
        variable.assign(tf.zeros([0], dtype))


def _gather(distribution, updated, replicas, variables, plan, dtype):
    """Every replica's updated blocks into the weights, bucket by bucket
    (`blocks.gather`: one bucket's buffers at a time)."""
    updated = [distribution.experimental_local_results(u) for u in updated]
    replicas = [int(tf.get_static_value(r))
                for r in distribution.experimental_local_results(replicas)]

    def assign(bucket, weights):
        return [distribution.extended.update(variables[i], lambda v, x: v.assign(x),
                                             args=(_compat.PerReplica(values),), group=True)
                for i, values in zip(bucket, weights)]

    blocks.gather(distribution, updated, replicas, plan, variables, dtype, assign)


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
            # The shard's length, which its variable leaves open (`shard_state`).
            shape = tuple(tf.convert_to_tensor(reference_variable).shape)
            slot = self.add_variable(shape=shape, initializer=initializer,
                                     dtype=reference_variable.dtype,
                                     name=f"zero_shard_{name or 'var'}")
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
