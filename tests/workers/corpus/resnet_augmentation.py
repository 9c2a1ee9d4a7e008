"""keras.io's "Image classification from scratch": data augmentation layers
(RandomFlip, RandomRotation, seeded) inside the model, then a small Xception-
style residual network (Conv2D / SeparableConv2D, BatchNormalization,
1x1-convolution shortcuts added to each block's output), shrunk to 16x16x3
images made offline. Momentum SGD. Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(44)
strategy = tfdist_ext.Strategy()

image_size = (16, 16)
rng = np.random.default_rng(44)
images = rng.integers(0, 256, size=(260, 16, 16, 3)).astype("float32")
labels = (images[:, 4:12, 4:12, 0].mean(axis=(1, 2)) > 127.5).astype("int64")
images[labels == 1, 6:10, 6:10, 1] = 255.0  # something to see

data_augmentation_layers = [
    layers.RandomFlip("horizontal", seed=1),
    layers.RandomRotation(0.1, seed=2),
]


def data_augmentation(images):
    for layer in data_augmentation_layers:
        images = layer(images)
    return images


def make_model(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = data_augmentation(inputs)
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(8, 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    previous_block_activation = x  # Set aside residual
    for size in [8, 16]:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(
            previous_block_activation)
        x = layers.add([x, residual])  # Add back residual
        previous_block_activation = x  # Set aside next residual

    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(1, activation=None)(x)
    return keras.Model(inputs, outputs)


with strategy.scope():
    model = make_model(input_shape=image_size + (3,), num_classes=2)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(name="acc")])
history = model.fit(images[:200], labels[:200], epochs=2, batch_size=32,
                    validation_data=(images[200:], labels[200:]), verbose=2)
evaluation = model.evaluate(images[200:], labels[200:], batch_size=32, verbose=0)
moving = [float(np.sum(w)) for w in model.non_trainable_weights if "moving" in w.path]

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history, "evaluate": evaluation, "moving": moving,
               "predict": model.predict(images[200:216], verbose=0).ravel().tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
