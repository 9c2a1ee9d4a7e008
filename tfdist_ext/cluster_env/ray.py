"""Ray Train's TensorflowTrainer: its workers get TF_CONFIG, and tf.keras stays Keras 3.

`ray.train.tensorflow.TensorflowTrainer` writes TF_CONFIG on every worker (so
`tfdist_ext.Strategy()` finds the job as on any TF_CONFIG cluster) and, since
Ray 2.5x, also ``TF_USE_LEGACY_KERAS=1``, which routes `tf.keras` to the
`tf_keras` package (Keras 2): `tf.keras` fails where `tf_keras` is not
installed and builds models `tfdist_ext.Strategy` cannot train where it is.
`import tfdist_ext` removes that setting (see `keep_keras_3`); `import keras`
is Keras 3 either way, and so are Ray's own Keras callbacks
(`ray.train.tensorflow.keras.ReportCheckpointCallback`).
"""

import logging
import os

log = logging.getLogger("tfdist_ext")
_TRUE = ("1", "true", "True")  # what TensorFlow's Keras loader takes as set


def keep_keras_3(environ=os.environ) -> bool:
    """Removes ``TF_USE_LEGACY_KERAS`` when set, so `tf.keras` resolves to Keras 3.

    TensorFlow reads the variable when `tf.keras` is first used, so this
    works even after `import tensorflow`, as long as the script has not
    touched `tf.keras` yet.

    Returns:
        Whether the variable was removed.
    """
    if environ.get("TF_USE_LEGACY_KERAS") not in _TRUE:
        return False
    value = environ.pop("TF_USE_LEGACY_KERAS")
    by_ray = (" (Ray Train's TensorflowTrainer sets it)"
              if any(key.startswith("RAY_") for key in environ) else "")
    log.info("tfdist_ext: TF_USE_LEGACY_KERAS=%s removed%s: tfdist_ext trains Keras 3 "
             "models, and tf.keras is Keras 3 in this process.", value, by_ray)
    return True
