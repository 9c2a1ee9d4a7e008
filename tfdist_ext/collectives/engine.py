"""The graph engine: runs any all-reduce `Schedule` with TF collective primitives.

Every pair of ranks (a, b), a < b, talks over its own 2-member collective
group, so point-to-point traffic is built from TensorFlow's stock collectives
and works in one process (logical CPUs, GPUs) and across TF_CONFIG workers
alike (docs/tf_internals.md):

* a pairwise exchange-and-sum (see `plan.py`) is one 2-member
  ``CollectiveReduceV2``, ordered per device by an ordering token;
* every other transfer is a ``CollectiveBcastSendV2`` / ``CollectiveBcastRecvV2``
  pair in the 2-member group. Broadcasts are async-stateful, so nothing keeps
  a send alive but the control dependencies we add from every send to the
  returned tensor (a pruned send leaves its receiver waiting until timeout).

    rank:      0        1        2        3
    group:  [0,1] [0,2] [0,3] [1,2] [1,3] [2,3]   key = base + a * world_size + b

Dtypes: float16, bfloat16, float32, float64, int32 and int64. The broadcast
kernels have no bfloat16 type, so bfloat16 travels bit-cast to float16 (same
width; the transport copies bytes and never does arithmetic on them);
``CollectiveReduceV2`` takes bfloat16 directly.
"""

import collections
import types

import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.collectives import plan as plan_lib

SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)
# Broadcast kernels lack bfloat16.
_WIRE_DTYPES = types.MappingProxyType({tf.bfloat16: tf.float16})
PAIR_GROUP_KEYS = 10_000  # group keys reserved per strategy for the pair groups
# Instance keys of the engine that times candidates in the middle of a trace
# (`refine.py`). It needs its own: with several local replicas the trace has
# drawn keys for replica 0's pairs but not yet for replica 1's when it stops to
# time, so shared counters would disagree within a pair and the timing would
# wait forever.
TIMING_INSTANCE_KEYS = 1 << 30


def max_world_size(num_group_keys: int = PAIR_GROUP_KEYS) -> int:
    """Largest world size whose pair keys ``a * p + b`` fit in `num_group_keys`."""
    p = 1
    while (p + 1) * (p + 1) - (p + 1) <= num_group_keys:  # largest offset is p*p - p - 1
        p += 1
    return p


def check_world_size(world_size: int, num_group_keys: int = PAIR_GROUP_KEYS) -> None:
    """Raises a ValueError when the pair groups of `world_size` do not fit."""
    if world_size > max_world_size(num_group_keys):
        raise ValueError(
            f"The graph all-reduce engine needs world_size * (world_size - 1) = "
            f"{world_size * (world_size - 1)} collective group keys for world_size="
            f"{world_size}, but each strategy reserves {num_group_keys} (enough for "
            f"{max_world_size(num_group_keys)} replicas). Use allreduce='native' for "
            "this many replicas.")


