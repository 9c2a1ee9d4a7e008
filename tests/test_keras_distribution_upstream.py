"""Keras' own tests of its distribution API, run against tfdist_ext's TensorFlow backend.

keras/src/distribution/distribution_lib_test.py comes with the installed Keras wheel
(3.12 and later; Keras 3.10 and 3.11 do not ship it, and this module skips).
DataShardingIntegrationTest is not run: Keras marks it JAX-only and `multi_device`
(it needs 4 or more devices and sets the process count by hand).
"""

import os

import pytest

import tfdist_ext  # noqa: F401  pylint: disable=unused-import  (installs the backend)

keras_tests = pytest.importorskip(
    "keras.src.distribution.distribution_lib_test",
    reason="this Keras wheel does not ship distribution_lib_test.py (3.12+ does)")


# Keras' own tests of keras/src/distribution/distribution_lib_test.py (from the installed
# wheel), run against tfdist_ext's TensorFlow backend. Keras skips three of its classes
# unless the backend is JAX ("Only JAX has the backend to mock"); pytest collects a class's
# marks from its bases, so the skip is taken off those classes (in this process only).
# MultiProcessInitializeTest's tearDown clears os.environ: the subclass restores it.
for _case in (keras_tests.MultiProcessInitializeTest, keras_tests.DataParallelDistributionTest,
              keras_tests.ModelParallelDistributionTest):
    _case.pytestmark = [m for m in _case.pytestmark
                        if not (m.name == "skipif" and "JAX" in m.kwargs.get("reason", ""))]


class TestKerasMultiProcessInitialize(keras_tests.MultiProcessInitializeTest):
    def setUp(self):
        self._environ = dict(os.environ)
        super().setUp()

    def tearDown(self):
        super().tearDown()  # os.environ.clear()
        os.environ.update(self._environ)


class TestKerasDataParallel(keras_tests.DataParallelDistributionTest):
    pass


class TestKerasModelParallel(keras_tests.ModelParallelDistributionTest):
    pass


class TestKerasDeviceMesh(keras_tests.DeviceMeshTest):
    pass


class TestKerasTensorLayout(keras_tests.TensorLayoutTest):
    pass


class TestKerasDistribution(keras_tests.DistributionTest):
    pass


class TestKerasTfDatasetDistribution(keras_tests.TfDatasetDistributionTest):
    pass


class TestKerasLayoutMap(keras_tests.LayoutMapTest):
    pass
