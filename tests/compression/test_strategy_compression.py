"""Compression inside the strategy: every compressor x every algorithm, real collectives.

Gradients reach the strategy as Keras sends them: one batched all-reduce of a
list (merge_call -> batch_reduce_implementation). Both tensors are fused into
one float32 buffer (in reverse order, as TF packs them), compressed per replica
and reduced; the result must equal the sum of what each replica's payload
decompresses to.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext import collectives, compression
from tfdist_ext.compression import transport

SHAPES = [(40, 25), (300,)]
ALGORITHMS = ["native"] + collectives.ALGORITHMS.names()
KEY = "b0_float32_1300"  # the strategy's name for the one fused buffer


def _grads(world):
    rng = np.random.default_rng(7)
    return [[rng.normal(size=s).astype("float32") * (r + 1) for s in SHAPES]
            for r in range(world)]


def _reduce(strategy, grads):
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: [tf.constant(g) for g in grads[ctx.replica_id_in_sync_group]])

    @tf.function
    def step(per_replica):
        return strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce("SUM", v),
            args=(per_replica,))

    out = step(values)
    return [[t.numpy() for t in strategy.experimental_local_results(o)] for o in out]


def _fused(grads_of_replica):
    return np.concatenate([g.ravel() for g in reversed(grads_of_replica)])


def _unfuse(flat):
    sizes = [int(np.prod(s)) for s in reversed(SHAPES)]
    pieces = np.split(flat, np.cumsum(sizes)[:-1])
    return [p.reshape(s) for p, s in zip(reversed(pieces), SHAPES)]


def _round_trip(compressor, flat, rank=0, step=0):
    """What replica `rank`'s payload decompresses to, with the strategy's seed."""
    seed = transport.buffer_seed(compressor, KEY, tf.constant(step, tf.int64), rank)
    payload = compressor.compress(tf.constant(flat), seed)
    return compressor.decompress(payload, flat.size, tf.float32, seed=seed).numpy()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", [n for n in compression.COMPRESSORS.names()
                                  if issubclass(compression.COMPRESSORS.class_for(n),
                                                compression.PayloadCompressor)])
def test_every_compressor_with_every_algorithm(name, algorithm):
    world = 3
    strategy = tfdist_ext.Strategy(num_replicas=world, allreduce=algorithm, compression=name)
    grads = _grads(world)
    results = _reduce(strategy, grads)
    true_sum = [sum(g[i] for g in grads) for i in range(len(SHAPES))]
    compressor = strategy.config.compression
    for replica in range(1, world):  # every replica ends with the same gradient
        for i in range(len(SHAPES)):
            np.testing.assert_array_equal(results[i][replica], results[i][0])
    got = _fused([results[i][0] for i in range(len(SHAPES))])
    expected = sum(_round_trip(compressor, _fused(g), rank) for rank, g in enumerate(grads))
    # Reducible casts are summed in their own precision (operands up to ~10):
    # bf16 keeps 8 significant bits, fp16 11.
    atol = {"bf16": 0.1, "fp16": 0.01}.get(name, 1e-5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=atol)
    if name == "randomk":  # identical indices everywhere: exact sums there
        nonzero = np.flatnonzero(got)
        assert 0 < nonzero.size <= max(1, round(0.01 * got.size)) + 1
        np.testing.assert_allclose(got[nonzero], _fused(true_sum)[nonzero], rtol=1e-5)
    stats = strategy.communication_stats()
    assert stats["reductions"] == 1
    if name == "none":
        assert stats["bytes_sent"] == stats["dense_bytes"] > 0
    else:
        assert 0 < stats["bytes_sent"] < stats["dense_bytes"]


def test_error_feedback_residual_is_kept_per_replica_and_checkpointed(tmp_path):
    world = 2
    strategy = tfdist_ext.Strategy(num_replicas=world, compression={"name": "topk",
                                                                    "ratio": 0.05})
    grads = _grads(world)
    _reduce(strategy, grads)
    (key, variables), = strategy.state.residuals.items()
    compressor = strategy.config.compression
    for replica, variable in enumerate(variables):
        flat = _fused(grads[replica])
        np.testing.assert_allclose(variable.numpy(), flat - _round_trip(compressor, flat),
                                   rtol=1e-6, atol=1e-6)
    path = tf.train.Checkpoint(tfdist=strategy.state).save(str(tmp_path / "ckpt"))
    saved = [v.numpy() for v in variables]
    other = tfdist_ext.Strategy(num_replicas=world, compression={"name": "topk",
                                                                 "ratio": 0.05})
    tf.train.Checkpoint(tfdist=other.state).restore(path)
    _reduce(other, [[np.zeros(s, "float32") for s in SHAPES]] * world)  # creates, restores
    restored = other.state.residuals[key]
    # The zero gradient step sent the top 5% of each restored residual onward.
    for replica in range(world):
        flat = saved[replica]
        np.testing.assert_allclose(restored[replica].numpy(),
                                   flat - _round_trip(compressor, flat), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", compression.COMPRESSORS.names())
def test_fit_on_one_replica_works_with_every_compressor(name):
    import keras  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(num_replicas=1, compression=name)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 5)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert strategy.communication_stats()["bytes_sent"] == 0


def test_momentum_correction_state_per_replica_and_in_the_sum():
    world, steps = 2, 3
    strategy = tfdist_ext.Strategy(num_replicas=world, compression={
        "name": "topk", "ratio": 0.05, "momentum": 0.9})
    compressor = strategy.config.compression
    residual = [tf.zeros([1300]) for _ in range(world)]
    velocity = [tf.zeros([1300]) for _ in range(world)]
    for step in range(steps):
        grads = [[g * (step + 1) for g in replica] for replica in _grads(world)]
        results = _reduce(strategy, grads)
        expected = np.zeros(1300)
        for rank in range(world):
            seed = transport.buffer_seed(compressor, KEY, tf.constant(step, tf.int64), rank)
            payload, residual[rank], velocity[rank] = (
                compression.compress_with_momentum_correction(
                    compressor, tf.constant(_fused(grads[rank])), residual[rank],
                    velocity[rank], seed))
            expected += compressor.decompress(payload, 1300, tf.float32).numpy()
        got = _fused([results[i][0] for i in range(len(SHAPES))])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    state = strategy.state.residuals
    assert set(state) == {KEY, KEY + "_velocity"}
    for rank in range(world):
        np.testing.assert_allclose(state[KEY][rank].numpy(), residual[rank].numpy(), atol=1e-5)
        np.testing.assert_allclose(state[KEY + "_velocity"][rank].numpy(),
                                   velocity[rank].numpy(), atol=1e-5)
        assert np.any(velocity[rank].numpy() != 0)


def _fit_sgd(compression_option, momentum, with_model=False, scale_loss=False):
    import keras  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(num_replicas=2, compression=compression_option)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 5)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05, momentum=momentum)
        if scale_loss:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return (model.get_weights(), model) if with_model else model.get_weights()


@pytest.mark.parametrize("scale_loss", [False, True])
def test_top_k_takes_the_optimizers_momentum_as_dgc_would(scale_loss, caplog):
    """compression="topk" + SGD(momentum=0.9) trains as explicit DGC with plain SGD."""
    import logging  # pylint: disable=import-outside-toplevel

    option = {"name": "topk", "ratio": 0.2}
    with caplog.at_level(logging.INFO, logger="tfdist_ext"):
        moved, model = _fit_sgd(option, 0.9, with_model=True, scale_loss=scale_loss)
    explicit = _fit_sgd(dict(option, momentum=0.9), 0.0, scale_loss=scale_loss)
    for ours, ref in zip(moved, explicit):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    kept = _fit_sgd(dict(option, correct_momentum=False), 0.9)
    assert not all(np.allclose(a, b, atol=1e-5) for a, b in zip(moved, kept))
    sgd = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    assert sgd.momentum == 0.9  # the user's optimizer keeps its momentum
    assert "compression='topk' with SGD(momentum=0.9): the momentum moves into the " \
           "compressor (DGC's momentum correction, masking=True)" in caplog.text


def test_moved_momentum_only_under_sync_with_feedback():
    import keras  # pylint: disable=import-outside-toplevel
    from tfdist_ext import compression  # pylint: disable=import-outside-toplevel
    from tfdist_ext.keras import moved_momentum  # pylint: disable=import-outside-toplevel

    sgd = keras.optimizers.SGD(0.1, momentum=0.5)
    assert moved_momentum.moved(compression.get("topk"), sgd).momentum == 0.5
    assert moved_momentum.moved(compression.get("topk_approx"), sgd).momentum == 0.5
    assert moved_momentum.moved(compression.get("topk"), keras.optimizers.SGD(0.1)) is None
    assert moved_momentum.moved(compression.get("topk"), keras.optimizers.Adam()) is None
    assert moved_momentum.moved(compression.get("powersgd"), sgd) is None
    assert moved_momentum.moved(compression.get(
        {"name": "topk", "error_feedback": False}), sgd) is None
    assert moved_momentum.moved(compression.get(
        {"name": "topk", "correct_momentum": False}), sgd) is None
    with pytest.raises(ValueError, match=r"`correct_momentum` .*True or False"):
        compression.get({"name": "topk", "correct_momentum": "yes"})


def test_fit_with_momentum_correction_refuses_optimizer_momentum_and_sending_all_is_sgd():
    with pytest.raises(ValueError, match=r"applies momentum correction \(DGC\) itself, and the "
                                         r"optimizer SGD also has momentum=0.9: momentum would "
                                         r"be applied twice"):
        _fit_sgd({"name": "topk", "momentum": 0.9}, momentum=0.9)
    # Masking restarts the momentum of every sent value: sending all of them is plain SGD.
    for ours, ref in zip(_fit_sgd({"name": "topk", "ratio": 1.0, "momentum": 0.9}, 0.0),
                         _fit_sgd("none", 0.0)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_warmup_steps_are_dense_and_counted_dense():
    world = 2
    strategy = tfdist_ext.Strategy(num_replicas=world, compression={
        "name": "topk", "ratio": 0.05, "warmup_steps": 2})
    grads = _grads(world)
    true_sum = _fused([sum(g[i] for g in grads) for i in range(len(SHAPES))])
    sent = []
    for step in range(3):
        results = _reduce(strategy, grads)
        got = _fused([results[i][0] for i in range(len(SHAPES))])
        if step < 2:
            np.testing.assert_allclose(got, true_sum, rtol=1e-6)
            assert not strategy.state.residuals[KEY][0].numpy().any()
        else:
            assert np.count_nonzero(got) <= 2 * 65
        stats = strategy.communication_stats()
        sent.append(stats["bytes_sent"] - sum(sent))
    dense = stats["dense_bytes"] // 3
    assert sent[:2] == [dense, dense] and 0 < sent[2] < dense / 5, (sent, dense)
