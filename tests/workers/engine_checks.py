"""Worker program for tests/collectives/test_engine_workers.py (run under tfdist-run).

    python engine_checks.py OUT_DIR [--fit] [--engine tf|ucx]

For every algorithm (and "hierarchical" with the workers split into two hosts),
one `tfdist_ext.Strategy(allreduce=name, engine=...)` reduces every dtype x
size (tests/collectives/engine_cases.py) across the worker processes; inputs
are seeded by rank, so each worker checks the result against numpy itself, and
records how many UCX ops sum through shared memory; IndexedSlices of uneven
row counts are summed too (all-gathered on the strategy's engine). With --fit (worker 1
refusing shared memory: TFDIST_UCX_SHARED_MEMORY=0), Keras `fit` runs once per
algorithm, once with "auto" and once with "native", and the final weights are
recorded; and
"auto" refines a model that ties three candidates (tests/collectives/
refine_cases.py), recording its timings. Writes OUT_DIR/w<index>.json.
"""

import hashlib
import json
import os
import pathlib
import sys

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "collectives"))
import engine_cases as cases  # noqa: E402  pylint: disable=wrong-import-position
import refine_cases  # noqa: E402  pylint: disable=wrong-import-position

import tfdist_ext  # noqa: E402  pylint: disable=wrong-import-position
from tfdist_ext import collectives  # noqa: E402  pylint: disable=wrong-import-position


