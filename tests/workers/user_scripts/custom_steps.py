"""keras-io's custom_train_step_in_tensorflow, shrunk, with offline data.

Two of its models: the "lower-level" one (its own loss function and loss
tracker in `train_step`) and the GAN (a subclassed model without `call()`).
Runs with or without TF_CONFIG; writes the logged losses and weight sums to
OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
import tensorflow as tf
from keras import layers

keras.utils.set_random_seed(7)
strategy = tfdist_ext.Strategy()


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        batch_size = tf.shape(real_images)[0]
        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        combined = tf.concat([self.generator(noise), real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((batch_size, 1)),
                                  self.discriminator(self.generator(noise)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


rng = np.random.default_rng(0)
x = rng.normal(size=(288, 16)).astype("float32")
y = (x @ rng.normal(size=(16, 1)) + 0.1).astype("float32")
with strategy.scope():
    inputs = keras.Input(shape=(16,))
    model = CustomModel(inputs, layers.Dense(1)(layers.Dense(8, activation="relu")(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
history = model.fit(x, y, batch_size=48, epochs=3, shuffle=False, verbose=2)

latent_dim = 4
images = rng.random((96, 8, 8, 1)).astype("float32")
with strategy.scope():
    discriminator = keras.Sequential([keras.Input((8, 8, 1)), layers.Conv2D(4, 3, strides=2),
                                      layers.LeakyReLU(0.2), layers.GlobalMaxPooling2D(),
                                      layers.Dense(1)])
    generator = keras.Sequential([keras.Input((latent_dim,)), layers.Dense(4 * 4 * 4),
                                  layers.Reshape((4, 4, 4)),
                                  layers.Conv2DTranspose(4, 4, strides=2, padding="same"),
                                  layers.Conv2D(1, 3, padding="same", activation="sigmoid")])
    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    gan.compile(d_optimizer=keras.optimizers.Adam(3e-4), g_optimizer=keras.optimizers.Adam(3e-4),
                loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
gan_history = gan.fit(tf.data.Dataset.from_tensor_slices(images).batch(48), epochs=2, verbose=2)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"loss": history.history["loss"], "mae": history.history["mae"],
               "weights": float(sum(np.sum(w) for w in model.get_weights())),
               "gan": gan_history.history,
               "gan_weights": float(sum(np.sum(w) for w in gan.get_weights()))}, f)
