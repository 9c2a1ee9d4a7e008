"""Keras reads each worker's part of its batches through a plain `tf.data` iterator.

Keras' `fit`, `evaluate` and `predict` distribute their dataset with
`strategy.experimental_distribute_dataset` and hand a
`tf.distribute.DistributedIterator` to their step function. With one replica
per worker that iterator costs at every step a multi-device iterator call,
flattening the composite iterator into the function's arguments and, with
several workers and finite data, one more cross-worker all-reduce and a
`tf.cond` to agree whether any worker still has data (TF's rebatching gives a
partial last batch to the first workers only, so their batch counts differ).

Under `tfdist_ext.Strategy` with one replica per worker, Keras' epoch iterator
instead iterates a plain `tf.data.Dataset`, which Keras' step function takes as
it is: with one worker, Keras' own dataset; with several, each global batch
split into contiguous parts, one per worker (sizes differ by at most one; a
part may be empty), as TF's DATA auto-sharding assigns samples. Every worker
then has as many batches as the dataset, so no agreement is needed. This
applies when the dataset's auto-shard policy is AUTO or DATA, its length is
known (or infinite) and the same on every worker (compared once per epoch
iterator), and every element is dense tensors with a batch dimension.
Otherwise (several replicas in this process, a length TF cannot know, auto-
sharding OFF or by files, ragged or sparse inputs, a `DistributedDataset` the
user made) Keras keeps the distributed iterator.

Under a current `keras.distribution.DataParallel(auto_shard_dataset=False)`
(Keras' "the input is already sharded across processes"; see
`tfdist_ext.distribution`) each worker's dataset is its own: every batch is
this worker's whole local batch, and the global batch is the workers' local
batches together. That dataset must have a known (or infinite) batch count
(the workers' counts are padded to the longest by `common_length`)
and, where its batch dimension is static, the same on every worker.

In elastic training (`tfdist_ext.elastic`) the part and the number of parts
are variables that the survivors of a worker's death set to their new ranks,
so the global batch keeps its size and every sample is still trained on (a
batch or two already prefetched may still be split the old way).
"""

import functools
import itertools
import logging
import weakref

import keras
import tensorflow as tf

from tfdist_ext import _compat, frontends

log = logging.getLogger("tfdist_ext")
_agreements = itertools.count()  # the same sequence on every worker (SPMD)
_chosen = weakref.WeakKeyDictionary()  # distributed dataset -> what Keras iterates
_last = weakref.WeakKeyDictionary()  # strategy -> its epoch iterator's last `_chosen` key
_starts = weakref.WeakKeyDictionary()  # strategy -> _Start of its next epoch iterator
_SPLITTABLE = (tf.data.experimental.AutoShardPolicy.AUTO,
               tf.data.experimental.AutoShardPolicy.DATA)


def wrap_get_iterator(original):
    """`TFEpochIterator._get_iterator`: this worker's plain dataset where it can be."""

    @functools.wraps(original)
    def get_iterator(self):
        distributed = original(self)
        if distributed not in _chosen:
            adapter = self.data_adapter
            user_made = (isinstance(adapter, _compat.TFDatasetAdapter) and isinstance(
                adapter.get_tf_dataset(), tf.distribute.DistributedDataset))
            _chosen[distributed] = _local_dataset(
                distributed, self._distribute_strategy,  # pylint: disable=protected-access
                user_made=user_made)
        strategy = self._distribute_strategy  # pylint: disable=protected-access
        _last[strategy] = weakref.ref(distributed)
        chosen = _chosen[distributed]
        start = _starts.get(strategy)
        if start is not None and not start.skipped:  # the first iterator since `start_at`
            if not isinstance(chosen, tf.data.Dataset):
                del _starts[strategy]
                return chosen
            start.skipped = start.batches
            return chosen.skip(start.batches)
        return chosen

    return get_iterator


class _Start:
    """Batches the next epoch iterator skips (`start_at`), and how many of them
    `skipped_in_input` has not yet counted."""

    def __init__(self, batches):
        self.batches, self.skipped = batches, 0


def start_at(strategy, batches: int):
    """The next epoch iterator Keras makes under `strategy` starts `batches` batches
    into its dataset: tf.data skips them, instead of the caller pulling each one.

    An elastic replacement joins mid-epoch and passes over the batches the
    members already trained on, while they wait for its first step; pulled one
    train-function call at a time, each would cost an eager `next`. Its calls
    for those batches ask `skipped_in_input` whether they are already skipped.
    Where Keras iterates a distributed dataset (`_local_dataset` kept it),
    nothing is skipped and the calls pull.

    Args:
        strategy: The strategy of the `fit` about to make its epoch iterator.
        batches: How many batches to skip (0: none, and any earlier request goes).
    """
    if batches > 0:
        _starts[strategy] = _Start(int(batches))
    else:
        _starts.pop(strategy, None)


