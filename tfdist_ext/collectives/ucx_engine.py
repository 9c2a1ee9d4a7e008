"""The UCX engine: runs any schedule in one C++ op per collective over UCX.

Each rank (a local replica) owns a UCX communicator: a UCP worker with an
endpoint to every other rank and one executor thread (`custom_ops/ucx/`). A
collective is one op that takes the rank's `Schedule`, encoded by `encode`,
as an attribute; the op runs all its rounds, cutting large steps into
segments that are all in flight at once and reducing each as it lands. UCX
picks the wire: shared memory between processes of one host, TCP (or RDMA
where the UCX build has it) across hosts, loopback within a process.

    worker 0                    worker 1
    replica -> op -> comm 0 <==UCX==> comm 1 <- op <- replica
                     (thread)           (thread)

Wire-up: communicators publish their UCP worker addresses in TF's
coordination-service key-value store (every TF_CONFIG job has one) and create
endpoints from the peers' addresses; replicas of one process exchange them
directly. No port, service or environment variable is needed.

When every rank is a replica of this process (logical CPU replicas), an
all-reduce skips the wire whatever the algorithm: the communicators form a
local group, each rank's thread sums its share of the elements over all
replicas' buffers into one output, and that one buffer is every replica's
result (bit-identical by construction). All-gather, broadcast and gossip
exchanges still run their schedules.

When every rank is a process of this machine (one replica each, same boot,
PID and network namespace: emulated hosts of the test bed do not count), an
all-reduce of at least `HOST_SUM_MIN_BYTES` (1 MB) likewise skips UCX whatever
the algorithm: the ranks stage chunks of their buffers in shared memory that
every peer maps, and each rank sums its part of every chunk into one block of
rank 0's shared area that becomes every rank's result (read-only to TF; see
`shared_output_bytes`), or, when the block does not fit, into its own tensor,
copying the others' parts (`custom_ops/ucx/host_group.h`).
Every rank must manage to map every peer's memory, or none uses it (the
reason is logged once). A peer whose process exits is noticed within
milliseconds there, not after `timeout_seconds`.

Tuning:
    * `segment_bytes` (1 MB): smaller segments overlap reduction and transfer
      sooner, larger ones cost fewer messages. 256 KB-4 MB all do well.
    * `spin_us` (200): how long a waiting rank polls before it sleeps on the
      worker's event descriptor. Polling costs a core; sleeping adds wake-up
      latency when a peer is late. `TFDIST_UCX_SPIN_US` (environment) sets it
      for every engine of the process; `tfdist-run` sets 0 when it starts more
      processes than the machine has cores (a polling rank would hold a core a
      peer needs; see docs/results.md, "All-reduce across emulated hosts").
    * `timeout_seconds` (30): a rank that hears nothing from a peer for this
      long fails the collective naming the peer; the communicator stays failed.
    * `TFDIST_UCX_IN_PROCESS=0` (environment) makes logical replicas run the
      schedules over UCX instead of the in-process sum (for testing them).
    * `TFDIST_UCX_SHARED_MEMORY=0` (environment, on any worker): the processes of
      one machine run the schedules over UCX instead of the shared-memory sum,
      whose chunk size is `segment_bytes` (each rank maps 4 chunks per peer).
    * `shared_output_bytes` (256 MB): room for shared-memory sums' results in
      rank 0's shared area. A result that fits is summed once, straight into
      memory every rank reads (each rank's result tensor is that block, never
      written in place by TF); one that does not (results kept for long, or
      more in flight than this) is copied into each rank's own tensor, which
      costs each rank one more write of the whole buffer. Pages are used only
      when written; 0 turns it off.
    * TCP segment sizes default to 128 KB / 512 KB unless UCX_TCP_TX_SEG_SIZE /
      UCX_TCP_RX_SEG_SIZE are set (UCX's own 8 KB / 64 KB cost bandwidth; larger
      ones can too, through a bridge or NIC); UCX_TLS and UCX_NET_DEVICES choose
      transports and interfaces as usual.
"""

import os
import threading

import tensorflow as tf

from tfdist_ext import _compat, coordination
from tfdist_ext.collectives import gather, ucx_aborts, ucx_host, ucx_slots, verify
from tfdist_ext.collectives.schedule import encode, schedule_fn
from tfdist_ext.ops import ucx as ucx_ops

SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)
HOST_SUM_MIN_BYTES = 1 << 20  # smaller all-reduces run the (latency-optimal) schedules
_RENDEZVOUS_SECONDS = 300
_engines = {}  # rendezvous name -> UcxEngine: deep copies of the cross-device ops share it
_engines_lock = threading.Lock()  # eager reductions create it from one thread per replica


def load_library():
    """Loads the UCX op library now (about 0.4 s), e.g. before a replacement worker
    asks to join, so that the members do not wait for it in their first collective."""
    ucx_ops.load()


