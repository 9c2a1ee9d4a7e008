"""PowerSGD inside the strategy against the numpy reference, real collectives.

Gradients reach the strategy as Keras sends them (one batched all-reduce of a
list); TF fuses them into one buffer per dtype in reverse order, which is the
order of `Bucket.shapes`.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfdist_ext
from tfdist_ext import collectives, compression
from tfdist_ext.collectives import cost
from tfdist_ext.compression import PowerSGD
from tests.compression import powersgd_reference as reference

# A Dense kernel, a bias, a convolution kernel, a matrix too small to compress,
# an empty matrix.
SHAPES = [(40, 25), (300,), (3, 3, 4, 5), (6, 4), (0, 3)]
ALGORITHMS = ["native"] + collectives.ALGORITHMS.names()


def gradients(step, replica, dtype="float32", shapes=SHAPES):
    rng = np.random.default_rng(100 * step + replica)
    return [(rng.normal(size=s) * (replica + 1)).astype(dtype) for s in shapes]


def reduce_steps(strategy, steps, dtype="float32", shapes=SHAPES):
    """Every local replica's reduced gradients: out[step][gradient][replica]."""
    @tf.function
    def reduce(per_replica):
        # tf.identity: with one replica per worker the inputs have no device,
        # which TF's reduce path rejects ("destinations can not be empty").
        return strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce(
                "SUM", [tf.identity(t) for t in v]),
            args=(per_replica,))

    out = []
    for step in range(steps):
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx, s=step: [tf.constant(g) for g in gradients(
                s, ctx.replica_id_in_sync_group, dtype, shapes)])
        result = reduce(values)
        out.append([[t.numpy() for t in strategy.experimental_local_results(o)]
                    for o in result])
    return out


def fused(tensors):
    """The strategy's flat buffer of one replica's gradients (reverse order)."""
    return np.concatenate([t.ravel() for t in reversed(tensors)])


def expected_history(compressor, world, steps, dtype="float32", shapes=SHAPES):
    bucket_shapes = list(reversed(shapes))
    n = sum(int(np.prod(s)) for s in shapes)
    key = f"b0_{dtype}_{n}"
    matrices = [compressor.matrix_shape(s) for s in bucket_shapes]
    cols = [m[1] for m in matrices if m is not None]
    q0 = compressor.initial_q(key, cols).numpy()
    buffers = [[fused(gradients(s, r, dtype, shapes)) for r in range(world)]
               for s in range(steps)]
    calc = np.float64 if dtype == "float64" else np.float32
    return key, reference.run(buffers, bucket_shapes, matrices, q0, compressor.rank,
                              compressor.error_feedback, calc)


