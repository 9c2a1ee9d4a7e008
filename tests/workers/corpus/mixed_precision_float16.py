"""TF's "Mixed precision" guide: `keras.mixed_precision.set_global_policy(
"mixed_float16")`, Dense layers computing in float16 with float32 variables, the
logits' softmax forced to float32 (`dtype="float32"`), `compile` wraps the
optimizer (Adam here) in a LossScaleOptimizer by itself. Offline data, shrunk.
Sets the policy back to "float32" at the end (a driver runs scripts after it
in the same process). Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
from keras import layers, mixed_precision

keras.utils.set_random_seed(155)
strategy = tfdist_ext.Strategy()
mixed_precision.set_global_policy("mixed_float16")

rng = np.random.default_rng(155)
x_train = rng.random((256, 64)).astype("float32")
y_train = (x_train[:, :8].sum(axis=1) * 2 % 10).astype("int64")
x_test = rng.random((64, 64)).astype("float32")
y_test = (x_test[:, :8].sum(axis=1) * 2 % 10).astype("int64")

with strategy.scope():
    inputs = keras.Input(shape=(64,), name="digits")
    num_units = 64
    dense1 = layers.Dense(num_units, activation="relu", name="dense_1")
    x = dense1(inputs)
    dense2 = layers.Dense(num_units, activation="relu", name="dense_2")
    x = dense2(x)
    print("x.dtype: %s" % x.dtype)
    print("dense1.kernel.dtype: %s" % dense1.kernel.dtype)
    x = layers.Dense(10, name="dense_logits")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="predictions")(x)
    print("Outputs dtype: %s" % outputs.dtype)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"])

history = model.fit(x_train, y_train, batch_size=32, epochs=2, validation_split=0.25,
                    verbose=2)
test_scores = model.evaluate(x_test, y_test, verbose=2)
print("Test loss:", test_scores[0])
print("Test accuracy:", test_scores[1])
result = {"history": history.history, "evaluate": test_scores,
          "optimizer": type(model.optimizer).__name__,
          "loss_scale": float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale)),
          "compute_dtype": dense1.compute_dtype, "kernel_dtype": dense1.kernel.dtype,
          "predict_dtype": str(model.predict(x_test[:2], verbose=0).dtype),
          "predict": model.predict(x_test[:16], verbose=0).tolist(),
          "weights": float(sum(np.sum(w) for w in model.get_weights()))}
mixed_precision.set_global_policy("float32")

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump(result, f)
