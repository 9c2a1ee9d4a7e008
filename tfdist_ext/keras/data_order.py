"""Every worker must read the data in the same order; `fit` checks it.

TF's auto-sharding gives worker i every N-th batch (or file) of the dataset
each worker builds, which is a partition of the data only if every worker
builds the same sequence. An unseeded shuffle made before `fit` (a
`tf.data` `shuffle()` or `text_dataset_from_directory` without `seed`, a
shuffled DataFrame, `np.random.permutation` before `validation_split`)
breaks that silently: workers train on overlapping data and validate on data
others trained on. At the start of a multi-worker `fit`, `check` compares a
digest of each worker's input (the first element of a `tf.data.Dataset`; the
first and last rows of arrays) and warns, naming the likely cause and the
fix, when they differ. Datasets whose auto-sharding is off (the user shards
them), any input under `keras.distribution.DataParallel(auto_shard_dataset=
False)` (each worker's own) and datasets that read through a `cache()` are
not compared.

Keras' own shuffle of array inputs (`fit(x, y, shuffle=True)`, the default)
draws from TF's global seed; when the script set none, `agree_shuffle_seed`
sets the same one on every worker.
"""

import hashlib
import logging
import random

import numpy as np
import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.keras import local_input

log = logging.getLogger("tfdist_ext")
_ROWS = 8

ADVICE = (
    "Auto-sharding gives each worker every N-th batch of the dataset every worker builds, "
    "so all workers must build it in the same order: seed every shuffle made before fit "
    "(tf.data `shuffle(..., seed=S)`, `keras.utils.text_dataset_from_directory(..., "
    "seed=S)`, `df.sample(frac=1, random_state=S)`, `np.random.default_rng(S)`), or call "
    "`keras.utils.set_random_seed(S)` first thing in the script; or shard the data "
    "yourself and turn auto-sharding off.")


def digest(data, y=None):
    """A hex digest of what `fit` would read first; None where it cannot tell.

    Args:
        data: `fit`'s `x`: a `tf.data.Dataset`, or arrays (a nest of NumPy
            arrays, tensors or DataFrames).
        y: `fit`'s `y` with array inputs.
    """
    if local_input.per_worker_input():
        return None
    if isinstance(data, tf.data.Dataset):
        policy = data.options().experimental_distribute.auto_shard_policy
        if policy == tf.data.experimental.AutoShardPolicy.OFF or _caches(data):
            return None
        leaves = tf.nest.flatten(next(iter(data.take(1)), None))
    else:
        leaves = []
        for value in tf.nest.flatten((data, y)):
            if value is None or not hasattr(value, "shape") or not len(value.shape):
                continue
            rows = np.asarray(value[:_ROWS]), np.asarray(value[-_ROWS:])
            leaves.extend(rows + (np.asarray(value.shape),))
        if not leaves:
            return None
    hasher = hashlib.sha256()
    for leaf in leaves:
        array = np.asarray(leaf)
        hasher.update(str((array.dtype, array.shape)).encode())
        hasher.update(array.tobytes() if array.dtype != object else repr(array).encode())
    return hasher.hexdigest()


def _caches(dataset) -> bool:
    """Whether `dataset` reads through a `cache()`.

    Reading its first element here would start a second iterator over the
    cache beside the one `fit` starts, and TF's in-memory cache can then end
    `fit`'s epoch early on some workers (seen on 1 run in 2 with keras.io's
    text classifier at 2 workers): such datasets are not compared.
    """
    return b"CacheDataset" in _compat.dataset_graph(dataset)


def check(strategy, name, data, y=None):
    """Warns when the workers' inputs differ (a collective: every worker calls it).

    Args:
        strategy: The model's `tfdist_ext.Strategy`.
        name: A name unique to this call on every worker (the exchange key).
        data, y: As for `digest`.

    Returns:
        Whether every worker that could tell had the same digest.
    """
    if strategy.num_workers < 2:
        return True
    digests = strategy.exchange(name, digest(data, y) or "")
    known = {d for d in digests if d}
    if len(known) <= 1:
        return True
    groups = {}
    for worker, value in enumerate(digests):
        groups.setdefault(value, []).append(worker)
    kind = "dataset" if isinstance(data, tf.data.Dataset) else "arrays"
    log.warning("tfdist_ext: the workers' input %s differ in content or order (workers "
                "with the same input: %s): they will train on overlapping data and "
                "validate on data others trained on. %s", kind,
                "; ".join(map(str, groups.values())), ADVICE)
    return False


def agree_shuffle_seed(strategy, name):
    """Sets one TF global seed on every worker when the script set none.

    Keras shuffles array inputs with an unseeded `tf.random.shuffle`, which
    draws from TF's global seed. Every worker must call it (an exchange).

    Returns:
        The seed set, or None when a global seed was already set (or one worker).
    """
    if strategy.num_workers < 2:
        return None
    mine = _compat.global_seed()
    seed = int(strategy.exchange(name, random.SystemRandom().randrange(2**31))[0])
    if mine is not None:
        return None
    tf.random.set_seed(seed)
    log.info("tfdist_ext: fit shuffles array inputs with TF's global seed, set to %d on "
             "every worker (set your own with keras.utils.set_random_seed).", seed)
    return seed
