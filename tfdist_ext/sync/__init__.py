"""When replicas communicate: synchronization models (`Strategy(sync=...)`)."""

from tfdist_ext.sync.base import SYNC_POLICIES, Synchronous, SyncPolicy, get

__all__ = ["SYNC_POLICIES", "SyncPolicy", "Synchronous", "get"]
