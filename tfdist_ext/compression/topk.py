"""Top-k sparsification (Deep Gradient Compression): exact and sampled threshold."""

import dataclasses

import tensorflow as tf

from tfdist_ext import ops
from tfdist_ext.compression.base import COMPRESSORS, check_ratio
from tfdist_ext.compression.payload import RatioCompressor


class SparseCompressor(RatioCompressor):
    """Payload (values [k] in the buffer's dtype, indices [k] int32), all-gathered.

    Subclasses choose the k positions in `_select`. The gathered payloads of
    all replicas are summed in one `sparse_to_dense` (duplicate indices add).
    """

    reducible = False

    def payload_spec(self, num_elements, dtype):
        k = self.k(num_elements)
        return (tf.TensorSpec([k], tf.as_dtype(dtype)), tf.TensorSpec([k], tf.int32))

    def _compress(self, flat, n, seed):
        return self._select(flat, self.k(n), seed)

    def _decompress(self, payload, n, dtype, seed):
        values, indices = payload
        return ops.sparse_to_dense(values, indices, n)

    def _decompress_sum(self, gathered, n, dtype, world_size, seed):
        values, indices = gathered
        return ops.sparse_to_dense(values, indices, n)


@COMPRESSORS.register("topk")
@dataclasses.dataclass(frozen=True)
class TopK(SparseCompressor):
    """Sends the `ratio` fraction of largest-magnitude elements (exact top-k).

    Deep Gradient Compression (Lin et al., ICLR 2018,
    https://arxiv.org/abs/1712.01887): with error feedback (the unsent
    remainder is added to the next step's gradient) top-k at 0.1%-1% reaches
    the dense model's accuracy. Tuning: start with ratio=0.01 and lower it to
    0.001 on slow links; keep error feedback on (without it top-k is biased
    and stalls); with momentum SGD, move the momentum into the compressor
    (`momentum=0.9`, optimizer without momentum, DGC's momentum correction),
    which closes most of the gap to dense momentum SGD; a few hundred dense
    warm-up steps (`warmup_steps`) help early training, when gradients change
    fastest. Payload per replica: k values and k int32 indices,
    k = max(1, round(ratio * n)), so 1% of float32 costs 2% of the dense
    bytes. Not reducible: replicas pick different indices, so the payloads are
    all-gathered (the cost grows with the number of replicas).

    Args:
        ratio: Fraction of elements sent, in (0, 1]. Defaults to 0.01.
        error_feedback: Keep the unsent remainder. Defaults to True.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
        momentum: DGC momentum correction with this momentum (e.g. 0.9) when
            > 0: the momentum is accumulated before compression, so what
            error feedback delays is the velocity. Give the optimizer no
            momentum of its own (`fit` refuses `keras.optimizers.SGD` with
            momentum). Defaults to 0 (off).
        momentum_masking: DGC's momentum factor masking: a value's momentum
            restarts once it is sent. Values sent at every step then move as
            in plain SGD, so use a learning rate 2-5x the momentum-SGD one it
            replaces. False keeps the momentum (the dense limit is momentum
            SGD at the same rate); prefer masking with a raised rate.
            Defaults to True.
        correct_momentum: With `momentum` 0 and a Keras SGD optimizer with
            momentum m, apply momentum correction with m here and trace the
            optimizer's step without momentum, while `fit` runs under
            sync="sync" (`tfdist_ext.keras.moved_momentum`). Defaults to True;
            False leaves the momentum in the optimizer (`fit` then warns).
    """

    ratio: float = 0.01
    error_feedback: bool = True
    warmup_steps: int = 0
    momentum: float = 0.0
    momentum_masking: bool = True
    correct_momentum: bool = True
    adam_caution = (
        "each value is sent a few times in a hundred steps with what accumulated meanwhile, "
        "and Adam divides these bursts by their own magnitude, so values move less than "
        "under synchronous Adam: it may end several points below synchronous Adam. "
        "compression='fp16' or 'adaptive' is safer")

    @property
    def momentum_caution(self):
        """What momentum SGD risks, with the momentum moved (the default) or not."""
        if self.momentum:
            return ""
        if self.correct_momentum:
            risk = ("with DGC's momentum correction taking the optimizer's momentum (the "
                    "default) top-k keeps up on some models but may end several points below "
                    "synchronous momentum SGD on others; leaving the momentum in the "
                    "optimizer (correct_momentum=False) is no safer")
        else:
            risk = ("with the momentum left in the optimizer (correct_momentum=False) "
                    "error feedback's late values add to it and top-k may end several points "
                    "below synchronous momentum SGD; DGC's momentum correction "
                    "(correct_momentum=True, the default) closes that on some models")
        return risk + ". compression='adaptive' or 'int8' is safer"

    def _select(self, flat, k, seed):
        return ops.top_k(flat, k)


@COMPRESSORS.register("topk_approx")
@dataclasses.dataclass(frozen=True)
class TopKApprox(SparseCompressor):
    """Top-k with DGC's sampled threshold: the same payload as "topk", faster.

    Lin et al. (ICLR 2018) estimate the top-k magnitude threshold from a
    random sample instead of sorting. `ops.top_k_approx` uses the sample only
    to skip work: it still returns the exact top-k set (the name follows DGC),
    so accuracy is that of `TopK`; it is faster on large buffers (n >~ 100k)
    and costs the same on small ones. See `TopK` for tuning advice.

    Args:
        ratio: Fraction of elements sent, in (0, 1]. Defaults to 0.01.
        sample_fraction: Fraction of the buffer sampled for the threshold, in
            (0, 1]. Defaults to 0.01 (DGC uses 0.001-0.01).
        error_feedback: Keep the unsent remainder. Defaults to True.
        warmup_steps: Dense steps before compression starts. Defaults to 0.
        momentum: DGC momentum correction when > 0, as in `TopK`. Defaults
            to 0 (off).
        momentum_masking: DGC's momentum factor masking, as in `TopK`.
            Defaults to True.
        correct_momentum: Take an SGD optimizer's momentum, as in `TopK`.
            Defaults to True.
    """

    ratio: float = 0.01
    sample_fraction: float = 0.01
    error_feedback: bool = True
    warmup_steps: int = 0
    momentum: float = 0.0
    momentum_masking: bool = True
    correct_momentum: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_ratio(type(self).__name__, "sample_fraction", self.sample_fraction)

    def _select(self, flat, k, seed):
        return ops.top_k_approx(flat, k, sample_fraction=self.sample_fraction, seed=seed)
