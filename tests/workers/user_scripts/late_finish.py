"""A script whose non-chief workers finish 4 s after the chief (a slow teardown).

The chief's process hosts TF's coordination service, so it must exit last: the
others would otherwise print `StartAbort UNAVAILABLE: Failed to send RPC to
coordination service` and stall. Prints "finished <worker> <time>" last.
"""

import time

import keras
import numpy as np

import tfdist_ext

s = tfdist_ext.Strategy()
with s.scope():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    m.compile("sgd", "mse")
m.fit(np.ones((60, 3)), np.ones((60, 1)), batch_size=12, epochs=1, verbose=0)
if s.worker_index:
    time.sleep(4)  # e.g. a slow input pipeline's teardown
print("finished", s.worker_index, time.time(), flush=True)
