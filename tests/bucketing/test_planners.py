"""Bucketing planners and their timing model, against hand-computed schedules."""

import numpy as np
import pytest

from tfdist_ext import bucketing
from tfdist_ext.bucketing import (MGWFBP, WFBP, FixedSize, modelled_time, schedule,
                                  single_bucket)

OPTIMAL, GREEDY = MGWFBP(), MGWFBP("greedy")


def _time(planner, sizes, times, alpha, beta):
    return modelled_time(planner.plan(sizes, times, alpha, beta), sizes, times, alpha, beta)


# --- timing model ---------------------------------------------------------------

def test_schedule_by_hand():
    # ready at 1, 2, 3 s; each message 0.5 + 0.1 * 4 = 0.9 s.
    sizes, times = [4, 4, 4], [1.0, 1.0, 1.0]
    np.testing.assert_allclose(schedule(((0,), (1,), (2,)), sizes, times, 0.5, 0.1),
                               [(1.0, 1.9), (2.0, 2.9), (3.0, 3.9)])
    # one bucket: waits for the last gradient (3 s), then 0.5 + 1.2.
    assert modelled_time(((0, 1, 2),), sizes, times, 0.5, 0.1) == pytest.approx(4.7)
    # channel busy: the second message waits for the first (ends 1 + 0.5 + 2 = 3.5).
    np.testing.assert_allclose(schedule(((0,), (1, 2)), [20, 1, 1], times, 0.5, 0.1),
                               [(1.0, 3.5), (3.5, 4.2)])


def test_iteration_never_ends_before_backward():
    assert modelled_time(((0,),), [0], [2.0], 0.0, 0.0) == 2.0
    assert modelled_time((), [], [], 1.0, 1.0) == 0.0


def test_plan_must_cover_consecutive_indices():
    with pytest.raises(ValueError, match=r"Argument `buckets` must split .*0\.\.2"):
        modelled_time(((0, 2), (1,)), [1, 1, 1], [1, 1, 1], 0.1, 0.1)
    with pytest.raises(ValueError, match="Argument `buckets`"):
        modelled_time(((0,),), [1, 1], [1, 1], 0.1, 0.1)


# --- hand-computed plans ----------------------------------------------------------

def test_wfbp_one_bucket_per_layer_and_single_bucket():
    assert WFBP().plan([3, 0, 5], [1, 1, 1], 0.1, 0.1) == ((0,), (1,), (2,))
    assert single_bucket([3, 0, 5]) == ((0, 1, 2),)
    assert single_bucket([]) == ()
    assert bucketing.plan_buckets(None, [3, 0, 5]) == ((0, 1, 2),)
    assert bucketing.plan_buckets(WFBP(), [3, 5], [1, 1], 0.1, 0.1) == ((0,), (1,))


def test_fixed_size_packs_to_the_cap():
    planner = FixedSize(bytes_per_bucket=10)
    assert planner.plan([4, 4, 4, 6, 10, 1], [0] * 6, 0, 0) == ((0, 1), (2, 3), (4,), (5,))
    # A tensor larger than the cap gets a bucket of its own.
    assert planner.plan([3, 25, 3, 3], None, 0, 0) == ((0,), (1,), (2, 3))
    for sizes in np.random.default_rng(3).integers(0, 30, size=(50, 12)):
        for bucket in planner.plan(sizes.tolist(), None, 0, 0):
            assert len(bucket) == 1 or sum(sizes[i] for i in bucket) <= 10


