"""The seam between `tfdist_ext.Strategy` and the training front end that drives it.

The strategy does not import Keras. When a strategy is made it asks the front end
registered here to attach to it (Keras' patches, the SIGTERM handler), and it asks the
front end for what only the front end knows (the callbacks `fit` adds, the adaptive
compression's decisions). A multi-worker job's import-time set-up (`tfdist_ext.early`)
asks it to prepare the process for its workers.

The package root (`tfdist_ext/__init__.py`) registers the Keras front end,
`tfdist_ext.keras.keras_frontend`, by module name; the module is imported the first
time it is needed, so `import tfdist_ext` and the launcher do not import TensorFlow.

A front end is any object (a module will do) with the functions of `FrontEnd`.
The front end, and the layers below the strategy, tell a `tfdist_ext.Strategy` from
TF's own strategies with `our_strategy`, then read its public attributes (`config`,
`sync_runner`, `membership`, `allreduce_decisions`).
"""

import importlib
import sys
from typing import Any, List, Protocol, Sequence


class FrontEnd(Protocol):
    """What the strategy needs of the framework that trains with it."""

    def attach(self, strategy) -> Any:
        """Prepares the framework for a new `strategy`; returns its preemption handler,
        which the strategy keeps as `strategy.preemption`."""

    def fit_callbacks(self, strategy) -> List[Any]:
        """The callbacks `fit` adds first for `strategy`."""

    def compression_decisions(self, strategy) -> List[dict]:
        """The decision rounds of `compression="adaptive"` under `strategy` so far."""

    def prepare_workers(self, worker_addresses: Sequence[str]) -> None:
        """A worker of a multi-worker job, at `import tfdist_ext`, before its first op."""


_registered: List[str] = []


def register(module_name: str) -> None:
    """Makes the module `module_name` (the functions of `FrontEnd`) the front end."""
    _registered[:] = [module_name]


def get() -> FrontEnd:
    """The registered front end, imported on first use."""
    if not _registered:
        raise RuntimeError("tfdist_ext: no training front end is registered; "
                           "import tfdist_ext (its package root registers Keras').")
    return importlib.import_module(_registered[0])


def our_strategy(strategy):
    """`strategy` if it is a `tfdist_ext.Strategy`, else None.

    Never imports `tfdist_ext.strategy`: `zero/` and `elastic/` sit below it, and
    the Keras front end is imported while `import tfdist_ext` prepares a TF_CONFIG
    worker, before the strategy module may load. No instance exists before then.
    """
    module = sys.modules.get("tfdist_ext.strategy")
    cls = None if module is None else vars(module).get("Strategy")
    return strategy if cls is not None and isinstance(strategy, cls) else None
