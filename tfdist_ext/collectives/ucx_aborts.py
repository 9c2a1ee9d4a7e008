"""Failing this process's UCX collectives when a peer is found dead.

`tfdist_ext.liveness` (through the strategy or an elastic job's recovery) calls
`abort`; the op library fails the collectives of every communicator, or of
those that exist now (elastic training goes on with new ones), and an engine
that waits for its peers' addresses stops when an abort made since its
membership was decided (`failed_since`) fails it.
"""

from typing import Optional

import tensorflow as tf

from tfdist_ext.ops import ucx as ucx_ops

_aborts = []  # (reason, later) of each `abort`: a wire-up waiting for a dead peer stops


def abort(reason: str, later: bool = True):
    """Fails the UCX collectives of this process with `reason`: every one, now and
    later, or with ``later=False`` those of the communicators that exist now."""
    _aborts.append((reason, later))
    with tf.device("/cpu:0"):
        ucx_ops.load().tfdist_ucx_abort(reason, later=later)


def count() -> int:
    """How many times `abort` was called in this process (a `UcxEngine`'s `born`)."""
    return len(_aborts)


def failed_since(born: int) -> Optional[str]:
    """The reason of an abort that fails a communicator made after `born` aborts
    (one for every communicator, or one made since), else None."""
    return next((reason for i, (reason, later) in enumerate(_aborts) if later or i >= born),
                None)