def test_matrix_view_and_which_gradients_are_compressed():
    c = PowerSGD(rank=2)
    assert c.matrix_shape((40, 25)) == (40, 25)
    assert c.matrix_shape((3, 3, 4, 5)) == (36, 5)      # kernel * in, out
    assert c.matrix_shape((300,)) is None               # vectors go exact
    assert c.matrix_shape(()) is None
    assert c.matrix_shape((6, 4)) is None               # 24 < 2 * (6 + 4) * 2
    assert c.matrix_shape((0, 3)) is None
    assert PowerSGD(rank=1, min_compression_rate=1).matrix_shape((6, 4)) == (6, 4)
    assert PowerSGD(rank=4).matrix_shape((36, 5)) is None  # 180 < 2 * 41 * 4


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_matches_numpy_over_steps_with_feedback_and_warm_start(rank):
    world, steps = 3, 4
    strategy = tfdist_ext.Strategy(num_replicas=world, allreduce="ring",
                                   compression={"name": "powersgd", "rank": rank})
    got = reduce_steps(strategy, steps)
    key, history = expected_history(strategy.config.compression, world, steps)
    for step, (summed, q, residuals) in enumerate(history):
        for replica in range(world):
            flat = fused([got[step][i][replica] for i in range(len(SHAPES))])
            np.testing.assert_allclose(flat, summed, rtol=2e-4, atol=2e-4,
                                       err_msg=f"step {step} replica {replica}")
    for replica in range(world):  # the state after the last step
        np.testing.assert_allclose(strategy.state.residuals[f"{key}_powersgd_q"][replica],
                                   q, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(strategy.state.residuals[key][replica], residuals[replica],
                                   rtol=2e-4, atol=2e-4)


def test_error_feedback_invariant_nothing_is_lost():
    """Sum of results + residuals == sum of every replica's gradients, over steps."""
    world, steps = 3, 5
    strategy = tfdist_ext.Strategy(num_replicas=world, compression="powersgd")
    got = reduce_steps(strategy, steps)
    results = sum(fused([got[s][i][0] for i in range(len(SHAPES))]) for s in range(steps))
    key = f"b0_float32_{sum(int(np.prod(s)) for s in SHAPES)}"
    residuals = sum(v.numpy() for v in strategy.state.residuals[key])
    grads = sum(fused(gradients(s, r)) for s in range(steps) for r in range(world))
    np.testing.assert_allclose(results + residuals, grads, rtol=1e-4, atol=1e-3)
    assert np.abs(residuals).max() > 0.1  # the low-rank approximation did drop something


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_gives_the_reference_and_counts_its_bytes(algorithm):
    world = 3
    strategy = tfdist_ext.Strategy(num_replicas=world, allreduce=algorithm,
                                   compression="powersgd")
    got = reduce_steps(strategy, 2)
    _, history = expected_history(strategy.config.compression, world, 2)
    for step in range(2):
        flat = fused([got[step][i][0] for i in range(len(SHAPES))])
        np.testing.assert_allclose(flat, history[step][0], rtol=2e-4, atol=2e-4)
    # Round 1: the exact gradients and P (rows x 2); round 2: Q (cols x 2).
    first = 300 + 24 + 40 * 2 + 36 * 2
    second = 25 * 2 + 5 * 2
    dense = sum(int(np.prod(s)) for s in SHAPES)
    stats = strategy.communication_stats()
    sent = sum(4 * cost.elements_sent(algorithm, world, 0, m) for m in (first, second))
    assert stats["bytes_sent"] == 2 * sent
    assert stats["dense_bytes"] == 2 * 4 * cost.elements_sent(algorithm, world, 0, dense)


@pytest.mark.parametrize("world", [2, 5])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_other_dtypes_and_world_sizes(world, dtype):
    if dtype == "bfloat16":
        np_dtype = tf.bfloat16.as_numpy_dtype
    else:
        np_dtype = dtype
    shapes = [(20, 12), (7,)]
    strategy = tfdist_ext.Strategy(num_replicas=world, allreduce="butterfly",
                                   compression={"name": "powersgd", "rank": 1})
    got = reduce_steps(strategy, 2, np_dtype, shapes)
    _, history = expected_history(strategy.config.compression, world, 2, dtype, shapes)
    tolerance = {"float16": 0.05, "bfloat16": 0.3, "float64": 1e-10}[dtype]
    for step in range(2):
        flat = fused([got[step][i][world - 1] for i in range(len(shapes))]).astype(np.float64)
        assert got[step][0][0].dtype == np_dtype
        # Half-precision inputs round differently than the float32 reference.
        np.testing.assert_allclose(flat, history[step][0], rtol=tolerance, atol=tolerance)


def test_checkpoint_restores_q_and_residuals(tmp_path):
    world = 2
    config = {"name": "powersgd", "rank": 2}
    strategy = tfdist_ext.Strategy(num_replicas=world, compression=config)
    reduce_steps(strategy, 2)
    path = tf.train.Checkpoint(tfdist=strategy.state).save(str(tmp_path / "ckpt"))
    saved = {k: [v.numpy() for v in vs] for k, vs in strategy.state.residuals.items()}
    assert len(saved) == 2 and all(np.abs(v).max() > 0 for vs in saved.values() for v in vs)
    continued = reduce_steps(strategy, 3)[2]

    other = tfdist_ext.Strategy(num_replicas=world, compression=config)
    tf.train.Checkpoint(tfdist=other.state).restore(path)
    for _ in range(2):  # two steps to bring the step counter (seeds) level
        other.state.steps[0].assign_add(1)
        other.state.steps[1].assign_add(1)
    resumed = reduce_steps(other, 3)[2]
    for a, b in zip(continued, resumed):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


def test_fit_trains_and_sends_fewer_bytes():
    import keras  # pylint: disable=import-outside-toplevel

    strategy = tfdist_ext.Strategy(num_replicas=2, compression="powersgd")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 32)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(32, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    history = model.fit(x, y, batch_size=32, epochs=5, verbose=0).history["loss"]
    assert history[-1] < 0.5 * history[0], history
    assert strategy.communication_stats()["compression_ratio"] > 5


@pytest.mark.parametrize("options, message", [
    ({"rank": 0}, r"Argument `rank` of PowerSGD must be an integer >= 1; received 0\."),
    ({"rank": 2.0}, r"Argument `rank` of PowerSGD must be an integer >= 1; received 2\.0\."),
    ({"min_compression_rate": 0.5},
     r"Argument `min_compression_rate` of PowerSGD must be a number >= 1; received 0\.5\. "
     r"It is the least size reduction"),
    ({"min_compression_rate": "2"}, r"`min_compression_rate` of PowerSGD must be a number"),
    ({"warmup_steps": -1}, r"Argument `warmup_steps` of PowerSGD must be an integer >= 0"),
    ({"error_feedback": 1}, r"Argument `error_feedback` of PowerSGD must be True or False"),
])
def test_bad_options_name_the_argument(options, message):
    with pytest.raises(ValueError, match=message):
        compression.get({"name": "powersgd", **options})


@pytest.mark.multiworker
def test_two_workers_match_the_reference(tmp_path):
    from conftest import ROOT, launch, read_worker_json  # pylint: disable=import-outside-toplevel

    code, out, _ = launch(2, [ROOT / "tests" / "workers" / "powersgd_checks.py", tmp_path],
                          timeout=300)
    assert code == 0, out[-3000:]
    results = read_worker_json(tmp_path, 2)
    _, history = expected_history(PowerSGD(), 2, 3)
    for case, first in results[0].items():
        for step, (summed, _, _) in enumerate(history):
            for worker in range(2):
                np.testing.assert_allclose(results[worker][case]["steps"][step], summed,
                                           rtol=2e-4, atol=2e-4, err_msg=f"{case} step {step}")
        assert first["stats"]["compression_ratio"] > 2, (case, first["stats"])
