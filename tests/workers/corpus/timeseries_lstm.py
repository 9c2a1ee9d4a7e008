"""keras.io's "Timeseries forecasting for weather prediction": normalized
features, windows made with `keras.utils.timeseries_dataset_from_array`
(sequence_length, sampling_rate, a target `future` steps ahead), an LSTM
regressor, validation windows the same way, shrunk to a synthetic series
made offline. Plain SGD (the example uses Adam). Writes OUT/w<index>.json.
"""

import json
import os
import sys

import tfdist_ext
import keras
import numpy as np

keras.utils.set_random_seed(66)
strategy = tfdist_ext.Strategy()

split_fraction = 0.75
step = 2
past = 24
future = 4
batch_size = 32
epochs = 2

rng = np.random.default_rng(66)
t = np.arange(800, dtype="float32")
features = np.stack([np.sin(t / 12) + 0.1 * rng.normal(size=t.size),
                     np.cos(t / 31) + 0.1 * rng.normal(size=t.size),
                     0.01 * t], axis=1).astype("float32")
train_split = int(split_fraction * len(features))


def normalize(data, train_split):
    data_mean = data[:train_split].mean(axis=0)
    data_std = data[:train_split].std(axis=0)
    return (data - data_mean) / data_std


features = normalize(features, train_split)
train_data = features[0:train_split - 1]
val_data = features[train_split:]

start = past + future
end = start + train_split
x_train = train_data
y_train = features[start:end][:, 0]
sequence_length = int(past / step)

dataset_train = keras.utils.timeseries_dataset_from_array(
    x_train, y_train, sequence_length=sequence_length, sampling_rate=step,
    batch_size=batch_size)

x_end = len(val_data) - past - future
label_start = train_split + past + future
x_val = val_data[:x_end]
y_val = features[label_start:][:, 0]
dataset_val = keras.utils.timeseries_dataset_from_array(
    x_val, y_val, sequence_length=sequence_length, sampling_rate=step,
    batch_size=batch_size)

for batch in dataset_train.take(1):
    inputs, targets = batch
print("Input shape:", inputs.numpy().shape)
print("Target shape:", targets.numpy().shape)

with strategy.scope():
    inputs = keras.layers.Input(shape=(inputs.shape[1], inputs.shape[2]))
    lstm_out = keras.layers.LSTM(16)(inputs)
    outputs = keras.layers.Dense(1)(lstm_out)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse",
                  metrics=["mae"])
history = model.fit(dataset_train, epochs=epochs, validation_data=dataset_val, verbose=2)
predictions = model.predict(dataset_val, verbose=0)

with open(os.path.join(sys.argv[1], f"w{strategy.worker_index}.json"), "w",
          encoding="utf-8") as f:
    json.dump({"history": history.history, "rows": len(predictions),
               "evaluate": model.evaluate(dataset_val, verbose=0),
               "predict": predictions[:16].ravel().tolist(),
               "weights": float(sum(np.sum(w) for w in model.get_weights()))}, f)
