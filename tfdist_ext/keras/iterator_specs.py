"""tf.distribute's iterator specs computed once per iterator, not at every step.

Each call of Keras' train function passes the distributed iterator to a
`tf.function`, which asks the iterator for its type spec (to find the traced
function) and the spec for its per-worker component specs (to flatten the
iterator into tensors). TF builds both anew at every call, canonicalizing
device names on the way: about a tenth of a small model's step on one worker
(py-spy). They depend only on what the iterator was made with, so `cached`
keeps the first answer on the instance.
"""

import functools


def cached(prop):
    """The read-only property `prop`, computed once per instance."""
    key = f"_tfdist_cached_{prop.fget.__name__}"

    @functools.wraps(prop.fget)
    def get(self):
        values = self.__dict__
        if key not in values:
            values[key] = prop.fget(self)
        return values[key]

    return property(get, doc=prop.__doc__)
