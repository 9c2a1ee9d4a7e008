"""Sync policies decide when replicas communicate and how results are applied."""

import dataclasses

from tfdist_ext.registry import Registry

SYNC_POLICIES = Registry("sync")


class SyncPolicy:
    """Base class of all synchronization policies (frozen dataclasses)."""


@SYNC_POLICIES.register("sync")
@dataclasses.dataclass(frozen=True)
class Synchronous(SyncPolicy):
    """Synchronous SGD: every step all-reduces the gradients (the default)."""


def get(identifier):
    """A sync policy from a name, dict or instance (None means "sync")."""
    return SYNC_POLICIES.get(identifier, default="sync")
