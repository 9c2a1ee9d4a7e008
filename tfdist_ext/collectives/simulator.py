"""A numpy engine for schedules: runs every rank's schedule and checks the result.

`simulate` executes the schedules of all ranks in lock-step on numpy buffers,
with exactly the semantics of `schedule.py` (Sends read the buffer as it was at
the start of the round, Recvs are applied afterwards in order). Before moving
any data it checks the schedules against the contract with `validate`, so a
broken algorithm fails with a message naming the round, the ranks and the step.

`check_allreduce` is the test oracle: random inputs, a float64/int64 numpy
reference, and a check that all ranks end with BIT-IDENTICAL buffers, for
float dtypes too (the TF engines rely on replicas staying identical).

Example:
    >>> outs = simulate("ring", 3, [np.arange(4.0)] * 3)
    >>> outs[0]
    array([0., 3., 6., 9.])
"""

import collections
from collections.abc import Sequence

import numpy as np

from tfdist_ext.collectives.schedule import (
    Recv,
    Schedule,
    ScheduleError,
    Send,
    all_schedules,
)


def validate(schedules: Sequence[Schedule]) -> None:
    """Checks the schedules of all ranks (in rank order) against the contract.

    Raises:
        ScheduleError: wrong rank/world_size/num_elements fields, different
            round counts, a bad peer, an empty or out-of-range range, or a
            Recv without a matching Send of the same length in the same round
            (or the reverse).
    """
    p = len(schedules)
    n = schedules[0].num_elements if p else 0
    for r, s in enumerate(schedules):
        if (s.rank, s.world_size, s.num_elements) != (r, p, n):
            raise ScheduleError(
                f"Schedule {r} of {p} has rank={s.rank}, world_size="
                f"{s.world_size}, num_elements={s.num_elements}; expected "
                f"rank={r}, world_size={p}, num_elements={n}.")
        if len(s.rounds) != len(schedules[0].rounds):
            raise ScheduleError(
                f"Rank {r} has {len(s.rounds)} rounds but rank 0 has "
                f"{len(schedules[0].rounds)}; every rank needs the same number "
                f"of rounds (use empty rounds () for idle ranks).")
    for i in range(len(schedules[0].rounds) if p else 0):
        sends = collections.defaultdict(collections.deque)  # (src, dst) -> Sends
        for r, s in enumerate(schedules):
            for step in s.rounds[i]:
                _check_step(i, r, step, p, n)
                if isinstance(step, Send):
                    sends[(r, step.peer)].append(step)
        for r, s in enumerate(schedules):
            for step in s.rounds[i]:
                if isinstance(step, Recv):
                    _match(i, r, step, sends[(step.peer, r)])
        for (src, dst), left in sends.items():
            if left:
                raise ScheduleError(
                    f"Round {i}: rank {src} sends {_len(left[0])} elements to "
                    f"rank {dst} ({left[0]}) but rank {dst} has no matching "
                    f"Recv from rank {src} in that round.")


def _len(step) -> int:
    return step.stop - step.start


def _check_step(i: int, r: int, step, p: int, n: int) -> None:
    if not isinstance(step, (Send, Recv)):
        raise ScheduleError(f"Round {i}: rank {r} has {step!r}, not a Send or Recv.")
    if not (0 <= step.peer < p) or step.peer == r:
        raise ScheduleError(
            f"Round {i}: rank {r} has {step} whose peer must be another rank "
            f"in [0, {p}).")
    if not 0 <= step.start < step.stop <= n:
        raise ScheduleError(
            f"Round {i}: rank {r} has {step} whose range must be non-empty and "
            f"within [0, {n}); omit empty steps on both sides.")


def _match(i: int, r: int, step: Recv, queue: collections.deque) -> None:
    if not queue:
        raise ScheduleError(
            f"Round {i}: rank {r} expects {_len(step)} elements from rank "
            f"{step.peer} ({step}) but rank {step.peer} sends rank {r} no "
            f"(further) data in that round.")
    sent = queue.popleft()
    if _len(sent) != _len(step):
        raise ScheduleError(
            f"Round {i}: rank {r} expects {_len(step)} elements from rank "
            f"{step.peer} ({step}) but the matching {sent} has {_len(sent)}.")


