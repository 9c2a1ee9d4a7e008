"""A schedule registered outside tfdist_ext is simulated before an engine runs it."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.collectives import ALGORITHMS, verify
from tfdist_ext.collectives.hierarchical import Hierarchical
from tfdist_ext.collectives.schedule import Recv, Send, register_schedule
from tfdist_ext.ops import ucx as ucx_ops

ENGINES = ["tf"] + ([] if ucx_ops.problem() else ["ucx"])


def _to_last(reduce):
    """Everyone sends to the last rank, which sends the result back."""
    def rounds(p, rank, n):
        root = p - 1
        if rank == root:
            return (tuple(Recv(peer, 0, n, reduce) for peer in range(root)),
                    tuple(Send(peer, 0, n) for peer in range(root)))
        return ((Send(root, 0, n),), (Recv(root, 0, n, False),))
    return rounds


@pytest.fixture
def schedules():
    names = {"test_to_last": _to_last(True), "test_to_last_overwrites": _to_last(False)}
    for name, rounds in names.items():
        register_schedule(name, rounds, "TestToLast")
    yield sorted(names)
    for name in names:
        ALGORITHMS.unregister(name)


def _sum_on_replicas(algorithm, engine, replicas=3):
    strategy = tfdist_ext.Strategy(allreduce=algorithm, engine=engine, num_replicas=replicas)
    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([7], tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)))

    @tf.function
    def step(x):
        return strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce("sum", v),
                            args=(x,))

    return [t.numpy() for t in strategy.experimental_local_results(step(inputs))]


def test_a_wrong_schedule_is_refused_naming_it_and_a_right_one_passes(schedules):
    verify.before_use("test_to_last", 4)
    with pytest.raises(ValueError) as info:
        verify.before_use("test_to_last_overwrites", 4)
    message = str(info.value)
    assert "Argument `allreduce`: the algorithm 'test_to_last_overwrites' is not an " \
           "all-reduce at world_size=4" in message
    assert "tfdist_ext.collectives.check_allreduce('test_to_last_overwrites', 4, 1)" in message


def test_the_package_schedules_are_not_simulated_again(monkeypatch):
    def fail(*args):
        raise AssertionError("simulated")
    monkeypatch.setattr(verify.simulator, "check_allreduce", fail)
    for name in ALGORITHMS.names():
        verify.before_use(name, 5)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_refuses_a_wrong_schedule_and_runs_a_right_one(schedules, engine,
                                                                   monkeypatch):
    # With logical replicas the UCX engine would sum in process without the schedule.
    monkeypatch.setenv("TFDIST_UCX_IN_PROCESS", "0")
    for result in _sum_on_replicas("test_to_last", engine):
        np.testing.assert_array_equal(result, np.full([7], 6.0))
    with pytest.raises(ValueError, match="'test_to_last_overwrites' is not an all-reduce "
                                         "at world_size=3"):
        _sum_on_replicas("test_to_last_overwrites", engine)


def test_a_user_schedule_run_by_the_host_leaders_is_simulated_at_their_number(schedules):
    """The hierarchical schedule is ours, its `inter` may not be (issue 53: it was
    not simulated)."""
    verify.before_use(Hierarchical(hosts=(0, 0, 1, 1, 2), inter="test_to_last"), 5)
    with pytest.raises(ValueError, match="'test_to_last_overwrites' is not an all-reduce "
                                         "at world_size=3"):
        verify.before_use(Hierarchical(hosts=(0, 0, 1, 1, 2), inter="test_to_last_overwrites"), 5)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_refuses_a_wrong_inter_schedule(schedules, engine, monkeypatch):
    monkeypatch.setenv("TFDIST_UCX_IN_PROCESS", "0")
    def hierarchical(inter):
        return {"name": "hierarchical", "hosts": (0, 0, 1), "inter_host": inter}

    for result in _sum_on_replicas(hierarchical("test_to_last"), engine):
        np.testing.assert_array_equal(result, np.full([7], 6.0))
    with pytest.raises(ValueError, match="'test_to_last_overwrites' is not an all-reduce "
                                         "at world_size=2"):
        _sum_on_replicas(hierarchical("test_to_last_overwrites"), engine)
