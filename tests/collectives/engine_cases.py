"""Inputs, numpy references and graph checks shared by the engine tests.

Used in-process (tests/collectives/test_engine_replicas.py) and by the worker
program tests/workers/engine_checks.py, so both check the same matrix: every
dtype x every size, SUM through one buffer per tensor and MEAN through one fused
buffer per dtype.
"""

import numpy as np
import tensorflow as tf

DTYPES = (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64)
SIZES = (0, 1, 1000, 2**20 + 3)
CASES = tuple((dtype, size) for dtype in DTYPES for size in SIZES)
COLLECTIVE_OPS = ("CollectiveReduceV2", "CollectiveBcastSendV2", "CollectiveBcastRecvV2")
UCX_OPS = ("TfdistUcxRun",)
ENGINES = ("tf", "ucx")
# bytes_per_pack=1 closes a pack after every tensor: one buffer (and one
# schedule) per size. MEAN uses the strategy's default: one buffer per dtype.
ONE_BUFFER_PER_TENSOR = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1)


def numpy_inputs(rank):
    """The inputs of global replica `rank` (as float64/int64 numpy arrays)."""
    out = []
    for k, (dtype, size) in enumerate(CASES):
        rng = np.random.default_rng([rank, k])
        if dtype.is_integer:
            out.append(rng.integers(-1000, 1000, size).astype(np.int64))
        else:  # values exactly representable in the dtype
            x = rng.standard_normal(size).astype(np.float32)
            out.append(tf.cast(tf.cast(x, dtype), tf.float64).numpy())
    return out


def tf_inputs(rank):
    return [tf.cast(x, dtype) for x, (dtype, _) in zip(numpy_inputs(rank), CASES)]


def replica_fn(inputs):
    """SUM (one buffer per tensor) and MEAN (fused) of `inputs` in replica context."""
    ctx = tf.distribute.get_replica_context()
    # With one replica the inputs are plain function arguments without a
    # device, which TF's reduce path rejects ("destinations can not be empty").
    inputs = [tf.identity(x) for x in inputs]
    return (ctx.all_reduce("SUM", inputs, options=ONE_BUFFER_PER_TENSOR),
            ctx.all_reduce("MEAN", inputs))


def check(world_size, all_inputs, sums, means):
    """Compares one replica's results to numpy; returns a list of problems."""
    problems = []
    for k, (dtype, size) in enumerate(CASES):
        stack = np.stack([inputs[k] for inputs in all_inputs])
        exact = stack.sum(axis=0)
        where = f"{dtype.name}[{size}]"
        for op, got, expected in (("SUM", sums[k], exact), ("MEAN", means[k], exact / world_size)):
            got = np.asarray(got)
            # Integer MEAN is a float64 true division, as in TF's native path;
            # with one replica TF returns the value itself before any
            # cross-device op runs.
            want_dtype = (np.float64 if op == "MEAN" and dtype.is_integer and world_size > 1
                          else dtype.as_numpy_dtype)
            if got.dtype != want_dtype or got.shape != (size,):
                problems.append(f"{op} {where}: got {got.dtype}{got.shape}")
                continue
            got = got.astype(np.float64)
            if dtype.is_integer and op == "SUM":
                bad = np.flatnonzero(got != expected)
            elif dtype.is_integer:  # exact sum; grappler may turn "/ p" into "* (1 / p)"
                bad = np.flatnonzero(np.abs(got - expected) > 4e-16 * np.abs(expected))
            else:
                eps = float(np.finfo(np.float16).eps) if dtype == tf.float16 else (
                    2.0**-7 if dtype == tf.bfloat16 else float(np.finfo(dtype.as_numpy_dtype).eps))
                # Worst-case rounding of any summation order, plus the final
                # rounding of the MEAN division.
                tol = (world_size + 1) * eps * np.abs(stack).sum(axis=0)
                if op == "MEAN":
                    tol = tol / world_size + eps * np.abs(expected)
                bad = np.flatnonzero(np.abs(got - expected) > tol)
            if bad.size:
                i = bad[0]
                problems.append(f"{op} {where}: {bad.size} bad elements, first [{i}] = "
                                f"{got[i]!r}, expected {expected[i]!r}")
    return problems


def collective_ops(graph):
    """[(op type, dtype name, group key)] of every collective in a FuncGraph."""
    found = []
    for op in graph.get_operations():
        if op.type in COLLECTIVE_OPS:
            names = [arg.name for arg in op.op_def.input_arg]
            key = tf.get_static_value(op.inputs[names.index("group_key")])
            found.append((op.type, op.get_attr("T").name, int(key)))
        elif op.type == "Bitcast" and op.get_attr("T") == tf.bfloat16:
            found.append((op.type, "bfloat16", None))
        elif op.type in UCX_OPS:
            found.append((op.type, op.get_attr("T").name, None))
    return found


def ucx_host_sums(graph):
    """[UCX ops summing through shared memory, all UCX ops] in a FuncGraph."""
    ops = [op for op in graph.get_operations() if op.type in UCX_OPS]
    return [sum(bool(op.get_attr("host_sum")) for op in ops), len(ops)]


def engine_problems(ops, pair_keys, world_size, engine="tf"):
    """Why `ops` do not show that `engine` ("tf" or "ucx") reduced every dtype."""
    lo, hi = pair_keys
    if world_size == 1:
        return [f"{len(ops)} collectives for one replica"] if ops else []
    wrong = [op for op in ops if (op[0] in UCX_OPS) != (engine == "ucx")
             and op[0] != "Bitcast"]
    if wrong:
        return [f"{len(wrong)} collectives of the other engine, e.g. {wrong[0]}"]
    outside = [op for op in ops if op[2] is not None and not lo <= op[2] < hi]
    problems = [f"{len(outside)} collectives outside the pair key range, e.g. {outside[0]}"
                ] if outside else []
    seen = {dtype for _, dtype, _ in ops}
    missing = [d.name for d in DTYPES if d.name not in seen]
    if missing:
        problems.append(f"no engine collective carries {missing}")
    return problems
