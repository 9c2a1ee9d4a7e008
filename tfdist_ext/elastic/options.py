"""`Strategy(elastic=...)`: the options of training that goes on after a worker dies."""

import dataclasses
import math
import os
from typing import Optional

# TFDIST_ELASTIC, the launcher's wait before it starts a replacement and the file a
# replacement creates once in the job, here for the workers; `tfdist-run` reads them
# from `launch.elastic_env`, free of TensorFlow.
from tfdist_ext.launch.elastic_env import (  # pylint: disable=unused-import
    MEMBER_FILE, REPLACEMENT_DELAY_SECONDS, VARIABLE)


@dataclasses.dataclass(frozen=True)
class Elastic:
    """Synchronous training that continues on the surviving workers.

    When a worker dies (its process killed, its host gone), the step that was
    running is lost: each survivor discards it, the survivors agree on who is
    left, build new communicators among themselves, take the lowest-ranked
    survivor's weights and optimizer state, and `fit` goes on without a
    restart, each survivor on its own shard of the data with the same
    per-replica batch (the global batch shrinks with the job). See
    `tfdist_ext.elastic.recovery`.

    Args:
        min_workers: Fewest workers to go on with; below it every survivor
            stops with an error naming the missing workers. Set it to the
            smallest job that still trains well, and to more than half the
            workers where a network partition could leave two halves that
            each think the other died (each would go on alone).
        recover_seconds: How long survivors wait for each other while they
            agree on the new membership (a survivor notices a death within
            about a second; raise it on slow links).
        join_seconds: How long a replacement worker (started again with the
            dead one's TF_CONFIG) waits to be taken in; the members admit it
            after their next step, so raise it only for steps that take
            minutes.
        straggler_factor: Off (None) by default. A number F > 1: a worker whose
            busy time per step is at least F times the other members' median for
            `straggler_steps` steps in a row leaves the job
            (`tfdist_ext.elastic.stragglers`); 3 is a good start.
        straggler_steps: K, the steps in a row (>= 1) that make a straggler;
            larger ignores longer hiccups.
    """

    min_workers: int = 1
    recover_seconds: float = 60.0
    join_seconds: float = 300.0
    straggler_factor: Optional[float] = None
    straggler_steps: int = 20

    def __post_init__(self):
        if (isinstance(self.min_workers, bool) or not isinstance(self.min_workers, int)
                or self.min_workers < 1):
            raise ValueError(f"`min_workers` of Elastic must be an integer >= 1; received "
                             f"{self.min_workers!r}.")
        for name in ("recover_seconds", "join_seconds"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"`{name}` of Elastic must be a finite number > 0; "
                                 f"received {value!r}.")
        factor = self.straggler_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not math.isfinite(factor) or factor <= 1):
            raise ValueError(f"`straggler_factor` of Elastic must be None (off) or a finite "
                             f"number > 1, e.g. 3; received {factor!r}.")
        steps = self.straggler_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"`straggler_steps` of Elastic must be an integer >= 1; "
                             f"received {steps!r}.")

    def check(self, config, spec=None):
        """Raises ValueError unless the strategy's other choices can run elastically.

        Args:
            config: The strategy's `StrategyConfig`.
            spec: The job's `cluster.ClusterSpec` from TF_CONFIG, if any.
        """
        from tfdist_ext.collectives import engines  # pylint: disable=import-outside-toplevel
        from tfdist_ext.ops import ucx as ucx_ops  # pylint: disable=import-outside-toplevel

        problems = []
        if config.engine != "ucx":
            unavailable = ucx_ops.problem()
            problems.append(f"engine={config.engine!r} (needs 'ucx', whose communicators "
                            "can be rebuilt" + (f"; the UCX engine is unavailable: {unavailable}"
                                                if unavailable else "") + ")")
        names = set(config.allreduce.algorithms)
        if names & {"auto", "native", "hierarchical"} or config.allreduce.hosts is not None:
            problems.append(f"allreduce={config.allreduce} (needs a fixed algorithm such as "
                            f"'{engines.default_algorithm('ucx')}')")
        problems += config.plain_reduction_problems()
        if config.zero_stage:
            problems.append(f"zero_stage={config.zero_stage} (needs 0: the shards of a dead "
                            "worker's optimizer state would be lost)")
        if spec is not None and set(spec.without_servers().jobs) != {"worker"}:
            problems.append(f"a TF_CONFIG cluster with jobs {sorted(spec.jobs)} (needs "
                            "'worker' tasks only: name the chief worker 0, as tfdist-run "
                            "does)")
        if problems:
            raise ValueError("Argument `elastic` cannot be combined with " + "; ".join(problems)
                             + ". Drop those arguments, or pass elastic=False.")


def get(value, environ=os.environ):
    """An `Elastic` for `Strategy(elastic=value)`, or None when it is off.

    Args:
        value: False (off), True (defaults), a dict of `Elastic`'s arguments,
            an `Elastic`, or None: True when the environment variable
            TFDIST_ELASTIC is "1" (`tfdist-run --elastic`), else off.
        environ: Where TFDIST_ELASTIC is read.

    Raises:
        ValueError: Anything else, or invalid options (naming them).
    """
    if value is None:
        flag = environ.get(VARIABLE, "")
        if flag not in ("", "0", "1"):
            raise ValueError(f"Environment variable {VARIABLE}={flag!r} must be '1' (elastic "
                             "training) or '0'.")
        value = flag == "1"
    if value is False:
        return None
    if value is True:
        return Elastic()
    if isinstance(value, Elastic):
        return value
    if isinstance(value, dict):
        fields = {f.name for f in dataclasses.fields(Elastic)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"Argument `elastic` has unknown option(s) {unknown}; valid: "
                             f"{sorted(fields)}.")
        return Elastic(**value)
    raise ValueError(f"Argument `elastic` must be True, False, a dict of options "
                     f"({', '.join(f.name for f in dataclasses.fields(Elastic))}) or "
                     f"tfdist_ext.elastic.Elastic; "
                     f"received {value!r}.")


def for_strategy(value, config, spec=None, environ=os.environ):
    """`get(value)` checked against the strategy's other choices (`Elastic.check`).

    Args:
        value: `Strategy(elastic=...)`.
        config: The strategy's `StrategyConfig`.
        spec: The job's `cluster.ClusterSpec` from TF_CONFIG, if any.
        environ: Where TFDIST_ELASTIC is read.

    Raises:
        ValueError: As `get` and `Elastic.check`; when elastic training came from the
            environment, the message says so.
    """
    options = get(value, environ)
    if options is None:
        return None
    try:
        options.check(config, spec)
    except ValueError as err:
        if value is not None:
            raise
        raise ValueError(f"{err} (elastic training is on because the environment has "
                         f"{VARIABLE}=1, e.g. from `tfdist-run --elastic`.)") from None
    return options
