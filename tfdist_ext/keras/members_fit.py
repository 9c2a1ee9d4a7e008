"""What `fit`, `evaluate` and `predict` do for the job's members, in one object: the
Keras side of the elastic seam (`tfdist_ext.elastic.seam` is the strategy's).
`tfdist_ext.keras.fit_hooks` asks `of(strategy)` and calls what it gets at four
points (the callbacks fit adds, the set-up before Keras' fit, the wrapping of the
train and test functions, the start of an evaluation): `FixedFit` changes nothing,
`ElasticFit` (a `tfdist_ext.Strategy(elastic=...)`) survives deaths and takes in
replacements. fit_hooks knows nothing else of elastic training.

The step-level work (a failed step discarded, the survivors' recovery, a
replacement's admission) is `tfdist_ext.keras.elastic_steps`; the membership
itself is the strategy's `elastic.recovery.Recovery`.
"""

import logging

import keras

from tfdist_ext import frontends
from tfdist_ext.keras import callback_state, elastic_steps

log = logging.getLogger("tfdist_ext")


def of(strategy):
    """What `strategy`'s members need of Keras: an `ElasticFit` under elastic
    training, else a `FixedFit`."""
    ours = frontends.our_strategy(strategy)
    return FixedFit() if ours is None or ours.elastic is None else ElasticFit(ours)


class FixedFit:
    """Keras' entry points when every worker stays for the whole job: as they are."""

    changes = False
    """Whether the members may change during fit (workers cannot then agree to
    stop at a common step by a collective between steps)."""

    def fit_callbacks(self, model) -> list:  # pylint: disable=unused-argument
        return []

    def begin_fit(self, model, callbacks):  # pylint: disable=unused-argument
        return callbacks, None

    def wrap(self, function, model, phase: str):  # pylint: disable=unused-argument
        return function

    def begin_inference(self, model, within_fit: bool):  # pylint: disable=unused-argument
        pass


class ElasticFit:
    """Keras' entry points under a `tfdist_ext.Strategy(elastic=...)`.

    Args:
        strategy: The `tfdist_ext.Strategy`, whose `elastic` is not None.
    """

    changes = True

    def __init__(self, strategy):
        self._strategy = strategy
        self._recovery = strategy.elastic

    def fit_callbacks(self, model) -> list:
        """At the start of `fit`: the callbacks it adds (the running position a
        replacement starts at); the functions kept for other memberships go."""
        elastic_steps.forget(model)
        return [elastic_steps.Position(self._recovery)]

    def begin_fit(self, model, callbacks):
        """Before Keras' `fit` runs with `callbacks` (a list, None or a
        `CallbackList`), whose state a later replacement receives.

        A replacement joins in the last callback's `on_train_begin`
        (`elastic_steps.Join`), or here when the callbacks are a `CallbackList`
        (then `fit` begins at the members' epoch, and the callbacks' own
        `on_train_begin` resets the counters `callback_state` set).

        Returns:
            (the callbacks to pass, the epoch to start at or None).
        """
        epoch = None
        if self._recovery.joining:
            if isinstance(callbacks, keras.callbacks.CallbackList):
                epoch = self._join_now(model, callbacks)
            else:
                callbacks = list(callbacks or []) + [elastic_steps.Join(self._recovery)]
        elastic_steps.track_callbacks(model, callbacks)
        return callbacks, epoch

    def wrap(self, function, model, phase: str):
        """Keras' train (``phase="train"``) or test function, surviving a death."""
        return elastic_steps.wrap(function, model, self._strategy, phase)

    def begin_inference(self, model, within_fit: bool):
        """At the start of `evaluate` or `predict`; a fit's validation (`within_fit`)
        keeps the functions made within that fit."""
        if not within_fit:
            elastic_steps.forget(model)

    def _join_now(self, model, callbacks) -> int:
        admission = elastic_steps.join(model, self._recovery)
        elastic_steps.track_callbacks(model, callbacks)
        elastic_steps.take_callback_state(model, self._recovery, admission)
        if callback_state.counters(callbacks.callbacks):
            log.warning("tfdist_ext: fit's callbacks are a CallbackList: this replacement "
                        "joined before Keras' set-up, and their on_train_begin starts "
                        "EarlyStopping, ReduceLROnPlateau and ModelCheckpoint afresh; pass a "
                        "list to continue the members' counts.")
        return admission["epoch"]
