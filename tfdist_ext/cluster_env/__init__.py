"""TF_CONFIG derived from a cluster manager's environment, so no process needs one written.

* `kubernetes`: a pod of an Indexed Job (``TFDIST_WORKERS`` in its manifest);
* `slurm`: a task of a Slurm job step (``srun -n N python train.py``).

`import tfdist_ext` calls `apply`; a TF_CONFIG that is already set always wins
(Ray Train's TensorflowTrainer sets one; `ray.keep_keras_3` undoes its
TF_USE_LEGACY_KERAS).
"""

import logging
import os

from tfdist_ext.cluster_env import ray
from tfdist_ext.cluster_env.kubernetes import kubernetes_tf_config
from tfdist_ext.cluster_env.slurm import slurm_tf_config

log = logging.getLogger("tfdist_ext")
_SOURCES = (("the Kubernetes Indexed Job", kubernetes_tf_config),
            ("the Slurm job step", slurm_tf_config))


def apply(environ=os.environ) -> bool:
    """Sets TF_CONFIG from a Kubernetes Indexed Job's or Slurm step's environment if unset.

    Returns:
        Whether TF_CONFIG was set.

    Raises:
        ValueError: the environment is one of those but malformed (the message
            names the variable, its value and the fix).
    """
    ray.keep_keras_3(environ)
    if environ.get("TF_CONFIG"):
        return False
    for source, derive in _SOURCES:
        config = derive(environ)
        if config is not None:
            environ["TF_CONFIG"] = config
            log.info("tfdist_ext: TF_CONFIG from %s: %s", source, config)
            return True
    return False


__all__ = ["apply", "kubernetes_tf_config", "slurm_tf_config"]
