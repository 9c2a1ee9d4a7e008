"""Relaxed modes at their defaults with the user's optimizer, and the divergence guard.

Real `fit` on logical CPU replicas: DiLoCo's outer step chosen from the inner
optimizer, and `DivergenceGuard` stopping a diverged relaxed or compressed run
with an error that names the mode and what to change.
"""

import logging
import math
import pathlib

import keras
import numpy as np
import pytest

import tfdist_ext
from tfdist_ext import sync
from tfdist_ext.keras import divergence
from tfdist_ext.sync import local_sgd, lr_scaling, momentum


def _data(seed=0, n=256):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    return x, y


def _fit(strategy, make_optimizer, epochs=1):
    x, y = _data()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        optimizer = make_optimizer()
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, model.fit(x, y, batch_size=32, epochs=epochs, verbose=0)


@pytest.mark.parametrize("optimizer, expected", [
    (lambda: keras.optimizers.SGD(0.1), local_sgd.PAPER_OUTER),
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9), local_sgd.MOMENTUM_OUTER),
    (lambda: keras.optimizers.SGD(0.1, momentum=0.5, nesterov=True), local_sgd.MOMENTUM_OUTER),
    (lambda: keras.optimizers.Adam(1e-3), local_sgd.PAPER_OUTER),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
     local_sgd.MOMENTUM_OUTER),
])
def test_diloco_outer_step_follows_the_inner_optimizer(optimizer, expected):
    assert local_sgd.outer_settings(sync.DiLoCo(), optimizer()) == expected
    given = sync.DiLoCo(outer_learning_rate=0.3)
    assert local_sgd.outer_settings(given, optimizer()) == (0.3, expected[1])
    both = sync.DiLoCo(outer_learning_rate=0.3, outer_momentum=0.2)
    assert local_sgd.outer_settings(both, optimizer()) == (0.3, 0.2)


def test_diloco_fit_logs_its_outer_step_and_uses_it(caplog):
    strategy = tfdist_ext.Strategy(sync={"name": "diloco", "period": 2}, num_replicas=2)
    with caplog.at_level(logging.INFO, logger="tfdist_ext"):
        _fit(strategy, lambda: keras.optimizers.SGD(0.05, momentum=0.9))
    assert strategy.sync_runner.outer == local_sgd.MOMENTUM_OUTER
    assert ("sync='diloco': outer nesterov step with learning rate 0.7, momentum 0.3, chosen "
            "for the inner SGD with momentum 0.9") in caplog.text


def test_outer_settings_need_an_outer_optimizer():
    with pytest.raises(ValueError, match=r"may be None \(chosen from the optimizer\) only with "
                                         r"an outer optimizer; received outer_optimizer='none'"):
        sync.LocalSGD(outer_learning_rate=None)


@pytest.mark.parametrize("sync_, compression, names", [
    ("local_sgd", None, ["sync='local_sgd'", "lower `period`"]),
    ({"name": "diloco", "period": 2}, None,
     ["sync='diloco'", "lower `outer_learning_rate` (e.g. 0.5)", "averaging rounds"]),
    ("sync", {"name": "topk", "ratio": 0.5}, ["compression='topk'", "add `warmup_steps`"]),
])
def test_a_diverging_relaxed_or_compressed_fit_stops_with_an_error(sync_, compression, names):
    strategy = tfdist_ext.Strategy(sync=sync_, compression=compression, num_replicas=2)
    with pytest.raises(divergence.DivergenceError) as error:
        _fit(strategy, lambda: keras.optimizers.SGD(1e6), epochs=3)
    text = str(error.value)
    assert "tfdist_ext: training diverged under" in text
    assert "The weights are not usable; fit stopped." in text
    for name in names:
        assert name in text, text


def test_exact_sync_is_not_guarded():
    strategy = tfdist_ext.Strategy(num_replicas=2)
    assert not [c for c in strategy.fit_callbacks()
                if isinstance(c, divergence.DivergenceGuard)]
    _, history = _fit(strategy, lambda: keras.optimizers.SGD(1e6), epochs=2)
    assert not math.isfinite(history.history["loss"][-1])  # Keras' behaviour, unchanged


