"""Horovod's Keras synthetic benchmark, written against `tfdist_ext.horovod`
(a test script; a small model instead of ResNet-50).

The API usage of Horovod's examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py
with the import changed and Keras 3's removed `experimental_run_tf_function`
dropped. Usage:

    tfdist-run -np 2 python keras_synthetic_benchmark.py [--fp16-allreduce]
"""

import argparse
import timeit

import numpy as np
import tensorflow as tf

import tfdist_ext.horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=5)
parser.add_argument("--num-iters", type=int, default=3)
args = parser.parse_args()

hvd.init()

model = tf.keras.Sequential([
    tf.keras.Input((32, 32, 3)),
    tf.keras.layers.Conv2D(16, 3, activation="relu"),
    tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(100),
])
opt = tf.optimizers.SGD(0.01)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
opt = hvd.DistributedOptimizer(opt, compression=compression)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)

data = tf.random.uniform([args.batch_size, 32, 32, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=99, dtype=tf.int64)
dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(args.batch_size)

callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]


class TimingCallback(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.img_secs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.starttime = timeit.default_timer()

    def on_epoch_end(self, epoch, logs=None):
        elapsed = timeit.default_timer() - self.starttime
        img_sec = args.batch_size * args.num_batches_per_iter / elapsed
        if hvd.rank() == 0:
            print(f"Iter #{epoch}: {img_sec:.1f} img/sec per device", flush=True)
        if epoch > 0:  # the first epoch is the warm-up
            self.img_secs.append(img_sec)


timing = TimingCallback()
callbacks.append(timing)
model.fit(dataset, steps_per_epoch=args.num_batches_per_iter, callbacks=callbacks,
          epochs=args.num_iters + 1, verbose=0)
if hvd.rank() == 0:
    mean = np.mean(timing.img_secs)
    print(f"Img/sec per device: {mean:.1f}")
    print(f"Total img/sec on {hvd.size()} device(s): {hvd.size() * mean:.1f}", flush=True)
