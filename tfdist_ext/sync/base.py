"""Sync policies decide when replicas communicate and how results are applied.

A policy is a frozen dataclass (the configuration, validated where it enters);
`SyncPolicy.runner(strategy)` builds the object that does the work inside
`model.fit` (`tfdist_ext.sync.runner.PolicyRunner`). `Synchronous` has no
runner: Keras' own all-reduce-then-apply path is synchronous SGD.
"""

import dataclasses

from tfdist_ext.compression import NoCompression
from tfdist_ext.registry import Registry

SYNC_POLICIES = Registry("sync")


class SyncPolicy:
    """Base class of all synchronization policies (frozen dataclasses)."""

    #: What the policy sends between replicas, for error messages.
    communicates = "gradients every step"
    #: Whether the policy trains against a TF_CONFIG "ps" job (`tfdist_ext.ps`).
    uses_parameter_servers = False
    #: What to change when training diverges under the policy (`keras.divergence`).
    divergence_advice = "use sync='sync'"
    #: What SGD with momentum risks under the policy, in words, and the safer choices
    #: (`keras.optimizer_check` warns with it when `fit` starts, linking the measured
    #: costs in docs/results.md); "" when measured safe.
    momentum_caution = ""
    #: The same for an optimizer that normalizes the gradient (Adam, RMSprop, ...).
    adam_caution = ""
    #: The same for every optimizer (said in place of the two above).
    caution = ""

    def check_compression(self, compressor) -> None:
        """Raises ValueError when `compressor` cannot work with this policy.

        Gradient compressors (and their error-feedback residuals) apply to the
        per-step gradient all-reduce of synchronous SGD; the other policies
        send parameters, or reduce gradients outside that path, uncompressed.
        """
        if not isinstance(compressor, NoCompression):
            name = getattr(compressor, "name", type(compressor).__name__)
            raise ValueError(
                f"Arguments `sync` and `compression` conflict: sync={self.name!r} "
                f"communicates {self.communicates}, which compression="
                f"{name!r} does not apply to (it compresses the per-step "
                "gradient all-reduce of synchronous SGD). Use compression='none' with "
                f"sync={self.name!r}, or sync='sync' with compression={name!r}.")

    def runner(self, strategy):
        """The object that applies this policy in `strategy`'s train steps (None: Keras' own)."""
        del strategy
        return None


@SYNC_POLICIES.register("sync")
@dataclasses.dataclass(frozen=True)
class Synchronous(SyncPolicy):
    """Synchronous SGD: every step all-reduces the gradients (the default)."""

    def check_compression(self, compressor) -> None:
        del compressor  # every compressor is built for this policy


def get(identifier):
    """A sync policy from a name, dict or instance (None means "sync")."""
    return SYNC_POLICIES.get(identifier, default="sync")