def test_guard_thresholds():
    guard = divergence.DivergenceGuard("sync='x'", "lower `y`")
    guard.on_train_begin()
    guard.on_train_batch_end(0, {"loss": 2.0})
    guard.on_train_batch_end(1, {"loss": 2.0 * divergence.EXPLODE_FACTOR})  # not above
    guard.on_train_batch_end(2, {})
    with pytest.raises(divergence.DivergenceError, match=r"under sync='x' at epoch 1, batch 4: "
                                                         r"the loss 200\.1 is above 100x"):
        guard.on_train_batch_end(3, {"loss": 200.1})
    guard.on_train_begin()  # a new fit measures its own first loss
    guard.on_train_batch_end(0, {"loss": 500.0})
    guard.on_train_batch_end(1, {"loss": 600.0})
    with pytest.raises(divergence.DivergenceError, match="the loss is inf"):
        guard.on_train_batch_end(2, {"loss": float("inf")})
    collapse = divergence.DivergenceGuard("compression='sign'", "use int8")
    collapse.on_train_begin()
    collapse.on_train_batch_end(0, {"loss": 2.3})
    for epoch, loss in enumerate([1.7, 1.3, 1.5, 2.5]):  # 1.5: noise; 2.5 < 2 x 1.3
        collapse.on_epoch_begin(epoch)
        collapse.on_epoch_end(epoch, {"loss": loss})
    collapse.on_epoch_begin(4)
    with pytest.raises(divergence.DivergenceError, match=(
            r"under compression='sign' at epoch 5, its end: the epoch's mean loss 2\.7 rose "
            r"above 2x the best epoch's 1\.3 and above the first batch's 2\.3: the model "
            r"lost what it had learned\. .*To fix it: use int8")):
        collapse.on_epoch_end(4, {"loss": 2.7})
    slow = divergence.DivergenceGuard("sync='x'", "lower `y`")  # a loss that starts low
    slow.on_train_batch_end(0, {"loss": 0.1})
    slow.on_epoch_end(0, {"loss": 0.5})
    slow.on_epoch_end(1, {"loss": 0.05})
    slow.on_epoch_end(2, {"loss": 0.09})  # above 2x the best, but below the first
    negative = divergence.DivergenceGuard("sync='x'", "lower `y`")
    negative.on_train_batch_end(0, {"loss": -1.0})
    negative.on_train_batch_end(1, {"loss": 1e9})  # no scale to compare with


