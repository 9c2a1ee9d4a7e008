"""Worker program for tests/test_horovod.py (run under tfdist-run).

    python horovod_checks.py api|training

`api`: every collective of `tfdist_ext.horovod.tensorflow` against numpy,
eagerly and in a tf.function. `training`: Horovod-style Keras training
(`DistributedOptimizer`, the broadcast and metric callbacks, with
`backward_passes_per_step=2`) and a `DistributedGradientTape` loop, each
against single-process Keras on the global batch. Prints "<mode> ok".
"""

import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext
import tfdist_ext.horovod.tensorflow as hvd_tf
import tfdist_ext.horovod.tensorflow.keras as hvd

PER_WORKER = 8


def value(rank, shape, dtype):
    rng = np.random.default_rng(100 + rank)
    data = rng.normal(size=shape) * 10
    return data.astype(dtype)


def check_api():
    size, rank = hvd.size(), hvd.rank()
    assert (hvd_tf.local_size(), hvd_tf.local_rank(), hvd_tf.cross_size(),
            hvd_tf.cross_rank()) == (size, rank, 1, 0)
    for dtype in ("float32", "float64", "int32", "float16"):
        for shape in ((), (0,), (5,), (3, 7)):
            mine = value(rank, shape, dtype)
            every = np.stack([value(r, shape, dtype) for r in range(size)])
            got_sum = hvd_tf.allreduce(tf.constant(mine), op=hvd_tf.Sum).numpy()
            got_avg = hvd_tf.allreduce(tf.constant(mine)).numpy()
            want_sum = every.sum(0, dtype=np.float64)
            tol = {"float16": 2e-2, "float32": 1e-6, "float64": 1e-12, "int32": 0}[dtype]
            np.testing.assert_allclose(got_sum, want_sum.astype(dtype), rtol=tol, atol=tol * 10)
            want_avg = (np.trunc(want_sum / size) if dtype == "int32" else want_sum / size)
            np.testing.assert_allclose(got_avg, want_avg.astype(dtype), rtol=tol, atol=tol * 10)
            assert got_sum.dtype == np.dtype(dtype) and got_sum.shape == shape
    mine = value(rank, (4,), "float32")
    every = np.stack([value(r, (4,), "float32") for r in range(size)])
    np.testing.assert_allclose(
        hvd_tf.allreduce(tf.constant(mine), compression=hvd_tf.Compression.fp16).numpy(),
        every.mean(0), rtol=2e-3, atol=2e-2)
    np.testing.assert_allclose(
        hvd_tf.allreduce(tf.constant(mine), op=hvd_tf.Sum, prescale_factor=2.0,
                         postscale_factor=0.5).numpy(), every.sum(0), rtol=1e-6)
    # Booleans: Sum is "any", Average (sum, truncating division) is "all".
    flags = tf.constant([True, rank == 0, False])
    assert hvd_tf.allreduce(flags, op=hvd_tf.Sum).numpy().tolist() == [True, True, False]
    assert hvd_tf.allreduce(flags).numpy().tolist() == [True, size == 1, False]
    grouped = hvd_tf.grouped_allreduce([tf.constant(mine), tf.constant([rank, 1])], op=hvd_tf.Sum)
    np.testing.assert_allclose(grouped[0].numpy(), every.sum(0), rtol=1e-6)
    assert grouped[1].numpy().tolist() == [sum(range(size)), size]
    # allgather: first dimensions differ across ranks; bools too.
    gathered = hvd_tf.allgather(tf.fill([rank + 1, 2], float(rank))).numpy()
    assert gathered.tolist() == [[float(r)] * 2 for r in range(size) for _ in range(r + 1)]
    flags = hvd_tf.allgather(tf.constant([rank % 2 == 0])).numpy().tolist()
    assert flags == [r % 2 == 0 for r in range(size)], flags
    # broadcast and broadcast_variables.
    assert hvd_tf.broadcast(tf.constant([rank, 7]), root_rank=1).numpy().tolist() == [1, 7]
    var = tf.Variable(value(rank, (3, 2), "float32"))
    hvd_tf.broadcast_variables([var], root_rank=size - 1)
    np.testing.assert_array_equal(var.numpy(), value(size - 1, (3, 2), "float32"))
    # alltoall: rank r sends (s + 1) rows of value r * 10 + s to rank s.
    splits = [s + 1 for s in range(size)]
    rows = np.concatenate([np.full((s + 1, 2), rank * 10 + s) for s in range(size)])
    received, got_splits = hvd_tf.alltoall(tf.constant(rows, tf.int32), splits=splits)
    want = np.concatenate([np.full((rank + 1, 2), s * 10 + rank) for s in range(size)])
    np.testing.assert_array_equal(received.numpy(), want)
    assert got_splits.numpy().tolist() == [rank + 1] * size

    @tf.function
    def in_graph(x):
        return hvd_tf.allreduce(x, op=hvd_tf.Sum), hvd_tf.allgather(x[:rank + 1])

    for step in range(2):
        reduced, gathered = in_graph(tf.constant(mine) + step)
        np.testing.assert_allclose(reduced.numpy(), every.sum(0) + size * step, rtol=1e-6)
        want = np.concatenate([every[r][:r + 1] + step for r in range(size)])
        np.testing.assert_allclose(gathered.numpy(), want, rtol=1e-6)
    for call, text in ((lambda: hvd_tf.allreduce(tf.ones(2), op=hvd_tf.Adasum), "Adasum"),
                       (lambda: hvd_tf.broadcast(tf.ones(2), root_rank=size),
                        f"Argument `root_rank` must be an integer in [0, {size})")):
        try:
            call()
        except ValueError as err:
            assert text in str(err), err
        else:
            raise AssertionError(f"no error for {text}")


