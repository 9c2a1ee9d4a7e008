"""Keras' train and test functions under elastic training: a step that fails because
a worker died is discarded, and `fit` (or `evaluate`, validation included) goes on
with the survivors (`tfdist_ext.elastic`).

`tfdist_ext.keras.fit_hooks` wraps the train and test functions that Keras calls
once per step; a failed test step's batch is left out of the metrics. On a failed step the
wrapper has the strategy's `elastic.recovery.Recovery` agree on the survivors
and rebuild the communicators, traces Keras' functions again, gives every
member the first survivor's weights and optimizer state, and returns the last good step's
logs (another death during that, again). A survivor that ran fewer steps than the others (its step had failed
while theirs had finished) then skips as many calls, consuming their
batches without training, so that all members' steps pair up again until the
end of `fit`. After a step that carried a stop request (SIGTERM), the worker
that got it leaves and the others go on (`tfdist_ext.elastic.leaving`). A
replacement worker joins the running job as its `fit` begins
(`tfdist_ext.keras.members_fit.Join`).
"""

import functools
import logging
import time
import weakref

import keras
import tensorflow as tf

from tfdist_ext import liveness
from tfdist_ext.elastic import leaving, membership
from tfdist_ext.keras import callback_state, local_input

log = logging.getLogger("tfdist_ext")
_progress = weakref.WeakKeyDictionary()  # model -> {"train" | "test": _Progress}
_functions = weakref.WeakKeyDictionary()  # model -> _Functions
_callbacks = weakref.WeakKeyDictionary()  # model -> the callbacks of its running fit


class _Progress:
    """Train-function calls of one model on this worker, and calls left to skip."""

    def __init__(self):
        self.steps = 0
        self.skip = 0
        self.logs = {}
        self.stop_everyone = False  # a stop request that cannot be a departure
        self.pause = None  # the last admission's "pause" record, until the next step


class _Functions:
    """Keras' train and test functions of one model, per membership they were made for.

    A function traced for a world size and rank runs on a later membership's
    communicators of the same size and rank (`UcxEngine`'s handle slots), so a
    worker that returns to its rank among as many members on the same hosts
    (`membership.traced_for`: the chief, say, whenever a replacement restores
    the full size) runs the functions it traced then instead of tracing again.
    Kept for one `fit` or `evaluate` (`forget`): a `compile` between them
    makes new functions.
    """

    def __init__(self):
        self.made = {}  # (phase, membership.traced_for) -> wrapped function
        self.current = {}  # phase -> the traced_for of the members it was made for
        self.reused = 0  # functions taken from `made` instead of traced again
        self.rehearsed = None  # the members a replacement traced for before it joined


def _membership(strategy, members=None):
    recovery = strategy.elastic
    return membership.traced_for(recovery.members if members is None else members,
                                 recovery.me, strategy.cluster.worker_addresses)


def traced_alike(strategy, members) -> bool:
    """Whether Keras' functions traced for `members` run unchanged for the current
    members (`membership.traced_for`)."""
    return _membership(strategy, members) == _membership(strategy)


def forget(model):
    """Drops the functions kept for other memberships (at the start of `fit`,
    `evaluate` and `predict`: a `compile` in between makes new ones)."""
    _functions.pop(model, None)


def track_callbacks(model, callbacks):
    """Keeps the callbacks of `model`'s `fit` (a list or a `CallbackList`) for an
    admission: their state goes to the replacement (`callback_state`)."""
    _callbacks[model] = list(getattr(callbacks, "callbacks", callbacks) or [])


def tracked_callbacks(model) -> list:
    """The callbacks of `model`'s running `fit` (`track_callbacks`)."""
    return _callbacks.get(model, [])


def reused_functions(model) -> int:
    """How many times a membership change found this model's functions for the new
    membership already traced (since the running `fit` or `evaluate` started)."""
    functions = _functions.get(model)
    return 0 if functions is None else functions.reused


def rehearsed_for(model):
    """The members this replacement traced `model`'s train function for before it
    joined (`members_fit.rehearse`), if it did in the running `fit`, else None."""
    functions = _functions.get(model)
    return None if functions is None else functions.rehearsed