# Each warning: (how it starts: mode, optimizer and the risk's first words; the safer choice
# it names with its argument). Every one also says what it may end below and links the figures.
@pytest.mark.parametrize("sync_, compression, optimizer, expected", [
    ({"name": "stale_synchronous", "momentum_compensation": False}, None,
     keras.optimizers.SGD(0.1, momentum=0.9),
     [("sync='stale_synchronous' with SGD(momentum=0.9): with momentum_compensation=False the "
       "gradients applied `staleness` steps late add to the optimizer's momentum",
       "momentum_compensation=True (the default) is safer")]),
    ("stale_synchronous", None, keras.optimizers.SGD(0.1, momentum=0.9), []),
    ("async", None, keras.optimizers.SGD(0.1, momentum=0.5),
     [("sync='async' with SGD(momentum=0.5)", "safer at 4 or more workers: Adam or sync='sync'")]),
    (None, "adaptive", keras.optimizers.SGD(0.1, momentum=0.9), []),
    ({"name": "stale_synchronous", "momentum_compensation": False}, None,
     keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
     [("sync='stale_synchronous' with SGD(momentum=0.9)", "momentum_compensation=True")]),
    ("stale_synchronous", None, keras.optimizers.SGD(0.1), []),
    ("stale_synchronous", None, keras.optimizers.Adam(),
     [("sync='stale_synchronous' with Adam: Adam's per-coordinate step",
       "safer: sync='local_sgd' or 'gossip', or sync='sync'")]),
    ("diloco", "none", keras.optimizers.SGD(0.1, momentum=0.9), []),
    ("sync", "powersgd", keras.optimizers.SGD(0.1, momentum=0.9),
     [("compression='powersgd' with SGD(momentum=0.9): error feedback",
       "safer: compression='adaptive', a higher `rank` (4), or SGD(momentum=0.8)")]),
    ("sync", "powersgd", keras.optimizers.Adam(),
     [("compression='powersgd' with Adam: what rank r leaves out comes back late",
       "safer: compression='bf16' or 'int8', or 'adaptive'")]),
    ("sync", "powersgd", keras.optimizers.SGD(0.1), []),
    ("async", None, keras.optimizers.SGD(0.1, momentum=0.9),
     [("sync='async' with SGD(momentum=0.9): each gradient is applied about N - 1 updates "
       "late", "Adam or sync='sync'")]),
    ("async", None, keras.optimizers.Adam(), []),
    ("sync", "topk", keras.optimizers.SGD(0.1, momentum=0.9),
     [("compression='topk' with SGD(momentum=0.9): with DGC's momentum correction taking the "
       "optimizer's momentum (the default)", "compression='adaptive' or 'int8' is safer")]),
    ("sync", {"name": "topk", "correct_momentum": False}, keras.optimizers.SGD(0.1, momentum=0.9),
     [("compression='topk' with SGD(momentum=0.9): with the momentum left in the optimizer "
       "(correct_momentum=False)", "compression='adaptive' or 'int8' is safer")]),
    ("sync", {"name": "topk", "momentum": 0.9}, keras.optimizers.SGD(0.1), []),
    ("sync", "topk", keras.optimizers.SGD(0.1), []),
    ("sync", "topk", keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
     [("compression='topk' with Adam: each value is sent a few times",
       "compression='fp16' or 'adaptive' is safer")]),
    ("sync", "topk", keras.optimizers.RMSprop(),
     [("compression='topk' with RMSprop", "compression='fp16' or 'adaptive'")]),
    ("local_sgd", None, keras.optimizers.Adam(), []),
    ("sync", "randomk", keras.optimizers.SGD(0.1),
     [("compression='randomk' with SGD: random-k",
       "compression='topk' at the same `ratio`, or 'adaptive', is safer")]),
    ("sync", "terngrad", keras.optimizers.Adam(),
     [("compression='terngrad' with Adam: TernGrad", "compression='int8' or 'qsgd' is safer")]),
    ("sync", "terngrad", keras.optimizers.SGD(0.1, momentum=0.9),
     [("compression='terngrad' with SGD(momentum=0.9): TernGrad",
       "compression='int8' or 'qsgd' is safer")]),
    ("sync", "sign", keras.optimizers.SGD(0.1, momentum=0.9),
     [("compression='sign' with SGD(momentum=0.9): each value is sent as its sign",
       "compression='int8' is safer")]),
    ("sync", "sign", keras.optimizers.Adam(), []),
    ("sync", "sign", keras.optimizers.SGD(0.1), []),
])
def test_momentum_cautions_name_the_mode_the_risk_the_safer_choice_and_the_figures(
        sync_, compression, optimizer, expected):
    from tfdist_ext import compression as compression_lib  # pylint: disable=import-outside-toplevel
    from tfdist_ext.keras import optimizer_check  # pylint: disable=import-outside-toplevel
    texts = optimizer_check.cautions(sync.get(sync_), compression_lib.get(compression), optimizer)
    assert len(texts) == len(expected)
    for text, (start, safer) in zip(texts, expected):
        assert text.startswith("tfdist_ext: " + start), text
        assert " below synchronous " in text and safer in text, text
        assert text.endswith(f"(measured costs: {optimizer_check.RESULTS})."), text


def test_the_section_the_warnings_link_holds_their_figures():
    """The figures the warnings quoted before they linked docs/results.md (the anchor itself
    is checked with every docs link in the package by tests/test_docs.py)."""
    from tfdist_ext.keras import optimizer_check  # pylint: disable=import-outside-toplevel
    page = optimizer_check.RESULTS.split("#")[0]
    text = (pathlib.Path(__file__).resolve().parents[2] / page).read_text(encoding="utf-8")
    section = text.split("### Costs behind the optimizer warnings\n", 1)[1].split("\n## ", 1)[0]
    for figure in ("3.4 points below synchronous momentum SGD", "84 points below",
                   "30.6 below momentum SGD", "15.4 below synchronous Adam",
                   "0.0, 0.0 and 4.8 points below", "1.4, 4.0 and 1.4 below",
                   "4.7 points below synchronous Adam", "3.6 points below",
                   "1.4-1.9 points below", "1.8 points below synchronous SGD (0.949 against 0.967)",
                   "2.6 points below synchronous Adam (6 seeds)", "mnist1d 3.5 points below"):
        assert figure in section, figure


