"""The callback counters a replacement takes from the members (`callback_state`), in
process: what is read from Keras' callbacks after real epochs, through JSON, and set on
fresh ones; the kept weights' broadcast is checked by test_elastic.py's early-stopping job."""

import json
import logging

import keras
import numpy as np

from tfdist_ext.keras import callback_state


def _trained_callbacks():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    callbacks = [keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, min_delta=10.0),
                 keras.callbacks.EarlyStopping(monitor="loss", patience=5, min_delta=10.0,
                                               restore_best_weights=True),
                 keras.callbacks.EarlyStopping(monitor="loss", patience=9)]
    x = np.arange(24, dtype="float32").reshape(8, 3)
    model.fit(x, x[:, :1], epochs=3, verbose=0, callbacks=callbacks)
    return callbacks


def test_counters_after_epochs_arrive_on_fresh_callbacks_of_the_same_classes():
    members = _trained_callbacks()
    sent = json.loads(json.dumps(callback_state.counters(members)))
    fresh = [keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, min_delta=10.0),
             keras.callbacks.EarlyStopping(monitor="loss", patience=5, min_delta=10.0,
                                           restore_best_weights=True),
             keras.callbacks.EarlyStopping(monitor="loss", patience=9)]
    for callback in fresh:
        callback.on_train_begin()  # what Keras does before the Join callback runs
    keeping = callback_state.set_counters(fresh, sent)
    assert keeping == [fresh[1]]  # only the one that restores weights keeps them
    assert members[1].wait == 2 and fresh[1].wait == 2  # epochs 2 and 3 did not improve by 10
    for mine, theirs in zip(fresh, members):
        for name in ("wait", "best", "best_epoch", "stopped_epoch", "cooldown_counter"):
            if hasattr(theirs, name):
                assert getattr(mine, name) == getattr(theirs, name), name
                assert type(getattr(mine, name)) is type(getattr(theirs, name)) or name == "best"


def test_other_callbacks_on_the_replacement_are_named_and_their_weights_still_received(caplog):
    sent = json.loads(json.dumps(callback_state.counters(_trained_callbacks())))
    fresh = [keras.callbacks.EarlyStopping(monitor="loss")]
    with caplog.at_level(logging.WARNING, logger="tfdist_ext"):
        keeping = callback_state.set_counters(fresh, sent)
    assert "this worker's fit has 1 EarlyStopping callback(s), the members' 2" in caplog.text
    assert "pass the same callbacks on every worker" in caplog.text
    assert keeping == [None]  # the members broadcast one set of weights: received, dropped
    assert fresh[0].wait == 0


def test_a_model_checkpoint_keeps_its_best_value_through_json():
    checkpoint = keras.callbacks.ModelCheckpoint("/tmp/unused.weights.h5", save_best_only=True,
                                                 save_weights_only=True, monitor="loss")
    checkpoint.best = float("inf")
    sent = json.loads(json.dumps(callback_state.counters([checkpoint])))
    fresh = keras.callbacks.ModelCheckpoint("/tmp/unused.weights.h5", save_best_only=True,
                                            save_weights_only=True, monitor="loss")
    fresh.best = 0.5
    assert callback_state.set_counters([fresh], sent) == []
    assert fresh.best == float("inf")
