"""The graph engine's plans (segments, exchanges, canonical order), without TensorFlow."""

import collections

import numpy as np
import pytest

from tfdist_ext.collectives import ALGORITHMS, engine, plan, simulate

NAMES = ALGORITHMS.names()


@pytest.mark.parametrize("world_size", range(1, 10))
@pytest.mark.parametrize("name", NAMES)
def test_plans_compute_what_the_simulator_computes_bit_for_bit(name, world_size):
    for n in (1, 7, 1000):
        rng = np.random.default_rng([world_size, n])
        inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(world_size)]
        expected = simulate(name, world_size, inputs)
        for got, want in zip(plan.simulate_plans(name, world_size, inputs), expected):
            assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("world_size", [2, 3, 5, 8])
@pytest.mark.parametrize("name", NAMES)
def test_both_sides_of_a_pair_number_their_collectives_alike(name, world_size):
    mirror = {plan.SEND: plan.RECV, plan.RECV: plan.SEND, plan.EXCHANGE: plan.EXCHANGE}
    plans = [plan.make_plan(name, world_size, r, 1001) for r in range(world_size)]
    for i in range(len(plans[0].rounds)):
        seqs = collections.defaultdict(list)  # (me, peer) -> [(kind, length)]
        for r, p in enumerate(plans):
            for c in p.rounds[i].comms:
                seqs[(r, c.peer)].append((c.kind, p.bounds[c.hi] - p.bounds[c.lo]))
        for (a, b), seq in seqs.items():
            assert [(mirror[k], n) for k, n in seq] == seqs[(b, a)], (i, a, b)


def test_exchanges_are_detected_where_both_sides_swap_and_sum():
    kinds = {c.kind for r in plan.make_plan("butterfly", 4, 0, 10).rounds for c in r.comms}
    assert kinds == {plan.EXCHANGE}
    kinds = {c.kind for r in plan.make_plan("ring", 4, 0, 10).rounds for c in r.comms}
    assert kinds == {plan.SEND, plan.RECV}


def test_world_sizes_whose_pair_keys_do_not_fit_are_rejected():
    assert engine.max_world_size() == 100
    engine.check_world_size(100)
    with pytest.raises(ValueError, match=r"world_size=101, but each strategy reserves 10000"):
        engine.check_world_size(101)