def skipped_in_input(strategy) -> bool:
    """For each call that must pass over a batch after `start_at`: True while the
    epoch iterator already skipped it (count down), else False (pull it). The first
    False forgets `start_at`, so no later iterator skips."""
    start = _starts.get(strategy)
    if start is None or not start.skipped:
        _starts.pop(strategy, None)
        return False
    start.skipped -= 1
    if not start.skipped:
        del _starts[strategy]
    return True


def last_input(strategy):
    """What Keras' epoch iterator under `strategy` last iterated (a plain or a
    distributed dataset), while Keras keeps it, else None: an elastic
    replacement traces its train function on it before it joins."""
    distributed = _last.get(strategy, lambda: None)()
    return None if distributed is None else _chosen.get(distributed)


def _local_dataset(distributed, strategy, user_made):
    """This worker's `tf.data.Dataset` of `distributed`, or `distributed` itself."""
    if (frontends.our_strategy(strategy) is not None and strategy.num_workers > 1
            and per_worker_input() and (user_made or len(strategy.extended.worker_devices) != 1
                                        or _compat.undistributed_dataset(distributed) is None)):
        raise ValueError(
            "keras.distribution.DataParallel(auto_shard_dataset=False) on several workers "
            "takes each worker's input as a tf.data.Dataset, numpy arrays or a generator "
            "with one device per worker; this worker has "
            f"{len(strategy.extended.worker_devices)} device(s) and the input is a "
            f"{type(distributed).__name__}. Pass the undistributed dataset, or use "
            "auto_shard_dataset=True with the global batch.")
    if (user_made or frontends.our_strategy(strategy) is None
            or len(strategy.extended.worker_devices) != 1):
        return distributed
    dataset = _compat.undistributed_dataset(distributed)
    if dataset is None:
        return distributed
    workers = strategy.num_workers
    if workers == 1:
        return dataset
    if per_worker_input():
        return _whole(dataset, strategy)
    if not (_splittable(dataset) and _same_length(dataset, strategy)):
        return distributed
    return with_promised_length(split_batches(dataset, *strategy.membership.data_split()))


def per_worker_input() -> bool:
    """Whether the current Keras distribution says each worker's input is its own."""
    return getattr(keras.distribution.distribution(), "auto_shard_dataset", True) is False


def _whole(dataset, strategy):
    """`dataset`, this worker's own, checked to give every worker as many batches."""
    batch = tf.nest.flatten(dataset.element_spec)[0].shape
    batch = batch[0] if batch.rank else None
    count = int(dataset.cardinality())
    seen = [c.split("/") for c in strategy.exchange(
        f"per-worker-input/{next(_agreements)}", f"{count}/{batch}")]
    counts, batches = [int(c) for c, _ in seen], [b for _, b in seen]
    fix = ("Give each worker a dataset whose length TF knows (no `filter` or generator "
           "without `assert_cardinality`), or `.repeat()` it and pass steps_per_epoch / "
           "steps.")
    if min(counts) == tf.data.UNKNOWN_CARDINALITY or len(set(counts)) > 1:
        raise ValueError(
            "keras.distribution.DataParallel(auto_shard_dataset=False): each worker trains "
            "on its own dataset, and every worker must run the same number of steps, but the "
            f"workers' datasets have {counts} batches (-2: unknown to TF, -1: infinite). "
            + fix)
    if "None" not in batches and len(set(batches)) > 1:
        raise ValueError(
            "keras.distribution.DataParallel(auto_shard_dataset=False): the workers' "
            f"datasets have static batch sizes {batches}; Keras' DataParallel takes the same "
            "batch size on every process. Batch every worker's dataset with the same size, "
            "or without drop_remainder=True.")
    return with_promised_length(dataset)


SHORT_DATASET = "tfdist_ext: this worker's dataset"


def with_promised_length(dataset):
    """`dataset` that fails when it ends before its cardinality said it would.

    Every worker runs as many steps as the agreed cardinality; a dataset that
    ends sooner on one worker (TF's cardinality is a promise, not a count)
    would leave the others waiting in the step's collectives, or pair them
    with the next call's. The error is raised on the worker whose data ended,
    at the batch that was missing; `is_short_dataset` recognizes it.
    """
    count = int(dataset.cardinality())
    if count < 0:
        return dataset
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


