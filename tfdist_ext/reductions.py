"""What a reduction reduces: an immutable context that travels with the call.

A `tf.distribute` reduction reaches `CrossDeviceOps._all_reduce` through TF's
`batch_reduce_to` -> `batch_reduce` -> `batch_reduce_implementation` chain,
once per replica (on replica threads when eager), and that chain carries one
`CommunicationOptions` and nothing else. `ReductionOptions` is such an options
object with a `Reduction` attached, so what is reduced is an argument of the
call, not a mode of the cross-device ops:

    strategy.extended.batch_reduce_to(
        tf.distribute.ReduceOp.SUM, pairs,
        options=reductions.options(reductions.Reduction(reductions.DENSE)))

The kinds:

* ``GRADIENTS``: an optimizer's gradient all-reduce. Compressed by the
  reduction's compressor (None: the strategy's), its bytes counted, bucketed
  by the gradient bucket plan. A `batch_reduce_to` without a `Reduction` is
  this (Keras reduces gradients with a plain `replica_context.all_reduce`):
  `strategy_extended.Extended` attaches the strategy's gradient reduction.
* ``PSEUDO_GRADIENTS``: what relaxed sync policies send instead of gradients
  (local SGD's parameter change since the last average). Compressed and
  counted like gradients, under bucket keys of their own ("delta_b0_..."), so
  residuals and compressor state never mix with the gradient buckets'.
* ``DENSE``: bookkeeping and parameter averages (sample counts, stop flags,
  sync policies' means). Never compressed or counted; the algorithm is chosen
  (and for "auto" timed) as for gradients.

Reductions that carry no `Reduction` and are not batched (`strategy.reduce`,
metrics) are dense, uncounted and take the model's algorithm untimed.
"""

import copy
import dataclasses

from tfdist_ext import _compat

GRADIENTS = "gradients"
PSEUDO_GRADIENTS = "pseudo_gradients"
DENSE = "dense"
KINDS = (GRADIENTS, PSEUDO_GRADIENTS, DENSE)


@dataclasses.dataclass(frozen=True)
class Reduction:
    """What one reduction call reduces.

    Args:
        kind: One of `KINDS`.
        compressor: For GRADIENTS and PSEUDO_GRADIENTS, the
            `tfdist_ext.compression.Compressor` to use instead of the
            strategy's (`keras.moved_momentum` passes the strategy's with the
            optimizer's momentum); None: the strategy's.
    """

    kind: str = GRADIENTS
    compressor: object = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Argument `kind`: {self.kind!r} is not a reduction kind; "
                             f"pass one of {', '.join(map(repr, KINDS))}.")
        if self.kind == DENSE and self.compressor is not None:
            raise ValueError(f"Argument `compressor`: {self.compressor!r} with kind='dense'; "
                             "dense reductions are never compressed: pass compressor=None.")

    @property
    def compressed(self) -> bool:
        """Whether it goes through the compressor and the byte counters."""
        return self.kind != DENSE

    @property
    def key_prefix(self) -> str:
        """Prefix of its buckets' state keys (residuals, compressor state)."""
        return "delta_" if self.kind == PSEUDO_GRADIENTS else ""


class ReductionOptions(_compat.CommunicationOptions):
    """`tf.distribute.experimental.CommunicationOptions` that carry a `Reduction`.

    `merge` keeps the argument's reduction (TF merges the strategy's options
    with each call's), so a strategy whose options are `ReductionOptions`
    hands a call's `Reduction` on to its cross-device ops.
    """

    def __init__(self, reduction=None, bytes_per_pack=0, timeout_seconds=None,
                 implementation=_compat.CommunicationImplementation.AUTO):
        super().__init__(bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds,
                         implementation=implementation)
        self.reduction = reduction

    @classmethod
    def from_options(cls, options, reduction=None):
        """`options`' settings (None: the defaults) with `reduction` attached."""
        if options is None:
            return cls(reduction)
        return cls(reduction, options.bytes_per_pack, options.timeout_seconds,
                   options.implementation)

    def merge(self, options):
        merged = super().merge(options)
        merged.reduction = of(options) or self.reduction
        return merged

    def __deepcopy__(self, memo):
        return copy.copy(self)  # its fields are immutable; the compressor is shared

    def __str__(self):
        return f"{super().__str__()[:-1]}, reduction={self.reduction})"


def of(options):
    """The `Reduction` that `options` carry, or None."""
    return options.reduction if isinstance(options, ReductionOptions) else None


def options(reduction, base=None):
    """`ReductionOptions` for `strategy.extended.batch_reduce_to(..., options=...)`.

    Args:
        reduction: A `Reduction`, or one of `KINDS`.
        base: Communication options whose settings to keep (None: defaults).
    """
    if isinstance(reduction, str):
        reduction = Reduction(reduction)
    return ReductionOptions.from_options(base, reduction)
