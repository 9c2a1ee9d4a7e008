"""The compressor interface: how one gradient bucket is reduced.

The strategy fuses gradients into flat buckets (`collectives.fusion`) and
hands each bucket of each replica to `reduction_hooks.reduce_bucket`, which sends
uncompressible buckets dense and runs the warm-up, then calls the
compressor's reduction hook (PyTorch's `register_comm_hook` is the model):

    compressor.reduce(bucket, comm, state) -> SUM over replicas of bucket.flat

`bucket` carries the flat buffer, the shapes of the gradients in it, its
stable key and the step; `comm` (a `reduction_hooks.Communicator`) is the only way to
talk to the other replicas (all-reduce with the configured algorithm,
all-gather) and counts what is sent; `state` holds per-bucket variables
(residuals, PowerSGD's Q) that checkpoints carry.

Most compressors are `payload.PayloadCompressor`s, whose default hook is
compress, all-reduce or all-gather, decompress; PowerSGD overrides `reduce`.
"""

import numbers

import numpy as np
import tensorflow as tf

from tfdist_ext.registry import Registry

FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_SEED_MULTIPLIER = 1_000_003


# ----------------------------------------------------------------------------
# Constructor argument checks: name the argument, the value and what is allowed.

def check_ratio(owner, arg, value):
    """Validates a fraction in (0, 1]; returns it as a float."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)
            or not 0.0 < value <= 1.0):
        raise ValueError(
            f"Argument `{arg}` of {owner} must be in (0, 1]; received {value!r}. "
            f"It is a fraction of the elements, e.g. 0.01 for 1%.")
    return float(value)


def check_bool(owner, arg, value):
    """Validates a flag that must be exactly True or False."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"Argument `{arg}` of {owner} must be True or False; received {value!r} "
            f"of type {type(value).__name__}.")
    return bool(value)


def check_int(owner, arg, value, minimum, maximum=None):
    """Validates an integer in [minimum, maximum] (no upper bound if None)."""
    is_int = (isinstance(value, (numbers.Integral, np.integer))
              and not isinstance(value, (bool, np.bool_)))
    if not is_int or value < minimum or (maximum is not None and value > maximum):
        allowed = (f"an integer >= {minimum}" if maximum is None
                   else f"an integer in [{minimum}, {maximum}]")
        raise ValueError(f"Argument `{arg}` of {owner} must be {allowed}; received {value!r}.")
    return int(value)