def test_mgwfbp_merges_when_it_strictly_helps():
    # A big last layer, then three small ones after a long backward step.
    # Ready at 1, 4, 4.1, 4.2 s. WFBP: 1 -> 4 (1 + 1 + 2), then three 1.02 s
    # messages in a row: 7.06. One bucket: 4.2 + 1 + 2.06 = 7.26. Best: the big
    # layer alone (overlaps backprop), the small ones together: 4.2 + 1.06.
    sizes, times, alpha, beta = [100, 1, 1, 1], [1.0, 3.0, 0.1, 0.1], 1.0, 0.02
    plan = OPTIMAL.plan(sizes, times, alpha, beta)
    assert plan == ((0,), (1, 2, 3))
    best = modelled_time(plan, sizes, times, alpha, beta)
    assert best == pytest.approx(5.26)
    assert _time(WFBP(), sizes, times, alpha, beta) == pytest.approx(7.06)
    assert modelled_time(single_bucket(sizes), sizes, times, alpha, beta) == pytest.approx(
        7.26)
    assert GREEDY.plan(sizes, times, alpha, beta) == plan


def test_mgwfbp_keeps_layers_apart_when_merging_strictly_hurts():
    # Long backward steps, cheap messages: each message ends before the next
    # gradient exists, so any merge only delays the last message.
    sizes, times, alpha, beta = [10, 10, 10], [5.0, 5.0, 5.0], 0.1, 0.01
    assert OPTIMAL.plan(sizes, times, alpha, beta) == ((0,), (1,), (2,))
    assert _time(OPTIMAL, sizes, times, alpha, beta) == pytest.approx(15.2)
    assert modelled_time(((0,), (1, 2)), sizes, times, alpha, beta) == pytest.approx(15.3)
    assert GREEDY.plan(sizes, times, alpha, beta) == ((0,), (1,), (2,))


# --- properties -------------------------------------------------------------------

def _random_case(rng):
    n = int(rng.integers(1, 30))
    sizes = (rng.integers(0, 1 << 22, size=n) * rng.integers(0, 2, size=n)).tolist()
    times = (rng.exponential(1e-3, size=n) * rng.integers(0, 2, size=n)).tolist()
    alpha = float(rng.choice([0.0, 1e-5, 1e-4, 1e-3, 1e-2]))
    beta = float(rng.choice([0.0, 1e-10, 1e-9, 1e-8]))
    return sizes, times, alpha, beta


def test_mgwfbp_never_worse_than_wfbp_single_or_fixed():
    rng = np.random.default_rng(2019)
    for _ in range(300):
        case = _random_case(rng)
        best = _time(OPTIMAL, *case)
        others = [_time(WFBP(), *case), modelled_time(single_bucket(case[0]), *case),
                  _time(FixedSize(1 << 20), *case), _time(GREEDY, *case)]
        assert best <= min(others) * (1 + 1e-12) + 1e-15, case


def test_mgwfbp_is_exhaustively_optimal_on_small_cases():
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(1, 8))
        sizes = rng.integers(0, 100, size=n).tolist()
        times = rng.uniform(0, 2, size=n).tolist()
        alpha, beta = float(rng.uniform(0, 2)), float(rng.uniform(0, 0.05))
        brute = min(modelled_time(_partition(n, mask), sizes, times, alpha, beta)
                    for mask in range(1 << max(n - 1, 0)))
        assert _time(OPTIMAL, sizes, times, alpha, beta) == pytest.approx(brute, rel=1e-12)


def _partition(n, mask):
    buckets, current = [], [0]
    for i in range(1, n):
        if mask >> (i - 1) & 1:
            buckets.append(tuple(current))
            current = []
        current.append(i)
    return tuple(buckets) + (tuple(current),)


def test_plans_are_deterministic():
    rng = np.random.default_rng(11)
    for _ in range(20):
        case = _random_case(rng)
        for planner in (OPTIMAL, GREEDY, WFBP(), FixedSize(1 << 20)):
            assert planner.plan(*case) == planner.plan(*case)
            assert planner.plan(*case) == planner.plan(list(case[0]), list(case[1]),
                                                       *case[2:])


# --- edge cases -------------------------------------------------------------------

def test_one_layer():
    for planner in (OPTIMAL, GREEDY, WFBP(), FixedSize(1)):
        assert planner.plan([123], [0.5], 0.1, 1e-3) == ((0,),)


