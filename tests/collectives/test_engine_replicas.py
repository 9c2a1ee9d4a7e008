"""Both engines with logical-CPU replicas in this process, against numpy and "native".

One tf.function per (engine, algorithm, replicas) reduces every dtype x size
at once (see engine_cases.py), so the whole matrix costs one trace per case.
"""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext import collectives

import engine_cases as cases

REPLICAS = (1, 2, 3, 4, 5)
# CI time: every algorithm at 3 replicas (odd, not a power of two) on both engines, 5 on
# the UCX schedules; on the graph engine 5 only for the schedules that fold a remainder
# onto a power of two (butterfly, halving-doubling: 5 runs their 4-replica core too), 1
# and 2 replicas for the ring, and 8 on the UCX schedules (halving-doubling without a
# remainder). tests/collectives/test_schedules.py runs every schedule in numpy at 1-16.
TF_REPLICAS = (3,)
TF_EXTRA = [("tf", "ring", 1), ("tf", "ring", 2), ("tf", "butterfly", 5),
            ("tf", "halving_doubling", 5)]


@functools.lru_cache(maxsize=None)
def _numpy_inputs(rank):
    return cases.numpy_inputs(rank)


def _run(strategy, replica_fn):
    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: cases.tf_inputs(ctx.replica_id_in_sync_group))
    fn = tf.function(lambda x: strategy.run(replica_fn, args=(x,)))
    results = [tuple([t.numpy() for t in part] for part in r)
               for r in strategy.experimental_local_results(fn(inputs))]
    # The per-tensor SUM reads buffers the caller still holds: out of place.
    for rank, held in enumerate(strategy.experimental_local_results(inputs)):
        for k, (x, ref) in enumerate(zip(held, _numpy_inputs(rank))):
            np.testing.assert_array_equal(x.numpy().astype(ref.dtype), ref,
                                          err_msg=f"input {k} of replica {rank} was changed")
    return results, fn.get_concrete_function(inputs).graph


def _native_by_dtype(inputs):
    # TF's native path concatenates every dtype into one pack and fails on
    # mixed dtypes, so reduce one dtype at a time. It also crashes the process
    # (segfault, TF 2.21) on an empty float64/int64 input that arrives as a
    # function argument, so empty tensors are compared to numpy only.
    sums, means = [tf.zeros([0])] * len(inputs), [tf.zeros([0])] * len(inputs)
    for dtype in cases.DTYPES:
        idx = [k for k, (d, size) in enumerate(cases.CASES) if d == dtype and size]
        s, m = cases.replica_fn([inputs[k] for k in idx])
        for k, a, b in zip(idx, s, m):
            sums[k], means[k] = a, b
    return sums, means


@functools.lru_cache(maxsize=None)
def _native(num_replicas):
    results, _ = _run(tfdist_ext.Strategy(num_replicas=num_replicas, allreduce="native"),
                      _native_by_dtype)
    return results


def test_every_algorithm_is_a_valid_allreduce_option():
    for name in collectives.ALGORITHMS.names():
        assert name in collectives.available_algorithms()
        assert tfdist_ext.Strategy(num_replicas=2, allreduce=name).config.allreduce.algorithm == name
    assert "auto" in collectives.available_algorithms()


# The UCX engine sums logical replicas in process whatever the algorithm (the same op
# and plan): every replica count once, each algorithm's name at 3 replicas. "ucx-schedules"
# makes it run each algorithm's schedules over UCX between the replicas instead.
UCX_IN_PROCESS = [("ucx", name, n) for name in collectives.ALGORITHMS.names()
                  for n in (REPLICAS if name == "ring" else (3,))]
UCX_SCHEDULES = [("ucx-schedules", name, n) for name in collectives.ALGORITHMS.names()
                 for n in ((3, 5, 8) if name == "halving_doubling" else (3, 5))]


@pytest.mark.parametrize("engine,name,num_replicas", [
    ("tf", name, n) for name in collectives.ALGORITHMS.names() for n in TF_REPLICAS]
    + TF_EXTRA + UCX_IN_PROCESS + UCX_SCHEDULES)
def test_engine_matches_numpy_and_native(engine, name, num_replicas, monkeypatch):
    if engine == "ucx-schedules":
        monkeypatch.setenv("TFDIST_UCX_IN_PROCESS", "0")
        engine = "ucx"
    strategy = tfdist_ext.Strategy(num_replicas=num_replicas, allreduce=name, engine=engine)
    ucx = strategy.extended.cross_device_ops.engines.main() if engine == "ucx" else None
    if ucx is not None and num_replicas > 1:
        assert ucx.in_process == (os.environ.get("TFDIST_UCX_IN_PROCESS") != "0")
    results, graph = _run(strategy, cases.replica_fn)
    lo, hi = strategy.collective_key_range
    problems = cases.engine_problems(cases.collective_ops(graph), (lo + (hi - lo) // 2, hi),
                                     num_replicas, engine)
    assert not problems, problems
    inputs = [_numpy_inputs(r) for r in range(num_replicas)]
    problems = cases.check(num_replicas, inputs, *results[0])
    assert not problems, problems
    for replica, result in enumerate(results[1:], 1):  # bit-identical replicas
        for k, (a, b) in enumerate(zip(results[0][0] + results[0][1], result[0] + result[1])):
            assert a.tobytes() == b.tobytes(), (replica, k)
    native = _native(num_replicas)[0]
    for k, (dtype, size) in enumerate(cases.CASES):
        if not size:
            continue
        for op, ours, ref in (("SUM", results[0][0][k], native[0][k]),
                              ("MEAN", results[0][1][k], native[1][k])):
            assert ours.dtype == ref.dtype, (op, dtype.name, size)
            if dtype.is_integer:
                np.testing.assert_array_equal(ours, ref, err_msg=f"{op} {dtype.name}[{size}]")
            else:  # both are within the numpy tolerance; the orders differ
                rtol = {"float16": 1e-2, "bfloat16": 5e-2}.get(dtype.name, 1e-5)
                np.testing.assert_allclose(ours.astype(np.float64), ref.astype(np.float64),
                                           rtol=rtol, atol=rtol * num_replicas,
                                           err_msg=f"{op} {dtype.name}[{size}]")
