"""tfdist_ext.horovod: Horovod's TensorFlow / Keras API on tfdist_ext, checked against numpy
and single-process Keras, and Horovod-style scripts run under tfdist-run."""

import pytest

from conftest import ROOT, launch
from tfdist_ext.horovod import _collectives, _gradients, _runtime

CHECKS = ROOT / "tests" / "workers" / "horovod_checks.py"
SCRIPTS = ROOT / "tests" / "workers" / "horovod_scripts"
DRIVER = ROOT / "tests" / "workers" / "run_scripts.py"


@pytest.mark.multiworker
def test_every_collective_matches_numpy_on_three_workers():
    code, out, _ = launch(3, [CHECKS, "api"], timeout=240)
    assert code == 0, out[-4000:]
    assert all(f"[{i}] api ok" in out for i in range(3)), out[-4000:]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """One 2-worker launch: the training checks, then Horovod's example scripts."""
    out = tmp_path_factory.mktemp("horovod")
    code, text, _ = launch(2, [DRIVER, out, f"{CHECKS} training",
                               SCRIPTS / "keras_mnist.py", SCRIPTS / "tf2_mnist.py",
                               f"{SCRIPTS / 'keras_synthetic_benchmark.py'} --fp16-allreduce"],
                           timeout=480)
    assert code == 0, text[-4000:]
    return out, text


@pytest.mark.multiworker
def test_distributed_optimizer_and_tape_train_like_one_process_on_the_global_batch(two_workers):
    """DistributedOptimizer (with backward_passes_per_step 1 and 2) and DistributedGradientTape."""
    _, out = two_workers
    assert "[0] training ok" in out and "[1] training ok" in out, out[-4000:]


@pytest.mark.multiworker
def test_horovod_keras_example_runs_with_only_the_import_changed(two_workers):
    out_dir, out = two_workers
    accuracies = [float(line.split("final accuracy ")[1].split(",")[0])
                  for line in out.splitlines() if "final accuracy" in line]
    assert len(accuracies) == 2 and min(accuracies) > 0.9, accuracies
    assert sorted(p.name for p in (out_dir / "keras_mnist").glob("checkpoint-*")) == [
        f"checkpoint-{e}.weights.h5" for e in range(1, 5)]  # rank 0 only wrote them


@pytest.mark.multiworker
def test_horovod_tf2_example_runs_with_only_the_import_changed(two_workers):
    out_dir, out = two_workers
    assert "last loss" in out, out[-4000:]
    assert (out_dir / "tf2_mnist" / "checkpoint").exists()


@pytest.mark.multiworker
def test_horovod_synthetic_benchmark_runs_with_only_the_import_changed(two_workers):
    _, out = two_workers
    assert "Total img/sec on 2 device(s)" in out, out[-4000:]


def test_topology_from_the_cluster_addresses():
    jobs = {"chief": ["a:1"], "worker": ["a:2", "b:1", "b:2", "c:1"]}
    assert _runtime.topology(jobs, "worker", 2) == {
        "rank": 3, "size": 5, "local_rank": 1, "local_size": 2, "cross_rank": 1,
        "cross_size": 3}
    assert _runtime.topology(jobs, "chief", 0)["rank"] == 0


def test_calls_before_init_and_unsupported_options_say_what_to_do():
    with pytest.raises(ValueError, match=r"call hvd.init\(\) before hvd.rank\(\)"):
        _runtime.rank()
    with pytest.raises(ValueError, match="Argument `sync` is not available through hvd.init"):
        _runtime.init(sync="local_sgd")
    with pytest.raises(ValueError, match=r"Argument `op` must be hvd.Average or hvd.Sum; "
                                         r"received hvd.Adasum"):
        _gradients.DistributedGradientTape(None, op=_collectives.Adasum)
    with pytest.raises(ValueError, match=r"Argument `compression` must be hvd.Compression.none, "
                                         r"hvd.Compression.fp16 or a tfdist_ext compressor .*"
                                         r"received 'top-k'"):
        _gradients.distributed_keras_optimizer(None, compression="top-k")
