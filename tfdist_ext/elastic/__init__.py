"""Training that goes on when a worker dies: `tfdist_ext.Strategy(elastic=True)`.

`Elastic` holds the options; `seam` is all the strategy and Keras call (the
job's members, fixed or elastic) and `starting` all that `tfdist_ext.early` asks
at import (how this worker starts TF); `recovery` what the survivors do (see there);
`health` and `membership` how they find who is left and agree on it; `store`
where they meet;
`beacon`, `joining` and `admission` how a replacement finds the running job and
gets in; `state` how the members agree on the weights;
`KillAt` (a Keras callback) injects a failure.
"""

from tfdist_ext.elastic.membership import MembershipError
from tfdist_ext.elastic.options import Elastic, get

__all__ = ["Elastic", "KillAt", "MembershipError", "get"]


def __getattr__(name):
    if name == "KillAt":  # imports Keras, which `import tfdist_ext` does not
        from tfdist_ext.elastic.inject import KillAt  # pylint: disable=import-outside-toplevel
        return KillAt
    raise AttributeError(f"module 'tfdist_ext.elastic' has no attribute {name!r}")
