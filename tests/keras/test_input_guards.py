"""Guards on what each worker reads (issue 47): Keras' loaders seeded alike on every
worker, no second iterator over a cached dataset, and a dataset that ends before
its cardinality said is an error naming it.

The multi-worker runs of these are in tests/test_user_scripts.py (keras.io's
text example) and tests/test_multiworker.py (a worker whose dataset ends early).
"""

import keras
import pytest
import tensorflow as tf

from tfdist_ext.keras import data_order, loader_seeds, local_input


def test_a_job_seed_is_the_same_for_the_same_job_and_call_and_differs_otherwise():
    job = ["127.0.0.1:2001", "127.0.0.1:2002"]
    assert loader_seeds.job_seed(job, 0) == loader_seeds.job_seed(list(job), 0)
    seeds = {loader_seeds.job_seed(job, i) for i in range(20)}
    assert len(seeds) == 20 and all(0 <= s < 1_000_000 for s in seeds)
    assert loader_seeds.job_seed(["127.0.0.1:2003", "127.0.0.1:2004"], 0) not in seeds


def test_an_unseeded_loader_call_gets_the_job_seed_and_a_seeded_one_keeps_its_own(tmp_path):
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(6):
            (tmp_path / label / f"{i}.txt").write_text(f"{label} {i}")
    job = ["h:1", "h:2"]
    orders = []
    for _ in range(2):  # two workers of the same job, each counting its calls from 0
        calls = iter(range(10))
        loader = loader_seeds.wrap(keras.utils.text_dataset_from_directory, job, calls)
        unseeded = loader(str(tmp_path), batch_size=4)
        orders.append([t.decode() for x, _ in unseeded for t in x.numpy()])
        assert next(calls) == 1  # the seeded call below does not take a job seed
        loader(str(tmp_path), batch_size=4, seed=5)
        assert next(calls) == 2
    assert orders[0] == orders[1] and sorted(orders[0]) != orders[0]
    reference = keras.utils.text_dataset_from_directory(
        str(tmp_path), batch_size=4, seed=loader_seeds.job_seed(job, 0))
    assert orders[0] == [t.decode() for x, _ in reference for t in x.numpy()]


def test_the_data_order_digest_leaves_cached_datasets_alone():
    data = tf.data.Dataset.range(8).batch(2)
    assert data_order.digest(data) is not None
    assert data_order.digest(data.cache().prefetch(2)) is None
    assert data_order.digest(data.map(lambda x: x).cache()) is None


def test_a_dataset_ending_before_its_cardinality_raises_a_named_error():
    promised = tf.data.Dataset.range(10).filter(lambda x: x < 6).apply(
        tf.data.experimental.assert_cardinality(10))
    guarded = local_input.with_promised_length(tf.data.Dataset.range(10).batch(3))
    assert [len(b) for b in guarded] == [3, 3, 3, 1]  # a true promise changes nothing
    with pytest.raises(tf.errors.FailedPreconditionError) as raised:
        list(local_input.with_promised_length(promised))
    assert local_input.is_short_dataset(raised.value)
    error = local_input.short_dataset_error(raised.value, "evaluate")
    assert "this worker's dataset in `evaluate` ended before" in str(error)
    assert "expected to contain 10 elements" in str(error)
    assert "Fix:" in str(error)
    assert not local_input.is_short_dataset(tf.errors.FailedPreconditionError(None, None, "x"))
    unknown = tf.data.Dataset.range(4).filter(lambda x: x > 0)
    assert local_input.with_promised_length(unknown) is unknown


@pytest.mark.multiworker
@pytest.mark.parametrize("call", ["fit", "evaluate"])
def test_a_worker_whose_dataset_ends_early_fails_naming_it_and_its_peer_stops(call):
    from conftest import ROOT, launch  # pylint: disable=import-outside-toplevel
    code, text, seconds = launch(2, [ROOT / "tests" / "workers" / "short_dataset.py", call],
                                 timeout=120)
    assert code != 0, text[-3000:]
    assert "finished without an error" not in text
    lines = [line for line in text.splitlines() if line.startswith("[1] ERROR")]
    assert lines and "RuntimeError: tfdist_ext: this worker's dataset in " \
        f"`{call}` ended before" in lines[0], text[-3000:]
    assert "expected to contain 8 elements but contained only 5" in lines[0]
    assert seconds < 90, text[-3000:]  # worker 0 did not wait out the launch