def engine_for(name, devices, world_size, first_rank, slot_key=None, wire=True, **options):
    """The process's `UcxEngine` called `name`, created (and wired up) on first use;
    its ops run on the handle slots of `slot_key` (default: `name`; `ucx_slots`).
    With ``wire=False`` a new engine that is not wired up (`UcxEngine`'s
    `wire`) and not kept for later calls."""
    in_process = os.environ.get("TFDIST_UCX_IN_PROCESS", "1") != "0"
    slot_key = name if slot_key is None else slot_key
    if not in_process and world_size == len(devices):  # the names of rendezvous keys:
        name, slot_key = name + "-schedules", slot_key + "-schedules"  # in one process only
    shared_memory = os.environ.get("TFDIST_UCX_SHARED_MEMORY", "1") != "0"
    if os.environ.get(ucx_ops.SPIN_VARIABLE):
        options.setdefault("spin_us", ucx_ops.spin_from_environment())
    if not wire:
        return UcxEngine(name, devices, world_size, first_rank, in_process=in_process,
                         shared_memory=shared_memory, slot_key=slot_key, wire=False, **options)
    with _engines_lock:
        if name not in _engines:
            _engines[name] = UcxEngine(name, devices, world_size, first_rank,
                                       in_process=in_process, shared_memory=shared_memory,
                                       slot_key=slot_key, **options)
        return _engines[name]


