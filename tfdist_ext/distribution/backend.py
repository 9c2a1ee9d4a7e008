"""Keras' distribution backend functions for TensorFlow, carried by tfdist_ext.

Keras 3's `keras.distribution` front end calls a backend module
(`keras.src.backend.tensorflow.distribution_lib` on TensorFlow) that Keras
ships as an unfinished DTensor prototype. `tfdist_ext.distribution.install`
replaces its functions with these, which read the job from TF_CONFIG (as
`tfdist-run`, Slurm, Kubernetes and Ray set it) or from
`keras.distribution.initialize`:

* `list_devices` / `get_device_count`: every replica of the job, numbered
  globally as JAX does ("cpu:0" ... "cpu:N-1"; worker w's local device i is
  w * local + i);
* `initialize(job_addresses, num_processes, process_id)`: writes TF_CONFIG and
  readies TensorFlow for it (`tfdist_ext.early.prepare`), or checks that the
  arguments agree with a TF_CONFIG already set;
* `num_processes` / `process_id`: the number of workers and this worker's index;
* `distribute_tensor`: a replicated layout leaves the tensor as it is; a
  layout that shards it raises (tfdist_ext is data parallel).
"""

import json
import os

import tensorflow as tf

from tfdist_ext import _compat, cluster, early

SUPPORTED = ("tfdist_ext carries Keras' DataParallel, and ModelParallel layouts that "
             "replicate every variable, on TensorFlow")


def _job():
    """This process's cluster from TF_CONFIG, or None for one process."""
    spec = cluster.cluster_from_env()
    return spec if spec is not None and spec.num_workers else None


def num_processes() -> int:
    """The job's number of worker processes (1 without TF_CONFIG)."""
    job = _job()
    return job.num_workers if job else 1


def process_id() -> int:
    """This worker's index in the job (0 without TF_CONFIG)."""
    job = _job()
    return job.task_index if job and job.task_type == "worker" else 0


def _device_type(device_type):
    if device_type is not None:
        return device_type.lower()
    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def _local_count(device_type) -> int:
    """Replicas one worker runs of `device_type` (without initializing TensorFlow)."""
    physical = tf.config.list_physical_devices(device_type.upper())
    if device_type != "cpu" or not physical:
        return len(physical)
    if num_processes() > 1:
        return 1  # a CPU worker is one replica
    return len(tf.config.get_logical_device_configuration(physical[0]) or [None])


def list_devices(device_type=None):
    """Every replica device of the job as "type:index", numbered across workers.

    Args:
        device_type: "cpu" or "gpu"; by default GPUs if this host has any.
    """
    kind = _device_type(device_type)
    local = _local_count(kind)
    return [f"{kind}:{worker * local + i}"
            for worker in range(num_processes()) for i in range(local)]


def get_device_count(device_type=None) -> int:
    """The number of devices `list_devices(device_type)` lists."""
    return len(list_devices(device_type))


def _disagree(argument, value, configured, fix):
    return ValueError(
        f"keras.distribution.initialize: {argument}={value!r}, but TF_CONFIG (set by tfdist-run, "
        f"Slurm, Kubernetes, Ray or the environment) says {configured!r}. {fix}")


def initialize(job_addresses=None, num_processes=None, process_id=None):  # pylint: disable=redefined-outer-name
    """Makes this process worker `process_id` of the job at `job_addresses`.

    Args:
        job_addresses: Comma-separated "host:port" of every worker, in
            process-id order (TensorFlow needs each worker's address, not only
            the coordinator's).
        num_processes: The number of workers; must match the addresses.
        process_id: This worker's index, 0 <= process_id < num_processes.

    With TF_CONFIG already set (tfdist-run and the cluster integrations set
    it), the arguments may be omitted and, if given, must agree with it. Call
    it at the top of the script, before TensorFlow runs any op.

    Raises:
        ValueError: An argument is missing, inconsistent or disagrees with TF_CONFIG.
        RuntimeError: TensorFlow already runs (an op ran or a strategy exists).
    """
    addresses = ([a.strip() for a in job_addresses.split(",") if a.strip()]
                 if job_addresses else None)
    job = _job()
    if job is not None:
        fix = "Pass no arguments under a launcher, or unset TF_CONFIG to pass your own."
        if addresses is not None and addresses != job.worker_addresses:
            raise _disagree("job_addresses", job_addresses, ",".join(job.worker_addresses), fix)
        if num_processes is not None and num_processes != job.num_workers:
            raise _disagree("num_processes", num_processes, job.num_workers, fix)
        if process_id is not None and process_id != job.task_index:
            raise _disagree("process_id", process_id, job.task_index, fix)
        return
    if addresses is None and num_processes in (None, 1) and process_id in (None, 0):
        return  # one process: nothing to join
    _check_arguments(addresses, job_addresses, num_processes, process_id)
    if _compat.context_initialized():
        raise RuntimeError(
            "keras.distribution.initialize() must run before TensorFlow runs any op or a "
            "strategy exists (TensorFlow cannot join a cluster afterwards): call it first "
            "in the script, right after the imports.")
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses},
                                          "task": {"type": "worker", "index": process_id}})
    early.prepare()


def _check_arguments(addresses, job_addresses, count, index):
    example = ('e.g. initialize("10.0.0.1:1234,10.0.0.2:1234", num_processes=2, '
               'process_id=0), or set KERAS_DISTRIBUTION_JOB_ADDRESSES, '
               "KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID")
    if addresses is None or index is None:
        missing = "job_addresses" if addresses is None else "process_id"
        raise ValueError(f"keras.distribution.initialize: {missing} is missing; on TensorFlow "
                         f"every worker's address and this process's index are needed, "
                         f"{example}.")
    if count is not None and count != len(addresses):
        raise ValueError(f"keras.distribution.initialize: num_processes={count} but "
                         f"job_addresses={job_addresses!r} names {len(addresses)} worker(s); "
                         f"give one address per process, {example}.")
    if not 0 <= index < len(addresses):
        raise ValueError(f"keras.distribution.initialize: process_id={index} is not in "
                         f"[0, {len(addresses)}) for {len(addresses)} worker(s).")


def shards(layout) -> bool:
    """Whether a Keras `TensorLayout` splits its tensor across devices."""
    mesh = layout.device_mesh
    for axis in layout.axes:
        if axis is None:
            continue
        if mesh is None or mesh.shape[mesh.axis_names.index(axis)] > 1:
            return True
    return False


def distribute_tensor(tensor, layout):
    """`tensor` itself for a replicated layout; a sharding layout raises ValueError."""
    if isinstance(layout, _compat.keras_distribution_lib.TensorLayout) and not shards(layout):
        return tensor
    raise ValueError(f"keras.distribution.distribute_tensor: layout {layout!r} shards the "
                     f"tensor; {SUPPORTED}. Use a layout whose axes are all None.")


def to_backend_mesh(device_mesh):
    """The mesh itself: tfdist_ext needs no DTensor mesh."""
    return device_mesh


def to_backend_layout(tensor_layout):
    """The layout itself (Keras' check that it has a mesh kept)."""
    if tensor_layout.device_mesh is None:
        raise ValueError("Cannot create sharding when device mesh is not set for TensorLayout.")
    return tensor_layout
