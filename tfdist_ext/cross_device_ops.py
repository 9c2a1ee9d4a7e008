"""The strategy's cross-device ops: the one place where the four concerns compose.

Keras reduces every gradient with one `replica_context.all_reduce(SUM, grads)`,
which reaches `CollectiveAllReduce._all_reduce` for every replica (through
merge_call and `batch_reduce_implementation`, or directly in replica context).
Subclassing TF's `CollectiveAllReduce` and overriding that single choke point
keeps `CollectiveAllReduceExtended` (and so MultiWorkerMirroredStrategy's
isinstance checks, key management and input pipeline) intact.
"""

import copy

from tfdist_ext import _compat


class CrossDeviceOps(_compat.CollectiveAllReduce):
    """Cross-device ops that route reductions by the strategy's configuration.

    Args:
        devices: Local devices of this worker taking part in the reduction.
        group_size: Replicas in sync across all workers.
        options: Default `tf.distribute.experimental.CommunicationOptions`.
        collective_keys: The owning strategy's `CollectiveKeys` (its key range).
        config: The validated `tfdist_ext.strategy.StrategyConfig`.
        canonicalize_devices: As in TF's `CollectiveAllReduce`.
    """

    def __init__(self, devices, group_size, options, collective_keys, config,
                 canonicalize_devices=True):
        super().__init__(devices, group_size, options, collective_keys=collective_keys,
                         canonicalize_devices=canonicalize_devices)
        self.config = config

    def _all_reduce(self, reduce_op, value, replica_id, options):
        # The only engine so far is TF's native CollectiveReduceV2 ring, with
        # fusion controlled by options.bytes_per_pack (set by the strategy).
        return super()._all_reduce(reduce_op, value, replica_id, options)

    def __deepcopy__(self, memo):
        return CrossDeviceOps(self._devices, self._group_size, self._options,
                              copy.deepcopy(self._collective_keys, memo), self.config,
                              self._canonicalize_devices)