class UcxEngine:
    """Communicators for this process's replicas, and the collectives over them.

    Args:
        name: Rendezvous name, identical on every worker and unique per engine.
        devices: This worker's local devices; local replica i has rank
            ``first_rank + i``.
        world_size: Replicas in sync across all workers.
        first_rank: Global rank of local replica 0.
        timeout_seconds: Seconds without progress before a collective fails.
        segment_bytes: Largest message; bigger steps are pipelined.
        spin_us: Polling before a waiting rank sleeps.
        shared_output_bytes: Room for results shared by the ranks of one
            machine (0: every rank copies the sum into its own tensor).
        in_process: Sum all-reduces in process when every rank is local.
        shared_memory: Sum all-reduces through shared memory when every rank
            is a one-replica process of this machine.
        kv: Where ranks of other workers meet to wire up: an object with
            ``set(key, value)`` and ``get(key, seconds)``; None is the
            coordination service's store (`tfdist_ext.coordination.KeyValue`).
        slot_key: The ops address the communicators through the handle slots
            of this key (`ucx_slots`), which this engine takes over once wired
            up; None: through the communicators' own handles.
        born: `ucx_aborts.count()` when the membership it wires up was decided:
            a later `ucx_aborts.abort` (a peer found dead) stops its wait for the
            peers' addresses (None: now).
        wire: False makes this process's communicators without meeting the
            peers, as rehearsals: functions traced on its ops run, each
            collective's result being its input, so that TF instantiates them;
            the next wired engine of the same `slot_key` takes its slots over
            (an elastic replacement traces and runs its step once before it
            asks to join). Needs `slot_key`.

    Raises:
        UcxUnavailableError: the UCX op library cannot be loaded.
        tf.errors.UnavailableError: wire-up failed (names the cause).
        tf.errors.AbortedError: `ucx_aborts.abort` was called while it waited for
            a peer.
    """

    def __init__(self, name, devices, world_size, first_rank, timeout_seconds=30.0,
                 segment_bytes=1 << 20, spin_us=200, in_process=True, shared_memory=True,
                 kv=None, shared_output_bytes=256 << 20, slot_key=None, born=None,
                 wire=True):
        if not wire and slot_key is None:
            raise ValueError("Argument `slot_key` is required with wire=False: only a "
                             "slot can be taken over by the engine that is wired later.")
        self._ops = ucx_ops.load()
        self._kv = kv or coordination.KeyValue()
        self._born = ucx_aborts.count() if born is None else born
        self.name = name
        self.devices = tuple(devices)
        self.world_size = world_size
        self.first_rank = first_rank
        self._plans = {}
        self._tokens = []
        self._handles = []
        self.in_process = in_process and world_size == len(self.devices) > 1
        with _compat.init_scope():
            addresses = []
            for i, device in enumerate(self.devices):
                with tf.device(device):
                    self._tokens.append(_compat.ResourceVariable(0.0, trainable=False))
                handle, address = self._ops.tfdist_ucx_create(
                    rank=first_rank + i, world_size=world_size,
                    timeout_seconds=float(timeout_seconds or 0.0),
                    segment_bytes=int(segment_bytes), spin_us=int(spin_us),
                    shared_output_bytes=int(shared_output_bytes), rehearsal=not wire)
                self._handles.append(int(handle))
                addresses.append(address.numpy())
            if not wire:
                self.on_host = False
                self._op_handles = ucx_slots.take_over(self._ops, slot_key, world_size,
                                                       first_rank, self._handles)
                return
            everyone = self._exchange(addresses)
            for handle in self._handles:
                self._ops.tfdist_ucx_connect(handle, tf.constant(everyone))
            if self.in_process:
                self._ops.tfdist_ucx_join_local(tf.constant(self._handles, tf.int64),
                                                timeout_seconds=float(timeout_seconds or 0.0))
            self.on_host = (world_size > 1 and not self.in_process
                            and ucx_host.join(self._ops, self._handles, self._exchange,
                                              shared_memory, len(self.devices), self.first_rank))
            self._op_handles = (list(self._handles) if slot_key is None else
                                ucx_slots.take_over(self._ops, slot_key, world_size,
                                                    first_rank, self._handles))

    def close(self):
        """Destroys this engine's communicators (their threads and shared memory) and
        empties the handle slots that address them; `engine_for` makes a new
        engine for its name. For an engine no op will run on again, such as an
        elastic job's earlier generation once the next one is made."""
        with _engines_lock:
            if _engines.get(self.name) is self:
                del _engines[self.name]
        with _compat.init_scope(), tf.device("/cpu:0"):
            ucx_slots.release(self._ops, self._handles)
            for handle in self._handles:
                self._ops.tfdist_ucx_destroy(handle)
        self._handles = []

    def shared_result_bytes(self):
        """Bytes of this machine's shared-memory results that some rank still holds.

        Results that fit in `shared_output_bytes` live there until every rank's
        tensor is freed; 0 when the ranks do not sum through shared memory.
        """
        with tf.device("/cpu:0"):
            return int(self._ops.tfdist_ucx_shared_result_bytes(self._handles[0]))

    def _exchange(self, mine, topic="address"):
        """Every rank's bytes for `topic`, in rank order (KV store across workers); the
        wait stops when `ucx_aborts.abort` fails this engine meanwhile (a dead peer
        never sends)."""
        if len(mine) == self.world_size:
            return list(mine)
        return coordination.exchange_ranks(
            f"tfdist_ext/ucx/{self.name}/{topic}", mine, self.first_rank, self.world_size,
            self._kv, _RENDEZVOUS_SECONDS,
            lambda: ucx_aborts.failed_since(self._born))

    def _plan(self, kind, algorithm, rank, n):
        key = (kind, algorithm, rank, n)
        if key not in self._plans:
            if kind == "all_reduce":
                verify.before_use(algorithm, self.world_size)
                sched = schedule_fn(algorithm)(self.world_size, rank, n)
            elif kind == "all_gather":
                sched = gather.all_gather_schedule(self.world_size, rank, n)
            elif kind == "reduce_scatter":
                sched = gather.reduce_scatter_schedule(self.world_size, rank, n)
            else:
                sched = gather.broadcast_schedule(self.world_size, rank, n, root=algorithm)
            self._plans[key] = encode(sched)
        return self._plans[key]

    def _check(self, flat, static=True):
        n = flat.shape.num_elements()
        if flat.shape.rank != 1 or (static and n is None):
            length = " of static length" if static else ""
            raise ValueError(f"Argument `flat` must be a 1-D tensor{length}; "
                             f"received shape {flat.shape}.")
        if flat.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"The UCX engine supports dtypes {[d.name for d in SUPPORTED_DTYPES]}; "
                f"received {flat.dtype.name}.")
        return n

    def _run(self, flat, local_index, plan, label, in_process=False, host_sum=False):
        with tf.device(self.devices[local_index]):
            return self._ops.tfdist_ucx_run(
                flat, self._tokens[local_index].handle, handle=self._op_handles[local_index],
                plan=plan, label=label, in_process=in_process, host_sum=host_sum)

    def _sums_in_process(self, algorithm):
        # A registered all-reduce (a name); a schedule object such as gossip's
        # exchange is not a sum and always runs as written.
        return self.in_process and isinstance(algorithm, str)

    def _sums_on_host(self, algorithm, flat):
        return isinstance(algorithm, str) and self._host_sum_fits(flat)

    def _host_sum_fits(self, flat):
        # Big enough to beat the schedules where every rank is a process of this machine;
        # the op runs its plan where they are not (decided per communicator at run time,
        # so a function traced for one generation runs on the next: `ucx_slots`).
        nbytes = flat.shape.num_elements() * flat.dtype.size
        return self.world_size > 1 and not self.in_process and nbytes >= HOST_SUM_MIN_BYTES

    def all_reduce(self, flat, local_index, algorithm, label=None):
        """Sums the 1-D `flat` over all ranks with `algorithm`'s schedule.

        Call for every local replica, on every worker, in the same order.
        `algorithm` may also be a `Schedule`-returning object (run as written).
        """
        n = self._check(flat)
        if self.world_size == 1 or n == 0:
            return flat
        rank = self.first_rank + local_index
        label = label or f"tfdist/{algorithm}"
        if self._sums_in_process(algorithm):
            return self._run(flat, local_index, [0], label, in_process=True)
        plan = self._plan("all_reduce", algorithm, rank, n)
        return self._run(flat, local_index, plan, label,
                         host_sum=self._sums_on_host(algorithm, flat))

    def all_gather(self, flat, local_index, label="tfdist/allgather"):
        """Concatenates every rank's 1-D `flat` (equal lengths) in rank order."""
        n = self._check(flat)
        if self.world_size == 1:
            return flat
        rank = self.first_rank + local_index
        padded = tf.concat([tf.zeros([rank * n], flat.dtype), flat,
                            tf.zeros([(self.world_size - rank - 1) * n], flat.dtype)], 0)
        if n == 0:
            return padded
        return self._run(padded, local_index,
                         self._plan("all_gather", None, rank, n), label)

    def all_gather_v(self, flat, local_index, label="tfdist/allgatherv", counts=None):
        """Concatenates every rank's 1-D `flat` in rank order; the lengths may differ
        and be unknown when traced.

        Args:
            counts: Every rank's length (int64, the same on every rank), when
                known; else one small all-gather of the lengths runs first.
        """
        self._check(flat, static=False)
        if self.world_size == 1:
            return flat
        if counts is None:
            counts = self.all_gather(tf.size(flat, out_type=tf.int64)[None], local_index,
                                     label + "/counts")
        with tf.device(self.devices[local_index]):
            return self._ops.tfdist_ucx_all_gather_v(
                flat, counts, self._tokens[local_index].handle,
                handle=self._op_handles[local_index], label=label)

    def reduce_scatter(self, flat, local_index, label="tfdist/reducescatter"):
        """This rank's block of the sum of every rank's 1-D `flat` (world_size equal blocks).

        Rank r gets block r (elements [r n, (r + 1) n) of the sum, n =
        len(flat) / world_size); each rank sends (world_size - 1) n elements
        (a ring), or, where every rank is a process of this machine and the
        buffer is large enough, the sum goes through shared memory as an
        all-reduce's does.
        """
        total = self._check(flat)
        if total % self.world_size:
            raise ValueError(f"Argument `flat` must hold world_size={self.world_size} equal "
                             f"blocks; received {total} elements. Pad it to a multiple.")
        n = total // self.world_size
        if self.world_size == 1 or n == 0:
            return flat
        rank = self.first_rank + local_index
        # Shared memory, where it is on, sums the whole buffer: faster than the ring.
        summed = self._run(flat, local_index, self._plan("reduce_scatter", None, rank, n),
                           label, host_sum=self._host_sum_fits(flat))
        return summed[rank * n:(rank + 1) * n]

    def broadcast(self, flat, local_index, root=0, label="tfdist/broadcast"):
        """Every rank gets rank `root`'s 1-D `flat`."""
        n = self._check(flat)
        if self.world_size == 1 or n == 0:
            return flat
        rank = self.first_rank + local_index
        return self._run(flat, local_index, self._plan("broadcast", root, rank, n), label)

    def start(self, flat, local_index, algorithm, label=None, keep_input=False):
        """Starts `all_reduce`; returns a ticket for `wait` (any later step).

        Args:
            keep_input: Also keep `flat` for ``wait(..., with_input=True)``
                (the reduction then runs out of place).
        """
        n = self._check(flat)
        rank = self.first_rank + local_index
        in_process = self._sums_in_process(algorithm) and n > 0
        host_sum = self._sums_on_host(algorithm, flat) and n > 0
        plan = ([0] if self.world_size == 1 or n == 0 or in_process
                else self._plan("all_reduce", algorithm, rank, n))
        with tf.device(self.devices[local_index]):
            return self._ops.tfdist_ucx_start(
                flat, self._tokens[local_index].handle, handle=self._op_handles[local_index],
                plan=plan, label=label or f"tfdist/{algorithm}", keep_input=keep_input,
                in_process=in_process, host_sum=host_sum)

    def wait(self, ticket, local_index, num_elements, dtype, with_input=False):
        """The result of the collective `ticket` (each ticket is awaited once).

        With `with_input`, returns ``(result, input)``: the started tensor too
        (the ticket must come from ``start(..., keep_input=True)``).
        """
        with tf.device(self.devices[local_index]):
            result, kept = self._ops.tfdist_ucx_wait(
                ticket, self._tokens[local_index].handle, T=dtype,
                num_elements=num_elements, with_input=with_input)
        return (result, kept) if with_input else result

    def finished(self, tickets):
        """Bool per ticket: its collective finished (or was already awaited); no waiting."""
        return self._ops.tfdist_ucx_finished(tickets)

