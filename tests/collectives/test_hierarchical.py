"""Hierarchical all-reduce: the schedule against numpy, both engines on logical
replicas grouped into hosts, host discovery, `auto`'s candidates and bad input."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext import collectives
from tfdist_ext.collectives import cost, hierarchical, plan
from tfdist_ext.collectives.hierarchical import Hierarchical

import engine_cases as cases

LAYOUTS = {"2x2": (0, 0, 1, 1), "2x3": (0, 0, 0, 1, 1, 1), "3x2": (0, 0, 1, 1, 2, 2)}
ODD_LAYOUTS = [(0, 1, 0, 1), (0, 0, 0, 1), (7, 7), (0, 1, 2), (3, 1, 1, 2, 3)]


@pytest.mark.parametrize("hosts", list(LAYOUTS.values()) + ODD_LAYOUTS)
@pytest.mark.parametrize("inter", collectives.ALGORITHMS.names())
def test_schedule_is_an_allreduce_for_every_dtype_and_size(hosts, inter):
    # chunk_elements=40: buffers from 80 elements run as a pipeline of up to 3 chunks
    for algorithm in (Hierarchical(hosts, inter), Hierarchical(hosts, inter, 40, 3)):
        for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64):
            for n in (0, 1, 7, 101, 1000):
                collectives.check_allreduce(algorithm, len(hosts), n, dtype)  # bit-identical
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(101) for _ in hosts]
        for out in plan.simulate_plans(algorithm, len(hosts), inputs):  # the engines' plans
            np.testing.assert_allclose(out, np.sum(inputs, axis=0), rtol=1e-12)


def test_pipeline_overlaps_the_phases_of_successive_chunks():
    n, hosts = 4 << 20, LAYOUTS["2x2"]
    leader, member = (Hierarchical(hosts, "ring").schedule(4, r, n) for r in (0, 1))
    assert len(leader.rounds) == 8 + 3  # 8 chunks; gather, 2 ring rounds, broadcast each
    # round 2: chunk 2 is gathered while the leaders reduce-scatter chunk 1 and
    # all-gather chunk 0
    kinds = sorted((type(s).__name__, s.peer) for s in leader.rounds[2])
    assert kinds == [("Recv", 1), ("Recv", 2), ("Recv", 2), ("Send", 2), ("Send", 2)]
    assert sorted(type(s).__name__ for s in member.rounds[3]) == ["Recv", "Send"]


def test_only_leaders_cross_hosts_and_bytes_are_counted():
    n, hosts = 1200, LAYOUTS["2x3"]
    schedules = collectives.all_schedules(Hierarchical(hosts, "ring"), 6, n)
    for s in schedules:
        for step in (x for rnd in s.rounds for x in rnd):
            if hosts[step.peer] != hosts[s.rank]:
                assert s.rank in (0, 3) and step.peer in (0, 3), (s.rank, step)
    # leader: 2 members' broadcasts + a 2-rank ring (n/2 twice); member: one buffer
    for inter in ("ring", "auto"):  # auto: one full exchange for two hosts
        assert cost.elements_sent(Hierarchical(hosts, inter), 6, 0, n) == 2 * n + n
        assert cost.elements_sent(Hierarchical(hosts, inter), 6, 1, n) == n
    assert [len(s.rounds) for s in schedules] == [4] * 6  # gather, 2 ring rounds, broadcast


def test_auto_inter_takes_few_rounds_for_small_buffers_and_ring_for_large_on_many_hosts():
    two, three = Hierarchical(LAYOUTS["2x2"]), Hierarchical(LAYOUTS["3x2"])
    assert two.inter_algorithm(2, 256) == "butterfly"  # one exchange
    assert len(two.schedule(4, 0, 256).rounds) == 3  # gather, exchange, broadcast
    assert three.inter_algorithm(3, 4 << 20) == "ring"
    assert three.inter_algorithm(3, 256) == "butterfly"


def test_host_discovery_from_addresses():
    addresses = ["10.0.0.2:5000", "10.0.0.2:5001", "10.0.0.3:5000", "10.0.0.2:5002"]
    assert hierarchical.hosts_from_addresses(addresses) == (0, 0, 1, 0)
    assert hierarchical.hosts_from_addresses(addresses[:2], 2) == (0, 0, 0, 0)
    assert hierarchical.host_groups((0, 0, 1, 0)) == ((0, 1, 3), (2,))


def _run(strategy, num_replicas):
    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: cases.tf_inputs(ctx.replica_id_in_sync_group))
    fn = tf.function(lambda x: strategy.run(cases.replica_fn, args=(x,)))
    return [tuple([t.numpy() for t in part] for part in r)
            for r in strategy.experimental_local_results(fn(inputs))]


@pytest.mark.parametrize("engine", cases.ENGINES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_engines_match_numpy_on_replicas_grouped_into_hosts(engine, layout):
    hosts = LAYOUTS[layout]
    strategy = tfdist_ext.Strategy(
        num_replicas=len(hosts), engine=engine,
        allreduce={"name": "hierarchical", "hosts": hosts})
    cross_ops = strategy.extended.cross_device_ops
    assert cross_ops.choice.rank_hosts == hosts
    assert cross_ops.choice.spec("hierarchical") == Hierarchical(hosts, "auto")
    results = _run(strategy, len(hosts))
    inputs = [cases.numpy_inputs(r) for r in range(len(hosts))]
    problems = cases.check(len(hosts), inputs, *results[0])
    assert not problems, problems
    for replica, result in enumerate(results[1:], 1):  # bit-identical replicas
        for k, (a, b) in enumerate(zip(results[0][0] + results[0][1], result[0] + result[1])):
            assert a.tobytes() == b.tobytes(), (replica, k)


def test_auto_considers_hierarchical_only_when_hosts_hold_several_ranks():
    def candidates(hosts):
        strategy = tfdist_ext.Strategy(
            num_replicas=4, engine="tf",
            allreduce={"name": "ring", "hosts": hosts})
        return strategy.extended.cross_device_ops.choice.candidates

    assert "hierarchical" in candidates((0, 0, 1, 1))
    assert "hierarchical" not in candidates((0, 1, 2, 3))  # every rank its own host
    assert "hierarchical" not in candidates((0, 0, 0, 0))  # one host
    assert "hierarchical" not in candidates(None)  # one process: one host


@pytest.mark.parametrize("allreduce, message", [
    ({"name": "hierarchical", "inter_host": "native"},
     "Argument `inter_host` must name a flat algorithm for the host leaders: "),
    ({"name": "hierarchical", "inter_host": "rings"}, "received 'rings'"),
    ({"name": "hierarchical", "hosts": "0011"},
     "Argument `hosts` must list the host of every worker, e.g. (0, 0, 1, 1)"),
    ({"name": "hierarchical", "hosts": ()}, "received ()"),
])
def test_bad_options_name_the_argument(allreduce, message):
    with pytest.raises(ValueError) as info:
        tfdist_ext.Strategy(num_replicas=2, allreduce=allreduce, engine="tf")
    assert message in str(info.value)


def test_layout_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match=r"Argument `hosts` lists 3 hosts \(\(0, 0, 1\)\) but "
                                         r"the job has 1 worker\(s\) of 4 replica\(s\); give "
                                         r"the host of every worker"):
        tfdist_ext.Strategy(num_replicas=4, engine="tf",
                            allreduce={"name": "hierarchical", "hosts": (0, 0, 1)})
    with pytest.raises(ValueError, match="world_size=3"):
        Hierarchical((0, 1)).schedule(3, 0, 10)


def test_two_level_cost_model():
    flat = cost.CostModel(alpha=1e-5, beta=1e-9, gamma=1e-10)
    for name in collectives.ALGORITHMS.names():  # one rank per host: the flat model
        schedules = collectives.all_schedules(name, 5, 1000)
        assert cost.two_level_cost(schedules, range(5), 4, flat, flat) == pytest.approx(
            cost.schedule_cost(schedules, 4, flat))
    free = cost.CostModel(alpha=0, beta=0, gamma=0)
    slow = cost.CostModel(alpha=0, beta=1 / 12.5e6, gamma=0)  # 100 Mbit between hosts
    n = 1 << 22

    def seconds(algorithm, hosts):
        schedules = collectives.all_schedules(algorithm, len(hosts), n)
        return cost.two_level_cost(schedules, hosts, 4, free, slow)

    # Host links carry n each way for hierarchical (2 hosts), 2 (p-1)/p n for the ring
    # with ranks in host order (each link crossed once per round), twice that when
    # ranks alternate between hosts.
    assert seconds(Hierarchical(LAYOUTS["2x2"]), LAYOUTS["2x2"]) == pytest.approx(4 * n / 12.5e6)
    assert seconds("ring", LAYOUTS["2x2"]) == pytest.approx(1.5 * 4 * n / 12.5e6)
    assert seconds("ring", LAYOUTS["2x3"]) / seconds(
        Hierarchical(LAYOUTS["2x3"]), LAYOUTS["2x3"]) == pytest.approx(5 / 3, rel=1e-3)
    assert seconds("ring", (0, 1, 0, 1)) == pytest.approx(3 * 4 * n / 12.5e6)
    with pytest.raises(ValueError, match="must give the host of each of the 4 ranks; "
                                         "received 3"):
        cost.two_level_cost(collectives.all_schedules("ring", 4, 8), (0, 0, 1), 4, free, slow)
