"""Parameter-server planning without TensorFlow: sharding and the staleness bound."""

import random

import pytest

from tfdist_ext.ps import sharding
from tfdist_ext.ps.staleness import Admission


def test_shard_balances_whole_variables_and_is_deterministic():
    sizes = [100, 10, 10, 80, 1, 5]
    layout = sharding.shard(sizes, 2)
    assert sorted(i for s in layout for i in s) == list(range(len(sizes)))
    loads = [sum(sizes[i] for i in s) for s in layout]
    assert max(loads) - min(loads) <= max(sizes)
    assert all(s == sorted(s) for s in layout)  # model order within a server
    assert layout == sharding.shard(sizes, 2)
    assert sharding.shard([7], 1) == [[0]]


def test_shard_gives_every_server_a_variable():
    layout = sharding.shard([1000, 1, 1], 3)
    assert all(layout) and len(layout) == 3


@pytest.mark.parametrize("servers,match", [
    (4, r"4 parameter servers but the model has only 3 trainable variable\(s\).*at most 3"),
    (0, r"`num_servers` must be >= 1; received 0")])
def test_shard_refuses_more_servers_than_variables(servers, match):
    with pytest.raises(ValueError, match=match):
        sharding.shard([3, 4, 5], servers)


def test_unbounded_admission_applies_in_arrival_order():
    admission = Admission()
    for w in range(3):
        admission.pulled(w)
    assert admission.next([2, 0]) == (2, True)
    assert admission.applied(2) == 0
    assert admission.next([0, 1]) == (0, True)
    assert admission.applied(0) == 1


def test_bound_defers_the_fast_worker_until_the_slow_ones_pushed():
    admission = Admission(bound=2)
    for w in range(3):
        admission.pulled(w)
    assert admission.next([0]) == (0, True)
    assert admission.applied(0) == 0
    assert admission.next([0]) is None  # 1 and 2 would fall beyond 2
    assert admission.next([0, 1]) == (1, True)
    assert admission.applied(1) == 1
    assert admission.next([0]) is None
    assert admission.next([0, 2]) == (2, True)
    assert admission.applied(2) == 2
    assert admission.next([0]) == (0, True)
    assert admission.applied(0) == 2


def test_resting_workers_do_not_hold_others_and_stale_returns_are_refused():
    admission = Admission(bound=1)
    admission.pulled(0)
    admission.pulled(1, rest=True)
    for _ in range(3):
        assert admission.next([0]) == (0, True)
        admission.applied(0)
    admission.wake(1)
    assert admission.next([1]) == (1, False)  # 3 updates old > 1
    admission.pulled(1)
    assert admission.next([1]) == (1, True)


@pytest.mark.parametrize("workers,bound,seed", [(2, 1, 0), (3, 2, 1), (4, 3, 2), (5, 6, 3),
                                                (3, 5, 4)])
def test_random_schedules_never_exceed_the_bound_nor_deadlock(workers, bound, seed):
    """Workers of random speeds push and pull; applied staleness stays <= bound."""
    rng = random.Random(seed)
    admission = Admission(bound)
    for w in range(workers):
        admission.pulled(w)
    computing = set(range(workers))
    pending = []
    speeds = [rng.uniform(0.1, 1.0) for _ in range(workers)]
    applied = [0] * workers
    for _ in range(3000):
        ready = [w for w in computing if rng.random() < speeds[w]]
        for w in ready:
            computing.discard(w)
            pending.append(w)
        while True:
            decision = admission.next(pending)
            if decision is None:
                break
            worker, apply = decision
            assert apply, "nothing rests here, so nothing is refused"
            pending.remove(worker)
            assert admission.applied(worker) <= bound
            applied[worker] += 1
            computing.add(worker)
        assert computing or not pending or admission.next(pending), "deadlock"
    assert min(applied) > 100
