"""TensorFlow's `strategy_test_lib` checks, run on 1 and 2 replicas of one process.

TF ships `tensorflow/python/distribute/strategy_test_lib.py` (the checks its
own strategy tests call: minimize a loss, replica ids, merge_call exceptions,
input functions, global step, numpy datasets, all-reduce sums and means and
their gradients) but not the tests that call them. This file calls each check
with `tf.distribute.MirroredStrategy(devices)`, which tests/upstream's plugin
turns into `tfdist_ext.Strategy` (or leaves as TF's, the control).
"""

import tensorflow as tf
from absl.testing import parameterized
from tensorflow.python.distribute import strategy_test_lib
from tensorflow.python.eager import context

DEVICES = {1: ["CPU:0"], 2: ["CPU:0", "CPU:1"]}


def _strategy(replicas):
    return tf.distribute.MirroredStrategy(DEVICES[replicas])


class _LogicalCpus:
    def setUp(self):  # pylint: disable=invalid-name
        super().setUp()
        context._reset_context()  # pylint: disable=protected-access
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


class DistributionChecks(_LogicalCpus, strategy_test_lib.DistributionTestBase,
                         parameterized.TestCase):
    """DistributionTestBase's checks that need no session or parameter servers."""

    @parameterized.parameters(1, 2)
    def test_minimize_loss_eager(self, replicas):
        self._test_minimize_loss_eager(_strategy(replicas))

    @parameterized.parameters(1, 2)
    def test_replica_id(self, replicas):
        self._test_replica_id(_strategy(replicas))

    @parameterized.parameters(1, 2)
    def test_call_and_merge_exceptions(self, replicas):
        self._test_call_and_merge_exceptions(_strategy(replicas))

    @parameterized.parameters(1, 2)
    def test_global_step_update(self, replicas):
        self._test_global_step_update(_strategy(replicas))

    @parameterized.parameters((1, False), (2, False), (1, True), (2, True))
    def test_numpy_dataset(self, replicas, in_function):
        self._test_numpy_dataset(_strategy(replicas), run_in_function=in_function)

    @parameterized.parameters(1, 2)
    def test_trainable_variable(self, replicas):
        self._test_trainable_variable(_strategy(replicas))

    @parameterized.parameters(1, 2)
    def test_summary_for_replica_zero_only(self, replicas):
        self._test_summary_for_replica_zero_only(_strategy(replicas))


class OneReplicaChecks(_LogicalCpus, strategy_test_lib.OneDeviceDistributionTestBase):
    """OneDeviceDistributionTestBase's checks on one replica."""

    def test_run(self):
        self._test_run(_strategy(1))

    def test_all_reduce_sum(self):
        self._test_all_reduce_sum(_strategy(1))

    def test_all_reduce_sum_gradients(self):
        self._test_all_reduce_sum_gradients(_strategy(1))

    def test_all_reduce_sum_gradient_tape(self):
        self._test_all_reduce_sum_gradient_tape(_strategy(1))

    def test_all_reduce_mean(self):
        self._test_all_reduce_mean(_strategy(1))

    def test_all_reduce_mean_gradients(self):
        self._test_all_reduce_mean_gradients(_strategy(1))

    def test_all_reduce_mean_gradient_tape(self):
        self._test_all_reduce_mean_gradient_tape(_strategy(1))


class TwoReplicaChecks(_LogicalCpus, strategy_test_lib.TwoDeviceDistributionTestBase,
                       parameterized.TestCase):
    """TwoDeviceDistributionTestBase's checks, eager and inside a tf.function."""

    @parameterized.parameters(False, True)
    def test_run(self, in_function):
        self._test_run(_strategy(2), run_in_function=in_function)

    @parameterized.parameters(False, True)
    def test_all_reduce_sum(self, in_function):
        self._test_all_reduce_sum(_strategy(2), run_in_function=in_function)

    @parameterized.parameters(False, True)
    def test_all_reduce_sum_gradients(self, in_function):
        self._test_all_reduce_sum_gradients(_strategy(2), run_in_function=in_function)

    @parameterized.parameters(False, True)
    def test_all_reduce_sum_gradient_tape(self, in_function):
        self._test_all_reduce_sum_gradient_tape(_strategy(2), run_in_function=in_function)

    @parameterized.parameters(False, True)
    def test_all_reduce_mean(self, in_function):
        self._test_all_reduce_mean(_strategy(2), run_in_function=in_function)

    @parameterized.parameters(False, True)
    def test_all_reduce_mean_gradients(self, in_function):
        self._test_all_reduce_mean_gradients(_strategy(2), run_in_function=in_function)

    @parameterized.parameters(False, True)
    def test_all_reduce_mean_gradient_tape(self, in_function):
        self._test_all_reduce_mean_gradient_tape(_strategy(2), run_in_function=in_function)


if __name__ == "__main__":
    tf.test.main()
