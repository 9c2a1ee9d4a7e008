"""What `fit`, `evaluate` and `predict` do for the job's members, in one object: the
Keras side of the elastic seam (`tfdist_ext.elastic.seam` is the strategy's).
`tfdist_ext.keras.fit_hooks` asks `of(strategy)` and calls what it gets at four
points (the callbacks fit adds, the set-up before Keras' fit, the wrapping of the
train and test functions, the start of an evaluation): `FixedFit` changes nothing,
`ElasticFit` (a `tfdist_ext.Strategy(elastic=...)`) survives deaths and takes in
replacements. fit_hooks knows nothing else of elastic training.

A replacement joins here (`Join`, `join`), or exits with `EXIT_LATE` when the
members run a later `fit` of the script than its own (`late`); the step-level work
(a failed step discarded, the survivors' recovery, the members' side of an
admission) is `tfdist_ext.keras.elastic_steps`; the membership itself is the
strategy's `elastic.recovery.Recovery`.
"""

import contextlib
import logging
import time

import keras
import tensorflow as tf

from tfdist_ext import _compat, frontends
from tfdist_ext.elastic import joining, rehearsal
from tfdist_ext.keras import callback_state, elastic_steps, local_input
from tfdist_ext.launch.elastic_env import EXIT_LATE

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
        replacement starts at); the functions kept for other memberships go. A
        replacement whose fit is not the members' exits here (`late`)."""
        with late(self._recovery.me):
            self._recovery.begin_fit()
        elastic_steps.forget(model)
        return [elastic_steps.Position(self._recovery)]

    def begin_fit(self, model, callbacks):
        """Before Keras' `fit` runs with `callbacks` (a list, None or a
        `CallbackList`), whose state a later replacement receives.

        A replacement joins in the last callback's `on_train_begin`
        (`Join`), or here when the callbacks are a `CallbackList`
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
                callbacks = list(callbacks or []) + [Join(self._recovery)]
        elastic_steps.track_callbacks(model, callbacks)
        return callbacks, epoch

    def wrap(self, function, model, phase: str):
        """Keras' train (``phase="train"``) or test function, surviving a death."""
        return elastic_steps.wrap(function, model, self._strategy, phase)

    def begin_inference(self, model, within_fit: bool):
        """At the start of `evaluate` or `predict`; a fit's validation (`within_fit`)
        keeps the functions made within that fit. A replacement not yet admitted
        exits here (`late`): it has no members to run them with."""
        if within_fit:
            return
        if self._recovery.joining:
            with late(self._recovery.me):
                raise joining.inference_first(self._recovery.me)
        elastic_steps.forget(model)

    def _join_now(self, model, callbacks) -> int:
        admission = join(model, self._recovery)
        elastic_steps.track_callbacks(model, callbacks)
        take_callback_state(model, self._recovery, admission)
        if callback_state.counters(callbacks.callbacks):
            log.warning("tfdist_ext: fit's callbacks are a CallbackList: this replacement "
                        "joined before Keras' set-up, and their on_train_begin starts "
                        "EarlyStopping, ReduceLROnPlateau and ModelCheckpoint afresh; pass a "
                        "list to continue the members' counts.")
        return admission["epoch"]


class Join(keras.callbacks.Callback):
    """A replacement worker joins the running job as its `fit` begins (the last
    callback's `on_train_begin`): it asks the members to take it in, receives their
    model and optimizer state, and resumes at their epoch and batch.

    Keras has by then built the model, distributed the dataset and made the train
    function, so the members, who wait for the replacement in their next step,
    wait only for its first step; and a `BackupAndRestore` the script also passes
    has restored its backup first, which the members' state then replaces, as the
    members' `EarlyStopping`, `ReduceLROnPlateau` and `ModelCheckpoint` counters
    replace its callbacks' fresh ones (`callback_state`).
    """

    def __init__(self, recovery):
        super().__init__()
        self.recovery = recovery
        self._epoch_before = None
        self._set = False

    def on_train_begin(self, logs=None):
        admission = join(self.model, self.recovery)
        # Keras makes the epoch's iterator after this: tf.data skips the batches the
        # members ran, instead of this worker's first calls pulling them one by one.
        local_input.start_at(self.model.distribute_strategy, admission["batch"])
        take_callback_state(self.model, self.recovery, admission)
        self._epoch_before = _compat.set_initial_epoch(self.model, admission["epoch"])
        self._set = True

    def on_train_end(self, logs=None):
        # A fit that ended before Keras made an epoch iterator leaves no skip behind
        # for the next `fit` or `evaluate` on this strategy.
        local_input.start_at(self.model.distribute_strategy, 0)
        if self._set:
            _compat.set_initial_epoch(self.model, self._epoch_before)
            self._set = False