def check_reductions(allreduce, num_workers, index, engine):
    strategy = tfdist_ext.Strategy(allreduce=allreduce, engine=engine)
    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: cases.tf_inputs(ctx.replica_id_in_sync_group))
    fn = tf.function(lambda x: strategy.run(cases.replica_fn, args=(x,)))
    sums, means = strategy.experimental_local_results(fn(inputs))[0]
    sums, means = [t.numpy() for t in sums], [t.numpy() for t in means]
    lo, hi = strategy.collective_key_range
    graph = fn.get_concrete_function(inputs).graph
    ops = cases.collective_ops(graph)
    problems = cases.engine_problems(ops, (lo + (hi - lo) // 2, hi), num_workers, engine)
    problems += cases.check(num_workers, [cases.numpy_inputs(r) for r in range(num_workers)],
                            sums, means)
    digest = hashlib.sha256(b"".join(t.tobytes() for t in sums + means)).hexdigest()
    return {"rank": index, "problems": problems, "collectives": len(ops), "sha": digest,
            "host_sums": cases.ucx_host_sums(graph)}


def check_disagreement(index):
    """The error when worker 0 sums fewer elements than the others (own communicators)."""
    strategy = tfdist_ext.Strategy(engine="ucx")
    engine = strategy.extended.cross_device_ops.engines.new(role="disagree")
    try:
        engine.all_reduce(tf.ones([(1 << 18) + (index > 0)]), 0, "ring")
    except tf.errors.UnavailableError as err:
        return {"on_host": engine.on_host, "error": err.message}
    return {"on_host": engine.on_host, "error": None}


def check_refinement(engine):
    strategy = tfdist_ext.Strategy(allreduce={"name": "auto", "calibrate": False,
                                              "calibration_cache": None}, engine=engine)
    refine_cases.tie_refiner(strategy)
    sums, ops = refine_cases.reduce_sizes(strategy)
    return {"problems": refine_cases.problems(strategy, sums, ops),
            "decisions": strategy.allreduce_refinements}


def fit(name, engine):
    if name == "auto":  # probe and refine; no cache, so every run measures
        strategy = tfdist_ext.Strategy(allreduce={"name": "auto", "calibration_cache": None},
                                       engine=engine)
    else:
        strategy = tfdist_ext.Strategy(allreduce=name, engine=engine)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(192, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(24)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    history = model.fit(dataset, epochs=3, verbose=0)
    on_host = getattr(strategy.extended.cross_device_ops.engines.main(), "on_host", None)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return {"loss": history.history["loss"], "weights": weights.tolist(),
            "sha": hashlib.sha256(weights.tobytes()).hexdigest(),
            "refinements": strategy.allreduce_refinements, "on_host": on_host}


def check_sparse(index, num_workers, engine):
    """Embedding-style IndexedSlices of uneven row counts (worker 1 has none), unknown
    when traced, summed across the workers: every worker's rows in worker order."""
    strategy = tfdist_ext.Strategy(engine=engine)
    rows = [0 if w == 1 else 3 * w + 2 for w in range(num_workers)]

    def part(w, dtype):
        ids = np.arange(rows[w], dtype=np.int64) * num_workers + w
        return ids, (np.arange(rows[w] * 6, dtype=np.float32).reshape(-1, 2, 3) / 4 + 100 * w
                     ).astype(dtype.as_numpy_dtype)

    def replica_fn(ids, values):
        slices = tf.IndexedSlices(values, ids, tf.constant([50, 2, 3], tf.int64))
        return tf.distribute.get_replica_context().all_reduce("sum", slices)

    problems, ops = [], set()
    for dtype in (tf.float32, tf.float16):
        step = tf.function(lambda i, v: strategy.run(replica_fn, args=(i, v)),
                           input_signature=[tf.TensorSpec([None], tf.int64),
                                            tf.TensorSpec([None, 2, 3], dtype)])
        ids, values = part(index, dtype)
        result = strategy.experimental_local_results(step(ids, values))[0]
        ops |= {op.type for op in step.get_concrete_function().graph.get_operations()}
        expected = [np.concatenate(p) for p in zip(*(part(w, dtype) for w in range(num_workers)))]
        if not (np.array_equal(result.indices.numpy(), expected[0])
                and np.array_equal(result.values.numpy(), expected[1])):
            problems.append(dtype.name)
    return {"problems": problems, "on_engine": "TfdistUcxAllGatherV" in ops,
            "tf_gather": "CollectiveGatherV2" in ops}


def check_state_broadcast(index):
    """The elastic state broadcast of Keras variables from rank 1, every number dtype and
    bool (complex and uint64 as int64 words, narrow ones widened, zero-length ones
    skipped): the mismatches against rank 1's values, which every worker computes."""
    from tfdist_ext.elastic import state_sync  # pylint: disable=import-outside-toplevel
    strategy = tfdist_ext.Strategy(engine="ucx")
    engine = strategy.extended.cross_device_ops.engines.new(role="state")
    dtypes = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16",
              "uint16", "int32", "uint32", "int64", "uint64", "bool", "complex64",
              "complex128"]

    def values(rank, dtype, size):
        rng = np.random.default_rng(rank * 100 + size)
        ints = rng.integers(-100, 100, size)
        if dtype == "bool":
            return ints > 0
        if dtype.startswith("complex"):
            return (ints + 1j * rng.integers(-100, 100, size)).astype(dtype)
        if dtype.startswith("u"):  # the top bit set: a widening must not lose it
            return np.abs(ints).astype(dtype) | np.array(np.iinfo(dtype).max // 2 + 1, dtype)
        return ints.astype(tf.as_dtype(dtype).as_numpy_dtype)

    cases = [(d, size) for d in dtypes for size in (7, 0)]
    variables = [keras.Variable(values(index, d, size), dtype=d, trainable=False)
                 for d, size in cases]
    state_sync.broadcast(engine, variables, root=1)
    return [f"{d}[{size}]" for v, (d, size) in zip(variables, cases)
            if not np.array_equal(v.numpy(), values(1, d, size))]


def main(out_dir, *flags):
    engine = flags[flags.index("--engine") + 1] if "--engine" in flags else "tf"
    num_workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    names = collectives.ALGORITHMS.names()
    results = {"workers": num_workers}
    if "--fit" not in flags:
        results["reduce"] = {name: check_reductions(name, num_workers, index, engine)
                             for name in names}
        # Workers split into two "hosts" (all share 127.0.0.1, so the layout is given).
        hosts = tuple(2 * i // num_workers for i in range(num_workers))
        results["reduce"]["hierarchical"] = check_reductions(
            {"name": "hierarchical", "hosts": hosts}, num_workers, index, engine)
        results["sparse"] = check_sparse(index, num_workers, engine)
        if engine == "ucx":
            results["disagree"] = check_disagreement(index)
            results["state"] = check_state_broadcast(index)
    else:
        # Worker 1 refuses shared memory, so every worker runs the schedules
        # over UCX (and the fits compare them across processes).
        if index == 1:
            os.environ["TFDIST_UCX_SHARED_MEMORY"] = "0"
        # "native" last: a strategy whose variables are created after a
        # native-path fit in the same process hung in TF's variable-init
        # broadcast (seen with 2 workers, TF 2.21); the reverse order works.
        results["refine"] = check_refinement(engine)
        results["fit"] = {name: fit(name, engine) for name in names + ["auto", "native"]}
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