def is_short_dataset(error) -> bool:
    """Whether `error` is `with_promised_length`'s (TF's assert_cardinality)."""
    return (isinstance(error, tf.errors.FailedPreconditionError)
            and "was expected to contain" in str(error))


def short_dataset_error(error, call):
    """A RuntimeError naming `call`'s dataset for `is_short_dataset`'s `error`."""
    lines = str(error).strip().splitlines()
    detail = next((line.strip() for line in lines if "was expected to contain" in line),
                  lines[0] if lines else "")
    return RuntimeError(
        f"{SHORT_DATASET} in `{call}` ended before the number of batches its cardinality "
        f"promised, which every worker runs ({detail}). The workers would otherwise "
        "reduce metrics and gradients over different steps. A dataset that ends early "
        "usually changes under iteration: a `cache()` filled while another iterator of "
        "the same dataset still ran, a generator or file list that differs per pass, or "
        "`tf.data.experimental.assert_cardinality` with a wrong count. Fix: read the "
        "dataset in full once before fit (e.g. `for _ in ds: pass` after `cache()`), or "
        "give steps_per_epoch / steps explicitly with `.repeat()`.")


def split_batches(dataset, index, count):
    """Part `index` of `count` of each batch of `dataset`: contiguous, sizes within one.

    Args:
        dataset: Batches of dense tensors sharing their first dimension.
        index: This worker's part (an int, or an int64 `tf.Variable` read at
            every batch).
        count: The number of parts (workers), likewise.
    """

    packed = isinstance(dataset.element_spec, tuple)  # map unpacks tuples into arguments

    def part(*batch):
        batch = batch if packed else batch[0]
        size = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
        at, parts = tf.cast(index, tf.int64), tf.cast(count, tf.int64)
        lo, hi = size * at // parts, size * (at + 1) // parts
        return tf.nest.map_structure(lambda t: t[lo:hi], batch)

    return dataset.map(part, deterministic=True)


def _splittable(dataset):
    if dataset.options().experimental_distribute.auto_shard_policy not in _SPLITTABLE:
        return False
    specs = tf.nest.flatten(dataset.element_spec)
    return bool(specs) and all(type(s) is tf.TensorSpec and s.shape.rank  # pylint: disable=unidiomatic-typecheck
                               for s in specs)


def _same_length(dataset, strategy):
    """Whether every worker's dataset has the same known (or infinite) batch count.

    Elastic training assumes it without asking (a replacement could not meet
    the members, which met long before)."""
    count = int(dataset.cardinality())
    if strategy.membership.changes:
        return count >= 0 or count == tf.data.INFINITE_CARDINALITY
    counts = {int(c) for c in strategy.exchange(f"local-input/{next(_agreements)}",
                                                str(count))}
    return len(counts) == 1 and (count >= 0 or count == tf.data.INFINITE_CARDINALITY)


def common_length(dataset, strategy):
    """`dataset` padded with empty batches to the longest worker's batch count.

    Args:
        dataset: What the user passed to `fit` / `evaluate` / `predict` (only
            a `tf.data.Dataset` of known cardinality is padded; anything else
            is returned unchanged).
        strategy: A `tfdist_ext.Strategy`. Every worker must call this in the
            same order (it exchanges batch counts through the coordination
            service).
    """
    if not isinstance(dataset, tf.data.Dataset) or strategy.num_workers < 2:
        return dataset
    batches = int(dataset.cardinality())
    counts = [int(c) for c in strategy.exchange(f"batches/{next(_agreements)}", batches)]
    if min(counts) < 0 or min(counts) == max(counts):
        return dataset  # unknown / infinite somewhere, or already equal
    empty = _empty_batch(dataset.element_spec)
    if empty is None:
        log.warning("tfdist_ext: workers' datasets have %s batches; cannot pad this one "
                    "(its element_spec %s has unknown non-batch dimensions), so the "
                    "workers will fall out of step.", counts, dataset.element_spec)
        return dataset
    padded = dataset.concatenate(
        tf.data.Dataset.from_tensors(empty).repeat(max(counts) - batches))
    return padded.with_options(dataset.options())


def _empty_batch(spec):
    def empty(leaf):
        if not isinstance(leaf, tf.TensorSpec) or leaf.shape.rank is None:
            raise ValueError(leaf)
        if leaf.shape.rank == 0 or not leaf.shape[1:].is_fully_defined():
            raise ValueError(leaf)
        return tf.zeros([0] + leaf.shape[1:].as_list(), leaf.dtype)

    try:
        return tf.nest.map_structure(empty, spec)
    except ValueError:
        return None
