"""The strategy's cross-device ops: the one place where the four concerns compose.

Keras reduces every gradient with one `replica_context.all_reduce(SUM, grads)`,
which reaches `CollectiveAllReduce._all_reduce` for every replica (through
merge_call and `batch_reduce_implementation`, or directly in replica context).
Subclassing TF's `CollectiveAllReduce` and overriding that single choke point
keeps `CollectiveAllReduceExtended` (and so MultiWorkerMirroredStrategy's
isinstance checks, key management and input pipeline) intact.

Routing (`_all_reduce`):
    * ``allreduce="native"`` for every size: TF's own path, unchanged.
    * otherwise dense tensors are fused into flat buffers per dtype
      (`collectives.fusion`), and each buffer goes to the algorithm
      `choice.select(num_bytes)` picks: "native" buffers to TF's
      CollectiveReduceV2 ring, any other name to the strategy's engine
      (`engines.main()`: UCX or the graph engine), which runs that
      algorithm's schedule.
    * IndexedSlices (embedding gradients) are all-gathered, rows in replica
      order (the one-process answer): on the UCX engine (`collectives.sparse`),
      else by TF's native path. With `densify_sparse` (`sparse_as_dense=True`,
      elastic training) those of a static dense shape are reduced dense
      (`fusion.densified`). Tensors without a static shape and dtypes the
      engine does not support go to TF's native path.
    * Zero-size tensors pass through without communication.
    * MEAN divides the sum by the global replica count at the end exactly as
      TF's native path does (``value / group_size``): integer tensors become
      float64 means, not floor divisions.
    * "auto" buffers go to the algorithm `collectives.refine.Refiner` picks: the
      model's choice, or the fastest of close candidates timed by the chief.

What a reduction reduces comes with the call, as a `reductions.Reduction` in
its options (`reductions.of(options)`): gradients and pseudo-gradients (an
optimizer's batched all-reduce, which `strategy_extended.Extended` marks as
gradients when the caller did not say) are where compression applies and where
the per-replica step counter and byte counters of `StrategyState` advance;
dense reductions and calls without a `Reduction` (metrics, `strategy.reduce`)
stay dense and uncounted. The class keeps no mode between calls.

This class routes; each other concern is a part in its own module:

    CrossDeviceOps --- choice   collectives/choice.py      the algorithm per buffer size,
           |                                               "auto"'s calibration, host layout
           +-------- wire     collectives/wire_bytes.py  the bytes counted per buffer
           +-------- buckets  bucketing/gradients.py     the gradient bucket plan
           +-------- engines  collectives/engines.py     the engine objects
           +-------- GradientReduction  compression/reduction_hooks.py
                              one replica's buckets, compressed and counted

The strategy, the sync policies and the Keras hooks reach a part through its
attribute: ``cross_ops.choice.calibration``, ``cross_ops.buckets.bucket_plan``,
``cross_ops.engines.main()`` (the engine, wired up on first use); this class
forwards nothing to them.
"""

import copy

import tensorflow as tf

from tfdist_ext import _compat, reductions
from tfdist_ext.bucketing import gradients as gradient_buckets
from tfdist_ext.collectives import (choice, engines, fusion, sparse, strategy_gather,
                                    ucx_engine, wire_bytes)
from tfdist_ext.collectives import engine as engine_lib
from tfdist_ext.compression import NoCompression, reduction_hooks
from tfdist_ext.state import StrategyState

NATIVE = "native"


