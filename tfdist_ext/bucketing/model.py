"""The timing model every bucketing planner optimises (pure functions, no TensorFlow).

Gradients are numbered in BACKWARD order: index 0 is the last layer's gradient,
the first one backprop produces. Layer i's backward takes `backward_times[i]`
seconds and the layers run one after another, so gradient i is ready at

    ready[i] = backward_times[0] + ... + backward_times[i]

A bucket (a tuple of consecutive indices) is sent as one message. It may start
when its last gradient is ready AND the previous bucket's message has finished
(one communication channel); it takes ``alpha + beta * bucket_bytes``:

    backward  |--g0--|--g1--|--g2--|--g3--|
    comm             |=b0(g0)=|     |===b1(g1,g2,g3)===|
                     ^ready[0]             ^ready[3]  ^ finish

The iteration ends when the last message finishes (never before the backward
pass: the last bucket waits for the last gradient). The model ignores the
forward pass and the optimizer update, which no bucketing changes.
"""

import math
import numbers
from typing import List, Optional, Sequence, Tuple

Bucket = Tuple[int, ...]
Plan = Tuple[Bucket, ...]


def _check_values(argument: str, values, what: str) -> List:
    values = list(values)
    for i, value in enumerate(values):
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(value) or value < 0):
            raise ValueError(
                f"Argument `{argument}` must hold finite {what} >= 0; entry {i} is "
                f"{value!r}.")
    return values


def _check_scalar(argument: str, value, unit: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value < 0):
        raise ValueError(
            f"Argument `{argument}` must be a finite number of {unit} >= 0; received "
            f"{value!r}.")
    return float(value)


def check_inputs(sizes, backward_times, alpha, beta):
    """Validates a planner's inputs; returns them as (list, list, float, float).

    Args:
        sizes: Gradient sizes in bytes, backward order.
        backward_times: Seconds of each layer's backward, same order and length
            as `sizes`; None means unknown (every gradient ready at time 0).
        alpha: Seconds per message.
        beta: Seconds per byte.

    Raises:
        ValueError: naming the argument, the value received and what is allowed.
    """
    sizes = _check_values("sizes", sizes, "byte counts")
    if backward_times is None:
        backward_times = [0.0] * len(sizes)
    backward_times = _check_values("backward_times", backward_times, "seconds")
    if len(backward_times) != len(sizes):
        raise ValueError(
            f"Argument `backward_times` has {len(backward_times)} entries but there are "
            f"{len(sizes)} gradients; pass one backward time per gradient, in the "
            "same (backward) order as `sizes`.")
    return (sizes, backward_times, _check_scalar("alpha", alpha, "seconds per message"),
            _check_scalar("beta", beta, "seconds per byte"))


def ready_times(backward_times: Sequence[float]) -> List[float]:
    """ready[i]: when gradient i exists (prefix sums of `backward_times`)."""
    ready, now = [], 0.0
    for t in backward_times:
        now += t
        ready.append(now)
    return ready


def check_plan(buckets: Sequence[Sequence[int]], num_gradients: int) -> Plan:
    """Validates that `buckets` cover 0..num_gradients-1 in order, each consecutive."""
    buckets = tuple(tuple(int(i) for i in b) for b in buckets)
    flat = [i for b in buckets for i in b]
    if flat != list(range(num_gradients)) or any(not b for b in buckets):
        raise ValueError(
            f"Argument `buckets` must split the gradient indices 0..{num_gradients - 1} "
            f"into non-empty runs of consecutive indices, in order; received {buckets!r}.")
    return buckets


def schedule(buckets, sizes, backward_times, alpha, beta) -> List[Tuple[float, float]]:
    """(start, end) seconds of each bucket's communication under the model."""
    sizes, backward_times, alpha, beta = check_inputs(sizes, backward_times, alpha, beta)
    buckets = check_plan(buckets, len(sizes))
    ready = ready_times(backward_times)
    times, channel_free = [], 0.0
    for bucket in buckets:
        start = max(ready[bucket[-1]], channel_free)
        channel_free = start + alpha + beta * sum(sizes[i] for i in bucket)
        times.append((start, channel_free))
    return times


def modelled_time(buckets, sizes, backward_times, alpha, beta) -> float:
    """Modelled seconds from the start of backprop to the end of the last reduction.

    Args:
        buckets: Tuple of buckets, each a tuple of consecutive gradient indices.
        sizes: Gradient sizes in bytes, backward order.
        backward_times: Per-layer backward seconds (same order), or None (all 0).
        alpha: Seconds per message.
        beta: Seconds per byte.

    Returns:
        ``max(end of backward, end of the last message)``; 0.0 with no gradients.
    """
    times = schedule(buckets, sizes, backward_times, alpha, beta)
    end_of_backward = sum(backward_times) if backward_times is not None else 0.0
    return max([end_of_backward] + [end for _, end in times])


def single_bucket(sizes: Sequence[float]) -> Plan:
    """The plan of `bucketing=None`: every gradient in one bucket (() if there are none)."""
    n = len(list(sizes))
    return (tuple(range(n)),) if n else ()


def plan_buckets(planner: Optional[object], sizes, backward_times=None, alpha=0.0,
                 beta=0.0) -> Plan:
    """`planner.plan(...)`, or `single_bucket(sizes)` when `planner` is None."""
    if planner is None:
        sizes, _, _, _ = check_inputs(sizes, backward_times, alpha, beta)
        return single_bucket(sizes)
    return planner.plan(sizes, backward_times, alpha, beta)
