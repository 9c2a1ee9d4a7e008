"""What a strategy remembers between steps, as tracked variables.

Per replica: a step counter (seeds and warm-up follow it) and the
per-bucket state of compression: the error-feedback residual of every
compressed buffer (and, with DGC momentum correction, its velocity, under the
key `<buffer>_velocity`; PowerSGD's Q under `<buffer>_powersgd_q`); per
worker: byte counters.
`Strategy.state` is a `tf.Module`, so a `tf.train.Checkpoint(model=model,
optimizer=optimizer, tfdist=strategy.state)` saves and restores all of it
(residuals created after `restore()` are filled in eagerly by TF's deferred
restoration when the train step first creates them). A Keras
`BackupAndRestore` in `fit` backs it up too (`tfdist_ext.keras.worker_callbacks`).

Variables are created on first use while the train step is traced, under
`init_scope` and directly as `ResourceVariable`s on the replica's device: they
must not become MirroredVariables (each replica's residual differs).
"""

import tensorflow as tf

from tfdist_ext import _compat


class StrategyState(tf.Module):
    """Residuals, step counters and communication counters of one strategy.

    Args:
        devices: This worker's local replica devices.
    """

    def __init__(self, devices):
        super().__init__(name="tfdist_state")
        self._devices = tuple(devices)
        self.steps = [self._variable(0, tf.int64, i, "step") for i in range(len(devices))]
        # Counted on local replica 0: what this worker sent, what dense sync SGD
        # with the same algorithm would have sent, and the reductions issued.
        self.bytes_sent = self._variable(0, tf.int64, 0, "bytes_sent")
        self.dense_bytes = self._variable(0, tf.int64, 0, "dense_bytes")
        self.reductions = self._variable(0, tf.int64, 0, "reductions")
        self.residuals = {}
        self.ready_sum = self.ready_count = None

    def _variable(self, initial, dtype, replica, name):
        with _compat.init_scope(), tf.device(self._devices[replica]):
            return _compat.ResourceVariable(tf.constant(initial, dtype), trainable=False,
                                            name=name)

    def residual(self, key, replica, num_elements, dtype):
        """The residual variable of buffer `key` on `replica` (created zero on first use)."""
        return self.buffer(key, replica, num_elements, dtype)

    def buffer(self, key, replica, num_elements, dtype, initial=None):
        """A per-replica 1-D variable of bucket state `key` (created on first use).

        Args:
            key: Stable name (the same every step and on every worker).
            replica: Local replica index.
            num_elements: Its length.
            dtype: Its dtype.
            initial: Optional ``fn() -> [num_elements] tensor``, the initial
                value of every replica's variable (zeros if None).
        """
        if key not in self.residuals:
            variables = []
            for i, device in enumerate(self._devices):
                with _compat.init_scope(), tf.device(device):
                    value = tf.zeros([num_elements], dtype) if initial is None else initial()
                    variables.append(_compat.ResourceVariable(
                        value, trainable=False, name=f"residual_{key}_{i}"))
            with _compat.init_scope():  # a pending checkpoint restores them eagerly
                self.residuals[key] = variables
        return self.residuals[key][replica]

    def buffers_ending(self, suffix):
        """{key: per-replica variables} of the buffers whose key ends with `suffix`, by key."""
        return {key: list(self.residuals[key]) for key in sorted(self.residuals)
                if key.endswith(suffix)}

    def record_ready(self, ready):
        """Accumulates one step's gradient-ready timestamps (seconds, relative)."""
        if self.ready_sum is None:
            n = ready.shape.num_elements()
            with _compat.init_scope():
                self.ready_sum = self._variable([0.0] * n, tf.float64, 0, "ready_sum")
                self.ready_count = self._variable(0, tf.int64, 0, "ready_count")
        return tf.group(self.ready_sum.assign_add(ready - tf.reduce_min(ready)),
                        self.ready_count.assign_add(1))

    def next_step(self, replica):
        """Increments `replica`'s step counter; returns the step before it."""
        return self.steps[replica].assign_add(1) - 1

    def count(self, bytes_sent, dense_bytes, reductions=1):
        """Adds byte counts (ints or int64 scalars) and `reductions` to the counters."""
        return tf.group(self.bytes_sent.assign_add(bytes_sent),
                        self.dense_bytes.assign_add(dense_bytes),
                        self.reductions.assign_add(reductions))

    def stats(self):
        """Counters as Python numbers (eager)."""
        sent, dense = int(self.bytes_sent.numpy()), int(self.dense_bytes.numpy())
        return {"bytes_sent": sent, "dense_bytes": dense,
                "reductions": int(self.reductions.numpy()),
                "compression_ratio": dense / sent if sent else 1.0}