class GraphEngine:
    """Builds the ops of one rank's all-reduce schedule, for each local replica.

    Args:
        devices: This worker's local devices; local replica i runs on devices[i].
        world_size: Replicas in sync across all workers.
        first_rank: Global rank of local replica 0 (worker_index * len(devices));
            local replica i has rank ``first_rank + i``.
        group_key_base: First of the `num_group_keys` collective group keys
            reserved for the pair groups (the same on every worker).
        timeout_seconds: Collective timeout; None or 0 waits forever.
        num_group_keys: Size of the reserved key range. Defaults to 10000.
        first_instance_key: Instance keys of every pair start above it.
            Engines sharing pair groups need disjoint ranges (see
            `TIMING_INSTANCE_KEYS`).

    Raises:
        ValueError: when `world_size` has more pairs than reserved keys.
    """

    def __init__(self, devices, world_size, first_rank, group_key_base,
                 timeout_seconds=None, num_group_keys=PAIR_GROUP_KEYS, first_instance_key=0):
        check_world_size(world_size, num_group_keys)
        if not 0 <= first_rank <= world_size - len(devices):
            raise ValueError(
                f"Argument `first_rank` must be in [0, world_size - len(devices)] = "
                f"[0, {world_size - len(devices)}]; received {first_rank}.")
        self.devices = tuple(devices)
        self.world_size = world_size
        self.first_rank = first_rank
        self.group_key_base = group_key_base
        self.timeout_seconds = timeout_seconds or 0
        self._tokens = {}
        # Instance keys are drawn at TRACE time, per (my_rank, peer), in the
        # canonical order of `plan.py`. Both ranks of a pair see the same
        # sequence of pair collectives, so their counters agree, and counters
        # only grow, so a key is never reused with another shape or dtype: each
        # traced function gets fresh keys and keeps them for every call. A key
        # reused by the next call of the same function is safe because calls
        # (training steps) do not overlap, so the previous instance is complete.
        # TF's own launcher instead draws keys at CALL time
        # (cross_device_utils.CollectiveReplicaLauncher._next_instance_key via
        # capture_call_time_value), which tolerates workers retracing a function
        # at different times and allows overlapping calls; trace-time keys
        # require every worker to trace the same functions in the same order
        # (true for data-parallel Keras: all workers build the same steps).
        self._instance_keys = collections.defaultdict(lambda: first_instance_key)

    def group_key(self, a: int, b: int) -> int:
        """Group key of the pair {a, b}; identical on every worker."""
        a, b = min(a, b), max(a, b)
        return self.group_key_base + a * self.world_size + b

    def _next_instance_key(self, rank: int, peer: int) -> int:
        self._instance_keys[(rank, peer)] += 1
        return self._instance_keys[(rank, peer)]

    def _ordering_token(self, local_index: int):
        # A per-device resource orders this device's CollectiveReduceV2 ops by
        # automatic control dependencies; without it all devices' reductions
        # in one tf.function are chained in program order and deadlock.
        if local_index not in self._tokens:
            with _compat.init_scope(), tf.device(self.devices[local_index]):
                self._tokens[local_index] = _compat.ResourceVariable(0.0, trainable=False)
        return self._tokens[local_index].handle

    def all_reduce(self, flat, local_index: int, algorithm, label=None):
        """Sums the 1-D tensor `flat` over all replicas with `algorithm`.

        Builds, on ``devices[local_index]``, the ops of rank ``first_rank +
        local_index`` of ``schedule_fn(algorithm)``. Must be called for every
        local replica, and on every worker, with the same shapes in the same
        order. Returns the input itself when there is nothing to exchange.
        `label` is accepted for the communicator interface; the caller's name
        scope already labels these ops.
        """
        n = flat.shape.num_elements()
        if n is None or flat.shape.rank != 1:
            raise ValueError(
                f"Argument `flat` must be a 1-D tensor of static length; received "
                f"shape {flat.shape}.")
        if flat.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"The graph all-reduce engine supports dtypes "
                f"{[d.name for d in SUPPORTED_DTYPES]}; received {flat.dtype.name}.")
        if self.world_size == 1 or n == 0:
            return flat
        rank = self.first_rank + local_index
        plan = plan_lib.make_plan(algorithm, self.world_size, rank, n)
        with tf.device(self.devices[local_index]), tf.name_scope("tfdist_allreduce"):
            segments = tf.split(flat, plan.sizes) if len(plan.sizes) > 1 else [flat]
            sends, consts = [], _Constants()
            for round_plan in plan.rounds:
                outputs = [self._comm(comm, segments, rank, local_index, sends, consts)
                           for comm in round_plan.comms]
                for apply in round_plan.applies:
                    pieces = _split(outputs[apply.comm], plan.sizes[apply.lo:apply.hi])
                    for offset, piece in enumerate(pieces):
                        i = apply.lo + offset
                        segments[i] = segments[i] + piece if apply.reduce else piece
            with tf.control_dependencies(sends):
                return tf.identity(_concat(segments))

    def _comm(self, comm, segments, rank, local_index, sends, consts):
        """Builds one collective; returns its output (None for a send)."""
        group_key = consts(self.group_key(rank, comm.peer))
        instance_key = consts(self._next_instance_key(rank, comm.peer))
        two = consts(2)
        if comm.kind == plan_lib.EXCHANGE:
            return _compat.collective_ops.all_reduce_v2(
                _concat(segments[comm.lo:comm.hi]), two, group_key, instance_key,
                timeout=self.timeout_seconds,
                ordering_token=self._ordering_token(local_index))
        dtype = segments[0].dtype
        wire = _WIRE_DTYPES.get(dtype, dtype)
        if comm.kind == plan_lib.SEND:
            data = _concat(segments[comm.lo:comm.hi])
            if wire != dtype:
                data = tf.bitcast(data, wire)
            sends.append(_compat.collective_ops.broadcast_send_v2(
                data, two, group_key, instance_key, timeout=self.timeout_seconds))
            return None
        length = sum(s.shape[0] for s in segments[comm.lo:comm.hi])
        data = _compat.collective_ops.broadcast_recv_v2(
            consts((length,)), wire, two, group_key, instance_key,
            timeout=self.timeout_seconds)
        data.set_shape([length])
        return tf.bitcast(data, dtype) if wire != dtype else data


class _Constants(dict):
    """int32 constants of one `all_reduce` call, each built once (fewer graph ops)."""

    def __call__(self, value):
        if value not in self:
            self[value] = tf.constant(value, tf.int32)
        return self[value]


def _concat(tensors):
    return tensors[0] if len(tensors) == 1 else tf.concat(tensors, axis=0)


def _split(tensor, sizes):
    return [tensor] if len(sizes) == 1 else tf.split(tensor, list(sizes))
