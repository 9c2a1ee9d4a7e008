"""Worker program for tests/collectives/test_peer_failures.py: worker 1 dies before it
publishes its address for the UCX communicators; the others' first all-reduce waits
for that address.

    python wireup_death.py
"""

import os
import signal

import tensorflow as tf

import tfdist_ext

strategy = tfdist_ext.Strategy(engine="ucx")
if strategy.cluster.task_index == 1:
    os.kill(os.getpid(), signal.SIGKILL)


@tf.function
def step():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        "SUM", tf.ones([4])))


print("wiring up", flush=True)
print(step(), flush=True)
