"""TF's "Multi-worker training with Keras" tutorial, with tfdist_ext.Strategy() in
place of MultiWorkerMirroredStrategy and a small offline MNIST stand-in.

Its cells unchanged otherwise: every worker saves the model (the others into a
temporary directory they delete), then every worker loads the chief's file;
the same with tf.train.CheckpointManager. Writes OUT/w<index>.json.
"""

import json
import os
import sys
import tempfile

import tfdist_ext
import numpy as np
import tensorflow as tf

OUT = sys.argv[1]


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 255, size=(512, 28, 28)).astype(np.float32) / np.float32(255)
    y_train = rng.integers(0, 10, size=(512,)).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(
        600, seed=1).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    import keras  # pylint: disable=import-outside-toplevel
    model = keras.Sequential([
        keras.layers.InputLayer(input_shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model


tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tfdist_ext.Strategy()
global_batch_size = 16 * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=5, verbose=2)


def _is_chief(task_type, task_id):
    return task_type == "worker" and task_id == 0


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


model_path = os.path.join(OUT, "keras-model.keras")
task_type, task_id = tf_config["task"]["type"], tf_config["task"]["index"]
write_model_path = write_filepath(model_path, task_type, task_id)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))
import keras  # pylint: disable=wrong-import-position
loaded_model = keras.models.load_model(model_path)
loaded_model.fit(mnist_dataset(global_batch_size), epochs=1, steps_per_epoch=2, verbose=0)

checkpoint_dir = os.path.join(OUT, "ckpt")
checkpoint = tf.train.Checkpoint(model=multi_worker_model)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir,
                                                max_to_keep=1)
checkpoint_manager.save()
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(write_checkpoint_dir)
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
checkpoint.restore(latest_checkpoint)

# A file only the chief writes, read by all after a barrier.
note = os.path.join(OUT, "chief-note.txt")
if task_id == 0:
    with open(note, "w", encoding="utf-8") as f:
        f.write("written by the chief")
strategy.barrier()
with open(note, encoding="utf-8") as f:
    read_back = f.read()
with open(os.path.join(OUT, f"w{task_id}.json"), "w", encoding="utf-8") as f:
    json.dump({"latest_checkpoint": latest_checkpoint, "note": read_back,
               "loaded_weights": float(sum(np.sum(w) for w in loaded_model.get_weights()))}, f)
