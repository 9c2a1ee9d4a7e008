"""Driver of tests/test_multiworker.py's Ray Train test.

    python ray_train.py OUT_DIR NUM_WORKERS

Starts a local Ray instance, trains `multiworker_checks.main(OUT_DIR, "ray")` (the
program tfdist-run's test runs, plus Ray's ReportCheckpointCallback) with
`TensorflowTrainer(..., scaling_config=ScalingConfig(num_workers=NUM_WORKERS))`,
which writes each worker's TF_CONFIG (and TF_USE_LEGACY_KERAS=1), writes the trainer's
result to OUT_DIR/result.json and shuts Ray down.
"""

import json
import pathlib
import sys

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

WORKERS = pathlib.Path(__file__).resolve().parent


def loop(config):
    sys.path.insert(0, config["workers"])
    import multiworker_checks  # pylint: disable=import-outside-toplevel
    multiworker_checks.main(config["out"], "ray")


def main(out, num_workers):
    out = pathlib.Path(out)
    ray.init(num_cpus=num_workers, include_dashboard=False, log_to_driver=True)
    try:
        trainer = TensorflowTrainer(
            loop, train_loop_config={"out": str(out), "workers": str(WORKERS)},
            scaling_config=ScalingConfig(num_workers=num_workers,
                                         resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=str(out / "ray_results"), name="fit"))
        result = trainer.fit()
        (out / "result.json").write_text(json.dumps({
            "metrics": result.metrics, "error": repr(result.error) if result.error else None,
            "checkpoint": result.checkpoint.path if result.checkpoint else None}))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
