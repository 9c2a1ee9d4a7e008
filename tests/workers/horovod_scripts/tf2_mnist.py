"""Horovod's TF2 custom training loop (DistributedGradientTape), written against
`tfdist_ext.horovod` (a test script).

The API usage of Horovod's examples/tensorflow2/tensorflow2_mnist.py with the
import changed and generated 8x8 digits
(tests/workers/digits8x8.py) instead of a download. Usage:

    tfdist-run -np 2 python tf2_mnist.py OUT_DIR
"""

import os
import sys

import tensorflow as tf

import tfdist_ext.horovod.tensorflow as hvd
from tests.workers.digits8x8 import load_digits

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

digits = load_digits()
dataset = tf.data.Dataset.from_tensor_slices(
    ((digits.images[..., None] / 16.0).astype("float32"), digits.target.astype("int64")))
dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(64)

model = tf.keras.Sequential([
    tf.keras.Input((8, 8, 1)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10),
])
loss_fn = tf.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = tf.optimizers.Adam(0.001 * hvd.size())
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    # Broadcast initial variables from rank 0 after the first step, when the
    # optimizer's variables exist.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
    return loss


losses = []
for batch, (images, labels) in enumerate(dataset.take(300 // hvd.size())):
    loss = training_step(images, labels, batch == 0)
    losses.append(float(loss))
    if batch % 50 == 0 and hvd.rank() == 0:
        print(f"Step #{batch}\tLoss: {loss:.6f}", flush=True)

weights = hvd.allgather(tf.reshape(model.trainable_variables[0], [1, -1]))
assert float(tf.reduce_max(tf.abs(weights[0] - weights[-1]))) == 0.0, "replicas diverged"
if hvd.rank() == 0:
    checkpoint.save(os.path.join(sys.argv[1], "checkpoint"))
print(f"rank {hvd.rank()}: first loss {losses[0]:.3f}, last loss {losses[-1]:.3f}", flush=True)
assert losses[-1] < 0.5 * losses[0], losses
