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
      `select_algorithm(num_bytes)` picks: "native" buffers to TF's
      CollectiveReduceV2 ring, any other name to the graph engine
      (`collectives.engine`), which runs that algorithm's schedule.
    * IndexedSlices, tensors without a static shape and dtypes the engine does
      not support (see `engine.SUPPORTED_DTYPES`) are delegated to TF's native
      path, which all-gathers IndexedSlices instead of densifying them (an
      embedding gradient stays sparse) and reports unsupported dtypes itself.
    * Zero-size tensors pass through without communication.
    * MEAN divides the sum by the global replica count at the end exactly as
      TF's native path does (``value / group_size``): integer tensors become
      float64 means, not floor divisions.
    * "auto" buffers go to the algorithm `collectives.refine.Refiner` picks:
      the calibrated model's choice, or, where the model finds candidates
      close, the fastest of them timed at that buffer size (the chief's
      timings, so identical on all workers).

Gradient reductions (the batched all-reduce an optimizer issues, which reaches
`batch_reduce_implementation`) are also where compression applies and where
the per-replica step counter and byte counters of `StrategyState` advance;
other reductions (metrics, `strategy.reduce`) stay dense and uncounted.
"""

import contextlib
import copy
import threading

import tensorflow as tf

from tfdist_ext import _compat, bucketing, cluster
from tfdist_ext.collectives import auto, cost, fusion, hierarchical
from tfdist_ext.collectives import engine as engine_lib
from tfdist_ext.collectives import ucx_engine
from tfdist_ext.compression import Bucket, Communicator, NoCompression, hooks
from tfdist_ext.state import StrategyState

NATIVE = "native"


class CrossDeviceOps(_compat.CollectiveAllReduce):
    """Cross-device ops that route reductions by the strategy's configuration.

    Args:
        devices: Local devices of this worker taking part in the reduction.
        group_size: Replicas in sync across all workers.
        options: Default `tf.distribute.experimental.CommunicationOptions`.
        collective_keys: The owning strategy's `CollectiveKeys` (its key range).
        config: The validated `tfdist_ext.strategy.StrategyConfig`.
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
    """

    def __init__(self, devices, group_size, options, collective_keys, config,
                 canonicalize_devices=True, *, worker_index=0, pair_group_key_base=None,
                 engine_role="main"):
        super().__init__(devices, group_size, options, collective_keys=collective_keys,
                         canonicalize_devices=canonicalize_devices)
        self.config = config
        self._worker_index = worker_index
        self._pair_group_key_base = pair_group_key_base
        self._engine = None
        self._engine_role = engine_role
        self._engine_lock = threading.Lock()
        self._rank_hosts = None
        self._state = None
        self.calibration = None  # set by the strategy when "auto" is used
        self.refiner = None      # likewise
        self._gradient_reduction = False
        self._dense_only = False
        self._key_prefix = ""
        self._native_only = (set(config.allreduce.algorithms) == {NATIVE}
                             and isinstance(config.compression, NoCompression)
                             and config.bucketing is None)
        self.backward_times = None  # per gradient, backward order (bucketing profile)
        self.plan_override = None   # buckets chosen by tuning (bucketing.MGWFBP.tune)
        self.plan_inputs = None     # (sizes, alpha, beta) of the last plan
        self.bucket_plan = ()       # the buckets of the last traced gradient reduction
        if not self._native_only and config.engine == "tf":
            if pair_group_key_base is None:
                raise ValueError("Argument `pair_group_key_base` is required when the "
                                 f"all-reduce configuration {config.allreduce} uses the "
                                 "graph engine.")
            engine_lib.check_world_size(group_size)

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

    def select_algorithm(self, num_bytes: int, itemsize: int = 4, refine: bool = True) -> str:
        """The one place an algorithm is chosen per fused buffer (same on every worker).

        Args:
            num_bytes: Size of the buffer.
            itemsize: Bytes per element.
            refine: Whether "auto" may time its close candidates at this size
                (`collectives.refine`). False where no buffer of this size is
                reduced (a bucket plan's total) or where it is off the
                training path (metrics, `strategy.reduce`): the model decides.
        """
        name = self.config.allreduce.algorithm_for(num_bytes)
        if name == "auto":
            if self.calibration is None:
                raise RuntimeError("allreduce='auto' needs the strategy's calibration; "
                                   "create the strategy with tfdist_ext.Strategy(...).")
            if self.refiner is not None and refine:
                return self.refiner.choose(num_bytes, itemsize)
            return auto.choose(self.calibration, num_bytes, itemsize, self.auto_candidates)
        return name

    @property
    def rank_hosts(self):
        """Host id of every global rank (`AllReduce.hosts`, else TF_CONFIG's addresses)."""
        if self._rank_hosts is None:
            per_worker = len(self._devices)
            given = self.config.allreduce.hosts
            if given is not None:
                workers = self._group_size // per_worker
                if len(given) not in (workers, self._group_size):
                    raise ValueError(
                        f"Argument `hosts` lists {len(given)} hosts ({given}) but the job has "
                        f"{workers} worker(s) of {per_worker} replica(s); give the host of "
                        f"every worker (or of every replica without TF_CONFIG).")
                repeat = per_worker if len(given) == workers else 1
                self._rank_hosts = tuple(h for h in given for _ in range(repeat))
            else:
                spec = cluster.cluster_from_env()
                addresses = spec.worker_addresses if spec else ["localhost:0"]
                self._rank_hosts = hierarchical.hosts_from_addresses(addresses, per_worker)
        return self._rank_hosts

    @property
    def auto_candidates(self):
        """What "auto" chooses from: `AllReduce.candidates`, else every algorithm, with
        "hierarchical" when the job spans several hosts and some host runs several ranks."""
        given = self.config.allreduce.candidates
        if given:
            return tuple(sorted(given))
        groups = hierarchical.host_groups(self.rank_hosts)
        layered = len(groups) > 1 and any(len(g) > 1 for g in groups)
        return auto.candidates_or_all(None) + ((hierarchical.NAME,) if layered else ())

    def algorithm_spec(self, name):
        """What the engines and the cost model run for the algorithm `name`: the name
        itself, or for "hierarchical" its schedule for this job's hosts."""
        if name != hierarchical.NAME:
            return name
        return hierarchical.Hierarchical(self.rank_hosts, self.config.allreduce.inter_host)

    def dense_wire_bytes(self, num_elements, dtype):
        """Bytes this worker's first replica sends to all-reduce such a buffer densely."""
        itemsize = tf.as_dtype(dtype).size
        algorithm = self.select_algorithm(num_elements * itemsize, itemsize, refine=False)
        return self._wire_bytes(algorithm, num_elements, itemsize, 0)

    def _wire_bytes(self, algorithm, num_elements, itemsize, replica_id):
        rank = self.first_rank + replica_id
        return itemsize * cost.elements_sent(self.algorithm_spec(algorithm), self._group_size,
                                             rank, num_elements)

    @contextlib.contextmanager
    def dense_reductions(self):
        """Reductions traced in this context are not gradients (no compression, uncounted).

        Sync policies average parameters through `batch_reduce_to` in this
        context.
        """
        self._dense_only = True
        try:
            yield
        finally:
            self._dense_only = False

    @contextlib.contextmanager
    def pseudo_gradient_reductions(self):
        """Reductions traced in this context are compressed and counted like gradients.

        For what relaxed sync policies send instead of gradients (local SGD's
        parameter change since the last average): their buckets get keys of
        their own ("delta_b0_..."), so residuals and compressor state never
        mix with the gradient buckets'.
        """
        self._key_prefix = "delta_"
        try:
            yield
        finally:
            self._key_prefix = ""

    def reduce_buffers(self, buffers):
        """Sums flat buffers over all replicas, densely, with the configured algorithms.

        Args:
            buffers: For each local replica, a list of 1-D tensors (the same
                lengths and dtypes on every replica and worker).

        Returns:
            The sums, in the same nesting. Call inside a `tf.function`.
        """
        options = self._options
        return [[self._reduce_buffer(b, r, options) if b.shape.num_elements() else b
                 for b in replica_buffers]
                for r, replica_buffers in enumerate(buffers)]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        # The optimizer's gradient all-reduce; see the module docstring.
        self._gradient_reduction = not self._dense_only
        try:
            return super().batch_reduce_implementation(reduce_op, value_destination_pairs,
                                                       options)
        finally:
            self._gradient_reduction = False

    def collective_engine(self):
        """The engine that runs this strategy's schedules (config.engine)."""
        with self._engine_lock:  # eager reductions run one thread per replica
            if self._engine is None:
                self._engine = self.new_engine(role=self._engine_role)
        return self._engine

    def new_engine(self, first_instance_key=0, role="main"):
        """An engine for collectives that must not interleave with another engine's.

        Args:
            first_instance_key: The graph engine's instance-key range (see
                `engine.GraphEngine`); engines sharing pair groups need
                disjoint ones.
            role: The UCX engine's communicators: one set per role and
                topology in a process, shared by the strategies that use it
                (their collectives never run at the same time).
        """
        if self.config.engine == "ucx":
            # The same on every worker: it names the rendezvous keys. Strategies
            # with another timeout get their own communicators.
            timeout = self.config.allreduce.timeout_seconds
            name = (f"{role}{first_instance_key or ''}-{self._group_size}x{len(self._devices)}"
                    f"-t{timeout:g}")
            return ucx_engine.engine_for(
                name, self._devices, self._group_size, self.first_rank,
                timeout_seconds=self.config.allreduce.timeout_seconds)
        return engine_lib.GraphEngine(
            self._devices, self._group_size, self.first_rank, self._pair_group_key_base,
            timeout_seconds=self._options.timeout_seconds, first_instance_key=first_instance_key)

    def _all_reduce(self, reduce_op, value, replica_id, options):
        if self._native_only:
            scope = "tfdist/native/b0/" if self._gradient_reduction else "tfdist/native/other/"
            with tf.name_scope(scope):
                result = super()._all_reduce(reduce_op, value, replica_id, options)
            if self._gradient_reduction and replica_id == 0:
                dense = sum(self._wire_bytes(NATIVE, t.shape.num_elements(), t.dtype.size, 0)
                            for t in _compat.nest.flatten(value)
                            if not isinstance(t, tf.IndexedSlices) and t.shape.is_fully_defined())
                with tf.control_dependencies([self.state.count(dense, dense)]):
                    result = _compat.nest.map_structure(tf.identity, result)
            return result
        options = self._options.merge(options or _compat.CommunicationOptions())
        flat = _compat.nest.flatten(value)
        results = [None] * len(flat)
        fused, native = [], []
        for i, v in enumerate(flat):
            if isinstance(v, tf.IndexedSlices):
                native.append(i)
                continue
            flat[i] = v = tf.convert_to_tensor(v)
            if not v.shape.is_fully_defined() or v.dtype not in engine_lib.SUPPORTED_DTYPES:
                native.append(i)
            elif v.shape.num_elements() == 0:
                results[i] = self._finish(reduce_op, v, replica_id)
            else:
                fused.append(i)
        if native:
            reduced = super()._all_reduce(reduce_op, [flat[i] for i in native], replica_id,
                                          options)
            for i, r in zip(native, reduced):
                results[i] = r
        if fused:
            gradients = self._gradient_reduction
            step = self.state.next_step(replica_id) if gradients else None
            counts = [0, 0]  # bytes sent, dense bytes (replica 0 counts)
            buffers = iter(range(len(fused)))

            def reduce_flat(buffer, shapes):
                if not gradients:
                    return self._reduce_buffer(buffer, replica_id, options)
                return self._reduce_gradient_buffer(buffer, shapes, replica_id, options, step,
                                                    f"{self._key_prefix}b{next(buffers)}",
                                                    counts)

            tensors = [flat[i] for i in fused]
            planned = gradients and self.config.bucketing is not None
            if planned and replica_id == 0 and self.needs_backward_profile():
                tensors = self._record_ready_times(tensors)
            reduced = fusion.fused_all_reduce(
                tensors, reduce_flat, options.bytes_per_pack,
                plan=self._plan_buckets if planned else None)
            if gradients and replica_id == 0:
                with tf.control_dependencies([self.state.count(*counts)]):
                    reduced = [tf.identity(r) for r in reduced]
            for i, r in zip(fused, reduced):
                results[i] = self._finish(reduce_op, r, replica_id)
        return _compat.nest.pack_sequence_as(value, results)

    def _reduce_buffer(self, buffer, replica_id, options, bucket="other"):
        """Sums one flat buffer with the algorithm chosen for its size.

        Its ops are in the name scope ``tfdist/<algorithm>/<bucket>/``, which
        profiler traces show (`keras.callbacks.TensorBoard(profile_batch=...)`).
        """
        name = self.select_algorithm(buffer.shape.num_elements() * buffer.dtype.size,
                                     buffer.dtype.size,
                                     refine=self._gradient_reduction or self._dense_only)
        if self._group_size == 1:
            return buffer
        with tf.name_scope(f"tfdist/{name}/{bucket}/"):
            if name == NATIVE:  # one tensor: TF's packing leaves it whole
                return super()._all_reduce(_compat.ReduceOp.SUM, [buffer], replica_id,
                                           options)[0]
            return self.collective_engine().all_reduce(buffer, replica_id,
                                                       self.algorithm_spec(name),
                                                       label=f"tfdist/{name}/{bucket}")

    def _all_gather(self, tensor, replica_id, options):
        if self._group_size == 1:
            return tensor
        if (self.config.engine == "ucx" and tensor.shape.is_fully_defined()
                and tensor.shape.rank and tensor.dtype in ucx_engine.SUPPORTED_DTYPES):
            shape = tensor.shape
            gathered = self.collective_engine().all_gather(tf.reshape(tensor, [-1]), replica_id)
            return tf.reshape(gathered, [shape[0] * self._group_size] + shape[1:])
        return self._launchers[replica_id].all_gather(tensor, 0, options)

    def _reduce_gradient_buffer(self, buffer, shapes, replica_id, options, step, bucket_name,
                                counts):
        """A gradient buffer: compressed if configured (`compression.hooks`), and counted."""
        compressor = self.config.compression
        n, dtype = buffer.shape.num_elements(), buffer.dtype
        dense_only = not hooks.compresses(compressor, buffer)
        algorithm = self.select_algorithm(n * dtype.size, dtype.size,
                                          refine=dense_only or compressor.warmup_steps > 0)
        counts[1] += self._wire_bytes(algorithm, n, dtype.size, replica_id)

        def reduce_bytes(length, wire_dtype):
            chosen = self.select_algorithm(length * wire_dtype.size, wire_dtype.size)
            return self._wire_bytes(chosen, length, wire_dtype.size, replica_id)

        comm = Communicator(
            all_reduce=lambda t: self._reduce_buffer(t, replica_id, options, bucket_name),
            all_gather=lambda t: self._gather_in_scope(t, replica_id, options, bucket_name),
            reduce_bytes=reduce_bytes, world_size=self._group_size,
            rank=self.first_rank + replica_id)
        bucket = Bucket(flat=buffer, shapes=tuple(shapes), key=f"{bucket_name}_{dtype.name}_{n}",
                        replica=replica_id, step=step)
        summed, sent = hooks.reduce_bucket(compressor, bucket, comm, self.state)
        counts[0] += sent
        return summed

    def _gather_in_scope(self, tensor, replica_id, options, bucket):
        with tf.name_scope(f"tfdist/allgather/{bucket}/"):
            return self._all_gather(tensor, replica_id, options)

    # -- bucketing ---------------------------------------------------------------

    def needs_backward_profile(self) -> bool:
        """Whether the planner wants per-gradient backward times nobody has supplied."""
        planner = self.config.bucketing
        return (getattr(planner, "uses_backward_times", False) and self.backward_times is None
                and getattr(planner, "backward_times", None) is None)

    def _record_ready_times(self, tensors):
        """Stamps when each gradient exists (replica 0), accumulated in `state`.

        Timestamps are stateful, so automatic control dependencies run them in
        program order: they are created in backward order (the order backprop
        produces the gradients) so that none waits for a later gradient. The
        reduction does not wait for the record (stateful ops are never pruned).
        """
        stamps = []
        for t in tensors[::-1]:
            with tf.control_dependencies([t]):
                stamps.append(tf.timestamp())
        self.state.record_ready(tf.stack(stamps[::-1]))
        return tensors

    def link_constants(self, algorithm):
        """(alpha seconds per message, beta seconds per byte) of `algorithm`."""
        calibration = self.calibration or auto.Calibration.defaults("defaults", self._group_size)
        for name, latency, per_byte in calibration.lines:
            if name == algorithm:
                return latency, per_byte
        return calibration.alpha, calibration.beta

    def _plan_buckets(self, sizes, itemsize):
        """Buckets (backward order) of one dtype's gradients; remembers the plan."""
        planner = self.config.bucketing
        algorithm = self.select_algorithm(sum(sizes), itemsize, refine=False)
        alpha, beta = self.link_constants(algorithm)
        self.plan_inputs = (tuple(sizes), alpha, beta)
        times = getattr(planner, "backward_times", None)
        if times is not None and len(times) != len(sizes):
            raise ValueError(
                f"Argument `backward_times` of {type(planner).__name__} has {len(times)} "
                f"entries but the model has {len(sizes)} gradients to reduce (of "
                f"{itemsize}-byte elements); pass one time per gradient tensor, in backward "
                "order, or None to profile them.")
        if times is None:
            times = self.backward_times
            if times is not None and len(times) != len(sizes):
                times = None  # profiled another dtype split: plan without times
        buckets = bucketing.plan_buckets(planner, sizes, times, alpha, beta)
        if self.plan_override is not None and sum(map(len, self.plan_override)) == len(sizes):
            buckets = self.plan_override
        self.bucket_plan = tuple(
            {"bytes": sum(sizes[i] for i in bucket), "gradients": len(bucket),
             "algorithm": self.select_algorithm(sum(sizes[i] for i in bucket), itemsize)}
            for bucket in buckets)
        return buckets

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
                              engine_role=self._engine_role)
