"""tfdist_ext: communication-efficient distributed training for Keras 3 / TF 2.19-2.21.

    import tfdist_ext as tde
    with tde.Strategy(allreduce="native").scope():
        model = build_model()
        model.compile(...)
    model.fit(dataset)

Run N local workers with `tfdist-run -np N python train.py`, set TF_CONFIG on
each host of a real cluster, or run a Kubernetes Indexed Job (`cluster_env`).

Submodules load on first use, so the launcher (`tfdist_ext.launch`) starts
without importing TensorFlow.
"""

import importlib
import os
import types

# Quiet TF's C++ INFO lines unless the user asked for them (must precede TF import).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__version__ = "0.1.0"

# Keras drives the strategy (tfdist_ext.frontends: the strategy does not import Keras).
importlib.import_module("tfdist_ext.frontends").register("tfdist_ext.keras.keras_frontend")
# keras.distribution on TensorFlow through tfdist_ext, once Keras is imported.
importlib.import_module("tfdist_ext.distribution").install_after_keras()
# A pod of a Kubernetes Indexed Job (TFDIST_WORKERS in its manifest): TF_CONFIG from it.
importlib.import_module("tfdist_ext.cluster_env").apply()
if os.environ.get("TF_CONFIG"):
    # A worker of a multi-worker job: configure TF before the script's first op.
    importlib.import_module("tfdist_ext.early").prepare()

_SUBMODULES = ("bucketing", "cluster", "cluster_env", "collectives", "compression",
               "distribution", "early", "elastic", "keras", "launch", "ops", "ps", "sync")
_ATTRIBUTES = types.MappingProxyType({"Strategy": "tfdist_ext.strategy",
                                      "StrategyConfig": "tfdist_ext.strategy_config"})
__all__ = sorted(_ATTRIBUTES) + list(_SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"tfdist_ext.{name}")
    if name in _ATTRIBUTES:
        return getattr(importlib.import_module(_ATTRIBUTES[name]), name)
    raise AttributeError(f"module 'tfdist_ext' has no attribute {name!r}")
