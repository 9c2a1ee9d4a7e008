"""Worker program for tests/keras/test_keras_features.py (run under tfdist-run or alone).

    python feature_checks.py OUT_DIR [NUM_REPLICAS]

Trains a small classifier with each ordinary Keras training feature
(`FEATURES`) under a `tfdist_ext.Strategy` (TF_CONFIG workers, or
NUM_REPLICAS logical replicas without TF_CONFIG) and the same model without
a strategy (one replica, same initial weights, same data), and writes the
losses, the largest weight difference and a weight digest per feature to
OUT_DIR/w<index>.json. "mixed_float16" instead forces loss-scale overflows
(initial scale 2^28) with top-k compression and records whether the losses
and error-feedback residuals stayed finite.
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np

import tfdist_ext

SAMPLES, BATCH, EPOCHS = 100, 16, 2
FEATURES = {
    "gradient_accumulation_steps": {"optimizer": {"gradient_accumulation_steps": 2}},
    "clipnorm": {"optimizer": {"clipnorm": 0.1}},
    "global_clipnorm": {"optimizer": {"global_clipnorm": 0.1}},
    "clipvalue": {"optimizer": {"clipvalue": 0.01}},
    "class_weight": {"fit": {"class_weight": {0: 1.0, 1: 3.0}}},
    "sample_weight": {"fit": {"sample_weight": True}},
    "validation_split": {"fit": {"validation_split": 0.25}},
    "validation_data": {"fit": {"validation_data": True}},
    "steps_per_execution": {"compile": {"steps_per_execution": 3}},
    "jit_compile": {"compile": {"jit_compile": True}},
    # Batch statistics over the global batch (the replicas' sums all-reduced), so
    # the moving mean and variance equal one process's too.
    "synchronized_batch_norm": {"model": {"synchronized": True}},
}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    return x, y, rng.uniform(0.5, 2.0, size=SAMPLES).astype("float32")


def build(feature, optimizer=None):
    norm = ([keras.layers.BatchNormalization(**feature["model"])] if "model" in feature
            else [])
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              *norm, keras.layers.Dense(2, dtype="float32")])
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1, **feature.get("optimizer", {})),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], **feature.get("compile", {}))
    return model


def fit_args(feature, x, y, weights):
    args = dict(feature.get("fit", {}))
    if args.get("sample_weight"):
        args["sample_weight"] = weights
    if args.get("validation_data"):
        args["validation_data"] = (x[:30], y[:30])
    return args


def compare(strategy, name, feature, x, y, weights):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build(feature)
    reference = build(feature)
    reference.set_weights(model.get_weights())
    args = fit_args(feature, x, y, weights)
    got = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False, **args)
    want = reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False, **args)
    weights_now = model.get_weights()
    return {"loss": got.history["loss"], "reference_loss": want.history["loss"],
            "val_loss": got.history.get("val_loss"),
            "reference_val_loss": want.history.get("val_loss"),
            "max_weight_difference": float(max(np.abs(a - b).max() for a, b in zip(
                weights_now, reference.get_weights()))),
            "sha": hashlib.sha256(b"".join(w.tobytes() for w in weights_now)).hexdigest()}


def mixed_precision(x, y, options):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        strategy = tfdist_ext.Strategy(compression={"name": "topk", "ratio": 0.1}, **options)
        with strategy.scope():
            optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                                            initial_scale=2.0 ** 28)
            model = build({}, optimizer)
        history = model.fit(x, y, batch_size=BATCH, epochs=4, verbose=0, shuffle=False)
        residuals = [v.numpy() for vs in strategy.state.residuals.values() for v in vs]
        return {"loss": history.history["loss"],
                "loss_scale": float(optimizer.dynamic_scale.numpy()),
                "applied_steps": int(optimizer.iterations.numpy()),
                "residuals_finite": bool(all(np.isfinite(r).all() for r in residuals)),
                "residuals": len(residuals),
                "sha": hashlib.sha256(b"".join(
                    w.tobytes() for w in model.get_weights())).hexdigest()}
    finally:
        keras.mixed_precision.set_global_policy("float32")


def main(out_dir, num_replicas=None):
    options = {} if num_replicas is None else {"num_replicas": int(num_replicas)}
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"] if num_replicas is None else 0
    strategy = tfdist_ext.Strategy(**options)
    x, y, weights = data()
    results = {name: compare(strategy, name, feature, x, y, weights)
               for name, feature in FEATURES.items()}
    results["mixed_float16"] = mixed_precision(x, y, options)
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
