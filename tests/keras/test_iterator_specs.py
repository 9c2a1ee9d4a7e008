"""A distributed iterator's type spec is computed once and still describes it."""

import numpy as np
import tensorflow as tf

import tfdist_ext


def test_distributed_iterator_specs_are_cached_and_still_work():
    strategy = tfdist_ext.Strategy(num_replicas=3)
    data = tf.data.Dataset.range(12).map(lambda i: tf.cast(i, tf.float32)).batch(6)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    spec = iterator._type_spec  # pylint: disable=protected-access
    assert iterator._type_spec is spec  # pylint: disable=protected-access
    assert spec._component_specs is spec._component_specs  # pylint: disable=protected-access
    workers = iterator._iterators  # pylint: disable=protected-access
    assert workers[0]._type_spec is workers[0]._type_spec  # pylint: disable=protected-access

    @tf.function
    def step(it):
        return strategy.reduce("SUM", strategy.run(tf.reduce_sum, args=(next(it),)), axis=None)

    assert float(step(iterator)) == sum(range(6))
    assert float(step(iterator)) == sum(range(6, 12))
    assert step.experimental_get_tracing_count() == 1
    # An iterator made later gets its own spec, and the same traced function.
    other = iter(strategy.experimental_distribute_dataset(data))
    assert other._type_spec is not spec  # pylint: disable=protected-access
    assert float(step(other)) == sum(range(6))
    assert step.experimental_get_tracing_count() == 1
    np.testing.assert_equal(strategy.experimental_local_results(next(other))[0].numpy(),
                            [6.0, 7.0])