class CrossDeviceOps(_compat.CollectiveAllReduce):
    """Cross-device ops that route reductions by the strategy's configuration.

    Args:
        devices: Local devices of this worker taking part in the reduction.
        group_size: Replicas in sync across all workers.
        options: Default `tf.distribute.experimental.CommunicationOptions`.
        collective_keys: The owning strategy's `CollectiveKeys` (its key range).
        config: The validated `tfdist_ext.strategy_config.StrategyConfig`.
        canonicalize_devices: As in TF's `CollectiveAllReduce`.
        worker_index: This worker's index among the workers (0 without a
            cluster); local replica i has global rank
            ``worker_index * len(devices) + i``.
        pair_group_key_base: First of the `engine.PAIR_GROUP_KEYS` group keys
            reserved for the graph engine's 2-member groups; the same on every
            worker. Required when the configuration uses the graph engine.
        engine_role: Which of the process's UCX communicator sets this
            instance uses ("main", or "background" for reductions that run
            beside the main thread's).
        densify_sparse: Reduce `IndexedSlices` as dense tensors (the
            strategy's ``sparse_as_dense``, and always in elastic training:
            TF's collectives, which gather sparse values, cannot change members).
        calibration: The `auto.Calibration` of another instance of the same
            strategy (background reductions decide as the main ones), or None
            (`collectives.choice.prepare_auto` calibrates).
    """

    def __init__(self, devices, group_size, options, collective_keys, config,
                 canonicalize_devices=True, *, worker_index=0, pair_group_key_base=None,
                 engine_role="main", densify_sparse=False, calibration=None):
        super().__init__(devices, group_size, options, collective_keys=collective_keys,
                         canonicalize_devices=canonicalize_devices)
        self.config = config
        self._worker_index = worker_index
        self._pair_group_key_base = pair_group_key_base
        self._engine_role = engine_role
        self._state = None
        self.densify_sparse = densify_sparse
        self._make_parts(engine_role, calibration=calibration)
        self._native_only = (set(config.allreduce.algorithms) == {NATIVE}
                             and isinstance(config.compression, NoCompression)
                             and config.bucketing is None)
        if not self._native_only:
            self.engines.check(config.allreduce)

    def _make_parts(self, engine_role, kv=None, generation=None, calibration=None, wire=True):
        """The parts this class delegates to, each in its own module."""
        config, group_size = self.config, self._group_size
        self.choice = choice.AlgorithmChoice(config.allreduce, group_size, len(self._devices),
                                             calibration)
        self.wire = wire_bytes.WireBytes(self.choice, self.first_rank)
        self.buckets = gradient_buckets.GradientBuckets(config.bucketing, self.choice)
        self.engines = engines.Engines(
            config.engine, self._devices, group_size, self.first_rank,
            self._pair_group_key_base, ucx_timeout_seconds=config.allreduce.timeout_seconds,
            graph_timeout_seconds=self._options.timeout_seconds, role=engine_role, kv=kv,
            generation=generation, wire=wire)

    def reconfigure(self, worker_index: int, num_workers: int, generation: int, kv=None,
                    wire: bool = True):
        """Goes on with another membership: `num_workers` workers, this one at `worker_index`.

        For elastic training (`tfdist_ext.elastic`) after a worker died: the
        algorithm choice, byte counts and engines are made again for the new
        world (new communicators, rendezvous keys named by `generation`, met
        through `kv` as in `engines.Engines`). Functions traced before for
        another world size or rank must be traced again; those traced for this
        one run on the new communicators once they are wired up
        (`engines.main()`). The previous generation's communicators are
        destroyed. With ``wire=False`` the communicators are not wired up:
        functions traced for this membership run as rehearsals (each
        collective's result is its input) until the next `reconfigure`
        (`engines.Engines`' `wire`).
        """
        self._worker_index = worker_index
        self._group_size = num_workers * len(self._devices)
        previous = self.engines
        self._make_parts(self._engine_role, kv, generation, wire=wire)
        previous.close()

    @property
    def devices(self) -> tuple:
        """This worker's local devices, one per local replica."""
        return tuple(self._devices)

    @property
    def group_size(self) -> int:
        """Replicas in sync across all workers."""
        return self._group_size

    @property
    def single_process(self) -> bool:
        """Whether every replica is local (no other worker to talk to)."""
        return self._group_size == len(self._devices)

    @property
    def timeout_seconds(self):
        """The strategy's collective timeout (CommunicationOptions), or None."""
        return self._options.timeout_seconds

    def native_sum(self, value, replica_id):
        """SUM of `value` over all replicas through TF's collectives, bypassing routing."""
        return super()._all_reduce(_compat.ReduceOp.SUM, [value], replica_id, self._options)[0]

    @property
    def state(self) -> StrategyState:
        """Residuals, step and byte counters (created on first use)."""
        if self._state is None:
            self._state = StrategyState(self._devices)
        return self._state

    @property
    def first_rank(self) -> int:
        return self._worker_index * len(self._devices)

    def reduce_buffers(self, buffers):
        """Sums flat buffers over all replicas, densely, with the configured algorithms.

        Args:
            buffers: For each local replica, a list of 1-D tensors (the same
                lengths and dtypes on every replica and worker).

        Returns:
            The sums, in the same nesting. Call inside a `tf.function`.
        """
        options = self._options
        return [[self._reduce_buffer(b, r, options, refine=False) if b.shape.num_elements()
                 else b
                 for b in replica_buffers]
                for r, replica_buffers in enumerate(buffers)]

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        if _compat.building_tf1_graph():
            return self._tf1_graph_ops().reduce_implementation(
                reduce_op, per_replica_value, destinations, options)
        return super().reduce_implementation(reduce_op, per_replica_value, destinations,
                                             options)

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        if _compat.building_tf1_graph():
            return self._tf1_graph_ops().batch_reduce_implementation(
                reduce_op, value_destination_pairs, options)
        return super().batch_reduce_implementation(reduce_op, value_destination_pairs,
                                                   options)

    def _all_reduce(self, reduce_op, value, replica_id, options):
        reduction = reductions.of(options)
        gradients = reduction is not None and reduction.compressed  # replica 0 counts
        if self._native_only:
            scope = "tfdist/native/b0/" if gradients else "tfdist/native/other/"
            values, restore = (fusion.densified(_compat.nest.flatten(value))
                               if self.densify_sparse else (None, None))
            with tf.name_scope(scope):
                result = super()._all_reduce(reduce_op, values or value, replica_id, options)
            if restore is not None:
                result = _compat.nest.pack_sequence_as(value, restore(result))
            if gradients and replica_id == 0:
                dense = self.wire.of_native(_compat.nest.flatten(value))
                with tf.control_dependencies([self.state.count(dense, dense)]):
                    result = _compat.nest.map_structure(tf.identity, result)
            return result
        options = self._options.merge(options or _compat.CommunicationOptions())
        refine = reduction is not None  # "auto" times its candidates for these
        values = _compat.nest.flatten(value)
        values, restore = fusion.densified(values) if self.densify_sparse else (values, list)
        flat, native, empty, fused = fusion.partition(values, engine_lib.SUPPORTED_DTYPES)
        results = [None] * len(flat)
        for i in empty:
            results[i] = self._finish(reduce_op, flat[i], replica_id)
        gathered = [i for i in native if sparse.on_engine(flat[i], self.config.engine)]
        native = [i for i in native if i not in gathered]
        for i in gathered:
            results[i] = sparse.all_gather(self.engines.main(), flat[i], replica_id,
                                           self._group_size, reduce_op == _compat.ReduceOp.MEAN)
        if native:
            reduced = super()._all_reduce(reduce_op, [flat[i] for i in native], replica_id,
                                          options)
            for i, r in zip(native, reduced):
                results[i] = r
        if fused:
            hooks = (self._gradient_reduction_of(reduction, replica_id, options) if gradients
                     else None)

            def reduce_flat(buffer, shapes):
                if hooks is None:
                    return self._reduce_buffer(buffer, replica_id, options, refine=refine)
                return hooks.reduce(buffer, shapes)

            tensors = [flat[i] for i in fused]
            planned = gradients and self.config.bucketing is not None
            if planned and replica_id == 0 and self.buckets.needs_backward_profile():
                tensors = gradient_buckets.record_ready_times(tensors, self.state)
            reduced = fusion.fused_all_reduce(
                tensors, reduce_flat, options.bytes_per_pack,
                plan=self.buckets.plan if planned else None)
            if gradients and replica_id == 0:
                count = self.state.count(hooks.bytes_sent, hooks.dense_bytes)
                with tf.control_dependencies([count]):
                    reduced = [tf.identity(r) for r in reduced]
            for i, r in zip(fused, reduced):
                results[i] = self._finish(reduce_op, r, replica_id)
        return _compat.nest.pack_sequence_as(value, restore(results))

    def _reduce_buffer(self, buffer, replica_id, options, bucket="other", *, refine):
        """Sums one flat buffer with the algorithm chosen for its size (with `refine`,
        "auto" times its close candidates at this size: `collectives.refine`).

        Its ops are in the name scope ``tfdist/<algorithm>/<bucket>/``, which
        profiler traces show (`keras.callbacks.TensorBoard(profile_batch=...)`).
        """
        name = self.choice.select(buffer.shape.num_elements() * buffer.dtype.size,
                                  buffer.dtype.size, refine=refine)
        if self._group_size == 1:
            return buffer
        with tf.name_scope(f"tfdist/{name}/{bucket}/"):
            if name == NATIVE:  # one tensor: TF's packing leaves it whole
                return super()._all_reduce(_compat.ReduceOp.SUM, [buffer], replica_id,
                                           options)[0]
            return self.engines.main().all_reduce(buffer, replica_id, self.choice.spec(name),
                                                  label=f"tfdist/{name}/{bucket}")

    def _tf1_graph_ops(self):
        """What reduces in a TF1 graph (a `tf.Graph` run by a session), as
        MirroredStrategy does there on CPUs: a sum on one device, copied to the
        destinations. The engines run eagerly or inside `tf.function` only."""
        if len(self._devices) != self._group_size:
            raise RuntimeError(
                "tfdist_ext.Strategy across several workers reduces eagerly or inside "
                "a tf.function (TF2), not in a TF1 graph (a tf.Graph().as_default() run "
                "by a tf.compat.v1.Session). Wrap the step in tf.function instead; TF1 "
                "graphs work with the replicas of one process only.")
        return tf.distribute.ReductionToOneDevice()

    def _all_gather(self, tensor, replica_id, options):
        if self._group_size == 1:
            return tensor
        if (self.config.engine == "ucx" and tensor.shape.is_fully_defined()
                and tensor.shape.rank and tensor.dtype in ucx_engine.SUPPORTED_DTYPES):
            shape = tensor.shape
            gathered = self.engines.main().all_gather(tf.reshape(tensor, [-1]), replica_id)
            return tf.reshape(gathered, [shape[0] * self._group_size] + shape[1:])
        return self._launchers[replica_id].all_gather(tensor, 0, options)

    def _batch_all_gather(self, per_replica_values, axis, options):
        """`strategy.gather` (Keras' `predict` across workers concatenates its outputs
        so) on the UCX engine, whose communicators follow an elastic job's members;
        TF's are fixed at the start. Lengths along `axis` may differ between replicas.
        TF's path takes the rest (`strategy_gather.engine_gathers`), and `allreduce="native"`."""
        values = [v for per_replica in per_replica_values for v in per_replica.values]
        axis = strategy_gather.static_axis(axis)
        if (self._group_size == 1 or self.config.engine != "ucx" or self._native_only
                or not all(strategy_gather.engine_gathers(v, axis) for v in values)):
            return super()._batch_all_gather(per_replica_values, axis, options)
        engine = self.engines.main()

        def gather_all():
            return [[strategy_gather.gather_along(engine, value, i, axis)
                     for i, value in enumerate(per_replica.values)]
                    for per_replica in per_replica_values]

        # In-process replicas meet only when their collectives run in one function.
        gathered = tf.function(gather_all)() if tf.executing_eagerly() else gather_all()
        return [_compat.regroup(outputs, wrap_class=_compat.Mirrored) for outputs in gathered]

    def _gradient_reduction_of(self, reduction, replica_id, options):
        """A `reduction_hooks.GradientReduction` for one replica's share of a
        (pseudo-)gradient all-reduce."""
        return reduction_hooks.GradientReduction(
            reduction.compressor or self.config.compression, self.state, replica_id,
            self.first_rank + replica_id, self._group_size,
            all_reduce=lambda t, name: self._reduce_buffer(t, replica_id, options, name,
                                                           refine=True),
            all_gather=lambda t, name: self._gather_in_scope(t, replica_id, options, name),
            dense_bytes=lambda n, dtype, refine: self.wire.dense(n, dtype, replica_id, refine),
            key_prefix=reduction.key_prefix)

    def _gather_in_scope(self, tensor, replica_id, options, bucket):
        with tf.name_scope(f"tfdist/allgather/{bucket}/"):
            return self._all_gather(tensor, replica_id, options)

    def _finish(self, reduce_op, value, replica_id):
        if reduce_op == _compat.ReduceOp.MEAN:
            with tf.device(self._devices[replica_id]):
                return value / self._group_size
        return value

    def __deepcopy__(self, memo):
        return CrossDeviceOps(self._devices, self._group_size, self._options,
                              copy.deepcopy(self._collective_keys, memo), self.config,
                              self._canonicalize_devices, worker_index=self._worker_index,
                              pair_group_key_base=self._pair_group_key_base,
                              engine_role=self._engine_role,
                              densify_sparse=self.densify_sparse,
                              calibration=self.choice.calibration)
