"""A generated stand-in for scikit-learn's 8x8 digits, for the test workers.

    from tests.workers.digits8x8 import load_digits
    digits = load_digits()   # .images (1797, 8, 8), .data (1797, 64), .target (1797,)

Ten fixed random 8x8 stroke templates with values 0..16, each sample one of them
with a random one-pixel shift and Gaussian noise, clipped to 0..16 like the
original. Same shapes, dtypes and value range as `sklearn.datasets.load_digits`,
learnable to over 95% by a small MLP, generated in milliseconds without
importing scikit-learn (which adds about 1.5 s to every TensorFlow process
where it is installed, because Keras' scikit-learn wrapper imports it).
"""

import types

import numpy as np

SAMPLES, CLASSES, SIDE = 1797, 10, 8


def load_digits(seed=0, samples=SAMPLES, noise=3.0):
    """Returns a namespace with `images`, `data` (float64, 0..16) and `target` (int64)."""
    rng = np.random.default_rng(seed)
    templates = (rng.random((CLASSES, SIDE + 2, SIDE + 2)) < 0.35) * 16.0
    target = np.arange(samples) % CLASSES
    rng.shuffle(target)
    dy, dx = rng.integers(0, 3, samples), rng.integers(0, 3, samples)
    images = np.stack([templates[t, y:y + SIDE, x:x + SIDE]
                       for t, y, x in zip(target, dy, dx)])
    images = np.clip(images + rng.normal(0.0, noise, images.shape), 0.0, 16.0)
    return types.SimpleNamespace(images=images, data=images.reshape(samples, -1),
                                 target=target.astype(np.int64))