def test_no_gradients():
    for planner in (OPTIMAL, GREEDY, WFBP(), FixedSize(1)):
        assert planner.plan([], [], 0.1, 1e-3) == ()


def test_zero_size_gradients():
    # Zero bytes still cost alpha as a message, so MG-WFBP folds them into a neighbour.
    sizes, times = [0, 1000, 0, 0], [0.1, 0.1, 0.1, 0.1]
    plan = OPTIMAL.plan(sizes, times, 0.01, 1e-6)
    assert len(plan) < len(sizes)
    assert modelled_time(plan, sizes, times, 0.01, 1e-6) <= _time(WFBP(), sizes, times,
                                                                  0.01, 1e-6)
    assert FixedSize(1).plan([0, 0, 1, 0], None, 0, 0) == ((0, 1, 2, 3),)  # 1 byte fits
    assert FixedSize(1).plan([0, 1, 0, 1], None, 0, 0) == ((0, 1, 2), (3,))


def test_alpha_zero_wfbp_is_optimal():
    # Without start-up cost, splitting never delays anything: MG-WFBP matches WFBP.
    rng = np.random.default_rng(5)
    for _ in range(50):
        sizes, times, _, beta = _random_case(rng)
        assert _time(OPTIMAL, sizes, times, 0.0, beta) == pytest.approx(
            _time(WFBP(), sizes, times, 0.0, beta), rel=1e-12, abs=1e-15)


def test_beta_zero_one_bucket_is_optimal():
    # Free bytes: one message right after backprop (end + alpha) cannot be beaten.
    rng = np.random.default_rng(6)
    for _ in range(50):
        sizes, times, alpha, _ = _random_case(rng)
        assert OPTIMAL.plan(sizes, times, alpha, 0.0) == single_bucket(sizes)
        assert _time(OPTIMAL, sizes, times, alpha, 0.0) == pytest.approx(
            sum(times) + alpha)


# --- validation -------------------------------------------------------------------

@pytest.mark.parametrize("planner", [OPTIMAL, GREEDY, WFBP(), FixedSize()])
def test_errors_name_argument_and_value(planner):
    with pytest.raises(ValueError, match=r"`sizes` .* entry 1 is -4"):
        planner.plan([1, -4], [0, 0], 0.1, 0.1)
    with pytest.raises(ValueError, match=r"`backward_times` .* entry 0 is -1\.0"):
        planner.plan([1, 4], [-1.0, 0], 0.1, 0.1)
    with pytest.raises(ValueError, match="backward_times` has 3 entries but there are 4 "
                                         "gradients"):
        planner.plan([1, 2, 3, 4], [0, 0, 0], 0.1, 0.1)
    with pytest.raises(ValueError, match=r"`alpha` must be .* >= 0; received -0\.5"):
        planner.plan([1], [0], -0.5, 0.1)
    with pytest.raises(ValueError, match=r"`beta` must be .* received nan"):
        planner.plan([1], [0], 0.1, float("nan"))


def test_registry_names_and_options():
    assert bucketing.get("wfbp") == WFBP()
    assert bucketing.get("mgwfbp") == MGWFBP()
    assert bucketing.get({"name": "mgwfbp", "method": "greedy"}) == GREEDY
    assert bucketing.get({"name": "fixed", "bytes_per_bucket": 1 << 20}) == FixedSize(1 << 20)
    assert bucketing.get(None) is None
    with pytest.raises(ValueError, match="Unknown bucketing 'dp'. Valid names: 'fixed', "
                                         "'mgwfbp', 'wfbp'"):
        bucketing.get("dp")
    with pytest.raises(ValueError, match=r"`bytes_per_bucket` must be an integer >= 1; "
                                         "received 0"):
        FixedSize(0)
    with pytest.raises(ValueError, match=r"`method` of MGWFBP must be one of \['greedy', "
                                         r"'optimal'\]; received 'best'"):
        MGWFBP("best")
