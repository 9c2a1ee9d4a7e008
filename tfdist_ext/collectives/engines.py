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
"""

import warnings

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