def test_fit_warns_once_before_the_first_step_with_momentum_sgd(caplog):
    from tfdist_ext.keras import optimizer_check  # pylint: disable=import-outside-toplevel
    strategy = tfdist_ext.Strategy(
        num_replicas=2, sync={"name": "stale_synchronous", "momentum_compensation": False})
    x, y = _data()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen = []

    class FirstBatch(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(len([r for r in caplog.records if "momentum=0.9" in r.getMessage()]))

    with caplog.at_level(logging.WARNING, logger="tfdist_ext"):
        with pytest.warns(optimizer_check.ModeOptimizerWarning,
                          match=r"momentum_compensation=True \(the default\) is safer "
                                r"\(measured costs: docs/results\.md#"):
            model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[FirstBatch()])
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert seen[0] == 1  # before the first step
    assert len([r for r in caplog.records if "momentum=0.9" in r.getMessage()]) == 1


def test_momentum_compensation_keeps_the_synchronous_step_gain():
    assert momentum.compensated(0.9, 1.0) == pytest.approx(0.8)    # SSP s=2, N=2; async N=2
    assert momentum.compensated(0.9, 3.0) == pytest.approx(0.6)    # async N=4
    assert momentum.compensated(0.9, 12.0) == 0.0                  # never negative
    assert momentum.compensated(0.0, 2.0) == 0.0
    for m, tau in ((0.9, 1.0), (0.5, 0.5), (0.99, 4.0)):
        assert (1 + tau) / (1 - momentum.compensated(m, tau)) == pytest.approx(1 / (1 - m))


@pytest.mark.parametrize("optimizer, path, expected", [
    (keras.optimizers.SGD(0.1, momentum=0.9), ("config", "momentum"), 0.8),
    (keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), ("config", "momentum"), 0.8),
    (keras.optimizers.SGD(0.1), ("config", "momentum"), 0.0),
    (keras.optimizers.Adam(1e-3), ("config", "beta_1"), 0.9),
    (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
     ("config", "inner_optimizer", "config", "momentum"), 0.8),
])
def test_the_servers_optimizer_config_is_compensated(optimizer, path, expected):
    config = keras.optimizers.serialize(optimizer)
    changed = momentum.compensated_config(config, 1.0)
    value, original = changed, config
    for key in path:
        value, original = value[key], original[key]
    assert value == pytest.approx(expected)
    assert original == pytest.approx(0.0 if expected == 0.0 else 0.9)  # the input is kept
    keras.optimizers.deserialize(changed)


def test_momentum_while_tracing_sets_once_in_nested_blocks_and_restores():
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    with momentum.momentum_while_tracing(optimizer, 1.0):
        assert optimizer.momentum == pytest.approx(0.8)
        with momentum.momentum_while_tracing(optimizer, 1.0):  # a second replica's block
            assert optimizer.momentum == pytest.approx(0.8)
        assert optimizer.momentum == pytest.approx(0.8)
    assert optimizer.momentum == 0.9
    adam = keras.optimizers.Adam()
    with momentum.momentum_while_tracing(adam, 3.0):
        assert adam.beta_1 == 0.9


def test_compensation_flags_are_booleans():
    for policy in (sync.StaleSynchronous, sync.Asynchronous):
        with pytest.raises(ValueError, match=r"Argument `momentum_compensation` must be True or "
                                             r"False; received 'no'\."):
            policy(momentum_compensation="no")


