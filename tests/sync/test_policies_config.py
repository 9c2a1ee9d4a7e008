"""Sync policy configuration: names, defaults and bad input."""

import pytest

import tfdist_ext
from tfdist_ext import sync


@pytest.mark.parametrize("name, cls", [
    ("sync", sync.Synchronous), ("local_sgd", sync.LocalSGD),
    ("stale_synchronous", sync.StaleSynchronous),
    ("delayed_averaging", sync.DelayedAveraging), ("model_averaging", sync.ModelAveraging)])
def test_every_policy_has_a_name_with_defaults(name, cls):
    policy = sync.get(name)
    assert isinstance(policy, cls) and policy.name == name
    assert sync.get({"name": name}) == policy


@pytest.mark.parametrize("policy, message", [
    (lambda: sync.LocalSGD(period=0), r"Argument `period` must be an integer >= 1; received 0"),
    (lambda: sync.LocalSGD(period=2.5), r"`period` must be an integer >= 1; received 2.5"),
    (lambda: sync.LocalSGD(warmup_steps=-1),
     r"`warmup_steps` must be an integer >= 0; received -1"),
    (lambda: sync.StaleSynchronous(staleness=0),
     r"`staleness` must be an integer >= 1; received 0"),
    (lambda: sync.DelayedAveraging(delay=-2), r"`delay` must be an integer >= 1; received -2"),
    (lambda: sync.ModelAveraging(learners_per_device=0),
     r"`learners_per_device` must be an integer >= 1; received 0"),
    (lambda: sync.ModelAveraging(alpha=1.5), r"`alpha` must be in \(0, 1\] or None"),
    (lambda: sync.ModelAveraging(momentum=1.0),
     r"`momentum` must be in \[0, 1\) or None \(0.9, or 0 with SGD \+ momentum\); received 1.0"),
    (lambda: sync.get({"name": "local_sgd", "periods": 3}), r"periods"),
])
def test_bad_policy_arguments_are_rejected(policy, message):
    with pytest.raises(ValueError, match=message):
        policy()


@pytest.mark.parametrize("compression", ["topk", "qsgd", "powersgd"])
@pytest.mark.parametrize("policy", ["stale_synchronous", "delayed_averaging"])
def test_in_flight_rounds_refuse_compressors_that_need_more_than_one_all_reduce(
        policy, compression):
    needs = "two all-reduces" if compression == "powersgd" else "an all-gather"
    with pytest.raises(ValueError, match=(
            rf"sync='{policy}' holds each step's gradient all-reduce in flight, which takes "
            rf"one-round reducible compressors \('fp16', 'bf16', 'randomk'\); "
            rf"compression='{compression}' needs {needs} per step")):
        tfdist_ext.Strategy(sync=policy, compression=compression, num_replicas=2)


@pytest.mark.parametrize("policy", ["stale_synchronous", "delayed_averaging"])
@pytest.mark.parametrize("compression", ["fp16", "bf16", "randomk"])
def test_in_flight_rounds_take_reducible_compressors(policy, compression):
    tfdist_ext.Strategy(sync=policy, compression=compression, num_replicas=2)


@pytest.mark.parametrize("policy", ["model_averaging"])
@pytest.mark.parametrize("compression", ["topk", "qsgd", "fp16", "powersgd"])
def test_policies_that_do_not_reduce_gradients_each_step_refuse_compression(policy,
                                                                            compression):
    with pytest.raises(ValueError, match=(
            rf"Arguments `sync` and `compression` conflict: sync='{policy}' communicates "
            rf".*compression='{compression}'.*Use compression='none' with sync='{policy}', "
            rf"or sync='sync' with compression='{compression}'")):
        tfdist_ext.Strategy(sync=policy, compression=compression, num_replicas=2)


def test_synchronous_accepts_every_compressor():
    tfdist_ext.Strategy(sync="sync", compression="topk", num_replicas=2)


@pytest.mark.parametrize("compression", ["topk", "qsgd", "fp16", "powersgd"])
def test_local_sgd_accepts_compressors_of_its_parameter_changes(compression):
    tfdist_ext.Strategy(sync="local_sgd", compression=compression, num_replicas=2)