def check_momentum(owner, value, error_feedback):
    """Validates DGC momentum correction: a float in [0, 1), needing error feedback."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)
            or not 0.0 <= value < 1.0):
        raise ValueError(
            f"Argument `momentum` of {owner} must be in [0, 1); received {value!r}. "
            f"Use the momentum you would give SGD (e.g. 0.9), or 0 to turn momentum "
            f"correction off.")
    if value and not error_feedback:
        raise ValueError(
            f"Argument `momentum` of {owner} needs error_feedback=True (the unsent "
            f"velocity accumulates in the residual); received momentum={value!r} with "
            f"error_feedback=False.")
    return float(value)


def as_seed(seed):
    """An int or integer scalar tensor as an int64 scalar tensor."""
    if isinstance(seed, (numbers.Integral, np.integer)) and not isinstance(seed, bool):
        return tf.constant(int(seed), tf.int64)
    if tf.is_tensor(seed) and seed.dtype.is_integer:
        return tf.cast(tf.reshape(seed, []), tf.int64)
    raise TypeError(f"Argument `seed` must be an integer or an integer scalar tensor; "
                    f"received {seed!r}.")


def fold_seed(seed, *values):
    """Mixes integers (step, bucket, rank, ...) into an int64 seed.

    seed = seed * 1_000_003 + value for each value, wrapping modulo 2**64, so
    distinct small values give distinct seeds. Deterministic and identical on
    every machine; works eagerly and inside `tf.function`.
    """
    mixed = tf.bitcast(as_seed(seed), tf.uint64)
    for value in values:
        mixed = (mixed * tf.constant(_SEED_MULTIPLIER, tf.uint64)
                 + tf.bitcast(as_seed(value), tf.uint64))
    return tf.bitcast(mixed, tf.int64)


def accumulation_dtype(dtype):
    """float16/bfloat16 sums are accumulated in float32; others in `dtype`."""
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


class Compressor:
    """Base class of all compressors (frozen dataclasses registered by name).

    Subclasses implement the reduction hook `reduce`; see the module
    docstring.

    Attributes:
        name: The registered name (set by the registry).
        error_feedback: Whether the strategy should keep a residual and call
            `tfdist_ext.compression.compress_with_feedback`.
        warmup_steps: Number of first steps sent dense (uncompressed); the
            strategy checks `step < warmup_steps`.
        momentum: DGC momentum correction (`compress_with_momentum_correction`)
            when > 0; the optimizer must then run without momentum.
        momentum_masking: With momentum correction, restart the momentum of
            every value sent (DGC's momentum factor masking).
        correct_momentum: With `momentum` 0, take an SGD optimizer's
            momentum into the compressor while `fit` runs under sync="sync"
            (`tfdist_ext.keras.moved_momentum`); the sparsifiers' default.
    """

    error_feedback = False
    warmup_steps = 0
    momentum = 0.0
    momentum_masking = True
    correct_momentum = False
    #: What to change when training diverges under the compressor (`keras.divergence`).
    divergence_advice = ("add `warmup_steps` (an epoch of uncompressed steps), send more "
                         "(PowerSGD `rank`, top-k/random-k `ratio`, QSGD `levels`) or use "
                         "compression='none'")
    #: What SGD with momentum risks under the compressor, in words, and the safer choices
    #: (`keras.optimizer_check` warns with it when `fit` starts, linking the measured
    #: costs in docs/results.md); "" when measured safe.
    momentum_caution = ""
    #: The same for an optimizer that normalizes the gradient (Adam, RMSprop, ...).
    adam_caution = ""
    #: The same for every optimizer (said in place of the two above).
    caution = ""

    def __post_init__(self):
        owner = type(self).__name__
        check_bool(owner, "error_feedback", self.error_feedback)
        check_int(owner, "warmup_steps", self.warmup_steps, minimum=0)
        check_momentum(owner, self.momentum, self.error_feedback)
        check_bool(owner, "momentum_masking", self.momentum_masking)
        check_bool(owner, "correct_momentum", self.correct_momentum)

    def reduce(self, bucket, comm, state):
        """The SUM over all replicas of `bucket.flat`, approximated (the hook).

        Called once per bucket and replica while the train step is traced, in
        the same order on every replica. Warm-up steps and uncompressible
        buckets (integer dtypes, zero elements) never reach it.

        Args:
            bucket: The `reduction_hooks.Bucket` (flat buffer, gradient shapes, key,
                local replica index, step).
            comm: The `reduction_hooks.Communicator`: the hook's only way to reach the
                other replicas; what it sends is what the strategy counts.
            state: The strategy's `StrategyState`: `state.buffer(key, replica, ...)`
                gives per-replica variables that checkpoints carry.

        Returns:
            A 1-D tensor of the bucket's length and dtype, identical on every
            replica.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement reduce().")

    # -- Checks ------------------------------------------------------------

    def _describe(self):
        name = getattr(type(self), "name", None)
        return type(self).__name__ + (f" ({name!r})" if name else "")

    def _check_dtype(self, dtype):
        dtype = tf.as_dtype(dtype)
        if dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"Compressor {self._describe()} compresses float16, bfloat16, float32 "
                f"or float64 gradients; received dtype {dtype.name}. Send integer "
                f"tensors uncompressed or cast them to a float dtype first.")
        return dtype


COMPRESSORS = Registry("compression", base=Compressor)


def get(identifier):
    """A compressor from a name, dict or instance (None means "none").

    Instances of unregistered `Compressor` subclasses (user-written hooks)
    are accepted as they are.
    """
    return COMPRESSORS.get(identifier, default="none")
