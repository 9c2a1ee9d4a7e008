"""Worker program for tests/elastic/test_elastic_custom_loop.py: under `tfdist-run
--elastic`, one epoch of Keras' `fit`, then a custom training loop in the style of TF's
distributed training tutorial (`strategy.run` in the user's own `tf.function`).

    python elastic_custom_loop.py KILL_STEP

Each worker prints "fit done" after the fit; worker 2 SIGKILLs itself after step
KILL_STEP of the custom loop.
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext

kill_step = int(sys.argv[1])
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(3)
strategy = tfdist_ext.Strategy()
GLOBAL_BATCH = 48
x = np.random.RandomState(0).randn(1536, 12).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")
with strategy.scope():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction="none")
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
model.compile(optimizer=optimizer, loss=loss_object)
model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
print("fit done", flush=True)


def train_step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_object(labels, model(features, training=True)),
                                          global_batch_size=GLOBAL_BATCH)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@tf.function
def distributed_step(inputs):
    losses = strategy.run(train_step, args=(inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
for epoch in range(3):
    for step, batch in enumerate(strategy.experimental_distribute_dataset(dataset)):
        distributed_step(batch)
        if index == 2 and epoch == 0 and step + 1 == kill_step:
            os.kill(os.getpid(), 9)
print("custom loop done", flush=True)
