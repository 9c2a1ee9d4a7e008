"""When replicas communicate: synchronization models (`Strategy(sync=...)`).

========================  =====================================================
name                      what is communicated
========================  =====================================================
"sync"                    gradients, every step (Keras' own path)
"local_sgd"               parameters, every `period` steps
"diloco"                  parameter changes every `period` steps, outer Nesterov
"stale_synchronous"       gradients, applied by others at most `staleness` late
"delayed_averaging"       gradients, the average applied `delay` steps late
"model_averaging"         model corrections of k learners per replica, every step
"gossip"                  parameters with a few peers, every step (no all-reduce)
"async"                   gradients to parameter servers, no waiting for others
========================  =====================================================
"""

from tfdist_ext.sync.asynchronous import Asynchronous
from tfdist_ext.sync.base import SYNC_POLICIES, Synchronous, SyncPolicy, get
from tfdist_ext.sync.delayed_averaging import DelayedAveraging
from tfdist_ext.sync.diloco import DiLoCo
from tfdist_ext.sync.gossip import Gossip
from tfdist_ext.sync.local_sgd import LocalSGD
from tfdist_ext.sync.model_averaging import ModelAveraging
from tfdist_ext.sync.stale_synchronous import StaleSynchronous

__all__ = ["SYNC_POLICIES", "SyncPolicy", "Synchronous", "LocalSGD", "DiLoCo", "Gossip",
           "StaleSynchronous", "DelayedAveraging", "ModelAveraging", "Asynchronous", "get"]
