"""A worker whose dataset ends before its cardinality said (tests/keras/test_input_guards.py).

Every worker's dataset claims 8 batches (`assert_cardinality`, as a reader of
sharded files or a lying generator would); worker 1's really has 5. Prints
"ERROR <type>: <message>" and the seconds the fit ran, then exits 3.
"""

import sys
import time

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

strategy = tfdist_ext.Strategy()
real = 5 if strategy.worker_index == 1 else 8
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int64")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).take(real).apply(
    tf.data.experimental.assert_cardinality(8))
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
start = time.monotonic()
try:
    getattr(model, sys.argv[1])(data, verbose=0)
except Exception as err:  # pylint: disable=broad-except
    print(f"ERROR {type(err).__name__}: {err}".replace("\n", " "), flush=True)
    print(f"after {time.monotonic() - start:.1f} s", flush=True)
    sys.exit(3)
print("finished without an error", flush=True)
