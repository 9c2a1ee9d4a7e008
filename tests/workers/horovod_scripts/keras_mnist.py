"""Horovod's Keras MNIST recipe, written against `tfdist_ext.horovod` (a test script).

The API usage of Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py, with
the import changed, generated 8x8 digits
(tests/workers/digits8x8.py) instead of a download, and Keras 3's
removed `experimental_run_tf_function` argument dropped. Usage:

    tfdist-run -np 2 python keras_mnist.py OUT_DIR
"""

import sys

import numpy as np
import tensorflow as tf

import tfdist_ext.horovod.tensorflow.keras as hvd
from tests.workers.digits8x8 import load_digits

# Initialize Horovod, pin one GPU per process (none on this machine).
hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

digits = load_digits()
images = (digits.images[..., None] / 16.0).astype("float32")
labels = digits.target.astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((images, labels))
dataset = dataset.shard(hvd.size(), hvd.rank()).repeat().shuffle(1000, seed=hvd.rank()).batch(32)

model = tf.keras.Sequential([
    tf.keras.Input((8, 8, 1)),
    tf.keras.layers.Conv2D(16, 3, activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])

# Scale the learning rate by the number of workers; wrap the optimizer.
scaled_lr = 0.002 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)
opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
]
if hvd.rank() == 0:  # checkpoints on worker 0 only
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(sys.argv[1] + "/checkpoint-{epoch}.weights.h5",
                                                        save_weights_only=True))
verbose = 1 if hvd.rank() == 0 else 0
history = model.fit(dataset, steps_per_epoch=240 // hvd.size(), callbacks=callbacks, epochs=4,
                    verbose=verbose)
accuracy = model.evaluate(images, labels, verbose=0)[1]
print(f"rank {hvd.rank()} of {hvd.size()}: final accuracy {accuracy:.3f}, "
      f"averaged epoch accuracy {history.history['accuracy'][-1]:.4f}", flush=True)
assert np.isfinite(history.history["loss"][-1])
