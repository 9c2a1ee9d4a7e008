"""`tfdist_ext.Strategy`: MultiWorkerMirroredStrategy with our cross-device ops.

    with tfdist_ext.Strategy(allreduce="native").scope():
        model = build_model()
        model.compile(...)
    model.fit(dataset)

With TF_CONFIG (written by `tfdist-run`, or by a deployment) each worker process
runs one replica (one per GPU on GPU machines); without it the strategy uses the
local devices, and `num_replicas=N` on a CPU-only machine makes N logical CPU
replicas in one process.

Besides owning the cross-device ops, the strategy repairs two Keras 3.15 bugs
of stock MultiWorkerMirroredStrategy (keras-team/keras#20585): `reduce` on a
nest of per-replica values, and `reduce(..., axis=0)` on per-replica scalars.
"""

import contextlib
import itertools
import logging
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tfdist_ext import (_compat, cluster, compression, coordination, early, frontends,
                        reductions, startup)
from tfdist_ext.collectives import calibration, choice, ucx_aborts
from tfdist_ext.elastic import options as elastic_options
from tfdist_ext.elastic import seam
from tfdist_ext.elastic import starting
from tfdist_ext.ops import _loader as ops_loader
from tfdist_ext.ps import roles
from tfdist_ext.registry import seconds
from tfdist_ext.strategy_config import StrategyConfig
from tfdist_ext.strategy_extended import KEY_BASE, KEY_SPAN, Extended

log = logging.getLogger("tfdist_ext")
ops_loader.check_build()

