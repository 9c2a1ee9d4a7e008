"""Where the replicas are: TF_CONFIG validation and local device selection.

Two ways to get replicas:
    * TF_CONFIG set (by `tfdist-run` or by a deployment): one process per worker,
      one replica per worker on CPU (one per GPU on GPU machines).
    * No TF_CONFIG: the local devices of this process; `num_replicas=N` on a
      machine without enough GPUs splits the CPU into N logical devices, which
      gives real collectives between N replicas in one process.
"""

import dataclasses
import json
import os
from typing import Dict, List, Optional

import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.registry import positive_int

TF_CONFIG = "TF_CONFIG"
_WORKER_JOBS = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A validated TF_CONFIG.

    Attributes:
        jobs: Job name -> list of "host:port" addresses.
        task_type: This process's job name.
        task_index: This process's index in its job.
    """

    jobs: Dict[str, List[str]]
    task_type: str
    task_index: int

    @property
    def num_workers(self) -> int:
        return sum(len(self.jobs.get(job, ())) for job in _WORKER_JOBS)

    @property
    def worker_addresses(self) -> List[str]:
        """"host:port" of every worker task, in the order of their ids (chief first)."""
        return [a for job in _WORKER_JOBS for a in self.jobs.get(job, ())]

    def without_servers(self) -> "ClusterSpec":
        """This spec without its "ps" job (what TF's collectives see)."""
        return dataclasses.replace(
            self, jobs={job: list(a) for job, a in self.jobs.items() if job != "ps"})

    def resolver(self):
        """A `tf.distribute` cluster resolver for this spec."""
        return _compat.SimpleClusterResolver(
            tf.train.ClusterSpec(self.jobs), task_type=self.task_type,
            task_id=self.task_index, rpc_layer="grpc")


def _config_error(problem: str, raw: str) -> ValueError:
    shown = raw if len(raw) <= 300 else raw[:300] + "..."
    return ValueError(
        f"Environment variable TF_CONFIG is invalid: {problem}. Received: {shown}. "
        'Expected JSON like {"cluster": {"worker": ["host0:port", "host1:port"]}, '
        '"task": {"type": "worker", "index": 0}}; unset TF_CONFIG to train on local '
        "devices, or let `tfdist-run -np N` write it.")


def parse_tf_config(raw: Optional[str]) -> Optional[ClusterSpec]:
    """Validates the text of TF_CONFIG; None or blank means "no cluster".

    Raises:
        ValueError: naming what is wrong (bad JSON, missing task, index out of
            range, ...), the value received and the expected form.
    """
    if raw is None or not raw.strip():
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        raise _config_error(f"it is not valid JSON ({err.msg} at char {err.pos})", raw) from None
    if not isinstance(config, dict):
        raise _config_error("the top level must be a JSON object", raw)
    cluster = config.get("cluster")
    if not cluster:
        if config.get("task"):
            raise _config_error('"task" is given but "cluster" is missing or empty', raw)
        return None  # TF treats a TF_CONFIG without cluster as local training.
    if not isinstance(cluster, dict) or not all(
            isinstance(v, list) and all(isinstance(a, str) and ":" in a for a in v)
            for v in cluster.values()):
        raise _config_error('"cluster" must map job names to lists of "host:port" strings',
                            raw)
    if not any(cluster.get(job) for job in _WORKER_JOBS):
        raise _config_error('"cluster" has no "worker" or "chief" job', raw)
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise _config_error('"task" with "type" and "index" is missing', raw)
    task_type, index = task["type"], task["index"]
    if task_type not in cluster:
        raise _config_error(f'task type {task_type!r} is not a job of "cluster" '
                            f"({', '.join(sorted(cluster))})", raw)
    if isinstance(index, bool) or not isinstance(index, int) or not (
            0 <= index < len(cluster[task_type])):
        raise _config_error(f"task index {index!r} is out of range for job "
                            f"{task_type!r} with {len(cluster[task_type])} task(s) "
                            f"(allowed: 0..{len(cluster[task_type]) - 1})", raw)
    return ClusterSpec(jobs={k: list(v) for k, v in cluster.items()},
                       task_type=task_type, task_index=index)


def tf_config_from_resolver(resolver) -> str:
    """The TF_CONFIG text of a `tf.distribute.cluster_resolver.ClusterResolver`.

    Any of TF's resolvers works (SlurmClusterResolver, TFConfigClusterResolver,
    SimpleClusterResolver, a GCE or Kubernetes one): its cluster, task type and
    task id become a TF_CONFIG, validated as if the environment had held it.

    Raises:
        ValueError: `resolver` is not a cluster resolver, or names no task of
            its cluster; the message names the argument and the fix.
    """
    if not all(hasattr(resolver, name) for name in ("cluster_spec", "task_type", "task_id")):
        raise ValueError(
            f"Argument `cluster_resolver` must be a tf.distribute.cluster_resolver."
            f"ClusterResolver (with cluster_spec(), task_type and task_id). Received: "
            f"{resolver!r}. Pass e.g. tf.distribute.cluster_resolver.SlurmClusterResolver(), "
            "or leave it out to read TF_CONFIG.")
    jobs = {job: [addresses[i] for i in sorted(addresses)] if isinstance(addresses, dict)
            else list(addresses)
            for job, addresses in resolver.cluster_spec().as_dict().items()}
    text = json.dumps({"cluster": jobs,
                       "task": {"type": resolver.task_type, "index": resolver.task_id}})
    try:
        parse_tf_config(text)
    except ValueError as err:
        raise ValueError(f"Argument `cluster_resolver` ({type(resolver).__name__}) does not "
                         f"describe this task: {err}") from None
    return text


def cluster_from_env() -> Optional[ClusterSpec]:
    """The validated TF_CONFIG of this process, or None."""
    return parse_tf_config(os.environ.get(TF_CONFIG))


def replica_devices(num_replicas: Optional[int], spec: Optional[ClusterSpec]):
    """The devices of `Strategy(num_replicas=...)`: `local_devices`, or None when not given.

    Raises:
        ValueError: `num_replicas` is not a positive integer, or is combined
            with TF_CONFIG (`spec`).
    """
    if num_replicas is None:
        return None
    positive_int("num_replicas", num_replicas)
    if spec is not None:
        raise ValueError(
            f"Argument `num_replicas` ({num_replicas}) cannot be combined with "
            f"TF_CONFIG: with a cluster each worker runs one replica per local "
            "GPU (one on CPU). Drop `num_replicas`, or unset TF_CONFIG to run "
            f"{num_replicas} replicas in this process.")
    return local_devices(num_replicas)


def local_devices(num_replicas: int) -> List[str]:
    """Names of `num_replicas` local devices: GPUs if there are enough, else CPUs.

    On CPU this splits the physical CPU into `num_replicas` logical devices,
    which must happen before TensorFlow initialises its runtime.

    It also gives TF's inter-op pool at least `num_replicas` + 2 threads (unless
    the program chose a size, or TF already runs): a `tf.function` that makes
    and drops a distributed dataset's iterator over several local devices
    (TF's `MultiDeviceIterator`) tears it down with blocking calls on that
    pool, which deadlocked with 2 threads (MirroredStrategy too).

    Raises:
        RuntimeError: TensorFlow was already initialised with fewer logical CPUs.
    """
    _enough_inter_op_threads(num_replicas)
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= num_replicas:
        return [f"/device:GPU:{i}" for i in range(num_replicas)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu) or []
    if len(configured) < num_replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas)
        except RuntimeError:
            # Already initialised (listing devices here would initialise it, which
            # must not happen before the strategy configures collectives).
            available = len(tf.config.list_logical_devices("CPU"))
            if available < num_replicas:
                raise RuntimeError(
                    f"Strategy(num_replicas={num_replicas}) needs {num_replicas} logical "
                    f"CPU devices, but TensorFlow was already initialised with "
                    f"{available}. Create the strategy before running any TensorFlow "
                    "op or creating a tensor, or call "
                    "tfdist_ext.cluster.local_devices(N) first thing in the program."
                ) from None
    return [f"/device:CPU:{i}" for i in range(num_replicas)]


def _enough_inter_op_threads(num_replicas: int):
    if num_replicas < 2 or tf.config.threading.get_inter_op_parallelism_threads():
        return
    try:
        tf.config.threading.set_inter_op_parallelism_threads(
            max(os.cpu_count() or 1, num_replicas + 2))
    except RuntimeError:
        pass  # TF already runs: its pool stays as it is
