"""Every all-reduce schedule, run by the numpy simulator, against numpy sums."""

import dataclasses
import math

import numpy as np
import pytest

from tfdist_ext.collectives import (
    ALGORITHMS,
    Recv,
    Schedule,
    ScheduleError,
    Send,
    all_schedules,
    check_allreduce,
    ring,
    simulate,
    split,
    validate,
)

NAMES = ALGORITHMS.names()
WORLD_SIZES = range(1, 17)
COUNTS = [0, 1, 7, 1000, 2**16 + 3]


@pytest.mark.parametrize("num_elements", COUNTS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_allreduce_exact_for_int64_and_bit_identical_for_float32(
        name, world_size, num_elements):
    check_allreduce(name, world_size, num_elements, np.int64)
    check_allreduce(name, world_size, num_elements, np.float32)


@pytest.mark.parametrize("world_size", [3, 5, 8, 13])
@pytest.mark.parametrize("name", NAMES)
def test_allreduce_bit_identical_for_float16(name, world_size):
    check_allreduce(name, world_size, 257, np.float16)


def test_all_algorithms_registered():
    # A schedule added in its own file registers itself beside these.
    assert {"all_to_all", "butterfly", "halving_doubling", "master_worker", "ring",
            "round_robin", "tree"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_matches_module_function(name):
    entry = ALGORITHMS.get({"name": name})
    assert entry.name == name
    assert entry.schedule(5, 3, 100).rounds == all_schedules(name, 5, 100)[3].rounds


@pytest.mark.parametrize("num_elements", [1, 7, 1000])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_schedule_invariants(name, world_size, num_elements):
    schedules = all_schedules(name, world_size, num_elements)
    validate(schedules)
    assert len({len(s.rounds) for s in schedules}) == 1
    for rank, s in enumerate(schedules):
        assert (s.rank, s.world_size, s.num_elements) == (
            rank, world_size, num_elements)
        for step in (step for rnd in s.rounds for step in rnd):
            assert 0 <= step.start < step.stop <= num_elements
            assert step.peer != rank


@pytest.mark.parametrize("name", NAMES)
def test_trivial_cases_have_no_rounds(name):
    assert all_schedules(name, 1, 100)[0].rounds == ()
    assert all(s.rounds == () for s in all_schedules(name, 6, 0))


def _power_of_two_rounds(p, per_level):
    p2 = 1 << (p.bit_length() - 1)
    return per_level * int(math.log2(p2)) + 2 * (p != p2)


EXPECTED_ROUNDS = {
    "ring": lambda p: 2 * (p - 1),
    "butterfly": lambda p: _power_of_two_rounds(p, 1),
    "halving_doubling": lambda p: _power_of_two_rounds(p, 2),
    "tree": lambda p: 2 * math.ceil(math.log2(p)),
    "master_worker": lambda p: 2,
    "all_to_all": lambda p: 2,
    "round_robin": lambda p: 2 * (p - 1),
}


@pytest.mark.parametrize("world_size", range(2, 17))
@pytest.mark.parametrize("name", sorted(EXPECTED_ROUNDS))
def test_round_counts(name, world_size):
    rounds = len(all_schedules(name, world_size, 1000)[0].rounds)
    assert rounds == EXPECTED_ROUNDS[name](world_size)


def test_round_counts_at_4_and_5():
    counts = {p: {n: len(all_schedules(n, p, 100)[0].rounds) for n in sorted(EXPECTED_ROUNDS)}
              for p in (4, 5)}
    assert counts[4] == {"all_to_all": 2, "butterfly": 2, "halving_doubling": 4,
                         "master_worker": 2, "ring": 6, "round_robin": 6, "tree": 4}
    assert counts[5] == {"all_to_all": 2, "butterfly": 4, "halving_doubling": 6,
                         "master_worker": 2, "ring": 8, "round_robin": 8, "tree": 6}


def test_ring_chunks_near_equal():
    s = ring.schedule(4, 0, 10)
    sizes = [step.stop - step.start for rnd in s.rounds for step in rnd]
    assert max(sizes) - min(sizes) <= 1


def test_split():
    assert split(0, 10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert split(5, 7, 4) == [(5, 6), (6, 7), (7, 7), (7, 7)]


def test_sends_read_the_buffer_at_the_start_of_the_round():
    def swap(world_size, rank, n):
        peer = 1 - rank
        return Schedule(rank, 2, n, ((Send(peer, 0, n), Recv(peer, 0, n, False)),))

    out = simulate(swap, 2, [np.array([1, 2]), np.array([3, 4])])
    np.testing.assert_array_equal(out[0], [3, 4])
    np.testing.assert_array_equal(out[1], [1, 2])


def test_several_sends_to_one_peer_match_recvs_in_order():
    def reverse(world_size, rank, n):
        if rank == 0:
            return Schedule(0, 2, n, ((Send(1, 0, 1), Send(1, 1, 2)),))
        return Schedule(1, 2, n, ((Recv(0, 1, 2, False), Recv(0, 0, 1, False)),))

    out = simulate(reverse, 2, [np.array([1, 2]), np.array([0, 0])])
    np.testing.assert_array_equal(out[1], [2, 1])


def test_simulate_does_not_modify_inputs():
    inputs = [np.arange(10.0) for _ in range(3)]
    simulate("ring", 3, inputs)
    np.testing.assert_array_equal(inputs[0], np.arange(10.0))


def _broken_ring(edit):
    """Ring schedules with ``edit(rank, rounds) -> rounds`` applied."""
    def fn(world_size, rank, n):
        s = ring.schedule(world_size, rank, n)
        return dataclasses.replace(s, rounds=edit(rank, list(s.rounds)))
    return fn


def _without(rank, kind, target):
    def edit(r, rounds):
        if r == target:
            rounds[0] = tuple(x for x in rounds[0] if not isinstance(x, kind))
        return tuple(rounds)
    return edit


def test_missing_send_is_reported():
    with pytest.raises(ScheduleError, match=r"Round 0: rank 1 expects 250 elements "
                       r"from rank 0 \(Recv\(peer=0, start=0, stop=250, reduce=True\)\)"
                       r" but rank 0 sends rank 1 no \(further\) data in that round"):
        simulate(_broken_ring(_without(0, Send, 0)), 4, [np.zeros(1000)] * 4)


def test_missing_recv_is_reported():
    with pytest.raises(ScheduleError, match=r"Round 0: rank 3 sends 250 elements to "
                       r"rank 0 .* but rank 0 has no matching Recv from rank 3"):
        simulate(_broken_ring(_without(0, Recv, 0)), 4, [np.zeros(1000)] * 4)


def test_length_mismatch_is_reported():
    def edit(rank, rounds):
        if rank == 1:
            rounds[0] = (rounds[0][0], Recv(0, 0, 249, True))
        return tuple(rounds)

    with pytest.raises(ScheduleError, match=r"rank 1 expects 249 elements from rank 0"
                       r" .* but the matching Send\(peer=1, start=0, stop=250\) has 250"):
        simulate(_broken_ring(edit), 4, [np.zeros(1000)] * 4)


def test_round_count_mismatch_is_reported():
    edit = lambda rank, rounds: tuple(rounds[:-1] if rank == 2 else rounds)
    with pytest.raises(ScheduleError, match="Rank 2 has 5 rounds but rank 0 has 6"):
        simulate(_broken_ring(edit), 4, [np.zeros(1000)] * 4)


@pytest.mark.parametrize("step, message", [
    (Send(0, 0, 10), r"peer must be another rank in \[0, 2\)"),
    (Send(1, 5, 5), "range must be non-empty"),
    (Send(1, 0, 11), r"within \[0, 10\)"),
])
def test_bad_steps_are_reported(step, message):
    def fn(world_size, rank, n):
        return Schedule(rank, 2, n, ((step,) if rank == 0 else (),))

    with pytest.raises(ScheduleError, match=message):
        simulate(fn, 2, [np.zeros(10)] * 2)


def test_bad_inputs_are_reported():
    with pytest.raises(ValueError, match=r"one array per rank \(3\); received 2"):
        simulate("ring", 3, [np.zeros(4)] * 2)
    with pytest.raises(ValueError, match="1-D arrays of one shape and dtype"):
        simulate("ring", 2, [np.zeros(4), np.zeros(5)])


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match=r"`world_size` must be an integer >= 1; "
                       r"received 0"):
        ring.schedule(0, 0, 10)
    with pytest.raises(ValueError, match=r"`rank` must be an integer in "
                       r"\[0, world_size=4\); received 4"):
        ring.schedule(4, 4, 10)
    with pytest.raises(ValueError, match=r"`num_elements` must be an integer >= 0"):
        ring.schedule(4, 0, -1)
    with pytest.raises(ValueError, match="Unknown allreduce 'rign'"):
        simulate("rign", 2, [np.zeros(4)] * 2)


def _one_shot(world_size, rank, n):
    """Everyone sends the whole buffer to everyone and adds in rank order."""
    peers = [q for q in range(world_size) if q != rank]
    steps = tuple(Send(q, 0, n) for q in peers) + tuple(
        Recv(q, 0, n, True) for q in peers)
    return Schedule(rank, world_size, n, (steps,))


def test_bit_identity_check_catches_one_shot_all_to_all():
    # x_r + x_a + x_b differs per rank in float: why all_to_all is two-shot.
    check_allreduce(_one_shot, 5, 1000, np.int64)
    with pytest.raises(AssertionError, match="not bit-identical"):
        check_allreduce(_one_shot, 5, 1000, np.float32)