def wrap(train_function, model, strategy, phase="train"):
    """`train_function` (Keras' `model.train_function`, or with ``phase="test"``
    its `test_function`) that survives a worker's death.

    Raises:
        ValueError: The model runs several steps per call (`steps_per_execution`).
    """
    if _batches_per_call(model) != 1:
        raise ValueError(f"Elastic training (Strategy(elastic=...)) needs "
                         f"steps_per_execution=1 in compile(); received "
                         f"{_batches_per_call(model)}: a failed call would lose an unknown "
                         "number of batches.")
    recovery = strategy.elastic
    progress = _progress.setdefault(model, {}).setdefault(phase, _Progress())
    _functions.setdefault(model, _Functions()).current[phase] = _membership(strategy)
    strategy.preemption.leave_alone()

    @functools.wraps(train_function)
    def run(iterator):
        recovery.catching_up = False  # the fit-start meetings are behind
        if recovery.state_stale:  # a death between steps (`Recovery.between_steps`)
            recovery.state_stale = False
            retrace(model)
            recovery.broadcast_state(state(model))
            again = model.train_function if phase == "train" else model.test_function
            return again(iterator)  # Keras' function traced again (wrapped again)
        progress.steps += 1
        if phase == "train":
            recovery.steps = progress.steps
        if progress.skip > 0:
            progress.skip -= 1
            # TF's distributed iterator (Keras' input from arrays) agrees with the other
            # workers on whether data is left: they are in a step, so it reads alone.
            if not local_input.skipped_in_input(strategy):
                strategy.keep_logs_local(True)
                try:
                    next(iterator)
                finally:
                    strategy.keep_logs_local(False)
            # A replacement has no step of its own yet: its (empty) metrics, read once.
            if not progress.logs:
                progress.logs = _metric_logs(model, strategy)
            return progress.logs
        try:
            began = time.monotonic()
            # A function kept from an earlier membership does not wire up the new
            # communicators when it runs (its trace did): they are made here.
            strategy.extended.cross_device_ops.engines.main()
            logs = train_function(iterator)
            if progress.pause is not None:  # the first step after an admission
                progress.pause["step"], progress.pause = time.monotonic() - began, None
        except tf.errors.OutOfRangeError:
            raise
        except tf.errors.OpError as err:
            _recover(recovery, model, progress, err)
            return progress.logs
        progress.logs = logs
        if phase == "train" and recovery.stragglers is not None:
            _check_stragglers(recovery, strategy, progress.steps)
        admitting = phase == "train" and recovery.join_requested()
        if admitting:
            tested = _progress[model].get("test")
            try:
                began = time.monotonic()
                recovery.admit(progress.steps, tested.steps if tested is not None else 0)
                admitted = time.monotonic()
                callbacks = _callbacks.get(model, [])
                if recovery.members[0] == recovery.me:
                    callback_state.publish(recovery.kv(), recovery.generation, callbacks)
                retrace(model)
                recovery.broadcast_state(state(model))
                callback_state.share_best_weights(recovery.broadcast_state, model,
                                                  callback_state.keeping_weights(callbacks),
                                                  receiving=False)
                progress.pause = recovery.joins[-1]["pause"] = {
                    "admit": admitted - began, "state": time.monotonic() - admitted}
            except (tf.errors.OpError, OSError, TimeoutError) as err:
                # A replacement, or the leader, died during the admission.
                _recover(recovery, model, progress, err)
        if phase == "train" and _stop_requested(strategy, progress):
            if admitting:  # the next step carries it again, with the replacement, who
                strategy.preemption.agreed.assign(0.0)  # never ran this one
            else:
                _leave(recovery, model, progress, strategy.preemption)
        return logs

    return run


def _stop_requested(strategy, progress) -> bool:
    """Whether the last step's all-reduce carried a stop request (every member agrees)."""
    return (not progress.stop_everyone and len(strategy.elastic.members) > 1
            and float(strategy.preemption.agreed.numpy()) > 0)


def _check_stragglers(recovery, strategy, steps):
    """After a training step: a straggler found asks to leave (`elastic.stragglers`)."""
    monitor = recovery.stragglers
    worker = monitor.step_ended(time.time(), steps, recovery.members)
    if worker is None:
        return
    found = monitor.removed[-1]
    enough = len(recovery.members) - 1 >= max(recovery.options.min_workers, 1)
    log.warning("tfdist_ext: worker %d is a straggler: busy %s s in its last %d steps against "
                "the other members' median %s s (Elastic(straggler_factor=%g)); %s", worker,
                _seconds(found["seconds"]), monitor.steps, _seconds(found["others"]),
                monitor.factor, "it leaves the job after the next step." if enough else
                f"it stays: the others would be fewer than min_workers="
                f"{recovery.options.min_workers}.")
    if enough and worker == recovery.me:
        monitor.leaving = True
        strategy.preemption.requested.assign(1.0)


