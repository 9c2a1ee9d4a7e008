"""TF's "Custom training with tf.distribute.Strategy" tutorial, with
tfdist_ext.Strategy() in place of MirroredStrategy and a small offline
stand-in for Fashion-MNIST (8x8 images).

Its cells unchanged otherwise: `experimental_distribute_dataset`, a per-example
loss (`reduction="none"`) averaged with `tf.nn.compute_average_loss` over the
global batch plus the scaled regularization loss, `strategy.run` inside
`tf.function`s, `strategy.reduce(SUM)` of the replicas' losses, Keras metrics
updated in the replicas, Adam. One change: the global batch is fixed (48)
rather than 64 per replica, so any number of workers trains as one process
would. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(33)
strategy = tfdist_ext.Strategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

rng = np.random.default_rng(33)
train_images = rng.random((250, 8, 8, 1)).astype("float32")
train_labels = (train_images[:, :4].mean(axis=(1, 2, 3)) * 20 % 10).astype("int64")
test_images = rng.random((100, 8, 8, 1)).astype("float32")
test_labels = (test_images[:, :4].mean(axis=(1, 2, 3)) * 20 % 10).astype("int64")

BUFFER_SIZE = len(train_images)
GLOBAL_BATCH_SIZE = 48
EPOCHS = 2

train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(
    BUFFER_SIZE, seed=7).batch(GLOBAL_BATCH_SIZE)
test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(
    GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)


def create_model():
    regularizer = keras.regularizers.L2(1e-3)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=regularizer),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
        keras.layers.Dense(10)])


with strategy.scope():
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction="none")

    def compute_loss(labels, predictions, model_losses):
        per_example_loss = loss_object(labels, predictions)
        loss = tf.nn.compute_average_loss(per_example_loss,
                                          global_batch_size=GLOBAL_BATCH_SIZE)
        if model_losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        return loss

    test_loss = keras.metrics.Mean(name="test_loss")
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    model = create_model()
    optimizer = keras.optimizers.Adam(learning_rate=0.01)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = compute_loss(labels, predictions, model.losses)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss


def test_step(inputs):
    images, labels = inputs
    predictions = model(images, training=False)
    t_loss = loss_object(labels, predictions)
    test_loss.update_state(t_loss)
    test_accuracy.update_state(labels, predictions)


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


@tf.function
def distributed_test_step(dataset_inputs):
    return strategy.run(test_step, args=(dataset_inputs,))


log = {"loss": [], "accuracy": [], "test_loss": [], "test_accuracy": [], "batches": []}
for epoch in range(EPOCHS):
    total_loss = 0.0
    num_batches = 0
    for x in train_dist_dataset:
        total_loss += distributed_train_step(x)
        num_batches += 1
    train_loss = total_loss / num_batches

    for x in test_dist_dataset:
        distributed_test_step(x)

    template = "Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, Test Accuracy: {}"
    print(template.format(epoch + 1, train_loss, train_accuracy.result() * 100,
                          test_loss.result(), test_accuracy.result() * 100))
    log["loss"].append(float(train_loss))
    log["accuracy"].append(float(train_accuracy.result()))
    log["test_loss"].append(float(test_loss.result()))
    log["test_accuracy"].append(float(test_accuracy.result()))
    log["batches"].append(num_batches)
    test_loss.reset_state()
    train_accuracy.reset_state()
    test_accuracy.reset_state()

log["iterations"] = int(optimizer.iterations.numpy())
log["weights"] = float(sum(np.sum(w) for w in model.get_weights()))
with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump(log, f)
