"""The strategy's gradient buckets: a planner's inputs completed, its plan and its summary.

`CrossDeviceOps` plans the buckets of each dtype's gradients when the
gradient all-reduce is traced. What it knows then: the gradient sizes in
backward order, the link constants of the algorithm chosen for their total,
backward times (the planner's own, or profiled by
`tfdist_ext.keras.backward_profile.BackwardProfile`) and a plan chosen by tuning
(`MGWFBP.tune`). `GradientBuckets` keeps that knowledge for one
`CrossDeviceOps`; the functions it calls turn it into buckets, and all but
`record_ready_times` are pure.
"""

from typing import Callable, Optional, Sequence, Tuple

import tensorflow as tf

from tfdist_ext.bucketing.model import plan_buckets


def needs_backward_profile(planner, profiled_times: Optional[Sequence[float]]) -> bool:
    """Whether `planner` wants per-gradient backward times nobody has supplied."""
    return (getattr(planner, "uses_backward_times", False) and profiled_times is None
            and getattr(planner, "backward_times", None) is None)


def backward_times_for(planner, num_gradients: int, itemsize: int,
                       profiled_times: Optional[Sequence[float]]):
    """The backward times to plan with: the planner's, else the profiled ones, else None.

    Profiled times of another number of gradients (another dtype's split)
    are dropped: the plan is then made without times.

    Raises:
        ValueError: The planner's own `backward_times` do not match the
            number of gradients.
    """
    times = getattr(planner, "backward_times", None)
    if times is not None and len(times) != num_gradients:
        raise ValueError(
            f"Argument `backward_times` of {type(planner).__name__} has {len(times)} "
            f"entries but the model has {num_gradients} gradients to reduce (of "
            f"{itemsize}-byte elements); pass one time per gradient tensor, in backward "
            "order, or None to profile them.")
    if times is None:
        times = profiled_times
        if times is not None and len(times) != num_gradients:
            times = None
    return times


def plan_gradient_buckets(planner, sizes: Sequence[int], itemsize: int, alpha: float,
                          beta: float, profiled_times: Optional[Sequence[float]] = None,
                          override: Optional[Sequence[Sequence[int]]] = None):
    """Buckets (lists of gradient indices, backward order) of one dtype's gradients.

    Args:
        planner: The strategy's `bucketing.Planner`.
        sizes: Bytes of each gradient, in backward order.
        itemsize: Bytes per element (for the error message).
        alpha: Seconds per message of the chosen algorithm.
        beta: Seconds per byte of the chosen algorithm.
        profiled_times: Backward times measured by `BackwardProfile`, or None.
        override: A plan chosen by tuning; used when it covers every gradient.
    """
    times = backward_times_for(planner, len(sizes), itemsize, profiled_times)
    buckets = plan_buckets(planner, sizes, times, alpha, beta)
    if override is not None and sum(map(len, override)) == len(sizes):
        buckets = override
    return buckets


def describe(buckets, sizes: Sequence[int], algorithm_for: Callable[[int], str]) -> Tuple:
    """Each bucket's "bytes", "gradients" and "algorithm" (`algorithm_for(bytes)`)."""
    return tuple(
        {"bytes": sum(sizes[i] for i in bucket), "gradients": len(bucket),
         "algorithm": algorithm_for(sum(sizes[i] for i in bucket))}
        for bucket in buckets)


def record_ready_times(tensors, state):
    """Stamps when each gradient exists (replica 0), accumulated in `state`.

    Timestamps are stateful, so automatic control dependencies run them in
    program order: they are created in backward order (the order backprop
    produces the gradients) so that none waits for a later gradient. The
    reduction does not wait for the record (stateful ops are never pruned).

    Returns:
        `tensors`, unchanged.
    """
    stamps = []
    for t in tensors[::-1]:
        with tf.control_dependencies([t]):
            stamps.append(tf.timestamp())
    state.record_ready(tf.stack(stamps[::-1]))
    return tensors


class GradientBuckets:
    """The bucketing state of one `CrossDeviceOps`, and its planning at trace time.

    Args:
        planner: The strategy's `bucketing.Planner` (None: one bucket).
        choice: The strategy's `collectives.choice.AlgorithmChoice` (the
            algorithm and link constants of each size).

    Attributes:
        backward_times: Profiled backward time of each gradient, backward
            order (`use_backward_times`), or None.
        plan_override: Buckets chosen by tuning (`MGWFBP.tune`; `use_plan`), or None.
        plan_inputs: (sizes, alpha, beta) of the last plan.
        bucket_plan: The buckets of the last traced gradient reduction
            ("bytes", "gradients", "algorithm" each).
    """

    def __init__(self, planner, choice):
        self.planner = planner
        self.choice = choice
        self.backward_times = None
        self.plan_override = None
        self.plan_inputs = None
        self.bucket_plan = ()

    def use_backward_times(self, times: Sequence[float]) -> None:
        """Plans with `times` (seconds per gradient, backward order) from now on:
        `tfdist_ext.keras.backward_profile.BackwardProfile` measured them."""
        self.backward_times = tuple(times)

    def use_plan(self, plan) -> None:
        """Uses `plan` (buckets of gradient indices, backward order) for the next
        traces instead of planning; None plans again. Retrace to apply."""
        self.plan_override = plan

    def needs_backward_profile(self) -> bool:
        """Whether the planner wants per-gradient backward times nobody has supplied."""
        return needs_backward_profile(self.planner, self.backward_times)

    def plan(self, sizes: Sequence[int], itemsize: int):
        """Buckets (backward order) of one dtype's gradients; remembers the plan."""
        algorithm = self.choice.select(sum(sizes), itemsize, refine=False)
        alpha, beta = self.choice.link_constants(algorithm)
        self.plan_inputs = (tuple(sizes), alpha, beta)
        buckets = plan_gradient_buckets(self.planner, sizes, itemsize, alpha, beta,
                                        self.backward_times, self.plan_override)
        self.bucket_plan = describe(buckets, sizes,
                                    lambda num_bytes: self.choice.select(num_bytes, itemsize))
        return buckets