def _straggler_left(monitor, steps):
    """Whether the stop request after step `steps` was a straggler's (found a step before)."""
    return (monitor is not None and bool(monitor.removed)
            and monitor.removed[-1]["step"] == steps - 1)


def _seconds(values):
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _leave(recovery, model, progress, preemption):
    """The worker asked to stop ends its process (exit code 0); the others go on."""
    monitor = recovery.stragglers
    straggler = monitor is not None and monitor.leaving
    reason = ("a straggler" if straggler or _straggler_left(monitor, progress.steps)
              else "asked to stop")
    try:
        outcome = leaving.leave(recovery, progress.steps,
                                preemption.signal_name is not None or straggler, reason)
    except (tf.errors.OpError, OSError, TimeoutError) as err:  # a member died meanwhile
        _recover(recovery, model, progress, err)
        return
    if outcome == "leave":
        liveness.exit_now(0)  # no TF shutdown barrier to wait in with the others
    if outcome == "stop":  # too few would be left: StopOnPreemption stops everyone
        progress.stop_everyone = True
        return
    preemption.agreed.assign(0.0)
    retrace(model)


def _metric_logs(model, strategy):
    """This worker's metric values, read without the other workers (who are training)."""
    strategy.keep_logs_local(True)
    try:
        return {name: float(value) for name, value in model.get_metrics_result().items()}
    except ValueError:  # metrics not built yet
        return {}
    finally:
        strategy.keep_logs_local(False)


def _recover(recovery, model, progress, err):
    progress.skip = recovery.recover_and_share(err, progress.steps, lambda: state(model),
                                               lambda: retrace(model))


def state(model):
    """What a new member must receive: the model's and the optimizer's variables."""
    return list(model.variables) + list(model.optimizer.variables)


def joined(model, rehearsed):
    """A replacement was just admitted (`members_fit.join`): the functions made
    before the join count as made for the members it joined, traced for them by
    `rehearse` (`rehearsed`, the members it traced for; None: not traced yet)."""
    functions = _functions.setdefault(model, _Functions())
    functions.rehearsed = rehearsed
    for phase in functions.current:
        functions.current[phase] = _membership(model.distribute_strategy)


def resume(model, steps, test_steps, skip):
    """A replacement worker's step counts: the members' `steps` train calls (after
    `skip` calls that only consume the batches they ran) and `test_steps` test calls."""
    progress = _progress.setdefault(model, {})
    train = progress.setdefault("train", _Progress())
    train.steps, train.skip = steps - skip, skip  # each skipped call counts
    progress.setdefault("test", _Progress()).steps = test_steps


class Position(keras.callbacks.Callback):
    """Keeps the running fit's (epoch, batch) on the strategy's `elastic` recovery
    (a replacement starts at the members' position)."""

    def __init__(self, recovery):
        super().__init__()
        self.recovery = recovery
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.recovery.position = (self.epoch, batch)


def _batches_per_call(model):
    value = getattr(model, "steps_per_execution", 1)
    return 1 if value is None else value


def retrace(model):
    """Keras' functions for the new membership (the ones a running `fit` or `evaluate`
    calls again at once; the others when next used): those made before for a
    membership they run unchanged on (`_Functions`), else new ones, traced at their
    first call."""
    model.predict_function = None
    functions = _functions.setdefault(model, _Functions())
    key = _membership(model.distribute_strategy)
    for phase, make in (("train", model.make_train_function),
                        ("test", model.make_test_function)):
        name = f"{phase}_function"
        if getattr(model, name) is None:
            continue
        if phase in functions.current:
            functions.made[(phase, functions.current[phase])] = getattr(model, name)
        kept = functions.made.get((phase, key))
        if kept is None:
            make(force=True)  # wrapped again: `wrap` records the membership
        else:
            setattr(model, name, kept)
            functions.current[phase] = key
            functions.reused += 1
