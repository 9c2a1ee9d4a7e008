"""The `engine=` option of `tfdist_ext.Strategy`: what carries the bytes.

    * ``"ucx"``: tfdist_ext's schedules run in one C++ op per collective over
      UCX (`ucx_engine.py`): shared memory within a host, TCP or RDMA across
      hosts. Needs the `libucx-cu12` wheel when tfdist_ext is built.
    * ``"tf"``: the same schedules built from TF's collective ops over gRPC
      (`engine.py`), portable but with TF's executor cost on every message.
    * ``"auto"`` (the default): "ucx" where its library is built for the
      running TensorFlow, else "tf" with a warning that says what to install.

Independent of the algorithm: ``allreduce="native"`` always means TF's own
CollectiveReduceV2 ring, whatever the engine.

`Engines` makes the engine objects a strategy's `CrossDeviceOps` runs its
schedules on.
"""

import threading
import warnings

from tfdist_ext.collectives import engine as graph_engine
from tfdist_ext.collectives import ucx_aborts, ucx_engine
from tfdist_ext.ops import ucx as ucx_ops

ENGINES = ("auto", "ucx", "tf")


def resolve(engine) -> str:
    """"ucx" or "tf" for an `engine=` value (None means "auto").

    Only reads build stamps: it never loads the library or starts TF's runtime.

    Raises:
        ValueError: an unknown name, naming the valid ones.
        UcxUnavailableError: "ucx" was asked for and cannot be used.
    """
    if engine is None:
        engine = "auto"
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"Argument `engine` must be one of {', '.join(map(repr, ENGINES))}; received "
            f"{engine!r}. 'ucx' runs tfdist_ext's collectives over UCX, 'tf' over TF's "
            "collective ops, 'auto' takes 'ucx' where it is installed.")
    if engine == "tf":
        return "tf"
    problem = ucx_ops.problem()
    if problem is None:
        return "ucx"
    if engine == "ucx":
        raise ucx_ops.UcxUnavailableError(
            f"Argument `engine='ucx'`: {problem} Or pass engine='tf' to use TF's collectives.")
    warnings.warn(f"tfdist_ext: {problem} Using TF's collectives (engine='tf') instead.",
                  stacklevel=3)
    return "tf"


def default_algorithm(engine: str) -> str:
    """The algorithm used when `allreduce=` is not given."""
    return "ring" if engine == "ucx" else "native"


class Engines:
    """The engines of one `CrossDeviceOps`: its main one (made once) and others on demand.

    Args:
        engine: "ucx" or "tf" (`resolve`).
        devices: This worker's local devices, one per local replica.
        world_size: Replicas in sync across all workers.
        first_rank: Global rank of local replica 0.
        pair_group_key_base: The graph engine's first pair group key (see
            `engine.GraphEngine`).
        ucx_timeout_seconds: The UCX engine's collective timeout
            (`AllReduce.timeout_seconds`).
        graph_timeout_seconds: The graph engine's collective timeout (the
            strategy's `CommunicationOptions`), or None.
        role: The main engine's role (see `new`).
        kv: Where the UCX engine's ranks meet to wire up (`UcxEngine`'s `kv`).
        generation: An elastic job's membership count (None: not elastic): each
            generation's UCX communicators are new, and its ops run on the
            handle slots of the earlier generations' (`UcxEngine`'s `slot_key`).
        wire: False: the UCX engines are not wired up, for a rehearsal
            (`UcxEngine`'s `wire`).
    """

    def __init__(self, engine, devices, world_size, first_rank, pair_group_key_base, *,
                 ucx_timeout_seconds, graph_timeout_seconds, role="main", kv=None,
                 generation=None, wire=True):
        self.kv = kv
        self.wire = wire
        self.generation = generation
        self.engine = engine
        self.devices = devices
        self.world_size = world_size
        self.first_rank = first_rank
        self.pair_group_key_base = pair_group_key_base
        self.ucx_timeout_seconds = ucx_timeout_seconds
        self.graph_timeout_seconds = graph_timeout_seconds
        self.role = role
        self._main = None
        self._made = []  # UCX engines, for `close`
        self._born = ucx_aborts.count()  # later aborts stop this generation's wire-ups
        self._lock = threading.Lock()

    def check(self, allreduce):
        """Raises unless the graph engine, if it is the engine, can run `allreduce`.

        Raises:
            ValueError: No `pair_group_key_base`, or a world size the graph
                engine does not support.
        """
        if self.engine != "tf":
            return
        if self.pair_group_key_base is None:
            raise ValueError("Argument `pair_group_key_base` is required when the "
                             f"all-reduce configuration {allreduce} uses the "
                             "graph engine.")
        graph_engine.check_world_size(self.world_size)

    def main(self):
        """The engine that runs the strategy's schedules, made on first use."""
        with self._lock:  # eager reductions run one thread per replica
            if self._main is None:
                self._main = self.new(role=self.role)
        return self._main

    def new(self, first_instance_key=0, role="main"):
        """An engine for collectives that must not interleave with another engine's.

        Args:
            first_instance_key: The graph engine's instance-key range (see
                `engine.GraphEngine`); engines sharing pair groups need
                disjoint ones.
            role: The UCX engine's communicators: one set per role and
                topology in a process, shared by the strategies that use it
                (their collectives never run at the same time).
        """
        if self.engine == "ucx":
            # The same on every worker: it names the rendezvous keys. Strategies
            # with another timeout get their own communicators.
            timeout = self.ucx_timeout_seconds
            name = (f"{role}{first_instance_key or ''}-{self.world_size}x{len(self.devices)}"
                    f"-t{timeout:g}")
            rendezvous = name if self.generation is None else f"{name}-g{self.generation}"
            made = ucx_engine.engine_for(rendezvous, self.devices, self.world_size,
                                         self.first_rank, slot_key=name,
                                         timeout_seconds=timeout, kv=self.kv,
                                         born=self._born, wire=self.wire)
            self._made.append(made)
            return made
        return graph_engine.GraphEngine(
            self.devices, self.world_size, self.first_rank, self.pair_group_key_base,
            timeout_seconds=self.graph_timeout_seconds, first_instance_key=first_instance_key)

    def close(self):
        """Destroys the UCX communicators of an elastic generation's engines
        (`UcxEngine.close`) once the next generation's engines replace them;
        a job that is not elastic keeps its engines for the process's life."""
        if self.generation is None and self.wire:
            return
        with self._lock:
            made, self._made, self._main = self._made, [], None
        for engine in dict.fromkeys(made):
            engine.close()