def join(model, recovery) -> dict:
    """A replacement joins (`Recovery.join`) with `model`'s state; its step counts
    become the members' (`elastic_steps.resume`). Returns the admission.

    Its train function is traced first for the members it expects (`rehearse`), and
    again if the members changed meanwhile (`Recovery.look_again`); if it is given
    others at its admission, the function is made again, to be traced at its first
    call.
    """
    if not model.optimizer.built:
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)
    rehearsed = rehearse(model, recovery)
    with late(recovery.me):
        again = rehearsed is not None and recovery.look_again()  # a death or a join meanwhile
    if again:
        log.warning("tfdist_ext: worker %d traced its step for members %s, but the job now "
                    "has %s: it rehearses again.", recovery.me, list(rehearsed),
                    list(recovery.found))
        model.make_train_function(force=True)
        rehearsed = rehearse(model, recovery)
    with late(recovery.me):
        admission = recovery.join(elastic_steps.state(model))
    elastic_steps.resume(model, admission["steps"], admission["test_steps"],
                         admission["batch"])
    members = tuple(recovery.members)
    if rehearsed is not None and not elastic_steps.traced_alike(model.distribute_strategy,
                                                                rehearsed):
        log.warning("tfdist_ext: worker %d traced its step for members %s but joined %s: "
                    "it traces again.", recovery.me, list(rehearsed), list(members))
        model.make_train_function(force=True)
    elastic_steps.joined(model, rehearsed)
    return admission


@contextlib.contextmanager
def late(me):
    """Within the context, a `joining.JoinRefused` (this replacement runs an earlier
    `fit` than the members) is logged and ends the process with `EXIT_LATE`, the
    code on which `tfdist-run --elastic` does not start the worker again."""
    try:
        yield
    except joining.JoinRefused as refused:
        log.error("%s (worker %d exits with code %d.)", refused, me, EXIT_LATE)
        raise SystemExit(EXIT_LATE) from refused


def rehearse(model, recovery):
    """A replacement, before it asks to join: traces Keras' train function for the
    members it expects and runs it once, on communicators that are not wired up
    (`tfdist_ext.elastic.rehearsal`: each collective's result is its input), so
    that the members, who wait for its first step once they admit it, wait
    neither for the trace nor for TF's instantiation of the traced function at
    its first run. The run reads one batch from an iterator of its own; the
    model's and optimizer's variables are restored afterwards, the metrics reset.

    Returns:
        The members it traced for, or None when it could not trace (no train
        function or distributed input yet, as when `fit`'s callbacks are a
        `CallbackList`, or `run_eagerly`).
    """
    strategy = model.distribute_strategy
    step = (None if model.train_function is None
            else _compat.keras_iterator_function(model.train_function))
    dataset = local_input.last_input(strategy)
    if step is None or dataset is None:
        return None
    began = time.monotonic()
    with rehearsal.rehearsal(strategy, recovery) as members:
        step.get_concrete_function(iter(dataset))
        traced = time.monotonic()
        run_rehearsal(model, step, iter(dataset), recovery.me)
    log.info("tfdist_ext: worker %d traced its train step for members %s in %.2f s and ran "
             "it once in %.2f s, before asking to join.", recovery.me, list(members),
             traced - began, time.monotonic() - traced)
    return members


def run_rehearsal(model, step, iterator, me):
    """Runs the traced `step` on `iterator`, then puts the model's and optimizer's
    variables back as they were and resets the metrics (a failed run only leaves
    TF's instantiation to the first real step)."""
    variables = elastic_steps.state(model)
    kept = [tf.convert_to_tensor(v.value) for v in variables]  # updates copy on write
    try:
        step(iterator)
    except tf.errors.OpError as err:  # no batch (an empty dataset), or an abort
        log.info("tfdist_ext: worker %d could not run its rehearsed step: %s",
                 me, err)
    finally:
        for variable, value in zip(variables, kept):
            variable.assign(value)
        model.reset_metrics()


def take_callback_state(model, recovery, admission):
    """A replacement just admitted (`join`): the members' callback counters and kept
    weights (`callback_state`) on the callbacks of its `fit`, unless a member died
    during the admission (then they start afresh)."""
    if recovery.generation != admission["generation"]:
        log.warning("tfdist_ext: a member died as this worker joined: its callbacks "
                    "(EarlyStopping, ReduceLROnPlateau) start afresh.")
        return
    keeping = callback_state.receive(recovery.kv(), admission["generation"],
                                     elastic_steps.tracked_callbacks(model))
    try:
        callback_state.share_best_weights(recovery.broadcast_state, model, keeping,
                                          receiving=True)
    except (tf.errors.OpError, OSError, TimeoutError) as err:  # a member died
        log.warning("tfdist_ext: a member died as this worker received the kept weights "
                    "of EarlyStopping(restore_best_weights=True): %s", err)
        recovery.recover_and_share(err, admission["steps"],
                                   lambda: elastic_steps.state(model),
                                   lambda: elastic_steps.retrace(model))
