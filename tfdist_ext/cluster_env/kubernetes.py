"""TF_CONFIG derived from a Kubernetes Indexed Job, so no pod needs a hand-written one.

An Indexed Job (``completionMode: Indexed``) gives each pod its index in
``JOB_COMPLETION_INDEX`` and the hostname ``<job name>-<index>``; with the pod
template's ``subdomain`` set to a headless Service of that name, every pod is
reachable as ``<job name>-<i>.<service>``. Two variables in the manifest say
what Kubernetes does not put in the environment:

* ``TFDIST_WORKERS``: the number of pods (the Job's ``completions``);
* ``TFDIST_SERVICE``: the headless Service (the pods' ``subdomain``);
* ``TFDIST_PORT`` (optional, default 12345): the port each worker listens on.

`tfdist_ext.cluster_env.apply` (called by `import tfdist_ext`) sets TF_CONFIG
for this process from them (worker ``JOB_COMPLETION_INDEX`` of
``TFDIST_WORKERS``) when TF_CONFIG is not set. The manifest:
docs/guide/multi-worker.md#kubernetes.
"""

import json
from typing import Mapping, Optional

WORKERS, SERVICE, PORT = "TFDIST_WORKERS", "TFDIST_SERVICE", "TFDIST_PORT"
INDEX = "JOB_COMPLETION_INDEX"
DEFAULT_PORT = 12345


def _number(env, name, low, high):
    text = env[name]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ValueError(f"Environment variable {name}={text!r} must be an integer in "
                         f"[{low}, {high}]. Fix the Job manifest's env (see "
                         f"docs/guide/multi-worker.md#kubernetes).")
    return value


def kubernetes_tf_config(env: Mapping[str, str]) -> Optional[str]:
    """The TF_CONFIG of this pod of an Indexed Job, or None when `env` is not one.

    Args:
        env: The process environment (``JOB_COMPLETION_INDEX``, ``HOSTNAME``,
            ``TFDIST_WORKERS``, ``TFDIST_SERVICE``, ``TFDIST_PORT``).

    Raises:
        ValueError: `env` has ``TFDIST_WORKERS`` but a value is missing or
            malformed; the message names the variable, the value and the fix.
    """
    if WORKERS not in env:
        return None
    workers = _number(env, WORKERS, 1, 1_000_000)
    for name in (INDEX, SERVICE, "HOSTNAME"):
        if not env.get(name):
            raise ValueError(
                f"{WORKERS}={env[WORKERS]!r} is set but {name} is not: tfdist_ext derives "
                f"TF_CONFIG from a Kubernetes Indexed Job (completionMode: Indexed sets "
                f"{INDEX} and HOSTNAME, the manifest sets {SERVICE} to the headless Service "
                f"named in the pod template's subdomain). Set it, or unset {WORKERS}.")
    index = _number(env, INDEX, 0, workers - 1)
    port = _number(env, PORT, 1, 65535) if env.get(PORT) else DEFAULT_PORT
    hostname, suffix = env["HOSTNAME"], f"-{index}"
    if not hostname.endswith(suffix) or hostname == suffix:
        raise ValueError(
            f"HOSTNAME={hostname!r} does not end in -{index} ({INDEX}): an Indexed Job's pods "
            f"are named <job name>-<index>; do not set the pod template's hostname.")
    job = hostname[:-len(suffix)]
    addresses = [f"{job}-{i}.{env[SERVICE]}:{port}" for i in range(workers)]
    return json.dumps({"cluster": {"worker": addresses},
                       "task": {"type": "worker", "index": index}})

