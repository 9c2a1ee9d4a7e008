"""keras.io's "Text classification with Transformer": a TransformerBlock layer
(MultiHeadAttention, feed-forward network, LayerNormalization, residuals) over
a TokenAndPositionEmbedding layer, global average pooling and a softmax, on
integer sequences made offline instead of IMDB, shrunk.

The example's dropout rate is passed as 0 (`rate=0.0`, and no Dropout before
the head) so that the run is deterministic. Adam, as there. Writes
OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np
from keras import layers, ops

keras.utils.set_random_seed(55)
strategy = tfdist_ext.Strategy()


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


vocab_size = 200  # Only consider the top 200 words
maxlen = 20  # Only consider the first 20 words of each review
rng = np.random.default_rng(55)
x_all = rng.integers(2, vocab_size, size=(340, maxlen))
y_all = (np.isin(x_all, np.arange(2, 40)).sum(axis=1) >= 4).astype("int64")
x_train, y_train, x_val, y_val = x_all[:280], y_all[:280], x_all[280:], y_all[280:]
print(len(x_train), "Training sequences")
print(len(x_val), "Validation sequences")

embed_dim = 16  # Embedding size for each token
num_heads = 2  # Number of attention heads
ff_dim = 16  # Hidden layer size in feed forward network inside transformer

with strategy.scope():
    inputs = layers.Input(shape=(maxlen,))
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim, rate=0.0)
    x = transformer_block(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(8, activation="relu")(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x_train, y_train, batch_size=32, epochs=2,
                    validation_data=(x_val, y_val), verbose=2)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history,
               "evaluate": model.evaluate(x_val, y_val, batch_size=32, verbose=0),
               "predict": model.predict(x_val[:16], verbose=0).tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