def simulate(algorithm, world_size: int,
             inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Runs an all-reduce schedule for all ranks on numpy buffers.

    Args:
        algorithm: A registered name (``"ring"``), dict, configuration object,
            or a function ``(world_size, rank, num_elements) -> Schedule``.
        world_size: Number of ranks.
        inputs: One 1-D array per rank, same length and dtype; not modified.

    Returns:
        The final buffer of each rank, in rank order.

    Raises:
        ValueError: inputs that do not fit `world_size`.
        ScheduleError: schedules that break the contract (see `validate`).
    """
    if len(inputs) != world_size:
        raise ValueError(
            f"Argument `inputs` must hold one array per rank ({world_size}); "
            f"received {len(inputs)}.")
    bufs = [np.array(x, copy=True) for x in inputs]
    if any(b.ndim != 1 or b.shape != bufs[0].shape or b.dtype != bufs[0].dtype
           for b in bufs):
        raise ValueError(
            f"Argument `inputs` must be 1-D arrays of one shape and dtype; "
            f"received {[(b.shape, str(b.dtype)) for b in bufs]}.")
    schedules = all_schedules(algorithm, world_size, bufs[0].size)
    validate(schedules)
    for i in range(len(schedules[0].rounds)):
        messages = collections.defaultdict(collections.deque)
        for r, s in enumerate(schedules):
            for step in s.rounds[i]:
                if isinstance(step, Send):
                    messages[(r, step.peer)].append(bufs[r][step.start:step.stop].copy())
        for r, s in enumerate(schedules):
            for step in s.rounds[i]:
                if isinstance(step, Recv):
                    data = messages[(step.peer, r)].popleft()
                    if step.reduce:
                        bufs[r][step.start:step.stop] += data
                    else:
                        bufs[r][step.start:step.stop] = data
    return bufs


def check_allreduce(algorithm, world_size: int, num_elements: int,
                    dtype=np.float32, seed: int = 0) -> list[np.ndarray]:
    """Simulates `algorithm` on random inputs and checks it is an all-reduce.

    Integer dtypes must match the exact sum. Float dtypes must be within the
    worst-case rounding error of any summation order, ``(p - 1) * eps *
    sum(|x|)`` per element. For every dtype all ranks must end bit-identical.

    Returns:
        The outputs of all ranks.

    Raises:
        AssertionError: naming the algorithm, the rank and the first bad index.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([seed, world_size, num_elements])
    if dtype.kind in "iu":
        inputs = [rng.integers(-1000, 1000, num_elements).astype(dtype)
                  for _ in range(world_size)]
    else:
        inputs = [rng.standard_normal(num_elements).astype(dtype)
                  for _ in range(world_size)]
    wide = np.stack(inputs).astype(np.float64 if dtype.kind == "f" else np.int64)
    expected = wide.sum(axis=0)
    outputs = simulate(algorithm, world_size, inputs)
    where = f"{algorithm!r} with world_size={world_size}, num_elements={num_elements}"
    for r, out in enumerate(outputs):
        assert out.dtype == dtype, f"{where}: rank {r} returned dtype {out.dtype}."
        if dtype.kind == "f":
            tol = (world_size - 1) * np.finfo(dtype).eps * np.abs(wide).sum(axis=0)
            bad = np.flatnonzero(np.abs(out - expected) > tol)
        else:
            bad = np.flatnonzero(out != expected)
        assert not bad.size, (
            f"{where}: rank {r} element {bad[0]} is {out[bad[0]]}, expected "
            f"{expected[bad[0]]}.")
        differ = np.flatnonzero(out.view(np.uint8) != outputs[0].view(np.uint8))
        assert not differ.size, (
            f"{where}: ranks 0 and {r} are not bit-identical (byte {differ[0]}); "
            f"every element must be reduced once and then copied.")
    return outputs
