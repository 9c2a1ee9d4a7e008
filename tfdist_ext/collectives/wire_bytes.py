"""Bytes on the wire: what one replica sends to all-reduce a buffer densely.

The byte counters of `StrategyState` (`Strategy.communication_stats()`), the
compressors' `Communicator.reduce_bytes` and the sync runners' dense
baselines all count the same way: the elements the chosen algorithm's
schedule has the replica's rank send (`cost.elements_sent`), times the
element size. Counted, not measured: the same figure on every run.
"""

import tensorflow as tf

from tfdist_ext.collectives import auto, cost


class WireBytes:
    """Counts the bytes this worker's replicas send, through `choice`'s algorithms.

    Args:
        choice: The `choice.AlgorithmChoice` of the strategy (algorithm names
            and the schedules they stand for).
        first_rank: Global rank of this worker's first replica.
    """

    def __init__(self, choice, first_rank: int):
        self.choice = choice
        self.first_rank = first_rank

    def of(self, algorithm: str, num_elements: int, itemsize: int, replica_id: int = 0) -> int:
        """Bytes local replica `replica_id` sends to all-reduce `num_elements` with `algorithm`."""
        rank = self.first_rank + replica_id
        return itemsize * cost.elements_sent(self.choice.spec(algorithm), self.choice.group_size,
                                             rank, num_elements)

    def dense(self, num_elements: int, dtype, replica_id: int = 0, refine: bool = False) -> int:
        """Bytes to all-reduce such a buffer with the algorithm chosen for its size.

        Args:
            num_elements: Elements of the buffer.
            dtype: Its dtype (a `tf.DType` or a name).
            replica_id: The local replica that sends.
            refine: Whether "auto" may time its candidates at this size (see
                `choice.AlgorithmChoice.select`).
        """
        itemsize = tf.as_dtype(dtype).size
        algorithm = self.choice.select(num_elements * itemsize, itemsize, refine=refine)
        return self.of(algorithm, num_elements, itemsize, replica_id)

    def of_native(self, values) -> int:
        """Bytes the first replica sends for TF's own all-reduce of `values` (a flat list).

        IndexedSlices and tensors without a static shape are not counted.
        """
        return sum(self.of(auto.NATIVE, t.shape.num_elements(), t.dtype.size)
                   for t in values
                   if not isinstance(t, tf.IndexedSlices) and t.shape.is_fully_defined())