@pytest.mark.parametrize("optimizer, factor", [
    (keras.optimizers.SGD(0.1), 1.0),
    (keras.optimizers.SGD(0.1, momentum=0.9), 1.0),
    (keras.optimizers.Adam(1e-3), 2.0),
    (keras.optimizers.AdamW(1e-3), 2.0),
    (keras.optimizers.RMSprop(1e-3), 2.0),
    (keras.optimizers.Lion(1e-4), 2.0),
    (keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3)), 2.0),
])
def test_sqrt_lr_scaling_applies_to_normalizing_optimizers_only(optimizer, factor):
    assert lr_scaling.scale(optimizer, 4.0) == factor
    assert lr_scaling.scale(optimizer, 1.0) == 1.0


def test_gossip_noise_ratio_counts_what_each_optimizer_averages():
    assert sync.Gossip().noise_ratio(4) == 4.0
    assert sync.Gossip(mix_gradients=True).noise_ratio(2) == pytest.approx(1.0)  # full mean
    assert sync.Gossip(mix_gradients=True, peers=2).noise_ratio(4) == pytest.approx(4 / 3)
    assert sync.Gossip(mixing=0.0).noise_ratio(4) == 1.0  # independent replicas


def _weights_after(sync_, learning_rate, epochs=1):
    strategy = tfdist_ext.Strategy(sync=sync_, num_replicas=3)
    model, _ = _fit(strategy, lambda: keras.optimizers.Adam(learning_rate), epochs)
    return strategy, [np.asarray(w) for w in model.get_weights()]


@pytest.mark.parametrize("sync_, ratio", [
    ({"name": "local_sgd", "period": 2}, 3),
    ({"name": "local_sgd", "period": 2, "warmup_steps": 100}, 3),
    ({"name": "delayed_averaging", "delay": 1}, 5),
    ({"name": "gossip", "topology": "ring"}, 3),
    ({"name": "model_averaging", "learners_per_device": 2}, 6),
])
def test_adam_steps_with_the_square_root_scaled_learning_rate(sync_, ratio, caplog):
    """3 replicas, Adam: the default run equals an unscaled run at sqrt(ratio) times the rate."""
    with caplog.at_level(logging.INFO, logger="tfdist_ext"):
        strategy, scaled = _weights_after(sync_, 1e-2)
    assert strategy.sync_runner.lr_factor == pytest.approx(math.sqrt(ratio))
    assert f"multiplied by sqrt({ratio:.3g})" in caplog.text
    given = dict(sync_, sqrt_lr_scaling=False)
    if sync_.get("warmup_steps"):  # every step of the epoch is a synchronous warm-up step
        _, unscaled = _weights_after(given, 1e-2)
        for a, b in zip(scaled, unscaled):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        return
    strategy, manual = _weights_after(given, 1e-2 * math.sqrt(ratio))
    assert strategy.sync_runner.lr_factor == 1.0
    for a, b in zip(scaled, manual):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    _, unscaled = _weights_after(given, 1e-2)
    assert not all(np.allclose(a, b, atol=1e-6) for a, b in zip(scaled, unscaled))


def test_sgd_and_outer_steps_are_not_rescaled():
    strategy = tfdist_ext.Strategy(sync={"name": "local_sgd", "period": 2}, num_replicas=2)
    _fit(strategy, lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    assert strategy.sync_runner.lr_factor == 1.0
    strategy = tfdist_ext.Strategy(sync={"name": "diloco", "period": 2}, num_replicas=2)
    _fit(strategy, lambda: keras.optimizers.Adam(1e-3))
    assert strategy.sync_runner.lr_factor == 1.0


@pytest.mark.parametrize("optimizer, expected", [
    (keras.optimizers.SGD(0.1), 0.9),
    (keras.optimizers.SGD(0.1, momentum=0.9), 0.0),
    (keras.optimizers.Adam(1e-3), 0.9),
    (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)), 0.0),
])
def test_model_averaging_central_momentum_follows_the_optimizer(optimizer, expected, caplog):
    with caplog.at_level(logging.INFO, logger="tfdist_ext"):
        assert sync.ModelAveraging().central_momentum(optimizer) == expected
    assert f"sync='model_averaging': central momentum {expected:g}, chosen for the" in caplog.text
    assert sync.ModelAveraging(momentum=0.5).central_momentum(optimizer) == 0.5