def data(size, batches):
    rng = np.random.default_rng(0)
    n = size * PER_WORKER * batches
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 3))).argmax(1).astype("int32")
    return x, y


def shard(array, size, rank):
    """Rank r's rows of each global batch: the global batch is the ranks' batches in order."""
    blocks = array.reshape(-1, size, PER_WORKER, *array.shape[1:])
    return blocks[:, rank].reshape(-1, *array.shape[1:])


def build(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(3)])


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def reference(x, y, batch, epochs, lr):
    model = build(0)
    model.compile(optimizer=keras.optimizers.Adam(lr), loss=LOSS)
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


def close(got, want, what):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=what)


def check_training():
    size, rank = hvd.size(), hvd.rank()
    x, y = data(size, 6)
    xs, ys = shard(x, size, rank), shard(y, size, rank)
    lr = 0.01 * size
    for passes in (1, 2):
        model = build(rank)  # different start on each rank: the broadcast must fix it
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr),
                                       backward_passes_per_step=passes,
                                       average_aggregated_gradients=True)
        model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
        history = model.fit(xs, ys, batch_size=PER_WORKER, epochs=2, shuffle=False,
                            verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                                  hvd.callbacks.MetricAverageCallback()])
        want = reference(x, y, size * PER_WORKER * passes, 2, lr)
        close(model.get_weights(), want, f"DistributedOptimizer, backward_passes_per_step={passes}")
        every = hvd.allgather(tf.constant([history.history["loss"][-1]])).numpy()
        assert np.all(every == every[0]), every  # MetricAverageCallback: one value everywhere

    # A tfdist_ext compressor per optimizer: top-k with error feedback, same on every rank.
    model = build(rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr),
                                   compression=tfdist_ext.compression.TopK(0.2))
    model.compile(optimizer=opt, loss=LOSS)
    history = model.fit(xs, ys, batch_size=PER_WORKER, epochs=3, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    flat = tf.concat([tf.reshape(w, [-1]) for w in model.trainable_variables], 0)
    every = hvd.allgather(flat[None]).numpy()
    assert np.all(every == every[0]), "top-k replicas diverged"
    dense = np.concatenate([w.ravel() for w in reference(x, y, size * PER_WORKER, 3, lr)])
    assert np.abs(every[0] - dense).max() > 1e-3, "top-k changed nothing"
    assert history.history["loss"][-1] < 0.8 * history.history["loss"][0], history.history
    assert hvd.strategy(tfdist_ext.compression.TopK(0.2)) is not hvd.strategy()

    model = build(rank)
    opt = keras.optimizers.Adam(lr)

    @tf.function
    def step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(images, training=True))
        tape = hvd_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd_tf.broadcast_variables(model.variables, root_rank=0)
            hvd_tf.broadcast_variables(opt.variables, root_rank=0)
        return loss

    model(xs[:1])
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    for epoch in range(2):
        for i in range(len(xs) // PER_WORKER):
            batch = slice(i * PER_WORKER, (i + 1) * PER_WORKER)
            step(xs[batch], ys[batch], epoch == 0 and i == 0)
    close(model.get_weights(), reference(x, y, size * PER_WORKER, 2, lr),
          "DistributedGradientTape")


def main(mode):
    hvd.init()
    {"api": check_api, "training": check_training}[mode]()
    print(f"{mode} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
