"""`compile(jit_compile=True)` under a tfdist_ext strategy: XLA for the compute only.

Keras' TF trainer compiles its whole step function with XLA when
`jit_compile` is true (Keras' "auto" turns it on where a GPU is visible).
Under a strategy the step contains the gradient all-reduce, and neither
TF's collective ops nor tfdist_ext's (`Tfdist*`) have XLA kernels, so such a
step failed to compile ("Detected unsupported operations ... TfdistUcxRun").

Here the step function is traced without `jit_compile` and every op it makes
is marked for XLA except the collectives (`tf.xla.experimental.jit_scope`
with a per-op rule). TF's clustering pass then compiles the ops between two
collectives (the forward and backward pass, the optimizer's update) as XLA
clusters, and the collectives run between them as ordinary ops; a cluster
never contains both an op before a collective and one after it.

With one replica in the whole job there are no collectives and Keras' own
whole-step compilation is kept.

TF's oneDNN CPU kernels mishandle empty batches, which a replica can get at
the end of an uneven dataset, so `tfdist_ext.keras.uneven` runs convolutions
and pooling on one zero sample instead; while a clustered step is traced
(`tracing`) it does so in a form XLA compiles.
"""

import threading

import tensorflow as tf

_tracing = threading.local()

# Ops that stay outside XLA clusters: TF's collectives, NCCL's, and tfdist_ext's
# own (the transport, the parameter-server mailbox and the C++ codecs).
_NOT_COMPILED_PREFIXES = ("Collective", "Nccl", "Tfdist")


def compilable(node_def) -> bool:
    """Whether an op may join an XLA cluster (`jit_scope`'s per-op rule)."""
    return not node_def.op.startswith(_NOT_COMPILED_PREFIXES)


def applies(model, strategy) -> bool:
    """Whether `model`'s step under `strategy` needs the collectives kept out of XLA."""
    return (bool(getattr(model, "jit_compile", False)) and not model.run_eagerly
            and strategy.num_replicas_in_sync > 1)


def clustered(step):
    """`step` with every op but the collectives marked for XLA clusters.

    Call the result only while a `tf.function` traces it (Keras' step function
    does).
    """

    def clustered_step(data):
        _tracing.active = True
        try:
            with tf.xla.experimental.jit_scope(compile_ops=compilable,
                                               separate_compiled_gradients=False):
                return step(data)
        finally:
            _tracing.active = False

    return clustered_step


def tracing() -> bool:
    """Whether this thread is tracing a `clustered` step."""
    return getattr(_tracing, "active", False)


def build_without_whole_step_jit(model, build):
    """Runs `build()` (Keras' `make_*_function`) with `jit_compile` off, then restores it.

    Keras reads `model.jit_compile` while it wraps the step function; the step
    passed to it is already `clustered`.
    """
    jit_compile, model.jit_compile = model.jit_compile, False
    try:
        return build()
    finally:
        model.jit_compile = jit_compile
