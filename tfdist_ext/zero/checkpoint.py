"""Saving and loading a sharded optimizer in Keras' own format.

`model.save`, `save_weights`, `ModelCheckpoint` and `BackupAndRestore` call
the optimizer's `save_own_variables`; under `zero_stage=1` it writes every
slot whole, as an unsharded optimizer would: each kind of slot ("momentum",
"velocity", ...) is gathered from the replicas' blocks (each block placed in
zeros and summed: exact) and written weight by weight, so a save holds one
kind of slot of the whole model at a time. The file is the one plain Keras
writes: plain Keras loads it, and so does a run at any other number of
workers or with `zero_stage=0`.

`load_own_variables` takes each replica's part of the whole slots (no
communication). Loaded before the first step, the state is kept until the
step makes the replicas' optimizers (`shards.keep_pending`).

Saving gathers across workers, so every worker must save at the same point:
`fit`'s callbacks do, and scripts that save after `fit` must call
`model.save` on every worker (the others into a temporary path, as
tf.distribute's multi-worker tutorial does); a save on the chief alone
waits for the others until the collective timeout.
"""

import functools

import numpy as np
import tensorflow as tf

from tfdist_ext.zero import blocks, shards, step
from tfdist_ext.zero.partition import Partition


def _plan(optimizer):
    paths, weights = shards.layout(optimizer)
    sizes = [int(np.prod(w.shape)) for w in weights]
    strategy = optimizer._distribution_strategy  # pylint: disable=protected-access
    return strategy, paths, weights, Partition.of(sizes, strategy.num_replicas_in_sync)


def _whole(optimizer, kind: str):
    """{weight path: whole `kind` slot (numpy)}, gathered from every replica's blocks."""
    strategy, paths, weights, plan = _plan(optimizer)
    dtype = tf.as_dtype(weights[0].dtype)

    def per_replica():
        context = tf.distribute.get_replica_context()
        replica = int(tf.get_static_value(context.replica_id_in_sync_group))
        _, own = step.shard_state(optimizer, replica, plan, paths, dtype)
        return [strategy.all_reduce_dense(tf.distribute.ReduceOp.SUM, blocks.placed(
            tf.convert_to_tensor(slot), replica, plan.world)) for slot in shards.kinds(own)[kind]]

    gathered = tf.function(lambda: strategy.run(per_replica))()
    return {path: strategy.experimental_local_results(flat)[0].numpy()[:size].reshape(
        tuple(weight.shape)) for path, weight, size, flat in zip(paths, weights, plan.sizes,
                                                                  gathered)}


def wrap_save_own_variables(original):
    """`BaseOptimizer.save_own_variables`: a sharded optimizer writes its slots whole."""

    @functools.wraps(original)
    def save_own_variables(self, store):
        if not step.sharded(self):
            return original(self, store)
        slots, owners = {}, {}
        for i, variable in enumerate(self.variables):
            found = shards.owner_of(self, variable)
            if found is None:
                store[str(i)] = variable.numpy()
                continue
            owner, weight, kind = found
            owners[id(owner)] = owner
            slots.setdefault((id(owner), kind), []).append((i, weight))
        for (owner, kind), entries in slots.items():
            whole = _whole(owners[owner], kind)
            for i, weight in entries:
                path = shards.path_of(weight)
                # A weight the step never updated (no gradient) has its initial zeros.
                store[str(i)] = (whole[path] if path in whole else
                                 np.zeros(tuple(weight.shape), tf.as_dtype(weight.dtype).name))
            del whole  # before the next kind's gather: one kind in memory at a time
        return None

    return save_own_variables


def wrap_load_own_variables(original):
    """`BaseOptimizer.load_own_variables`: a sharded optimizer keeps its replicas' parts."""

    @functools.wraps(original)
    def load_own_variables(self, store):
        if not step.sharded(self) or len(store.keys()) != len(self.variables):
            return original(self, store)
        arrays, owners = {}, {}
        for i, variable in enumerate(self.variables):
            value = np.asarray(store[str(i)])
            found = shards.owner_of(self, variable)
            if found is None:
                variable.assign(value)
                continue
            owner, weight, kind = found
            if value.shape != tuple(weight.shape):
                raise ValueError(
                    f"The optimizer state being loaded has shape {value.shape} for the "
                    f"{kind!r} slot of weight {shards.path_of(weight)!r}, whose shape is "
                    f"{tuple(weight.shape)}: the file was saved from another model. Load "
                    "a file saved with the same model.")
            owners[id(owner)] = owner
            arrays.setdefault(id(owner), {})[(shards.path_of(weight), kind)] = value
        for key, owner in owners.items():
            strategy, paths, _, plan = _plan(owner)
            made = shards.replicas(owner)
            for replica, (_, own) in made.items():
                shards.restore(own, replica, plan, paths, arrays[key])
            if not made:
                shards.keep_pending(owner, arrays[key], len(strategy.extended.worker_devices))
        return None

    return load_own_variables
