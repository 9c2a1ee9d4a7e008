"""The `StrategyExtended` of `tfdist_ext.Strategy`: MWMS internals with our cross-device ops.

`Extended` subclasses TF's `CollectiveAllReduceExtended` (through `_compat`)
and swaps tfdist_ext's `CrossDeviceOps` in where TF would build its own, for
the main thread and for the background reductions of the sync policies. Its
communication options are `reductions.ReductionOptions`, so the `Reduction` a
caller passes reaches the cross-device ops, and a batched reduction that names
none is the strategy's gradient all-reduce (Keras reduces gradients with a
plain `replica_context.all_reduce`). It also repairs `_reduce_to` on a nest of
values (keras-team/keras#20585, part 1).
"""

import contextlib

from tfdist_ext import _compat, reductions
from tfdist_ext.cross_device_ops import CrossDeviceOps

# Collective group keys: TF's stock strategies count from 1; each tfdist_ext
# Strategy instance owns [base, base + KEY_SPAN), TF's CollectiveKeys in the
# lower half and the plugin's own point-to-point groups in the upper half; the
# upper quarter of each half serves background reductions (sync policies).
KEY_BASE = 100_000
KEY_SPAN = 20_000


LATE_START = (
    "tfdist_ext.Strategy() with TF_CONFIG must configure TensorFlow before it runs "
    "anything, but this process already ran TensorFlow (an op, a tensor or a device "
    "query) before tfdist_ext could prepare it (TF: 'Collective ops must be configured "
    "at program startup'). Fix: put `import tfdist_ext` before the first TensorFlow op, "
    "e.g. among the script's first imports; when TF_CONFIG is set later in the program, "
    "call `tfdist_ext.early.prepare()` right after setting it.")


class Extended(_compat.CollectiveAllReduceExtended):
    """MWMS internals with tfdist_ext cross-device ops swapped in."""

    def __init__(self, container_strategy, config, devices, cluster_resolver=None,
                 densify_sparse=False):
        self.tfdist_config = config
        self._densify_sparse = densify_sparse
        self._gradients = reductions.Reduction(reductions.GRADIENTS)
        super().__init__(container_strategy, cluster_resolver=cluster_resolver,
                         communication_options=reductions.ReductionOptions.from_options(
                             config.communication_options()),
                         devices=devices)

    def _initialize_local(self, cluster_resolver, devices=None):
        super()._initialize_local(cluster_resolver, devices=devices)
        self._install_cross_device_ops()

    def _initialize_multi_worker(self, cluster_resolver):
        if _compat.collective_ops_enabled():
            # Enabled by `tfdist_ext.early` or an earlier strategy (see
            # _compat.collective_ops_enabled); TF's own check applies as for a
            # strategy that enabled them itself.
            self._std_server_started = True
            # Recoverable (elastic) jobs have their own watcher; TF's would all-reduce
            # with everyone.
            self._enable_check_health = not (_compat.coordination_service_configured()
                                             or _compat.recoverable_context())
        elif _compat.context_initialized():
            raise RuntimeError(LATE_START)
        super()._initialize_multi_worker(cluster_resolver)
        self._install_cross_device_ops()

    def _install_cross_device_ops(self):
        native = self._cross_device_ops
        self._cross_device_ops = CrossDeviceOps(
            native._devices, native._group_size, self._communication_options,  # pylint: disable=protected-access
            self._collective_keys, self.tfdist_config, worker_index=self._id_in_cluster,
            pair_group_key_base=self._collective_key_base + KEY_SPAN // 2,
            densify_sparse=self._densify_sparse)
        self._background_ops = None

    @property
    def cross_device_ops(self):
        """The routing `CrossDeviceOps` every reduction of this strategy goes through."""
        return self._cross_device_ops

    def background_cross_device_ops(self):
        """Cross-device ops for reductions that run concurrently with the main thread's.

        Same devices and algorithms, but their own group keys (the upper quarter
        of each half of the strategy's key range), so instance keys drawn on a
        background thread never interleave with the main thread's.
        """
        if self._background_ops is None:
            main = self._cross_device_ops
            quarter = KEY_SPAN // 4
            self._background_ops = CrossDeviceOps(
                main._devices, main._group_size, self._communication_options,  # pylint: disable=protected-access
                _compat.CollectiveKeys(group_key_start=self._collective_key_base + quarter),
                self.tfdist_config, worker_index=self._id_in_cluster,
                pair_group_key_base=self._collective_key_base + KEY_SPAN // 2 + quarter,
                engine_role="background",
                # "auto" decides from the main ops' calibration: timing on the
                # background thread would run beside the main thread's steps.
                calibration=main.choice.calibration)
        return self._background_ops

    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        # MWMS broadcasts initial values from the chief with TF's collectives, which
        # cannot change members: a worker joining a running job, and everyone after a
        # membership change, takes its own (the state comes from rank 0 later). A death
        # during that broadcast (Keras building a model at fit's start) is survived as
        # one between steps (`between_steps`): the first step then broadcasts the state.
        def own_value():
            with _compat.ops.device(device):
                value = kwargs["initial_value"]
                value = value() if callable(value) else value
                if isinstance(value, _compat.CheckpointInitialValue):
                    value = value.wrapped_value
                return _compat.ops.convert_to_tensor(value, dtype=kwargs.get("dtype", None))

        membership = self._container_strategy().membership
        if replica_id == 0 and membership.changed:
            return own_value
        broadcast = super()._get_variable_creator_initial_value(
            replica_id=replica_id, device=device, primary_var=primary_var, **kwargs)
        if replica_id != 0 or not membership.changes:
            return broadcast
        return lambda: membership.between_steps(broadcast, own_value)

    def step_down(self):
        """Not the chief until `reconfigure` makes it rank 0 (a replacement joining an
        elastic job, worker 0's included, is ranked after the members' chief)."""
        self._is_chief = False

    def reconfigure(self, worker_index, num_workers, generation, kv=None, wire=True,
                    chief=None):
        """Goes on as worker `worker_index` of `num_workers` (elastic training): TF's
        view of the cluster (input splitting, the chief: `chief`, or None for worker
        0) and the cross-device ops (`CrossDeviceOps.reconfigure`, with its `wire`)."""
        self._num_workers = num_workers
        self._id_in_cluster = worker_index
        self._is_chief = worker_index == 0 if chief is None else chief
        self._cross_device_ops.reconfigure(worker_index, num_workers, generation, kv, wire)
        if self._background_ops is not None:
            self._background_ops.reconfigure(worker_index, num_workers, generation, kv, wire)

    @contextlib.contextmanager
    def compressing_gradients_with(self, compressor):
        """Gradient all-reduces that name no `Reduction` (Keras') and are traced in
        the block use `compressor` instead of the configuration's
        (`keras.moved_momentum`: the configuration's with the optimizer's momentum)."""
        previous = self._gradients
        self._gradients = reductions.Reduction(reductions.GRADIENTS, compressor)
        try:
            yield
        finally:
            self._gradients = previous

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        if reductions.of(options) is None:
            options = reductions.ReductionOptions.from_options(options, self._gradients)
        return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)

    def _reduce_to(self, reduce_op, value, destinations, options):
        # Stock MWMS is not nest-aware here (keras-team/keras#20585, part 1).
        if not _compat.is_distributed_value(value) and _compat.nest.is_nested(value):
            return _compat.nest.map_structure(
                lambda v: super(Extended, self)._reduce_to(reduce_op, v, destinations,
                                                            options), value)
        return super()._reduce_to(reduce_op, value, destinations, options)