class Strategy(tf.distribute.MultiWorkerMirroredStrategy):
    """Data-parallel training with a choice of how gradients travel.

    A `tf.distribute.MultiWorkerMirroredStrategy` (so Keras and TF treat it as
    one) whose cross-device reductions are tfdist_ext's. Build the model, the
    optimizer and `compile` under `strategy.scope()`; `model.fit` is unchanged.

    Args:
        allreduce: Algorithm name, size-range dict or
            `tfdist_ext.collectives.AllReduce`. Defaults to "ring" on the UCX
            engine and "native" (TF's own ring) on the TF engine.
        compression: Name, dict or `tfdist_ext.compression.Compressor`.
            Defaults to "none".
        sync: Name, dict or `tfdist_ext.sync.SyncPolicy`. Defaults to "sync".
        bucketing: None (one fused buffer per dtype), a name, dict or
            `tfdist_ext.bucketing.Planner`.
        num_replicas: Without TF_CONFIG: number of local replicas (GPUs if there
            are that many, else logical CPU devices). Must be None with
            TF_CONFIG, where each worker runs its local devices.
        engine: What carries the bytes: "ucx" (tfdist_ext's C++ ops over UCX:
            shared memory within a host, TCP/RDMA across hosts), "tf" (TF's
            collective ops) or "auto" ("ucx" where it is built, else "tf"
            with a warning). Defaults to "auto". See
            `tfdist_ext.collectives.engines`.
        startup_timeout: Seconds a worker waits for every task of TF_CONFIG to
            join before it is killed with a message naming the workers that did
            not answer; 0 waits forever. Defaults to 600.
        elastic: True, a dict of options or `tfdist_ext.elastic.Elastic`: when a
            worker dies, the survivors discard the step in flight and `fit` goes
            on with them (`tfdist_ext.elastic.recovery`). Needs the UCX engine,
            sync="sync", a fixed all-reduce algorithm, no compression or
            bucketing, and "worker" tasks. Defaults to None: on when
            TFDIST_ELASTIC=1 (`tfdist-run --elastic`), else off.
        cluster_resolver: A `tf.distribute.cluster_resolver.ClusterResolver`
            (e.g. `SlurmClusterResolver()`) to take the cluster from instead of
            TF_CONFIG, which it becomes; create the strategy before any TF op.
            Not needed under `srun` or in a Kubernetes Indexed Job: `import
            tfdist_ext` derives TF_CONFIG there (`tfdist_ext.cluster_env`).
        sparse_as_dense: Reduce embedding gradients dense, fused with the others
            (Horovod's option), not as an all-gather of rows (`collectives.sparse`):
            fewer bytes when a batch looks up over 2/p of the vocabulary; the same
            for SGD; Adam squares each row's sum, not each lookup's (`fusion.densified`).
        zero_stage: 1 shards the optimizer's state (`tfdist_ext.zero`), 2 the
            summed gradients too (engine="ucx"); needs sync="sync", no
            compression or bucketing. Defaults to 0 (a full copy per replica).

    Raises:
        ValueError: Invalid TF_CONFIG or option, naming the argument and the
            valid values.
    """

    _key_counter = itertools.count()
    # What the front end reads (`frontends.our_strategy`), until __init__ sets them;
    # `config` is set right after TF's constructor.
    sync_runner = None
    membership = seam.Fixed(0, 1)
    allreduce_decisions = ()

    def __init__(self, allreduce=None, compression=None, sync=None, bucketing=None,
                 num_replicas: Optional[int] = None, engine: Optional[str] = None,
                 startup_timeout: float = startup.DEFAULT_SECONDS, cluster_resolver=None,
                 elastic=None, sparse_as_dense: bool = False, zero_stage: int = 0):
        config = StrategyConfig.from_args(allreduce, compression, sync, bucketing, engine,
                                          sparse_as_dense, zero_stage)
        elastic = elastic_options.for_strategy(
            elastic, config, cluster.cluster_from_env() if cluster_resolver is None else None)
        startup_timeout = seconds("startup_timeout", startup_timeout, startup.ADVICE)
        if cluster_resolver is not None:
            os.environ[cluster.TF_CONFIG] = cluster.tf_config_from_resolver(cluster_resolver)
            early.prepare()
        spec = cluster.cluster_from_env()
        devices = cluster.replica_devices(num_replicas, spec)
        resolver = roles.serve_or_resolver(spec, config.sync)
        # TF's CollectiveAllReduceExtended reads the key base off the container.
        self._collective_key_base = KEY_BASE + KEY_SPAN * next(Strategy._key_counter)
        early.release()  # this strategy's own startup_timeout bounds the join
        with startup.join_within(startup_timeout, spec, starting.startup_hint()):
            # Elastic always densifies: TF's collectives cannot change members.
            _compat.strategy_init(self, Extended(
                self, config, devices, resolver,
                densify_sparse=config.sparse_as_dense or elastic is not None))
        extended = self.extended
        _compat.record_strategy_gauges(extended._num_workers,  # pylint: disable=protected-access
                                       extended._num_devices_per_worker)  # pylint: disable=protected-access
        self.config, self.cluster = config, spec
        self.membership = seam.Fixed(self.worker_index, self.num_workers)
        self._barriers = itertools.count()
        self._worker_local = False
        self._local_logs = False
        log.info("tfdist_ext.Strategy: %d worker(s) x %d replica(s); %s",
                 extended._num_workers, extended._num_devices_per_worker,  # pylint: disable=protected-access
                 config.describe())
        if config.allreduce.hosts is not None:
            self._cross_ops.choice.rank_hosts  # pylint: disable=pointless-statement  (validates)
        uses_backward_times = getattr(config.bucketing, "uses_backward_times", False)
        if "auto" in config.allreduce.algorithms or uses_backward_times:
            # Before the sync runner, whose background ops share the calibration.
            decisions = choice.prepare_auto(self._cross_ops, spec)
            if decisions is not None:
                self.allreduce_decisions = decisions
        self.sync_runner = config.sync.runner(self)
        self.preemption = frontends.get().attach(self)
        self.membership = seam.for_strategy(self, elastic,
                                            f"tfdist/{self._collective_key_base}", spec)
        if spec is not None:
            self.membership.watch(spec, self._abort_collectives)

    @property
    def elastic(self):
        """The job's `tfdist_ext.elastic.recovery.Recovery` under elastic training (its
        `members`, `failures`, `joins`, `leaves`), else None."""
        return self.membership.recovery

    def reconfigure_workers(self, worker_index: int, num_workers: int, generation: int,
                            kv=None, wire: bool = True, chief: Optional[bool] = None):
        """Goes on as worker `worker_index` of `num_workers` (elastic training).

        The cross-device ops make new communicators (meeting through `kv`, as
        `CrossDeviceOps.reconfigure`; with ``wire=False`` not wired up, for a
        rehearsal: each collective's result is its input), datasets distributed from
        now on are split among these workers, and this worker is the chief (it
        checkpoints) if `chief` says so (None: if it is worker 0).
        """
        self.extended.reconfigure(worker_index, num_workers, generation, kv, wire, chief)

    def _abort_collectives(self, reason, task=None):
        """Fails this worker's collectives on both engines (peer `task` is dead)."""
        del task
        _compat.abort_collective_ops(reason)
        if self._cross_ops.engines.engine == "ucx":
            ucx_aborts.abort(reason)

    @property
    def _cross_ops(self):
        return self.extended.cross_device_ops

    @property
    def calibration(self):
        """The `collectives.auto.Calibration` "auto" uses (None without "auto")."""
        return self._cross_ops.choice.calibration

    @property
    def allreduce_refinements(self):
        """What "auto" timed at the model's buffer sizes: a list of dicts with
        "bytes", "candidates", "choice", "model" (the model's choice), "source"
        ("timed", "cache" or "model ...") and "ms" (the chief's times). Empty
        without "auto" or before the first reduction is traced."""
        refiner = self._cross_ops.choice.refiner
        return [dict(d) for _, d in sorted(refiner.decisions.items())] if refiner else []

    @property
    def state(self):
        """A `tf.Module` of residuals and counters; put it in your tf.train.Checkpoint."""
        return self._cross_ops.state

    def communication_stats(self):
        """This worker's communication counters so far (eager).

        Returns:
            dict with `bytes_sent` (what this worker's first replica sent for
            gradients), `dense_bytes` (what dense all-reduce with the same
            algorithms would have sent), `reductions` (gradient all-reduces
            issued) and `compression_ratio` (dense / sent).
        """
        stats = self.state.stats()
        if self.config.bucketing is not None:
            stats["buckets"] = len(self.bucket_plan)
        if self.sync_runner is not None:
            stats.update(self.sync_runner.stats())
        if isinstance(self.config.compression, compression.Adaptive):
            stats["compression_decisions"] = len(self.compression_decisions)
        return stats

    @property
    def compression_decisions(self):
        """The decision rounds of `compression="adaptive"` so far (a list of dicts,
        see `tfdist_ext.keras.AdaptiveCompression.decisions`); empty otherwise."""
        return frontends.get().compression_decisions(self)

    def broadcast_from_chief(self, values):
        """Every worker gets worker 0's `values` (a list of floats), eagerly.

        A collective: every worker must call it at the same point.
        """
        return calibration.broadcast_from_chief(self._cross_ops, list(values),
                                                self._cross_ops.first_rank)

    @property
    def bucket_plan(self):
        """Buckets of the last traced gradient reduction (bytes, gradients, algorithm each)."""
        return self._cross_ops.buckets.bucket_plan

    def fit_callbacks(self):
        """Callbacks `model.fit` adds first (installed by `tfdist_ext.keras.fit_hooks`)."""
        return frontends.get().fit_callbacks(self)

    @contextlib.contextmanager
    def worker_local_reductions(self):
        """`reduce` traced in this context reduces over this worker's replicas only.

        Used by relaxed sync policies while Keras traces the train function
        (see `tfdist_ext.sync.runner`), so that logging and end-of-data checks
        do not synchronise the workers every step.
        """
        previous, self._worker_local = self._worker_local, True
        try:
            yield
        finally:
            self._worker_local = previous

    def keep_logs_local(self, enabled: bool):
        """While enabled, eager `reduce` calls stay on this worker too.

        Set by `sync="async"` during `fit` (outside evaluation): Keras reads
        its metrics at epoch ends, and an all-worker reduction there would
        make every worker wait for the slowest once per epoch.
        """
        self._local_logs = bool(enabled)

    @property
    def num_workers(self) -> int:
        """Worker processes in the cluster (1 without TF_CONFIG)."""
        return self.extended._num_workers  # pylint: disable=protected-access

    @property
    def worker_index(self) -> int:
        """This process's index among the workers (0 without TF_CONFIG): its rank. Worker
        0 is the chief, except after elastic training changed the members, where the
        chief (`extended.should_checkpoint`) keeps its place and the ranks follow
        the worker indices (`tfdist_ext.elastic.membership.position`)."""
        return self._cross_ops.first_rank // len(self.extended.worker_devices)

    def all_reduce_dense(self, reduce_op, value):
        """All-reduces `value` (a tensor or a nest of tensors) from replica context:
        never compressed or counted.

        For bookkeeping collectives (sample counts, stop requests, overflow
        flags, metrics); `replica_context.all_reduce` would treat them as
        gradients.
        """
        def merge_fn(strategy, *per_replica):
            return strategy.extended.batch_reduce_to(
                reduce_op, [(v, v) for v in per_replica],
                options=reductions.options(reductions.DENSE))

        flat = tf.nest.flatten(value)
        reduced = tf.distribute.get_replica_context().merge_call(merge_fn, args=tuple(flat))
        return tf.nest.pack_sequence_as(value, list(reduced))

    def exchange(self, name: str, value: str):
        """Every worker's `value`, in worker order, through the coordination service
        (elastic training: the members' store, `tfdist_ext.elastic.store`).

        Blocks until every worker has called `exchange` with the same `name`
        (use each name once per strategy). Without TF_CONFIG returns [value].
        """
        if self.num_workers == 1:
            return [value]
        if self._catching_up():
            # A replacement's meetings at the start of its fit: the members held
            # theirs long ago, with the same values (the same script).
            return [str(value)] * self.num_workers
        return coordination.exchange(f"tfdist/{self._collective_key_base}/{name}", value,
                                     self.num_workers, self.worker_index,
                                     self.membership.kv())

    def barrier(self, timeout: float = 600.0):
        """Returns when every worker has called `barrier` as often (eager).

        For files or state one worker writes and others read: e.g. the chief
        writes, every worker calls `strategy.barrier()`, then all read. Saves
        through Keras and `tf.train.CheckpointManager` need none (see
        `tfdist_ext.keras.saving`). Without TF_CONFIG it returns at once.

        Args:
            timeout: Seconds to wait for the other workers.

        Raises:
            TimeoutError: Not every worker arrived within `timeout`.
        """
        timeout = seconds("timeout", timeout, "Raise it when workers reach the barrier far "
                          "apart.")
        if self.num_workers == 1:
            return
        coordination.barrier(f"tfdist/{self._collective_key_base}/barrier",
                             next(self._barriers), timeout, self.num_workers, self.worker_index)

    def _catching_up(self) -> bool:
        """A replacement worker between its start and its first training step: the
        members' meetings of that stretch are long past (`tfdist_ext.elastic`)."""
        return self.membership.behind

    @property
    def collective_key_range(self):
        """(first, last + 1) collective group keys this strategy may use."""
        return (self._collective_key_base, self._collective_key_base + KEY_SPAN)

    def run(self, fn, args=(), kwargs=None, options=None):
        """`tf.distribute.Strategy.run`. Under elastic training, outside Keras' `fit`,
        `evaluate` and `predict` (a custom training loop), it warns once that a death
        there stops the job (`tfdist_ext.elastic.seam.OUTSIDE_KERAS`)."""
        self.membership.before_run()
        return super().run(fn, args=args, kwargs=kwargs, options=options)

    def reduce(self, reduce_op, value, axis=None):
        """`tf.distribute.Strategy.reduce`, accepting nests and per-replica scalars.

        Stock MultiWorkerMirroredStrategy fails on both in Keras 3.15 `fit`
        (keras-team/keras#20585): a reduction over `axis` of a rank-0 value is
        the plain cross-replica reduction, so `axis` is dropped for scalars.
        """
        def on_worker():
            return _compat.nest.map_structure(
                lambda v: _reduce_on_worker(self, reduce_op, v, axis), value)

        def reduce_one(v):
            leaf_axis = None if axis is None or _rank(v) == 0 else axis
            return super(Strategy, self).reduce(reduce_op, v, leaf_axis)

        if (self._worker_local and tf.inside_function()) or self._local_logs or \
                self._catching_up():  # Keras' reduce of a first batch (symbolic build)
            return on_worker()
        if not tf.inside_function():
            # Keras reads its metrics (an all-reduce) between steps: a death survived.
            return self.membership.between_steps(
                lambda: _compat.nest.map_structure(reduce_one, value), on_worker)
        return _compat.nest.map_structure(reduce_one, value)


def _reduce_on_worker(strategy, reduce_op, value, axis):
    """`Strategy.reduce` of `value` over this worker's replicas only."""
    if not _compat.is_distributed_value(value):
        return value  # already this worker's value (e.g. its replicas with data)
    local = [tf.convert_to_tensor(v) for v in strategy.experimental_local_results(value)]
    mean = _compat.ReduceOp(reduce_op) if isinstance(reduce_op, str) else reduce_op
    mean = mean == _compat.ReduceOp.MEAN
    if axis is not None and local[0].shape.rank:
        joined = tf.concat(local, axis)
        return tf.reduce_mean(joined, axis) if mean else tf.reduce_sum(joined, axis)
    total = tf.add_n(local)
    return total / len(local) if mean else total


def _rank(value):
    if _compat.is_distributed_value(value):
        value = value.values[0]
    shape = getattr(value, "shape", None)
    return tf.TensorShape(shape).rank if shape is not None else np.ndim(value)
