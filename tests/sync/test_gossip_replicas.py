"""Gossip SGD in Keras `fit` on logical-CPU replicas, against the numpy D-PSGD reference."""

import numpy as np
import pytest

from tfdist_ext import sync
from tests.sync import reference
from tests.sync.harness import LR, close, fit


@pytest.mark.parametrize("num, options", [
    (2, {}),
    (3, {}),
    (4, {"peers": 2}),
    (5, {"topology": "ring", "peers": 2, "mixing": 0.25}),
    (5, {"topology": "random", "peers": 2, "seed": 3}),
    (3, {"topology": "ring", "mixing": 0.5}),
])
def test_gossip_follows_d_psgd_on_the_graph_sequence(num, options):
    steps = 7
    policy = sync.Gossip(**options)
    w0, history, final, strategy, rows = fit(policy, steps, num=num)
    expected = reference.gossip(w0, rows, steps, num, LR, policy.shift_table(num),
                                policy.weight)
    for t in range(steps):
        close(history[t], expected[t])
    if num > 2:  # two replicas mixing half and half are averaged every step
        assert np.abs(np.asarray(history[-1][0]) - np.asarray(history[-1][1])).max() > 1e-6
    close(final, [np.mean(history[-1], axis=0)] * num)  # one model after fit
    stats = strategy.communication_stats()
    spread = np.sqrt(np.mean([np.sum((w - np.mean(history[-1], axis=0)) ** 2)
                              for w in history[-1]]))
    np.testing.assert_allclose(stats["consensus_distance"], spread, rtol=1e-4)
    assert stats["sync_rounds"] == steps and stats["reductions"] == steps
    # p peers x 5 float32 parameters per step, no all-reduce.
    assert stats["bytes_sent"] == steps * policy.peers * 5 * 4


@pytest.mark.parametrize("mix_slots", [False, True])
def test_gossip_with_momentum_mixes_the_momentum_only_when_asked(mix_slots):
    steps, num, momentum = 7, 3, 0.9
    policy = sync.Gossip(mix_slots=mix_slots)
    w0, history, _, strategy, rows = fit(policy, steps, num=num, momentum=momentum)
    table = policy.shift_table(num)
    expected = reference.gossip(w0, rows, steps, num, LR, table, policy.weight, momentum,
                                mix_slots)
    other = reference.gossip(w0, rows, steps, num, LR, table, policy.weight, momentum,
                             not mix_slots)
    for t in range(steps):
        close(history[t], expected[t])
    assert np.abs(np.asarray(expected[-1]) - np.asarray(other[-1])).max() > 1e-4
    # Parameters, and with mix_slots the momentum: 5 float32 each, one peer per step.
    assert strategy.communication_stats()["bytes_sent"] == steps * 5 * 4 * (1 + mix_slots)


@pytest.mark.parametrize("num, options, momentum", [
    (3, {}, 0.9),
    (5, {"topology": "random", "peers": 2, "seed": 3}, 0.0),
])
def test_gossip_mixes_the_gradients_before_the_step_when_asked(num, options, momentum):
    steps = 7
    policy = sync.Gossip(mix_gradients=True, **options)
    w0, history, final, strategy, rows = fit(policy, steps, num=num, momentum=momentum)
    table = policy.shift_table(num)
    expected = reference.gossip(w0, rows, steps, num, LR, table, policy.weight, momentum,
                                mix_gradients=True)
    plain = reference.gossip(w0, rows, steps, num, LR, table, policy.weight, momentum)
    for t in range(steps):
        close(history[t], expected[t])
    assert np.abs(np.asarray(expected[-1]) - np.asarray(plain[-1])).max() > 1e-4
    close(final, [np.mean(history[-1], axis=0)] * num)
    stats = strategy.communication_stats()
    # Gradients and parameters, p peers x 5 float32 each per step; one reduction per step.
    assert stats["bytes_sent"] == steps * 2 * policy.peers * 5 * 4
    assert stats["reductions"] == steps


def test_gossip_of_gradients_and_parameters_on_two_replicas_is_synchronous_sgd():
    steps = 6
    w0, history, _, strategy, rows = fit(sync.Gossip(mix_gradients=True), steps, num=2)
    close(history[-1], reference.synchronous(w0, rows, steps, 2, LR))
    assert strategy.communication_stats()["consensus_distance"] < 1e-6


@pytest.mark.parametrize("mix_gradients", [False, True])
def test_gossip_without_mixing_is_independent_training(mix_gradients):
    steps, num = 6, 3
    w0, history, _, _, rows = fit(sync.Gossip(mixing=0.0, mix_gradients=mix_gradients),
                                  steps, num=num)
    expected = reference.gossip(w0, rows, steps, num, LR, [[1]], 0.0)
    for t in range(steps):
        close(history[t], expected[t])


@pytest.mark.parametrize("options, message", [
    ({"topology": "star"}, r"Argument `topology` must be one of 'exponential', 'ring', "
                           r"'random'; received 'star'\."),
    ({"topology": "ring", "peers": 3}, r"Argument `peers` must be 1 or 2 with "
                                       r"topology='ring'"),
    ({"peers": 2, "mixing": 0.6}, r"Argument `mixing` must be in \[0, 1 / peers\] = "
                                  r"\[0, 0\.5\]; received 0\.6\."),
    ({"peers": 0}, r"Argument `peers` must be an integer >= 1; received 0\."),
    ({"mix_slots": "yes"}, r"Argument `mix_slots` must be True or False; received 'yes'\."),
    ({"mix_gradients": 1}, r"Argument `mix_gradients` must be True or False; received 1\."),
])
def test_gossip_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        sync.get({"name": "gossip", **options})


def test_gossip_refuses_a_single_replica():
    with pytest.raises(ValueError, match=r"sync='gossip' needs at least 2 replicas to exchange "
                                         r"parameters; this strategy has 1\. Launch more"):
        fit(sync.Gossip(), 2, num=1)


def test_gossip_refuses_more_peers_than_the_graph_has():
    with pytest.raises(ValueError, match=r"Argument `peers` = 2 is more than "
                                         r"topology='exponential' offers with 2 replicas"):
        fit(sync.Gossip(peers=2), 2, num=2)


@pytest.mark.parametrize("mix_gradients", [False, True])
def test_gossip_on_the_graph_engine(mix_gradients):
    steps, num = 5, 3
    policy = sync.Gossip(topology="random", peers=2, seed=1, mix_gradients=mix_gradients)
    w0, history, _, _, rows = fit(policy, steps, num=num, engine="tf")
    expected = reference.gossip(w0, rows, steps, num, LR, policy.shift_table(num),
                                policy.weight, mix_gradients=mix_gradients)
    for t in range(steps):
        close(history[t], expected[t])
