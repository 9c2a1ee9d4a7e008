"""Keras' dataset loaders shuffle alike on every worker of a job.

`keras.utils.text_dataset_from_directory` (and the image, audio and
time-series loaders) shuffle by default, and without `seed` draw one from
NumPy's global generator, so each worker of a job lists its files in its own
order. Auto-sharding gives each worker every N-th batch of the dataset it
built, which is a partition of the data only if every worker built the same
sequence: with unseeded loaders, workers train on overlapping data and
`evaluate` counts some samples twice and others never (keras.io's "Text
classification from scratch" builds its test set so).

In a job of several workers (TF_CONFIG), `import tfdist_ext` wraps these
loaders: a call that passes no `seed` (and shuffles) gets one derived from
the job's worker addresses and the call's position among this process's
loader calls, the same on every worker (SPMD) and different between jobs.
A seed the script passes is used as it is.
"""

import functools
import hashlib
import itertools

LOADERS = ("text_dataset_from_directory", "image_dataset_from_directory",
           "audio_dataset_from_directory", "timeseries_dataset_from_array")
_installed = False


def job_seed(addresses, call_index) -> int:
    """A seed in [0, 1e6) from the job's worker addresses and the loader call's index."""
    text = ",".join(addresses) + f"#{call_index}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % 1_000_000


def wrap(loader, addresses, calls):
    """`loader` with a job-wide `seed` when the call passes none."""

    @functools.wraps(loader)
    def seeded(*args, **kwargs):
        if kwargs.get("seed") is None and kwargs.get("shuffle", True):
            kwargs["seed"] = job_seed(addresses, next(calls))
        return loader(*args, **kwargs)

    seeded.tfdist_wrapped = loader
    return seeded


def install(addresses):
    """Wraps the loaders in `keras.utils` (once per process).

    Args:
        addresses: The job's worker addresses, in TF_CONFIG's order.
    """
    global _installed  # pylint: disable=global-statement
    if _installed:
        return
    import keras  # pylint: disable=import-outside-toplevel
    calls = itertools.count()
    for name in LOADERS:
        loader = getattr(keras.utils, name, None)
        if loader is not None and not hasattr(loader, "tfdist_wrapped"):
            setattr(keras.utils, name, wrap(loader, list(addresses), calls))
    _installed = True
