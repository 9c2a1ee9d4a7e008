"""The UCX engine's own surface: gather/broadcast schedules, start/wait, options.

The all-reduce matrix of every algorithm runs in test_engine_replicas.py and
test_engine_workers.py (both engines); Keras fit in test_engine_workers.py.
"""


import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext.collectives import gather, simulate, ucx_engine
from tfdist_ext.ops import ucx as ucx_ops

needs_ucx = pytest.mark.skipif(ucx_ops.problem() is not None, reason="UCX engine not built")


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_all_gather_schedule_gathers_every_block(p):
    block = 3
    inputs = [np.where(np.arange(p * block) // block == r, r + 1.0, 0.0) for r in range(p)]
    expected = np.repeat(np.arange(1.0, p + 1), block)
    for out in simulate(lambda w, r, n: gather.all_gather_schedule(w, r, n // w), p, inputs):
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_reduce_scatter_schedule_leaves_each_rank_the_sum_of_its_block(p):
    block = 3
    rng = np.random.default_rng(p)
    inputs = [rng.integers(-50, 50, size=p * block).astype(np.float64) for _ in range(p)]
    total = np.sum(inputs, axis=0)
    outs = simulate(lambda w, r, n: gather.reduce_scatter_schedule(w, r, n // w), p, inputs)
    for rank, out in enumerate(outs):
        np.testing.assert_array_equal(out[rank * block:(rank + 1) * block],
                                      total[rank * block:(rank + 1) * block])


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("root", [0, 2])
def test_broadcast_schedule_copies_the_root(p, root):
    if root >= p:
        with pytest.raises(ValueError, match=r"Argument `root` must be a rank in \[0, "):
            gather.broadcast_schedule(p, 0, 4, root=root)
        return
    inputs = [np.full(4, float(r)) for r in range(p)]
    for out in simulate(lambda w, r, n: gather.broadcast_schedule(w, r, n, root=root), p, inputs):
        np.testing.assert_array_equal(out, np.full(4, float(root)))


def test_encode_lays_out_rounds_and_steps():
    # Ring, 2 ranks, rank 0, chunks [0, 2) and [2, 4): reduce-scatter round,
    # then all-gather round.
    schedule = tfdist_ext.collectives.schedule_fn("ring")(2, 0, 4)
    assert ucx_engine.encode(schedule) == [2,
                                           2, 0, 1, 0, 2, 1, 1, 2, 4,
                                           2, 0, 1, 2, 4, 2, 1, 0, 2]


def test_timeout_option_is_validated():
    with pytest.raises(ValueError, match=r"Argument `timeout_seconds` must be a number of "
                                         r"seconds >= 0 \(0 waits forever\); received -1"):
        tfdist_ext.Strategy(allreduce={"name": "ring", "timeout_seconds": -1}, num_replicas=2)


def test_engine_option_is_validated():
    with pytest.raises(ValueError, match=r"Argument `engine` must be one of 'auto', 'ucx', "
                                         r"'tf'; received 'gpu'"):
        tfdist_ext.Strategy(engine="gpu", num_replicas=2)


@needs_ucx
def test_engine_selects_ucx_and_ring_by_default_there():
    strategy = tfdist_ext.Strategy(engine="ucx", num_replicas=2)
    assert strategy.config.engine == "ucx"
    assert strategy.config.allreduce.algorithm == "ring"
    assert tfdist_ext.Strategy(num_replicas=2).config.engine == "ucx"  # "auto", built
    assert tfdist_ext.Strategy(num_replicas=2, engine="tf").config.allreduce.algorithm == "native"


@needs_ucx
def test_gather_broadcast_and_start_wait_across_three_replicas():
    strategy = tfdist_ext.Strategy(engine="ucx", num_replicas=3)
    engine = strategy.extended.cross_device_ops.engines.main()
    dtypes = (tf.float32, tf.bfloat16, tf.int64)

    @tf.function
    def run():
        out = []
        for i in range(3):
            with tf.device(engine.devices[i]):
                x = [tf.cast(tf.range(5) + 10 * i, d) for d in dtypes]
                gathered = [engine.all_gather(t, i) for t in x]
                scattered = [engine.reduce_scatter(tf.concat([t] * 3, 0), i) for t in x]
                broadcast = [engine.broadcast(t, i, root=1) for t in x]
                tickets = [engine.start(t, i, "butterfly") for t in x]
                waited = [engine.wait(k, i, 5, d) for k, d in zip(tickets, dtypes)]
                out.append((gathered, broadcast, waited, scattered))
        return out

    results = run()
    base = np.arange(5)
    for gathered, broadcast, waited, scattered in results:
        for k in range(len(dtypes)):
            np.testing.assert_array_equal(
                gathered[k].numpy().astype(np.float64),
                np.concatenate([base + 10 * i for i in range(3)]))
            np.testing.assert_array_equal(broadcast[k].numpy().astype(np.float64), base + 10)
            np.testing.assert_array_equal(waited[k].numpy().astype(np.float64),
                                          3 * base + 30)
            np.testing.assert_array_equal(scattered[k].numpy().astype(np.float64),
                                          3 * base + 30)


@needs_ucx
def test_started_reductions_keep_their_input_across_function_calls():
    """Tickets outlive the step that started them; the kept input is the original."""
    strategy = tfdist_ext.Strategy(engine="ucx", num_replicas=3)
    engine = strategy.extended.cross_device_ops.engines.main()
    n = (1 << 20) + 3  # several segments per step

    @tf.function
    def start(scale):
        tickets = []
        for i in range(3):
            with tf.device(engine.devices[i]):
                x = tf.range(n, dtype=tf.float32) * scale + i  # forwardable: still out of place
                tickets.append(engine.start(x, i, "ring", keep_input=True))
        return tf.stack(tickets)

    @tf.function
    def wait(tickets):
        return [engine.wait(tickets[i], i, n, tf.float32, with_input=True) for i in range(3)]

    first, second = start(tf.constant(1.0)), start(tf.constant(2.0))
    assert engine.finished(tf.concat([first, second], 0)).numpy().shape == (6,)
    base = np.arange(n, dtype=np.float32)
    for tickets, scale in ((second, 2.0), (first, 1.0)):  # any order
        for i, (total, own) in enumerate(wait(tickets)):
            np.testing.assert_array_equal(own.numpy(), base * scale + i)
            np.testing.assert_array_equal(total.numpy(), 3 * (base * scale) + 3)
    assert engine.finished(first).numpy().all()  # awaited tickets count as finished

    @tf.function
    def start_plain():
        return tf.stack([engine.start(tf.ones([4]), i, "ring") for i in range(3)])

    plain = start_plain()
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="did not keep its input .*keep_input=True"):
        engine.wait(plain[0], 0, 4, tf.float32, with_input=True)
    for i in (1, 2):
        np.testing.assert_array_equal(engine.wait(plain[i], i, 4, tf.float32).numpy(), 3.0)


@needs_ucx
def test_in_process_sum_shares_one_buffer_and_names_a_missing_replica():
    # Its own timeout gives this test its own communicators (it breaks them).
    strategy = tfdist_ext.Strategy(engine="ucx", num_replicas=3,
                                   allreduce={"name": "ring", "timeout_seconds": 1.5})
    engine = strategy.extended.cross_device_ops.engines.main()
    assert engine.in_process

    @tf.function
    def reduce(replicas):
        return [engine.all_reduce(tf.identity(tf.fill([7], float(i + 1))), i, "ring")
                for i in replicas]

    for out in reduce([0, 1, 2]):
        np.testing.assert_array_equal(out.numpy(), 6.0)
    with pytest.raises(tf.errors.OpError,  # TF reports it as InternalError in a function
                       match=r"rank [01] of 3: in-process all-reduce: no progress for 1.5 s, "
                             r"waiting for local replica\(s\) 2"):
        reduce([0, 1])


@needs_ucx
def test_a_function_traced_on_one_engine_runs_on_the_next_of_its_slot_key():
    # An elastic job's generations: each engine has new communicators (its own
    # rendezvous name) and takes over the handle slots of the key the ops were built on.
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:3]
    first = ucx_engine.engine_for("slot-test-g1", devices, 3, 0, slot_key="slot-test")
    current = {"engine": first}

    @tf.function
    def gather():
        engine = current["engine"]
        out = []
        for i in range(3):
            with tf.device(engine.devices[i]):
                out.append(engine.all_gather(tf.fill([2], float(i + 1)), i))
        return out

    expected = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    for result in gather():
        np.testing.assert_array_equal(result.numpy(), expected)
    current["engine"] = ucx_engine.engine_for("slot-test-g2", devices, 3, 0,
                                              slot_key="slot-test")
    assert current["engine"] is not first
    first.close()  # its communicators are gone: the slots must address the second's
    for result in gather():  # not traced again
        np.testing.assert_array_equal(result.numpy(), expected)
    assert gather.experimental_get_tracing_count() == 1


@needs_ucx
def test_a_function_traced_before_its_engine_is_wired_up_runs_once_it_is():
    # An elastic replacement traces and runs its step on communicators that meet no peer
    # (rehearsals), then asks to join; the generation it joins wires up and takes over
    # the same slots.
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:3]
    unwired = ucx_engine.engine_for("unwired-test-g0", devices, 3, 0, slot_key="unwired-test",
                                    wire=False)
    assert ucx_engine.engine_for("unwired-test-g0", devices, 3, 0, slot_key="unwired-test",
                                 wire=False) is not unwired  # not kept for later calls
    current = {"engine": unwired}

    @tf.function
    def reduce():
        engine = current["engine"]
        out = []
        for i in range(3):
            with tf.device(engine.devices[i]):
                out.append(engine.all_reduce(tf.fill([5], float(i + 1)), i, "ring"))
        return out

    for i, result in enumerate(reduce()):  # a rehearsal: each result is its input
        np.testing.assert_array_equal(result.numpy(), [i + 1.0] * 5)
    unwired.close()
    current["engine"] = ucx_engine.engine_for("unwired-test-g1", devices, 3, 0,
                                              slot_key="unwired-test")
    for result in reduce():
        np.testing.assert_array_equal(result.numpy(), [6.0] * 5)
    assert reduce.experimental_get_tracing_count() == 1
    current["engine"].close()
    with pytest.raises(ValueError, match=r"Argument `slot_key` is required with wire=False"):
        ucx_engine.UcxEngine("unwired-test-x", devices, 3, 0, wire=False)


def _threads():
    with open("/proc/self/status", encoding="ascii") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def test_closing_an_engine_frees_its_threads_and_empties_its_slots():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]

    @tf.function
    def gather(engine):  # one trace per engine: ranks must run at once
        out = []
        for i in range(2):
            with tf.device(engine.devices[i]):
                out.append(engine.all_gather(tf.fill([1], float(i)), i))
        return out

    engine = ucx_engine.engine_for("close-test-g0", devices, 2, 0, slot_key="close-test")
    before = _threads()
    for generation in range(1, 9):
        engine.close()
        with pytest.raises(tf.errors.FailedPreconditionError, match="does not exist"):
            gather(engine)  # an op on an emptied slot fails naming it
        engine = ucx_engine.engine_for(f"close-test-g{generation}", devices, 2, 0,
                                       slot_key="close-test")
        for result in gather(engine):
            np.testing.assert_array_equal(result.numpy(), [0.0, 1.0])
    assert _threads() <= before + 2  # 8 engines made and 7 closed: 2 threads each otherwise
    engine.close()


@needs_ucx
def test_a_slot_for_an_unknown_communicator_is_refused_naming_it():
    with tf.device("/cpu:0"), pytest.raises(tf.errors.InvalidArgumentError,
                                            match="communicator 987654321 does not exist"):
        ucx_ops.load().tfdist_ucx_alias(0, 987654321)


def test_missing_library_names_the_fix(monkeypatch):
    monkeypatch.setattr(ucx_ops, "_library_path", lambda: None)
    problem = ucx_ops.problem()
    assert "UCX op library is not available" in problem
    assert "pip install 'libucx-cu12>=1.22,<1.23'" in problem
    with pytest.raises(ucx_ops.UcxUnavailableError, match=r"Argument `engine='ucx'`: .*"
                                                          r"pass engine='tf'"):
        tfdist_ext.Strategy(engine="ucx", num_replicas=2)
    with pytest.warns(UserWarning, match=r"Using TF's collectives \(engine='tf'\) instead"):
        assert tfdist_ext.Strategy(num_replicas=2).config.engine == "tf"


def test_a_bad_spin_in_the_environment_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("TFDIST_UCX_SPIN_US", "fast")
    with pytest.raises(ValueError, match=r"Environment variable TFDIST_UCX_SPIN_US must be a "
                                         r"whole number of microseconds >= 0 .*received "
                                         r"'fast'\. Unset it for the default, 200\."):
        ucx_engine.engine_for("spin-check", ["/cpu:0"], 1, 0)
    monkeypatch.setenv("TFDIST_UCX_SPIN_US", "0")
    assert ucx_ops.spin_from_environment() == 0
