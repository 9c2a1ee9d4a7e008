"""What `import tfdist_ext` prepares for a TF_CONFIG job (tfdist_ext.early)."""

import json

from tfdist_ext import cluster, early


def spec(addresses, index=0, job="worker"):
    return cluster.parse_tf_config(json.dumps(
        {"cluster": {job: addresses}, "task": {"type": job, "index": index}}))


def test_local_workers_counts_this_hosts_workers():
    assert early.local_workers(spec(["127.0.0.1:1", "localhost:2", "127.0.0.2:3"])) == 3
    mixed = ["hostA:1", "hostA:2", "hostB:3"]
    assert early.local_workers(spec(mixed, 0)) == 2
    assert early.local_workers(spec(mixed, 2)) == 1


def test_threads_per_worker_splits_the_cores():
    assert early.threads_per_worker(2, 2) == 1
    assert early.threads_per_worker(16, 3) == 5
    assert early.threads_per_worker(2, 4) == 1
    assert early.threads_per_worker(8, 1) == 8
