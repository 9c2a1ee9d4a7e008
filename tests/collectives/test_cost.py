"""The alpha-beta-gamma cost model against hand-computed schedules."""

import pytest

from tfdist_ext.collectives import (
    ALGORITHMS,
    CostModel,
    Recv,
    Schedule,
    Send,
    all_schedules,
    best_algorithm,
    predict,
    schedule_cost,
)

ALPHA = CostModel(alpha=1.0, beta=0.0, gamma=0.0)  # counts non-empty rounds
BETA = CostModel(alpha=0.0, beta=1.0, gamma=0.0)  # sums the busiest link's bytes
GAMMA = CostModel(alpha=0.0, beta=0.0, gamma=1.0)  # sums the busiest reducer's bytes


def test_ring_p4_n1000_float32():
    schedules = all_schedules("ring", 4, 1000)
    assert schedule_cost(schedules, 4, ALPHA) == 6
    assert schedule_cost(schedules, 4, BETA) == 6 * 250 * 4
    assert schedule_cost(schedules, 4, GAMMA) == 3 * 250 * 4


def test_master_worker_root_receives_and_sends_everything():
    n = 1000
    # Alpha is per message: the root receives 3, then sends 3.
    assert predict("master_worker", 4, n * 4, 4, ALPHA) == 6
    assert predict("master_worker", 4, n * 4, 4, BETA) == 3 * n * 4 + 3 * n * 4
    assert predict("master_worker", 4, n * 4, 4, GAMMA) == 3 * n * 4


def test_butterfly_with_folding():
    n = 1000
    assert predict("butterfly", 4, n * 8, 8, BETA) == 2 * n * 8
    # p = 5: fold-in, 2 exchanges, fold-out; all move the whole buffer.
    assert predict("butterfly", 5, n * 8, 8, BETA) == 4 * n * 8
    assert predict("butterfly", 5, n * 8, 8, GAMMA) == 3 * n * 8


def test_halving_doubling_p8():
    n = 800
    assert predict("halving_doubling", 8, n, 1, BETA) == 2 * (400 + 200 + 100)
    assert predict("halving_doubling", 8, n, 1, GAMMA) == 400 + 200 + 100


def test_full_model_adds_the_three_terms():
    model = CostModel(alpha=1e-5, beta=1e-9, gamma=1e-10)
    expected = 6 * 1e-5 + 6 * 1000 * 1e-9 + 3 * 1000 * 1e-10
    assert predict("ring", 4, 1000 * 4, 4, model) == pytest.approx(expected)


def test_predict_matches_schedule_cost():
    model = CostModel(alpha=2e-6, beta=3e-10, gamma=1e-11)
    for name in ALGORITHMS.names():
        assert predict(name, 7, 333 * 2, 2, model) == pytest.approx(
            schedule_cost(all_schedules(name, 7, 333), 2, model))


def test_empty_rounds_cost_nothing():
    def schedules(rounds0, rounds1):
        return [Schedule(0, 2, 4, rounds0), Schedule(1, 2, 4, rounds1)]

    s = schedules(((), (Send(1, 0, 4),), ()), ((), (Recv(0, 0, 4, True),), ()))
    assert schedule_cost(s, 4, ALPHA) == 1
    assert predict("ring", 1, 400, 4, ALPHA) == 0
    assert predict("ring", 4, 0, 4, ALPHA) == 0


def test_best_algorithm_small_messages_large_alpha():
    model = CostModel(alpha=1e-3, beta=1e-9, gamma=1e-10)
    classic = ["butterfly", "halving_doubling", "ring", "tree"]
    assert best_algorithm(classic, 8, 4, 4, model)[0] == "butterfly"
    assert best_algorithm(["ring", "tree"], 6, 4, 4, model)[0] == "tree"
    # Among all: butterfly's 3 messages per rank beat the 2 x 7 messages of
    # all_to_all and master_worker, which have fewer rounds but busier ranks.
    name, seconds = best_algorithm(None, 8, 4, 4, model)
    assert name == "butterfly"
    assert predict("all_to_all", 8, 4, 4, CostModel(1.0, 0.0, 0.0)) == 14
    assert predict("master_worker", 8, 4, 4, CostModel(1.0, 0.0, 0.0)) == 14


def test_best_algorithm_large_messages_large_beta():
    model = CostModel(alpha=1e-6, beta=1e-9, gamma=1e-10)
    classic = ["butterfly", "halving_doubling", "ring", "tree"]
    assert best_algorithm(classic, 8, 64 << 20, 4, model)[0] == "halving_doubling"
    # Folding moves the whole buffer twice, so ring wins on non-powers of two.
    assert best_algorithm(classic, 6, 64 << 20, 4, model)[0] == "ring"


def test_best_algorithm_ties_are_alphabetical():
    free = CostModel(alpha=0.0, beta=0.0, gamma=0.0)
    assert best_algorithm(["tree", "ring"], 4, 4000, 4, free) == ("ring", 0.0)
    assert best_algorithm(None, 4, 4000, 4, free) == ("all_to_all", 0.0)
    assert best_algorithm("tree", 4, 4000, 4, free) == ("tree", 0.0)


@pytest.mark.parametrize("field, value", [
    ("alpha", -1.0), ("beta", float("nan")), ("gamma", "fast"), ("alpha", True)])
def test_cost_model_rejects_bad_values(field, value):
    kwargs = {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10, field: value}
    with pytest.raises(ValueError, match=(
            rf"Argument `{field}` of CostModel must be a finite float >= 0 "
            rf"\(seconds\); received {value!r}\.")):
        CostModel(**kwargs)


def test_cost_model_accepts_ints_as_floats():
    model = CostModel(alpha=0, beta=1, gamma=0)
    assert model.beta == 1.0 and isinstance(model.beta, float)


def test_predict_errors():
    with pytest.raises(ValueError, match="Unknown allreduce 'rign'. Valid names: "):
        predict("rign", 4, 400, 4, ALPHA)
    with pytest.raises(ValueError, match=r"`num_bytes` must be a multiple of "
                       r"`itemsize` \(4\); received 401"):
        predict("ring", 4, 401, 4, ALPHA)
    with pytest.raises(ValueError, match=r"`itemsize` must be an integer >= 1"):
        predict("ring", 4, 400, 0, ALPHA)
    with pytest.raises(ValueError, match="`candidates` must name at least one"):
        best_algorithm([], 4, 400, 4, ALPHA)
