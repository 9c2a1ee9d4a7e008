"""The models of bench/step.py in Keras and their data; the PyTorch twins are in step_torch.py.

* "mlp", "cnn": examples/keras_fit.py's (40 floats in, 10 classes).
* "resnet20": He et al.'s CIFAR ResNet-20 ("Deep Residual Learning for Image
  Recognition", CVPR 2016): a 3x3 convolution with 16 channels, three stages of
  three basic blocks (16, 32, 64 channels; batch norm, ReLU; a 1x1 projection where
  the shape changes), global average pooling, 10 classes; 32x32x3 images, 0.27M
  parameters.
* "transformer": a text classifier: token Embedding(20000, 64) plus a position
  Embedding(128, 64), two post-norm encoder blocks (2-head self-attention, a
  128-unit feed-forward layer, as PyTorch's `TransformerEncoderLayer`), average
  pooling, 2 classes; sequences of 128 token ids, 1.36M parameters (1.28M of them
  the token table, whose gradient is sparse in Keras and dense in PyTorch).
* "gru": GRU(128) over 64 steps of 32 features, the last state to 10 classes.

Each model has its own samples per worker per step (`BATCH`), so that a step of
every model takes tens of milliseconds on a CPU core.
"""

import numpy as np

VOCAB, SEQ, WIDTH = 20000, 128, 64
BATCH = {"mlp": 64, "cnn": 64, "resnet20": 16, "transformer": 16, "gru": 32}
CLASSES = {"transformer": 2}
MODELS = tuple(BATCH)


def data(name, samples=1024, seed=0):
    """`(x, y)` numpy arrays for model `name` (images channels-last)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES.get(name, 10), size=samples).astype("int32")
    if name == "resnet20":
        return rng.normal(size=(samples, 32, 32, 3)).astype("float32"), y
    if name == "transformer":
        return rng.integers(0, VOCAB, size=(samples, SEQ)).astype("int32"), y
    if name == "gru":
        return rng.normal(size=(samples, 64, 32)).astype("float32"), y
    return rng.normal(size=(4 * samples, 40)).astype("float32"), np.resize(y, 4 * samples)


def keras_model(keras, name):
    """The Keras model `name`, not compiled."""
    if name in ("mlp", "cnn"):
        from examples.keras_fit import build_model  # pylint: disable=import-outside-toplevel
        return build_model(keras, name)
    return {"resnet20": _resnet20, "transformer": _transformer, "gru": _gru}[name](keras)


def _resnet20(keras):
    layers = keras.layers

    def conv_bn(x, channels, strides=1, relu=True):
        x = layers.Conv2D(channels, 3, strides=strides, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input((32, 32, 3))
    x = conv_bn(inputs, 16)
    for stage, channels in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = conv_bn(x, channels, strides)
            y = conv_bn(y, channels, relu=False)
            if strides != 1:
                shortcut = layers.Conv2D(channels, 1, strides=2, use_bias=False)(x)
                shortcut = layers.BatchNormalization()(shortcut)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x))


def _transformer(keras):
    layers = keras.layers

    class Positions(layers.Layer):
        """Token plus position embeddings."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.token = layers.Embedding(VOCAB, WIDTH)
            self.position = layers.Embedding(SEQ, WIDTH)

        def call(self, ids):
            return self.token(ids) + self.position(keras.ops.arange(SEQ))

    inputs = keras.Input((SEQ,), dtype="int32")
    x = Positions()(inputs)
    for _ in range(2):
        attended = layers.MultiHeadAttention(num_heads=2, key_dim=WIDTH // 2)(x, x)
        x = layers.LayerNormalization(epsilon=1e-5)(x + attended)
        fed = layers.Dense(WIDTH)(layers.Dense(2 * WIDTH, activation="relu")(x))
        x = layers.LayerNormalization(epsilon=1e-5)(x + fed)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(2)(x))


def _gru(keras):
    return keras.Sequential([keras.Input((64, 32)), keras.layers.GRU(128),
                             keras.layers.Dense(10)])
